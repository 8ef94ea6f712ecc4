"""`wam-diff-ros-latency`: end-to-end latency of the planner node, measured from outside it.

Starts `wam_diff_ros.planner_node` as its own process (as deployed), publishes camera frames at
a fixed rate and records, per Trajectory received, the wall time since its frame was published.
Prints a table and writes JSON: latency p50/p95/max, plans per second, frames planned, dropped by
the node and lost in transport, the node's CPU use and its RSS (from /proc) when active, after the
first --warmup-frames frames and at the end, with the growth from warm-up to the end in %.
With --frames 10000 it is the soak test (about 17 minutes at 10 Hz):

    wam-diff-ros-latency --frames 10000 --out runs/ros_soak.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from tqdm import tqdm

from wam_diff_core.console import console_main
from wam_diff_core.constants import SHIPPED_MODEL

from .demo import config_file

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wam-diff-ros-latency", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SHIPPED_MODEL,
                        help="the shipped model (default), a preset name, a checkpoint directory or 'fake'")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rate", type=float, default=10.0, help="camera rate, Hz")
    parser.add_argument("--frames", type=int, default=300, help="frames to publish")
    parser.add_argument("--warmup-frames", type=int, default=100,
                        help="frames after which the node's RSS is the warm-up figure that growth is measured from")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--params-file", action="append", default=None,
                        help="planner parameter YAML (default config/planner.yaml: the node as shipped); repeatable")
    parser.add_argument("--block-size", type=int, default=0, help="B on top of the parameter files (0 = theirs)")
    parser.add_argument("--steps", type=int, default=0, help="K on top of the parameter files (0 = theirs)")
    parser.add_argument("--threshold", type=float, default=0.0,
                        help="remasking threshold on top of the parameter files (0 = theirs)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0 = the policy's default budget")
    parser.add_argument("--planner-rate", type=float, default=0.0, help="planner rate_hz (0 = as fast as it runs)")
    parser.add_argument("--reliable", action="store_true",
                        help="reliable camera QoS (default best effort, as cameras publish); depth stays 1")
    parser.add_argument("--load-timeout", type=float, default=300.0)
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="seconds between the camera matching the node and the first frame: DDS discovery ends on "
                             "both sides (frames sent before the node's reader matched the camera are lost)")
    parser.add_argument("--out", default="runs/ros_latency.json")
    return parser


def planner_settings(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The planner's parameter files and the decoding overrides (`name:=value`) the command line lays on top."""
    files = args.params_file if args.params_file is not None else [str(config_file("planner.yaml"))]
    decoding = {"block_size": args.block_size, "denoising_steps": args.steps, "remasking_threshold": args.threshold}
    return files, [f"{name}:={value}" for name, value in decoding.items() if value]


def planner_command(args: argparse.Namespace, ns: str) -> list[str]:
    """The planner node as its own process in namespace `ns`, listening to the probe's camera."""
    files, overrides = planner_settings(args)
    return [sys.executable, "-m", "wam_diff_ros.planner_node", "--ros-args", "-r", f"__ns:={ns}",
            *[arg for path in files for arg in ("--params-file", path)],
            "-p", f"model:={args.model}", "-p", f"device:={args.device}", "-p", "autostart:=true",
            *[arg for value in overrides for arg in ("-p", value)],
            "-p", f"max_new_tokens:={args.max_new_tokens}", "-p", f"rate_hz:={float(args.planner_rate)}",
            "-p", "camera_topics:=[camera/image_raw]", "-p", "warmup:=true",
            "-p", f"image_reliability:={'reliable' if args.reliable else 'best_effort'}"]


