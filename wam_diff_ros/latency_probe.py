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
    parser.add_argument("--model", default="nano")
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


@console_main("wam-diff-ros-latency")
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    domain = random.Random(os.getpid()).randrange(1, 200)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    ns = f"/latency{os.getpid()}"
    node_cmd = [sys.executable, "-m", "wam_diff_ros.planner_node", "--ros-args", "-r", f"__ns:={ns}",
                "-p", f"model:={args.model}", "-p", f"device:={args.device}", "-p", "autostart:=true",
                "-p", f"block_size:={args.block_size}", "-p", f"denoising_steps:={args.steps}",
                "-p", f"max_new_tokens:={args.max_new_tokens}", "-p", f"rate_hz:={float(args.planner_rate)}",
                "-p", "camera_topics:=[camera/image_raw]", "-p", "warmup:=true",
                "-p", f"image_reliability:={'reliable' if args.reliable else 'best_effort'}"]
    planner = subprocess.Popen(node_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log_lines: list[str] = []
    active = threading.Event()

    def pump():
        for line in planner.stdout:
            log_lines.append(line)
            if "active: policy loaded" in line:
                active.set()

    threading.Thread(target=pump, daemon=True).start()
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header

    from wam_diff_msgs.msg import Trajectory

    from .image_conversion import rgb_to_raw

    rclpy.init()
    probe = rclpy.create_node("latency_probe", namespace=ns)
    executor = SingleThreadedExecutor()
    executor.add_node(probe)
    published: dict[int, float] = {}
    latencies: list[float] = []
    decode_s: list[float] = []
    valid = [0]
    last_diag: list = [None]

    def on_traj(msg: Trajectory):
        now = time.perf_counter()
        key = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        sent = published.get(key)
        if sent is not None:
            latencies.append(now - sent)
            decode_s.append(msg.decode_time_s)
            valid[0] += int(msg.valid)

    def on_diag(msg: DiagnosticArray):
        for status in msg.status:
            if ns in status.name:
                last_diag[0] = {kv.key: kv.value for kv in status.values}

    traj_sub = probe.create_subscription(Trajectory, "trajectory", on_traj, 10)
    probe.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    pub = probe.create_publisher(Image, "camera/image_raw",
                                 QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE if args.reliable
                                            else ReliabilityPolicy.BEST_EFFORT))
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    result: dict = {}
    try:
        t_load = time.perf_counter()
        if not active.wait(args.load_timeout):
            raise TimeoutError("planner did not become active:\n" + "".join(log_lines[-20:]))
        load_s = time.perf_counter() - t_load
        deadline = time.monotonic() + 30
        while pub.get_subscription_count() < 1 or traj_sub.get_publisher_count() < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("planner never connected (camera subscription / trajectory publisher)")
            time.sleep(0.05)
        rss_start = proc_rss_mib(planner.pid)
        cpu_start = proc_cpu_s(planner.pid)
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
            pub.publish(msg)
        send_s = time.perf_counter() - t0
        # let the plan in flight finish, then read the node's own counters
        settle = time.monotonic() + max(10.0, 5 * (max(latencies) if latencies else 1.0))
        n = len(latencies)
        while time.monotonic() < settle:
            time.sleep(0.5)
            if len(latencies) == n and latencies:
                break
            n = len(latencies)
        time.sleep(1.5)  # one more diagnostics period
        cpu_end = proc_cpu_s(planner.pid)
        rss_end = proc_rss_mib(planner.pid)
        lat = np.array(latencies) * 1e3
        result = {
            "model": args.model, "device": args.device, "image": f"{args.width}x{args.height} rgb8",
            "camera_hz": args.rate, "block_size": args.block_size, "steps": args.steps,
            "frames_published": args.frames, "plans_received": len(latencies), "plans_valid": valid[0],
            "frames_not_planned": args.frames - len(latencies),
            # of those: lost before the node's callback (transport, best effort) vs dropped by the node
            "frames_lost_in_transport": (args.frames - int(last_diag[0]["frames_received"])) if last_diag[0] else None,
            "frames_dropped_by_node": int(last_diag[0]["frames_dropped"]) if last_diag[0] else None,
            "camera_qos": "reliable" if args.reliable else "best_effort",
            "latency_ms": {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                           "max": float(lat.max())} if len(lat) else None,
            "decode_ms_p50": float(np.percentile(decode_s, 50) * 1e3) if decode_s else None,
            "plans_per_s": len(latencies) / send_s,
            "planner_cpu_pct": 100.0 * (cpu_end - cpu_start) / send_s,
            "planner_rss_mib": {"start": rss_start, "end": rss_end},
            "model_load_s": load_s, "publish_s": send_s, "cpus": os.cpu_count(),
            "node_diagnostics": last_diag[0],
        }
    finally:
        executor.shutdown(timeout_sec=1.0)
        probe.destroy_node()
        rclpy.try_shutdown()
        planner.send_signal(2)
        try:
            planner.wait(10)
        except subprocess.TimeoutExpired:
            planner.kill()
    if result:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        lat = result["latency_ms"] or {}
        print(f"{'model':<10}{'image':<16}{'cam Hz':>7}{'frames':>7}{'plans':>7}{'node drop':>10}{'lost':>6}"
              f"{'p50 ms':>9}{'p95 ms':>9}{'CPU %':>7}{'RSS MiB start/end':>20}")
        print(f"{args.model:<10}{result['image']:<16}{args.rate:>7.1f}{args.frames:>7}{result['plans_received']:>7}"
              f"{str(result['frames_dropped_by_node']):>10}{str(result['frames_lost_in_transport']):>6}"
              f"{lat.get('p50', float('nan')):>9.0f}{lat.get('p95', float('nan')):>9.0f}"
              f"{result['planner_cpu_pct']:>7.0f}{result['planner_rss_mib']['start']:>10.0f}/"
              f"{result['planner_rss_mib']['end']:.0f}")
        print(f"wrote {out}")
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
