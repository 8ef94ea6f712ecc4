"""SIGINT and SIGTERM to `wam-diff-planner` while a plan is in flight: exit status 0 within 2 s, no traceback; and the
soak record of `wam-diff-ros-latency` (RSS growth from warm-up to the end, lost frames, p50/p95, plans/s).

The planner runs as its own process, as deployed; this test publishes camera frames and watches trajectories over
real DDS on a domain id of its own (tests/test_ros_planner_node.py does the same in-process). Two planners: the
fake policy made slow (it prints a line when a plan starts, then sleeps 60 s, so the signal always lands mid-plan)
and the `wam-diff-planner` console script with the untrained nano preset decoding 1,000 tokens one at a time
(about 1.4 s a plan on a 2-core CPU).
"""
from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from wam_diff_msgs.msg import Trajectory  # noqa: E402

SHUTDOWN_LIMIT_S = 2.0
SIGNAL_AFTER_S = 0.3  # from publishing the frame to the signal; every plan here takes longer
START_TIMEOUT_S = 120.0
# domain ids apart from tests/test_ros_planner_node.py's 1..150, offset per process
_DOMAINS = itertools.count(random.Random(os.getpid()).randrange(0, 80))
_NAMESPACES = itertools.count()

PLAN_STARTED = "slow fake: plan started"
SLOW_FAKE = f"""
import time
from wam_diff_ros.fake_policy import FakePolicy
from wam_diff_ros.planner_node import main

class SlowFake(FakePolicy):
    def plan(self, *args, **kwargs):
        print({PLAN_STARTED!r}, flush=True)
        time.sleep(60.0)
        return super().plan(*args, **kwargs)

main(policy_factory=lambda settings: SlowFake(tasks=settings.tasks))
"""
NODE_ARGS = ["-p", "autostart:=true", "-p", "warmup:=false", "-p", "camera_topics:=[camera/image_raw]",
             "-p", "image_reliability:=reliable"]


def _image(sec: int) -> Image:
    msg = Image(header=Header(frame_id="camera_front"), height=96, width=128, encoding="rgb8", step=128 * 3,
                data=np.full((96, 128, 3), 100, np.uint8).tobytes())
    msg.header.stamp.sec = sec
    return msg


class PlannerProcess:
    """The planner as a child process; a thread keeps its output (stdout and stderr together)."""

    def __init__(self, cmd: list[str], domain_id: int):
        env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_DOMAIN_ID=str(domain_id),
                   PYTHONUNBUFFERED="1")
        env.pop("ROS_STATIC_PEERS", None)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop_with(self, signum: int) -> tuple[int, float]:
        """Send `signum`; (exit status, seconds until the process was gone)."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        elapsed = time.monotonic() - sent
        self.kill()
        self._reader.join(2)
        return rc, elapsed

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Camera:
    """A node on its own context and domain: publishes frames, records trajectories by stamp second."""

    def __init__(self, domain_id: int, ns: str):
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("shutdown_probe", namespace=ns, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.trajectories: dict[int, Trajectory] = {}
        self.sub = self.node.create_subscription(
            Trajectory, "trajectory", lambda m: self.trajectories.setdefault(m.header.stamp.sec, m), 10)
        self.pub = self.node.create_publisher(Image, "camera/image_raw",
                                              QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))

    def spin_until(self, cond, timeout_s: float, what: str, planner: PlannerProcess) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert planner.proc.poll() is None, f"planner exited ({planner.proc.returncode}) before {what}:\n{planner.log}"
            assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}:\n{planner.log}"
            self.executor.spin_once(timeout_sec=0.02)

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)

    def first_plan(self, planner: PlannerProcess, sec: int, until=None) -> None:
        """Publish frame `sec` every 0.5 s until `until()` (default: its trajectory came back): a frame sent before
        the planner's subscription matched, or before it was activated, is never planned."""
        until = until or (lambda: sec in self.trajectories)
        self.spin_until(lambda: self.pub.get_subscription_count() >= 1 and self.sub.get_publisher_count() >= 1,
                        START_TIMEOUT_S, "the planner's camera subscription and trajectory publisher", planner)
        sent_at = [0.0]

        def done() -> bool:
            if until():
                return True
            if time.monotonic() - sent_at[0] > 0.5:
                self.pub.publish(_image(sec))
                sent_at[0] = time.monotonic()
            return False

        self.spin_until(done, START_TIMEOUT_S, f"the plan of frame {sec}", planner)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def ros_pair():
    """(domain id, namespace, Camera) for one planner process; the camera node is closed afterwards."""
    domain_id = 151 + next(_DOMAINS) % 80
    ns = f"/shutdown{os.getpid()}_{next(_NAMESPACES)}"
    camera = Camera(domain_id, ns)
    yield domain_id, ns, camera
    camera.close()