class Planner:
    """The planner process; a thread keeps its output lines and notes when its policy is loaded."""

    def __init__(self, cmd: list[str]):
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log_lines: list[str] = []
        self.active = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.log_lines.append(line)
            if "active: policy loaded" in line:
                self.active.set()

    def wait_active(self, timeout_s: float) -> float:
        """Seconds until the policy is loaded; TimeoutError with the last output lines after `timeout_s`."""
        t_load = time.perf_counter()
        if not self.active.wait(timeout_s):
            raise TimeoutError("planner did not become active:\n" + "".join(self.log_lines[-20:]))
        return time.perf_counter() - t_load

    def usage(self) -> tuple[float, float]:
        """(CPU seconds, RSS MiB) of the process so far."""
        return proc_cpu_s(self.process.pid), proc_rss_mib(self.process.pid)

    def stop(self) -> None:
        self.process.send_signal(2)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Recorder:
    """What comes back: per plan whose frame the probe published, the wall time since it was published, its decode
    time and validity; the node's own counters from /diagnostics."""

    def __init__(self, ns: str):
        self.ns = ns
        self.published: dict[int, float] = {}  # frame stamp (ns) -> perf_counter at publication
        self.latencies: list[float] = []
        self.planned: list[int] = []  # stamps of the planned frames, in arrival order
        self.decode_s: list[float] = []
        self.valid = 0
        self.detection_arrays = 0  # Detection2DArrays of frames the probe published (tasks with detection)
        self.boxes = 0
        self.last_diag: Optional[dict] = None

    def on_trajectory(self, msg) -> None:
        now = time.perf_counter()
        key = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        sent = self.published.get(key)
        if sent is not None:
            self.latencies.append(now - sent)
            self.planned.append(key)
            self.decode_s.append(msg.decode_time_s)
            self.valid += int(msg.valid)

    def on_detections(self, msg) -> None:
        if msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec in self.published:
            self.detection_arrays += 1
            self.boxes += len(msg.detections)

    def on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if self.ns in status.name:
                self.last_diag = {kv.key: kv.value for kv in status.values}

    def wait_for_last_plans(self) -> None:
        """Let the plan in flight finish, then one more diagnostics period for the node's own counters."""
        settle = time.monotonic() + max(10.0, 5 * (max(self.latencies) if self.latencies else 1.0))
        n = len(self.latencies)
        while time.monotonic() < settle:
            time.sleep(0.5)
            if len(self.latencies) == n and self.latencies:
                break
            n = len(self.latencies)
        time.sleep(1.5)


