"""`wam-diff-bag`: rosbag2 recordings for the planner (docs/data.md).

  wam-diff-bag record --out BAG [--route highway_00] [--policy expert | CHECKPOINT] [--seconds 60]
  wam-diff-bag replay BAG --model M --out OUT_BAG [--tasks planning,detection] [--question Q] [--json J]
  wam-diff-bag replay BAG --realtime [--rate 1.0]      (publish into a running planner over DDS)
  wam-diff-bag to-dataset BAG [BAG ...] --out DIR [--val BAG]   (training samples, `wam-diff data`'s format)
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from wam_diff_core.console import console_main
from wam_diff_core.constants import REPLAN_EVERY

from . import topics as T
from .errors import BagError

PROG = "wam-diff-bag"


def _require_rosbags() -> None:
    try:
        import rosbags  # noqa: F401
    except ImportError:
        raise BagError("the rosbags library is not installed: pip install -r requirements-data.txt") from None


def _write_json(data: dict, path: Optional[str]) -> None:
    if path:
        from .replay import write_json

        write_json(data, path)
        print(f"json: {path}")


def _add_record(sub) -> None:
    from wam_diff_core.decoding.options import add_decoding_arguments
    from wam_diff_core.sim.routes import DEFAULT_SUITE, add_frame_size_argument

    p = sub.add_parser("record", help="drive the embedded world and write its camera, odometry, command, route "
                                      "target and /clock to a bag (10 Hz, the planner's default topics)")
    p.add_argument("--out", required=True, help="bag directory to create")
    p.add_argument("--route", default="highway_00", help="route id of the suite (default: highway_00)")
    p.add_argument("--routes", default=str(DEFAULT_SUITE), help="route suite JSON (default: the bundled routes_v1)")
    p.add_argument("--seed-offset", type=int, default=0, help="other traffic on the same road: seed + offset")
    p.add_argument("--policy", default="expert",
                   help="expert (default), expert-plan, constant-velocity, or a checkpoint (lockstep, as `wam-diff drive`)")
    p.add_argument("--seconds", type=float, default=None,
                   help="drive this long (a road route is extended to last); default: to the route's end")
    add_frame_size_argument(p)
    p.add_argument("--image", choices=("raw", "png", "jpeg"), default="raw",
                   help="raw: sensor_msgs/Image rgb8 on /camera/image_raw, as the highway bridge; png / jpeg: "
                        "CompressedImage on /camera/image_raw/compressed")
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    p.add_argument("--replan-every", type=int, default=REPLAN_EVERY, help="with a policy: 10 Hz ticks between plans")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--no-progress", action="store_true")
    add_decoding_arguments(p)


def _add_replay(sub) -> None:
    from wam_diff_core.decoding.options import add_decoding_arguments

    p = sub.add_parser("replay", help="plan every frame set of a bag into a new bag (no DDS), or --realtime: "
                                      "publish the bag into a running planner")
    p.add_argument("bag", help="input bag (directory, or an .mcap / .db3 file)")
    p.add_argument("--model", help="checkpoint directory, preset, the shipped model's name, or 'fake'")
    p.add_argument("--out", help="output bag directory to create (Trajectory, Path, Detection2DArray, MarkerArray, "
                                 "DrivingAnswer)")
    p.add_argument("--camera-topics", default=T.CAMERA_TOPIC,
                   help=f"comma-separated camera topics in prompt order (default {T.CAMERA_TOPIC})")
    p.add_argument("--odometry-topic", default=T.ODOMETRY_TOPIC)
    p.add_argument("--command-topic", default=T.COMMAND_TOPIC)
    p.add_argument("--route-target-topic", default=T.ROUTE_TARGET_TOPIC)
    p.add_argument("--tasks", default="planning", help="planning[,detection], as the planner's `tasks` parameter")
    p.add_argument("--question", action="append", default=[], help="also ask this (repeatable): DrivingAnswer")
    p.add_argument("--ask-every", type=int, default=10, help="ask the questions every N frame sets (default 10)")
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    p.add_argument("--copy-inputs", action="store_true", help="also copy the input topics into the output bag")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("realtime", "publish over DDS instead (needs rclpy; the running node plans)")
    g.add_argument("--realtime", action="store_true", help="publish the bag at its recorded rate, as `ros2 bag play`")
    g.add_argument("--rate", type=float, default=1.0, help="pace factor (default 1.0)")
    g.add_argument("--delay", type=float, default=0.5, help="seconds to wait for discovery before playing")
    g.add_argument("--namespace", default="", help="publish every topic under this namespace")
    add_decoding_arguments(p)


def _add_to_dataset(sub) -> None:
    p = sub.add_parser("to-dataset", help="planning samples (the format of `wam-diff data`) from recorded drives")
    p.add_argument("bags", nargs="+", help="bags whose samples go to OUT/train.json")
    p.add_argument("--out", required=True, help="dataset directory")
    p.add_argument("--val", action="append", default=[], help="a bag whose samples go to OUT/val.json (repeatable)")
    p.add_argument("--period-s", type=float, default=0.5, help="seconds between sampled frames (default 0.5)")
    p.add_argument("--camera-topic", default=T.CAMERA_TOPIC)
    p.add_argument("--odometry-topic", default=T.ODOMETRY_TOPIC)
    p.add_argument("--command-topic", default=T.COMMAND_TOPIC)
    p.add_argument("--route-target-topic", default=T.ROUTE_TARGET_TOPIC)
    p.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="rosbag2 record / replay / to-dataset for the planner")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_record(sub)
    _add_replay(sub)
    _add_to_dataset(sub)
    return parser


def run_record(args) -> int:
    from wam_diff_core.decoding.options import decoding_arguments
    from wam_diff_core.errors import UsageError
    from wam_diff_core.sim.policies import load_policy
    from wam_diff_core.sim.routes import load_routes, resolve_frame_size, with_seed_offsets

    from .record import record

    try:
        route = load_routes(args.routes, ids=[args.route])[0]
        route = with_seed_offsets([route], [args.seed_offset])[0][0]
    except (ValueError, OSError) as exc:
        raise UsageError(f"--route {args.route}: {exc}") from None
    expert = args.policy == "expert"
    frame_size = resolve_frame_size(args.frame_size, None if expert else args.policy)
    policy = None if expert else load_policy(args.policy, args.device, decoding_arguments(args))
    try:
        summary = record(route, args.out, policy=policy, driver=args.policy, frame_size=frame_size,
                         seconds=args.seconds, image=args.image, storage=args.storage, replan_every=args.replan_every,
                         progress=not args.no_progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"bag {summary['bag']}: {summary['ticks']} ticks, {summary['duration_s']} s simulated, "
          f"{summary['bag_bytes'] / 1e6:.1f} MB, recorded in {summary['wall_s']} s")
    print("messages: " + ", ".join(f"{t} {n}" for t, n in summary["messages"].items()))
    _write_json(summary, args.json)
    return 0


def load_replay_policy(model: str, device: str, tasks, decoding: dict):
    """'fake' (wam_diff_ros.fake_policy, no model), else DrivingPolicy with the checkpoint's decoding and `decoding`
    on top, as the planner node loads it."""
    if model == "fake":
        from ..fake_policy import FakePolicy

        return FakePolicy(tasks=tasks)
    from wam_diff_core.policy import DrivingPolicy

    return DrivingPolicy.load(model, device=device, tasks=tasks, **decoding)


def run_replay(args) -> int:
    from wam_diff_core.decoding.options import decoding_arguments
    from wam_diff_core.errors import UsageError

    if args.realtime:
        from .realtime import play

        summary = play(args.bag, rate=args.rate, delay_s=args.delay, namespace=args.namespace,
                       progress=not args.no_progress)
        print(f"published {sum(summary['published'].values())} messages in {summary['wall_s']} s: "
              + ", ".join(f"{t} {n}" for t, n in summary["published"].items()))
        _write_json(summary, args.json)
        return 0
    if not args.model or not args.out:
        raise UsageError("replay needs --model and --out (or --realtime to publish into a running planner)")
    from .replay import format_summary, replay

    tasks = tuple(t for t in args.tasks.split(",") if t)
    if not tasks or any(t not in ("planning", "detection") for t in tasks):
        raise UsageError(f"--tasks {args.tasks!r}: expected planning and / or detection")
    policy = load_replay_policy(args.model, args.device, tasks, decoding_arguments(args))
    summary = replay(args.bag, policy, args.out, camera_topics=[t for t in args.camera_topics.split(",") if t],
                     odometry_topic=args.odometry_topic, command_topic=args.command_topic,
                     route_target_topic=args.route_target_topic, tasks=tasks, questions=args.question,
                     ask_every=args.ask_every, storage=args.storage, copy_inputs=args.copy_inputs,
                     progress=not args.no_progress, model_name=args.model)
    print(format_summary(summary))
    _write_json(summary, args.json)
    return 0


def run_to_dataset(args) -> int:
    from .to_dataset import to_dataset

    stats = to_dataset(args.bags, args.out, args.val, period_s=args.period_s, progress=not args.no_progress,
                       camera_topic=args.camera_topic, odometry_topic=args.odometry_topic,
                       command_topic=args.command_topic, route_target_topic=args.route_target_topic)
    print(json.dumps({k: stats[k] for k in ("bags", "samples", "skipped", "commands")}, indent=2))
    print(f"dataset: {args.out}/train.json, {args.out}/val.json (stats: {args.out}/stats.json)")
    return 0


@console_main(PROG, subcommands=True)
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _require_rosbags()
    return {"record": run_record, "replay": run_replay, "to-dataset": run_to_dataset}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