def _assert_clean_exit(planner: PlannerProcess, rc, elapsed: float, signame: str) -> None:
    print(f"{signame}: planner exited with {rc} after {elapsed:.3f} s")
    assert rc == 0, f"{signame}: exit status {rc}, expected 0:\n{planner.log}"
    assert elapsed < SHUTDOWN_LIMIT_S, f"{signame}: shutdown took {elapsed:.2f} s (limit {SHUTDOWN_LIMIT_S} s)"
    assert "Traceback" not in planner.log, planner.log


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_during_a_slow_fake_plan_exits_0_within_2_s_without_traceback(ros_pair, signame):
    domain_id, ns, camera = ros_pair
    planner = PlannerProcess([sys.executable, "-c", SLOW_FAKE, "--ros-args", "-r", f"__ns:={ns}"] + NODE_ARGS,
                             domain_id)
    try:
        camera.first_plan(planner, 1, until=lambda: PLAN_STARTED in planner.log)
        assert planner.log.count(PLAN_STARTED) == 1  # the plan is in flight: it sleeps 60 s
        rc, elapsed = planner.stop_with(getattr(signal, signame))
    finally:
        planner.kill()
    _assert_clean_exit(planner, rc, elapsed, signame)
    assert not camera.trajectories  # the plan never finished: the signal came mid-plan


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_to_the_console_script_mid_nano_plan_exits_0_within_2_s_without_traceback(ros_pair, signame):
    pytest.importorskip("wam_diff_core.policy")
    script = Path(sys.executable).with_name("wam-diff-planner")
    if not script.is_file():
        pytest.skip(f"console script not installed next to {sys.executable} (pip install -e .)")
    domain_id, ns, camera = ros_pair
    planner = PlannerProcess([str(script), "--ros-args", "-r", f"__ns:={ns}", "-p", "model:=nano", "-p", "device:=cpu",
                              "-p", "block_size:=1", "-p", "max_new_tokens:=1000"] + NODE_ARGS, domain_id)
    try:
        camera.first_plan(planner, 1)
        plan_s = camera.trajectories[1].decode_time_s
        assert plan_s > 2 * SIGNAL_AFTER_S, f"a nano plan took {plan_s:.2f} s: too short to be caught in flight"
        # the worker is free or finishing a re-sent frame 1; either way frame 2's plan (or that one) is running
        camera.pub.publish(_image(2))
        camera.spin_for(SIGNAL_AFTER_S)
        assert 2 not in camera.trajectories
        rc, elapsed = planner.stop_with(getattr(signal, signame))
    finally:
        planner.kill()
    camera.spin_for(0.2)
    _assert_clean_exit(planner, rc, elapsed, signame)
    assert 2 not in camera.trajectories  # frame 2 was never answered: its plan was cut short


