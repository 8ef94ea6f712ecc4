"""The embedded highway world as a ROS 2 simulator: frames, odometry and command out, Trajectory in.

The bridge drives routes of the suite with the same loop and scoring as `wam-diff drive`
(wam_diff_core.sim.closed_loop.run_route); the policy it hands that loop is the planner node,
reached over ROS. The world runs in lockstep with the planner (like CARLA's synchronous mode):
at each planning tick the bridge publishes /clock, Odometry, the navigation command (when it changes;
transient local, so a late subscriber gets the last one), the route target point (junction routes
only) and the camera Image stamped with simulated time in the camera's optical frame, then waits for
the Trajectory carrying that stamp. The camera's mounting goes once on /tf_static (camera_tf):
the world's frame is an ego-aligned top-down orthographic view (image right = forward, image up = left,
`scaling` px/m, the ego at `anchor`), so its <camera>_link sits above the image centre looking down.
Between plans the controller tracks the last plan (`replan_every` ticks at 10 Hz).
At the end it prints the Bench2Drive-style table and writes OUT/summary.json (+ a video).

Simulated time grows across routes (each route starts 1 s after the previous one ended), so
stamps never go backwards for the planner's camera matching.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import rclpy
from geometry_msgs.msg import Point, PointStamped, Quaternion
from nav_msgs.msg import Odometry
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image
from std_msgs.msg import Header, String

from wam_diff_core.console import console_main
from wam_diff_core.constants import FRAME_SIZE, JUNCTION_SCENARIOS, REPLAN_EVERY
from wam_diff_core.model.settings import check_route_target_scenarios
from wam_diff_core.types import EgoState, Plan
from wam_diff_msgs.msg import Trajectory

from .camera_tf import (TOP_DOWN_HEIGHT_M, TOP_DOWN_ROTATION, CameraMount, StaticTransforms,  # noqa: F401 - API
                        top_down_mount)
from .image_conversion import rgb_to_raw
from .topic_qos import COMMAND_QOS

NODE_NAME = "wam_diff_highway_bridge"

PARAMETERS = {
    "routes_file": ("", "route suite JSON; '' = the bundled suite"),
    "route_ids": ("", "comma-separated route ids; '' = the first `limit` routes"),
    "scenarios": ("", "comma-separated scenario types to keep; '' = all"),
    "limit": (1, "number of routes to drive (after the id / scenario filters); 0 = all"),
    "frame_width": (FRAME_SIZE[0], "camera frame width, pixels (the planner's model's trained frames: wam-diff-demo sets it)"),
    "frame_height": (FRAME_SIZE[1], "camera frame height, pixels"),
    "replan_every": (REPLAN_EVERY, "10 Hz ticks between plans; the controller tracks the last plan in between"),
    "plan_timeout_s": (120.0, "longest wait for the planner's Trajectory (wall seconds); then the tick brakes"),
    "connect_timeout_s": (300.0, "longest wait for the planner to subscribe the camera (model loading)"),
    "out_dir": ("runs/ros_demo", "per-route JSON, summary.json and videos/ land here"),
    "video": (True, "write a video of the first route with the plan drawn"),
    "camera_topic": ("/camera/image_raw", "sensor_msgs/Image published at each planning tick"),
    "odometry_topic": ("/odom", "nav_msgs/Odometry of the ego"),
    "command_topic": ("command", "std_msgs/String navigation command, published when it changes (transient local, "
                                 "depth 1, reliable)"),
    "route_target_topic": ("route_target", "geometry_msgs/PointStamped route target point in base_frame_id, "
                                           "published before the image on ticks where the route has one"),
    "route_target_scenarios": (",".join(JUNCTION_SCENARIOS), "comma-separated junction route types whose ticks "
                               "publish a route target (the planner's checkpoint's wam_diff.json route_target_scenarios; "
                               "wam-diff-demo sets it)"),
    "trajectory_topic": ("trajectory", "wam_diff_msgs/Trajectory from the planner"),
    "camera_name": ("camera_front", "images are stamped with <camera_name>_optical_frame; base_frame_id -> "
                                    "<camera_name>_link -> <camera_name>_optical_frame go on /tf_static"),
    "base_frame_id": ("base_link", "child frame of the odometry; frame of the route target point"),
    "odom_frame_id": ("odom", "frame of the odometry pose"),
}

ROUTE_GAP_S = 1.0
def _ns_to_time(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


class RosPlannerPolicy:
    """A closed-loop policy (plan(images, ego, command, target=None) -> Plan) answered by the planner node over
    ROS."""

    needs_images = True
    drives_itself = False
    name = "ros:wam_diff_planner"

    def __init__(self, bridge: "HighwayBridgeNode"):
        self.bridge = bridge
        self.world = None

    def bind(self, world) -> None:
        self.world = world
        self.bridge.publish_camera_tf(world)

    def plan(self, images, ego: EgoState, command: str, target=None) -> Plan:
        return self.bridge.request_plan(self.world, images[0], ego, command, target)


class HighwayBridgeNode(Node):
    """Publishes the embedded world's sensors on sim time and drives it with the planner's Trajectory."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        for name, (default, description) in PARAMETERS.items():
            self.declare_parameter(name, default, ParameterDescriptor(description=description))
        p = {name: self.get_parameter(name).value for name in PARAMETERS}
        self.cfg = p
        self._clock_pub = self.create_publisher(Clock, "/clock", 10)
        self._image_pub = self.create_publisher(Image, p["camera_topic"], 1)
        self._odom_pub = self.create_publisher(Odometry, p["odometry_topic"], 10)
        self._command_pub = self.create_publisher(String, p["command_topic"], COMMAND_QOS)
        self._target_pub = self.create_publisher(PointStamped, p["route_target_topic"], 10)
        self._traj_sub = self.create_subscription(Trajectory, p["trajectory_topic"], self._on_trajectory, 10)
        self._static_tf = StaticTransforms(self)
        self.camera = CameraMount(str(p["camera_name"]), (0.0, 0.0, TOP_DOWN_HEIGHT_M), TOP_DOWN_ROTATION)
        self._cond = threading.Condition()
        self._trajectories: dict[int, Trajectory] = {}
        self._offset_ns = 0
        self._last_command: Optional[str] = None
        self.plan_wait_s: list[float] = []
        self.timeouts = 0

    # ------------------------------------------------------------------ ROS side
    def publish_camera_tf(self, world) -> None:
        """The camera of `world` (its frame size, `scaling` px/m and ego `anchor`) on /tf_static, once per mounting."""
        self.camera = top_down_mount(self.camera.name, int(world.width), int(world.height), float(world.scaling),
                                     world.anchor)
        self._static_tf.publish([self.camera], self.cfg["base_frame_id"])

    def _on_trajectory(self, msg: Trajectory) -> None:
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        with self._cond:
            self._trajectories[stamp] = msg
            while len(self._trajectories) > 16:  # only the newest few can still be waited for
                self._trajectories.pop(min(self._trajectories))
            self._cond.notify_all()

    def wait_for_planner(self) -> bool:
        """Wait until the planner subscribes the camera (it does so once its model is loaded)."""
        deadline = time.monotonic() + float(self.cfg["connect_timeout_s"])
        while self._image_pub.get_subscription_count() < 1 or self._traj_sub.get_publisher_count() < 1:
            if time.monotonic() > deadline or not rclpy.ok(context=self.context):
                return False
            time.sleep(0.05)
        return True

    def request_plan(self, world, frame: np.ndarray, ego: EgoState, command: str,
                     target: Optional[tuple[float, float]] = None) -> Plan:
        """Publish one planning tick stamped with sim time (with the route target point (x, y) m in the ego frame
        when the route has one) and wait for the Trajectory with that stamp."""
        sim_t = float(world.snapshot()["t"])
        stamp_ns = self._offset_ns + int(round(sim_t * 1e9))
        stamp = _ns_to_time(stamp_ns)
        p = self.cfg
        self._clock_pub.publish(Clock(clock=stamp))
        self._odom_pub.publish(self._odometry(world, ego, stamp))
        if command != self._last_command:
            self._command_pub.publish(String(data=command))
            self._last_command = command
        if target is not None:  # before the image: the planner pairs it with the frame of the same stamp
            x, y = target
            self._target_pub.publish(PointStamped(header=Header(stamp=stamp, frame_id=p["base_frame_id"]),
                                                  point=Point(x=float(x), y=float(y))))
        data, step = rgb_to_raw(np.ascontiguousarray(frame), "rgb8")
        image = Image(header=Header(stamp=stamp, frame_id=self.camera.optical_frame), height=frame.shape[0],
                      width=frame.shape[1], encoding="rgb8", is_bigendian=0, step=step, data=data)
        t0 = time.monotonic()
        self._image_pub.publish(image)
        with self._cond:
            ok = self._cond.wait_for(lambda: stamp_ns in self._trajectories, timeout=float(p["plan_timeout_s"]))
            msg = self._trajectories.pop(stamp_ns, None)
        self.plan_wait_s.append(time.monotonic() - t0)
        if not ok or msg is None:
            self.timeouts += 1
            return Plan(trajectory=None, valid=False, errors={"planning": f"no Trajectory within {p['plan_timeout_s']} s"})
        if not msg.valid or not msg.points:
            return Plan(trajectory=None, valid=False, errors={"planning": msg.error or "invalid plan"})
        traj = np.array([[pt.pose.position.x, pt.pose.position.y] for pt in msg.points], dtype=np.float64)
        return Plan(trajectory=traj, valid=True, raw_text={"planning": msg.raw_text})

    def _odometry(self, world, ego: EgoState, stamp) -> Odometry:
        p = self.cfg
        odom = Odometry(header=Header(stamp=stamp, frame_id=p["odom_frame_id"]), child_frame_id=p["base_frame_id"])
        vehicle = getattr(world, "ego", None)
        if vehicle is not None:
            # highway-env (y right, heading + right) -> world (y left, yaw CCW), as in sim.highway
            x, y_right = (float(v) for v in vehicle.position)
            yaw = -float(vehicle.heading)
            odom.pose.pose.position.x, odom.pose.pose.position.y = x, -y_right
            odom.pose.pose.orientation = Quaternion(z=math.sin(yaw / 2), w=math.cos(yaw / 2))
        odom.twist.twist.linear.x, odom.twist.twist.linear.y = float(ego.vx), float(ego.vy)
        odom.twist.twist.angular.z = float(ego.yaw_rate)
        return odom

    # ------------------------------------------------------------------ routes
    def routes(self):
        from wam_diff_core.sim.routes import load_routes

        p = self.cfg
        ids = [i.strip() for i in str(p["route_ids"]).split(",") if i.strip()] or None
        scenarios = [s.strip() for s in str(p["scenarios"]).split(",") if s.strip()] or None
        limit = int(p["limit"]) or None
        return load_routes(p["routes_file"] or None, ids=ids, scenarios=scenarios, limit=limit)

    def run(self) -> dict:
        """Drive the selected routes through the planner; print and return the summary."""
        from wam_diff_core.eval import bench2drive
        from wam_diff_core.sim.closed_loop import run_route
        from wam_diff_core.sim.routes import suite_version

        p = self.cfg
        routes = self.routes()
        if not routes:
            raise ValueError("no routes selected (check route_ids / scenarios / limit)")
        target_scenarios = check_route_target_scenarios(  # a bad value fails before the wait for the planner
            [s.strip() for s in str(p["route_target_scenarios"]).split(",") if s.strip()])
        out_dir = Path(p["out_dir"])
        (out_dir / "routes").mkdir(parents=True, exist_ok=True)
        log = self.get_logger()
        log.info(f"waiting for the planner on {self._image_pub.topic_name} ...")
        if not self.wait_for_planner():
            raise TimeoutError(f"planner did not subscribe {self._image_pub.topic_name} within "
                               f"{p['connect_timeout_s']} s")
        policy = RosPlannerPolicy(self)
        policy.route_target_scenarios = target_scenarios
        records = []
        wall0 = time.perf_counter()
        for index, route in enumerate(routes):
            log.info(f"route {route.route_id} ({route.scenario}) {index + 1}/{len(routes)}")
            rec = run_route(route, policy, out_dir=out_dir, video=bool(p["video"]) and index == 0,
                            frame_size=(int(p["frame_width"]), int(p["frame_height"])),
                            replan_every=int(p["replan_every"]))
            (out_dir / "routes" / f"{route.route_id}.json").write_text(json.dumps(rec))
            records.append(rec)
            self._offset_ns += int(round((rec["duration_s"] + ROUTE_GAP_S) * 1e9))
            log.info(f"route {route.route_id}: {rec['status']}, score {rec['score']:.1f}, "
                     f"completion {rec['completion']:.1f} %, invalid plans {rec['invalid_plans']}")
        summary = bench2drive.summarize(records, expected_route_ids=[r.route_id for r in routes])
        waits = np.array(self.plan_wait_s) if self.plan_wait_s else np.array([np.nan])
        summary.update({
            "policy": f"ros:{self.get_namespace().rstrip('/')}/wam_diff_planner",
            "suite": suite_version(p["routes_file"] or None),
            "wall_s": round(time.perf_counter() - wall0, 2),
            "invalid_plans": int(sum(r.get("invalid_plans", 0) for r in records)),
            "plan_round_trip_ms": {"p50": round(float(np.nanpercentile(waits, 50)) * 1e3, 1),
                                   "p95": round(float(np.nanpercentile(waits, 95)) * 1e3, 1),
                                   "count": len(self.plan_wait_s)},
            "plan_timeouts": self.timeouts,
            "videos": sorted(r["video"] for r in records if r.get("video")),
        })
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(bench2drive.format_table(summary))
        print(f"plans {len(self.plan_wait_s)} (round trip p50 {summary['plan_round_trip_ms']['p50']} ms, "
              f"p95 {summary['plan_round_trip_ms']['p95']} ms), invalid {summary['invalid_plans']}, "
              f"timeouts {self.timeouts}, wall {summary['wall_s']:.1f} s")
        for video in summary["videos"]:
            print(f"video: {video}")
        print(f"summary: {out_dir / 'summary.json'}")
        return summary


@console_main("wam-diff-highway-bridge")
def main(argv: Optional[list[str]] = None) -> int:
    """Console script `wam-diff-highway-bridge`: drive the routes, print the scores, exit."""
    from rclpy.executors import ExternalShutdownException

    from .executor import ReadyOnceExecutor

    rclpy.init(args=argv if argv is not None else sys.argv)
    node = HighwayBridgeNode()
    executor = ReadyOnceExecutor(num_threads=2)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    rc = 0
    try:
        node.run()
    except (KeyboardInterrupt, ExternalShutdownException):
        rc = 130
    except (ValueError, TimeoutError, FileNotFoundError) as exc:
        node.get_logger().error(str(exc))
        rc = 1
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