class Probe:
    """The probe's ROS node in namespace `ns`: a camera publisher (depth 1), the trajectory and diagnostics
    subscriptions feeding `recorder`, spun on a thread."""

    def __init__(self, ns: str, recorder: Recorder, reliable: bool):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from wam_diff_msgs.msg import Detection2DArray, Trajectory

        self.rclpy = rclpy
        rclpy.init()
        self.node = rclpy.create_node("latency_probe", namespace=ns)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.trajectories = self.node.create_subscription(Trajectory, "trajectory", recorder.on_trajectory, 10)
        self.node.create_subscription(Detection2DArray, "detections", recorder.on_detections, 10)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", recorder.on_diagnostics, 10)
        reliability = ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT
        self.camera = self.node.create_publisher(Image, "camera/image_raw",
                                                 QoSProfile(depth=1, reliability=reliability))
        self.late_s: list[float] = []  # per frame published: seconds after its due time (the probe's own stalls)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def wait_connected(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.camera.get_subscription_count() < 1 or self.trajectories.get_publisher_count() < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("planner never connected (camera subscription / trajectory publisher)")
            time.sleep(0.05)

    def publish_frames(self, args: argparse.Namespace, published: dict[int, float],
                       after_frame: Callable[[int], None] = lambda n: None) -> float:
        """`args.frames` rgb8 frames at `args.rate` Hz, each stamp noted in `published` and `after_frame(n)` called
        with the count sent so far; the seconds it took."""
        from sensor_msgs.msg import Image
        from std_msgs.msg import Header

        from .image_conversion import rgb_to_raw

        rng = np.random.default_rng(0)
        base = rng.integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
        data, step = rgb_to_raw(base, "rgb8")
        period = 1.0 / args.rate
        t0 = time.perf_counter()
        wall0 = time.time()
        for i in tqdm(range(args.frames), desc="frames", unit="frame", mininterval=5.0, disable=None):
            target = t0 + i * period
            while (delay := target - time.perf_counter()) > 0:
                time.sleep(delay)
            stamp_ns = int((wall0 + i * period) * 1e9)
            header = Header(frame_id="camera_front")
            header.stamp.sec, header.stamp.nanosec = stamp_ns // 1_000_000_000, stamp_ns % 1_000_000_000
            msg = Image(header=header, height=args.height, width=args.width, encoding="rgb8", step=step, data=data)
            published[stamp_ns] = now = time.perf_counter()
            self.late_s.append(now - target)
            self.camera.publish(msg)
            after_frame(i + 1)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def rss_marks(frames: int, warmup_frames: int) -> set[int]:
    """Frame counts after which the planner's RSS is sampled: the warm-up point and 20 more, evenly spaced."""
    step = max(1, frames // 20)
    return {warmup_frames} | set(range(step, frames + 1, step))


def rss_record(start_mib: float, samples: list[tuple[int, float]], warmup_frames: int, end_mib: float) -> dict:
    """The planner's RSS in MiB: when active, after `warmup_frames` frames, at the end, the growth from warm-up to
    the end in %, and every (frames sent, MiB) sample."""
    warm = dict(samples).get(warmup_frames, float("nan"))
    return {"start": start_mib, "after_warmup": warm, "end": end_mib, "growth_pct": 100.0 * (end_mib - warm) / warm,
            "warmup_frames": warmup_frames, "samples": [[n, mib] for n, mib in samples]}


def unplanned_by_tenth(published: dict[int, float], planned: list[int]) -> list[int]:
    """Frames not planned in each tenth of the run, in publication order: losses at the start (discovery, warm-up)
    tell apart from losses spread over the run."""
    done = set(planned)
    missed = [i for i, stamp in enumerate(published) if stamp not in done]
    n = max(len(published), 1)
    return [sum(1 for i in missed if i * 10 // n == tenth) for tenth in range(10)]


def publish_lateness(late_s: list[float], period_s: float) -> dict:
    """How late the probe published its frames: p50 and max in ms, and the frames published more than one camera
    period after their due time per tenth of the run. A stall of the probe itself shows here: the frames due during
    it go out back to back after it, and a depth-1 queue keeps only the last, so they count as lost in transport."""
    late = np.asarray(late_s, dtype=float)
    n = max(len(late), 1)
    over = [i for i, v in enumerate(late) if v > period_s]
    return {"p50_ms": float(np.median(late) * 1e3) if len(late) else None,
            "max_ms": float(late.max() * 1e3) if len(late) else None,
            "frames_late_by_a_period_by_tenth": [sum(1 for i in over if i * 10 // n == t) for t in range(10)]}


def latency_result(args: argparse.Namespace, rec: Recorder, load_s: float, send_s: float,
                   start: tuple[float, float], end: tuple[float, float], rss_samples: list[tuple[int, float]],
                   late_s: Optional[list[float]] = None) -> dict:
    """The JSON record of one run; `start` and `end` are the planner's (CPU seconds, RSS MiB), `rss_samples` its
    (frames sent, RSS MiB) during the run, `late_s` per frame how late the probe published it."""
    lat = np.array(rec.latencies) * 1e3
    diag = rec.last_diag
    files, overrides = planner_settings(args)
    return {
        "model": args.model, "device": args.device, "image": f"{args.width}x{args.height} rgb8",
        "camera_hz": args.rate, "params_files": files,
        "decoding_overrides": overrides,
        "frames_published": args.frames, "plans_received": len(rec.latencies), "plans_valid": rec.valid,
        "frames_not_planned": args.frames - len(rec.latencies),
        "detection_arrays": rec.detection_arrays,
        "boxes_per_array": round(rec.boxes / rec.detection_arrays, 3) if rec.detection_arrays else None,
        # of those: lost before the node's callback (transport, best effort) vs dropped by the node
        "frames_lost_in_transport": (args.frames - int(diag["frames_received"])) if diag else None,
        "frames_dropped_by_node": int(diag["frames_dropped"]) if diag else None,
        "frames_not_planned_by_tenth": unplanned_by_tenth(rec.published, rec.planned),
        "camera_qos": "reliable" if args.reliable else "best_effort", "settle_s": args.settle_s,
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                       "max": float(lat.max())} if len(lat) else None,
        "decode_ms_p50": float(np.percentile(rec.decode_s, 50) * 1e3) if rec.decode_s else None,
        "plans_per_s": len(rec.latencies) / send_s,
        "planner_cpu_pct": 100.0 * (end[0] - start[0]) / send_s,
        "planner_rss_mib": rss_record(start[1], rss_samples, args.warmup_frames, end[1]),
        "model_load_s": load_s, "publish_s": send_s, "cpus": os.cpu_count(),
        "node_diagnostics": diag,
        "probe_publish_lateness": publish_lateness(late_s or [], 1.0 / args.rate),
    }


def measure(args: argparse.Namespace, planner: Planner, probe: Probe, rec: Recorder) -> dict:
    """Wait for the planner, publish the frames, collect the plans: the run's record."""
    load_s = planner.wait_active(args.load_timeout)
    probe.wait_connected()
    time.sleep(args.settle_s)
    start = planner.usage()
    marks, samples = rss_marks(args.frames, args.warmup_frames), []

    def after_frame(n: int) -> None:
        if n in marks:
            samples.append((n, planner.usage()[1]))

    send_s = probe.publish_frames(args, rec.published, after_frame)
    rec.wait_for_last_plans()
    return latency_result(args, rec, load_s, send_s, start, planner.usage(), samples, probe.late_s)


def print_table(args: argparse.Namespace, result: dict) -> None:
    lat, rss = result["latency_ms"] or {}, result["planner_rss_mib"]
    rss_text = f"{rss['start']:.0f}/{rss['after_warmup']:.0f}/{rss['end']:.0f}"
    print(f"{'model':<12}{'image':<16}{'cam Hz':>7}{'frames':>7}{'plans':>7}{'plans/s':>8}{'node drop':>10}{'lost':>6}"
          f"{'p50 ms':>8}{'p95 ms':>8}{'CPU %':>6}{'RSS MiB start/warm/end':>24}{'RSS growth':>11}")
    print(f"{args.model:<12}{result['image']:<16}{args.rate:>7.1f}{args.frames:>7}{result['plans_received']:>7}"
          f"{result['plans_per_s']:>8.2f}{str(result['frames_dropped_by_node']):>10}"
          f"{str(result['frames_lost_in_transport']):>6}{lat.get('p50', float('nan')):>8.0f}"
          f"{lat.get('p95', float('nan')):>8.0f}{result['planner_cpu_pct']:>6.0f}{rss_text:>24}"
          f"{rss['growth_pct']:>+10.1f}%")
    print(f"RSS: when active, after {rss['warmup_frames']} frames (warm), at the end; growth from warm to end")


@console_main("wam-diff-ros-latency")
def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.frames < 1 or args.rate <= 0 or args.warmup_frames < 1:
        parser.error(f"--frames and --warmup-frames must be >= 1 and --rate > 0, got {args.frames}, "
                     f"{args.warmup_frames}, {args.rate}")
    args.warmup_frames = min(args.warmup_frames, args.frames)
    domain = random.Random(os.getpid()).randrange(1, 200)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    ns = f"/latency{os.getpid()}"
    planner = Planner(planner_command(args, ns))  # starts loading while rclpy comes up here
    rec = Recorder(ns)
    probe = Probe(ns, rec, args.reliable)
    result: dict = {}
    try:
        result = measure(args, planner, probe, rec)
    finally:
        probe.close()
        planner.stop()
    if result:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print_table(args, result)
        print(f"wrote {out}")
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
