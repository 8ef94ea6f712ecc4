"""`wam-diff-ros-latency`: end-to-end latency of the planner node, measured from outside it.

Starts `wam_diff_ros.planner_node` as its own process (as deployed), publishes camera frames at
a fixed rate and records, per Trajectory received, the wall time since its frame was published.
Prints a table and writes JSON: latency p50/p95/max, frames planned and dropped, the node's CPU
use and RSS (from /proc) at the start and end of the run. With --frames 10000 it is the soak test.

    python -m wam_diff_ros.latency_probe --model nano --rate 10 --frames 300 --out runs/ros_latency.json
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
from typing import Optional

import numpy as np

from wam_diff_core.console import console_main
from wam_diff_core.constants import SHIPPED_MODEL

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
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0 = the policy's default budget")
    parser.add_argument("--planner-rate", type=float, default=0.0, help="planner rate_hz (0 = as fast as it runs)")
    parser.add_argument("--reliable", action="store_true",
                        help="reliable camera QoS (default best effort, as cameras publish); depth stays 1")
    parser.add_argument("--load-timeout", type=float, default=300.0)
    parser.add_argument("--out", default="runs/ros_latency.json")
    return parser


def planner_command(args: argparse.Namespace, ns: str) -> list[str]:
    """The planner node as its own process in namespace `ns`, listening to the probe's camera."""
    return [sys.executable, "-m", "wam_diff_ros.planner_node", "--ros-args", "-r", f"__ns:={ns}",
            "-p", f"model:={args.model}", "-p", f"device:={args.device}", "-p", "autostart:=true",
            "-p", f"block_size:={args.block_size}", "-p", f"denoising_steps:={args.steps}",
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
        self.decode_s: list[float] = []
        self.valid = 0
        self.last_diag: Optional[dict] = None

    def on_trajectory(self, msg) -> None:
        now = time.perf_counter()
        key = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        sent = self.published.get(key)
        if sent is not None:
            self.latencies.append(now - sent)
            self.decode_s.append(msg.decode_time_s)
            self.valid += int(msg.valid)

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

        from wam_diff_msgs.msg import Trajectory

        self.rclpy = rclpy
        rclpy.init()
        self.node = rclpy.create_node("latency_probe", namespace=ns)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.trajectories = self.node.create_subscription(Trajectory, "trajectory", recorder.on_trajectory, 10)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", recorder.on_diagnostics, 10)
        reliability = ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT
        self.camera = self.node.create_publisher(Image, "camera/image_raw",
                                                 QoSProfile(depth=1, reliability=reliability))
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def wait_connected(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.camera.get_subscription_count() < 1 or self.trajectories.get_publisher_count() < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("planner never connected (camera subscription / trajectory publisher)")
            time.sleep(0.05)

    def publish_frames(self, args: argparse.Namespace, published: dict[int, float]) -> float:
        """`args.frames` rgb8 frames at `args.rate` Hz, each stamp noted in `published`; the seconds it took."""
        from sensor_msgs.msg import Image
        from std_msgs.msg import Header

        from .image_conversion import rgb_to_raw

        rng = np.random.default_rng(0)
        base = rng.integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
        data, step = rgb_to_raw(base, "rgb8")
        period = 1.0 / args.rate
        t0 = time.perf_counter()
        wall0 = time.time()
        for i in range(args.frames):
            target = t0 + i * period
            while (delay := target - time.perf_counter()) > 0:
                time.sleep(delay)
            stamp_ns = int((wall0 + i * period) * 1e9)
            header = Header(frame_id="camera_front")
            header.stamp.sec, header.stamp.nanosec = stamp_ns // 1_000_000_000, stamp_ns % 1_000_000_000
            msg = Image(header=header, height=args.height, width=args.width, encoding="rgb8", step=step, data=data)
            published[stamp_ns] = time.perf_counter()
            self.camera.publish(msg)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def latency_result(args: argparse.Namespace, rec: Recorder, load_s: float, send_s: float,
                   start: tuple[float, float], end: tuple[float, float]) -> dict:
    """The JSON record of one run; `start` and `end` are the planner's (CPU seconds, RSS MiB)."""
    lat = np.array(rec.latencies) * 1e3
    diag = rec.last_diag
    return {
        "model": args.model, "device": args.device, "image": f"{args.width}x{args.height} rgb8",
        "camera_hz": args.rate, "block_size": args.block_size, "steps": args.steps,
        "frames_published": args.frames, "plans_received": len(rec.latencies), "plans_valid": rec.valid,
        "frames_not_planned": args.frames - len(rec.latencies),
        # of those: lost before the node's callback (transport, best effort) vs dropped by the node
        "frames_lost_in_transport": (args.frames - int(diag["frames_received"])) if diag else None,
        "frames_dropped_by_node": int(diag["frames_dropped"]) if diag else None,
        "camera_qos": "reliable" if args.reliable else "best_effort",
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                       "max": float(lat.max())} if len(lat) else None,
        "decode_ms_p50": float(np.percentile(rec.decode_s, 50) * 1e3) if rec.decode_s else None,
        "plans_per_s": len(rec.latencies) / send_s,
        "planner_cpu_pct": 100.0 * (end[0] - start[0]) / send_s,
        "planner_rss_mib": {"start": start[1], "end": end[1]},
        "model_load_s": load_s, "publish_s": send_s, "cpus": os.cpu_count(),
        "node_diagnostics": diag,
    }


def measure(args: argparse.Namespace, planner: Planner, probe: Probe, rec: Recorder) -> dict:
    """Wait for the planner, publish the frames, collect the plans: the run's record."""
    load_s = planner.wait_active(args.load_timeout)
    probe.wait_connected()
    start = planner.usage()
    send_s = probe.publish_frames(args, rec.published)
    rec.wait_for_last_plans()
    return latency_result(args, rec, load_s, send_s, start, planner.usage())


def print_table(args: argparse.Namespace, result: dict) -> None:
    lat = result["latency_ms"] or {}
    print(f"{'model':<10}{'image':<16}{'cam Hz':>7}{'frames':>7}{'plans':>7}{'node drop':>10}{'lost':>6}"
          f"{'p50 ms':>9}{'p95 ms':>9}{'CPU %':>7}{'RSS MiB start/end':>20}")
    print(f"{args.model:<10}{result['image']:<16}{args.rate:>7.1f}{args.frames:>7}{result['plans_received']:>7}"
          f"{str(result['frames_dropped_by_node']):>10}{str(result['frames_lost_in_transport']):>6}"
          f"{lat.get('p50', float('nan')):>9.0f}{lat.get('p95', float('nan')):>9.0f}"
          f"{result['planner_cpu_pct']:>7.0f}{result['planner_rss_mib']['start']:>10.0f}/"
          f"{result['planner_rss_mib']['end']:.0f}")


@console_main("wam-diff-ros-latency")
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
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
