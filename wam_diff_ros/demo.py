"""`wam-diff-demo`: what `ros2 launch wam_diff_ros demo.launch.py` starts, without `launch`.

One process, one executor: the planner lifecycle node and the highway bridge node, configured
from the same parameter files (config/planner.yaml, then config/demo.yaml). The bridge drives
the selected routes through the planner over ROS 2 (Fast DDS), prints the route scores and
writes OUT/summary.json and a video of the first route.
"""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import Optional

from wam_diff_core.console import console_main
from wam_diff_core.constants import SHIPPED_MODEL

PACKAGE = "wam_diff_ros"


def config_file(name: str) -> Path:
    """config/<name> of this package: the source tree (editable install) or the installed share dir."""
    source = Path(__file__).resolve().parent.parent / "config" / name
    if source.is_file():
        return source
    try:
        from ament_index_python.packages import get_package_share_directory

        installed = Path(get_package_share_directory(PACKAGE)) / "config" / name
    except Exception as exc:  # noqa: BLE001 - PackageNotFoundError or no ament index
        raise FileNotFoundError(f"parameter file {name} not found in {source.parent} nor the ament index ({exc})")
    if not installed.is_file():
        raise FileNotFoundError(f"parameter file {name} not found in {source.parent} nor {installed.parent}")
    return installed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wam-diff-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SHIPPED_MODEL,
                        help="planner model: the shipped nano-s-b32 (default), a preset name, a checkpoint directory, "
                             "or 'fake' (no model)")
    parser.add_argument("--device", default=None, help="torch device (default: config/planner.yaml)")
    parser.add_argument("--limit", type=int, default=None, help="number of routes (default: config/demo.yaml)")
    parser.add_argument("--route-ids", default=None, help="comma-separated route ids")
    parser.add_argument("--routes-file", default=None, help="route suite JSON (default: the bundled suite)")
    parser.add_argument("--replan-every", type=int, default=None, help="10 Hz ticks between plans")
    parser.add_argument("--frame-size", default=None,
                        help="WxH camera frames the bridge renders (default: the frames --model was trained on, "
                             "from its wam_diff.json; else config/demo.yaml)")
    parser.add_argument("--out", default=None, help="output directory (default: config/demo.yaml out_dir)")
    parser.add_argument("--no-video", action="store_true")
    parser.add_argument("--namespace", default="wam_diff")
    parser.add_argument("--params-file", action="append", default=[],
                        help="extra ROS parameter YAML loaded after planner.yaml and demo.yaml")
    return parser


@console_main("wam-diff-demo")
def main(argv: Optional[list[str]] = None) -> int:
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from .executor import ReadyOnceExecutor
    from .highway_bridge_node import HighwayBridgeNode
    from .planner_node import PlannerNode

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    params_files = [config_file("planner.yaml"), config_file("demo.yaml"), *map(Path, args.params_file)]
    ros_args = ["wam-diff-demo", "--ros-args"]
    for path in params_files:
        ros_args += ["--params-file", str(path)]
    planner_overrides = [Parameter("model", value=args.model)]
    if args.device:
        planner_overrides.append(Parameter("device", value=args.device))
    bridge_overrides = []
    for name, value in (("limit", args.limit), ("route_ids", args.route_ids), ("routes_file", args.routes_file),
                        ("replan_every", args.replan_every), ("out_dir", args.out)):
        if value is not None:
            bridge_overrides.append(Parameter(name, value=value))
    if args.no_video:
        bridge_overrides.append(Parameter("video", value=False))
    try:
        from wam_diff_core.sim.routes import checkpoint_frame_size, checkpoint_route_target_scenarios, parse_frame_size

        size = parse_frame_size(args.frame_size) if args.frame_size else checkpoint_frame_size(args.model)
        target_scenarios = checkpoint_route_target_scenarios(args.model)
    except ValueError as exc:
        print(f"wam-diff-demo: error: {exc}", file=sys.stderr)
        return 2
    if size is not None:
        bridge_overrides += [Parameter("frame_width", value=size[0]), Parameter("frame_height", value=size[1])]
    if target_scenarios is not None:
        bridge_overrides.append(Parameter("route_target_scenarios", value=",".join(target_scenarios)))

    rclpy.init(args=ros_args)
    planner = PlannerNode(namespace=args.namespace, parameter_overrides=planner_overrides)
    bridge = HighwayBridgeNode(namespace=args.namespace, parameter_overrides=bridge_overrides)
    executor = ReadyOnceExecutor(num_threads=4)
    executor.add_node(planner)
    executor.add_node(bridge)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    rc = 0
    try:
        spinner.start()
        if planner.get_parameter("autostart").value:
            print(f"loading planner model {args.model!r} ...", flush=True)
            if planner.trigger_configure() != TransitionCallbackReturn.SUCCESS or \
                    planner.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                print("wam-diff-demo: the planner failed to start (see its log above)", file=sys.stderr)
                return 1
        bridge.run()
    except (KeyboardInterrupt, ExternalShutdownException):
        rc = 130
    except (ValueError, TimeoutError, FileNotFoundError) as exc:
        print(f"wam-diff-demo: {exc}", file=sys.stderr)
        rc = 1
    finally:
        planner.release()
        executor.shutdown(timeout_sec=1.0)
        bridge.destroy_node()
        planner.destroy_node()
        rclpy.try_shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