def test_soak_record_and_table_show_rss_growth_from_warm_up_lost_frames_latency_and_plans_per_s(capsys):
    from wam_diff_ros.latency_probe import Recorder, build_parser, latency_result, print_table, rss_marks

    marks = rss_marks(10_000, 100)
    assert min(marks) == 100 and max(marks) == 10_000 and len(marks) == 21  # warm-up + every 500 frames
    args = build_parser().parse_args(["--frames", "200", "--warmup-frames", "100"])
    rec = Recorder("/ns")
    rec.latencies, rec.decode_s, rec.valid = [0.1, 0.2, 0.3, 0.4], [0.05] * 4, 4
    rec.last_diag = {"frames_received": "190", "frames_dropped": "6"}
    result = latency_result(args, rec, load_s=3.0, send_s=20.0, start=(1.0, 430.0), end=(11.0, 462.0),
                            rss_samples=[(10, 436.0), (100, 440.0), (200, 461.0)])
    rss = result["planner_rss_mib"]
    assert (rss["start"], rss["after_warmup"], rss["end"]) == (430.0, 440.0, 462.0)
    assert rss["growth_pct"] == pytest.approx(5.0) and rss["samples"][1] == [100, 440.0]
    assert (result["frames_lost_in_transport"], result["frames_dropped_by_node"]) == (10, 6)
    assert result["frames_not_planned"] == 196 and result["plans_per_s"] == pytest.approx(0.2)
    assert result["latency_ms"]["p50"] == pytest.approx(250.0) and result["latency_ms"]["p95"] == pytest.approx(385.0)
    print_table(args, result)
    header, row, note = capsys.readouterr().out.splitlines()
    assert "plans/s" in header and "RSS MiB start/warm/end" in header and "RSS growth" in header
    assert row.split()[4:] == ["200", "4", "0.20", "6", "10", "250", "385", "50", "430/440/462", "+5.0%"]
    assert note.startswith("RSS: when active, after 100 frames (warm)")


def test_latency_probe_runs_the_node_as_configured_with_only_the_decoding_overrides_given():
    from wam_diff_ros.latency_probe import build_parser, planner_command

    shipped = planner_command(build_parser().parse_args([]), "/probe")
    files = [shipped[i + 1] for i, arg in enumerate(shipped) if arg == "--params-file"]
    assert len(files) == 1 and files[0].endswith("config/planner.yaml")
    assert not any(arg.startswith(("block_size:=", "denoising_steps:=", "remasking_threshold:=")) for arg in shipped)
    custom = planner_command(build_parser().parse_args(["--steps", "4", "--threshold", "0.9", "--params-file", "a.yaml",
                                                        "--params-file", "b.yaml"]), "/probe")
    assert [custom[i + 1] for i, arg in enumerate(custom) if arg == "--params-file"] == ["a.yaml", "b.yaml"]
    assert "denoising_steps:=4" in custom and "remasking_threshold:=0.9" in custom
    assert not any(arg.startswith("block_size:=") for arg in custom)
    assert custom.index("--params-file") < custom.index("denoising_steps:=4")  # the overrides come last


def test_latency_probe_counts_unplanned_frames_per_tenth_of_the_run():
    from wam_diff_ros.latency_probe import unplanned_by_tenth

    published = {stamp: 0.0 for stamp in range(100, 120)}  # 20 frames, two per tenth
    planned = [s for s in published if s not in (100, 101, 102, 119)]
    assert unplanned_by_tenth(published, planned) == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1]
    assert unplanned_by_tenth({}, []) == [0] * 10


def test_latency_probe_records_when_it_published_late_itself():
    from wam_diff_ros.latency_probe import publish_lateness

    late = [0.001] * 18 + [0.35, 0.25]  # a stall of the probe near the end: two frames went out 250-350 ms late
    rec = publish_lateness(late, period_s=0.1)
    assert rec["p50_ms"] == pytest.approx(1.0) and rec["max_ms"] == pytest.approx(350.0)
    assert rec["frames_late_by_a_period_by_tenth"] == [0] * 9 + [2]
    assert publish_lateness([], 0.1)["max_ms"] is None
