"""wam-diff-carla-bridge: CARLA as a ROS 2 camera source, driven by wam_diff_msgs/Trajectory.

Connects to a CARLA server (host, port, timeout; a dead server is a clear error naming host:port
and the timeout, exit code 2), runs it in synchronous mode with fixed 0.05 s steps, spawns the ego
and its sensors (config/carla_bridge.yaml), and every tick publishes
  - sensor_msgs/Image (rgb8) per camera, stamped with the simulation time, frame <sensor id>_optical_frame,
  - nav_msgs/Odometry: pose in `map_frame` (right-handed: x, -y_carla; heading -yaw_carla),
    twist in `base_frame` (ego frame: x forward, y left),
  - rosgraph_msgs/Clock on /clock (simulation time; run the planner with use_sim_time),
  - std_msgs/String navigation command (transient local, depth 1, reliable: a late subscriber gets it),
and once, on /tf_static, base_frame -> <id>_link -> <id>_optical_frame of every camera, from its mounting
in the sensor list (camera_tf, `carla_mount`).
It subscribes wam_diff_msgs/Trajectory (ego frame at header.stamp), holds the last valid plan,
re-expresses it at the current pose and applies the shared controller's output as
carla.VehicleControl; an invalid or stale trajectory brakes. On exit (Ctrl-C, SIGTERM, error) it
destroys its actors and restores asynchronous mode. rclpy is imported only after CARLA answered.
"""
from __future__ import annotations

import argparse
import bisect
import math
import signal
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from wam_diff_core.console import console_main
from wam_diff_core.control import Controller, ControllerConfig
from wam_diff_core.plain_yaml import yaml_problem
from wam_diff_core.types import check_command
from wam_diff_ros.carla.agent_config import validate_sensors
from wam_diff_ros.carla.frames import (carla_steer, carla_to_rh, carla_yaw_to_heading, ego_state_from_carla,
                                       vehicle_max_steer_rad)
from wam_diff_ros.carla.plan_tracking import HeldPlan, valid_trajectory
from wam_diff_ros.camera_tf import CameraMount, StaticTransforms, quaternion_from_rpy

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "carla_bridge.yaml"
POSE_HISTORY_S = 10.0


@dataclass
class BridgeConfig:
    host: str = "localhost"
    port: int = 2000
    timeout_s: float = 10.0
    fixed_delta_s: float = 0.05
    realtime_factor: float = 1.0
    max_ticks: int = 0
    town: Optional[str] = None
    vehicle: str = "vehicle.lincoln.mkz_2020"
    spawn_point: int = 0
    command: str = "follow lane"
    topics: dict = field(default_factory=lambda: {"rgb_front": "/camera/image_raw"})
    odometry_topic: str = "/odom"
    command_topic: str = "command"
    trajectory_topic: str = "trajectory"
    map_frame: str = "map"
    base_frame: str = "base_link"
    steer_scale: float = 1.0
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    sensors: list = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path, **overrides) -> "BridgeConfig":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"bridge config {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"bridge config {path}: {yaml_problem(exc)}") from None
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}; expected some of {sorted(known)}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        data["controller"] = ControllerConfig(**(data.get("controller") or {}))
        data["sensors"] = validate_sensors(data.get("sensors"), str(path))
        cfg = cls(**data)
        cfg.command = check_command(cfg.command)
        cams = {s["id"] for s in cfg.sensors if s["type"] == "sensor.camera.rgb"}
        missing = sorted(set(cfg.topics) - cams)
        if missing:
            raise ValueError(f"{path}: topics name camera ids {missing} that are not camera sensors {sorted(cams)}")
        if cfg.timeout_s <= 0 or cfg.fixed_delta_s <= 0 or cfg.realtime_factor < 0:
            raise ValueError(f"{path}: timeout_s and fixed_delta_s must be > 0 and realtime_factor >= 0")
        return cfg


def odometry_fields(ego: dict) -> dict:
    """Right-handed pose and ego-frame twist of a CarlaSession.ego_state() dict."""
    xy = carla_to_rh([[ego["x"], ego["y"]]])[0]
    heading = carla_yaw_to_heading(ego["yaw_deg"])
    st = ego_state_from_carla(ego["velocity"], ego["acceleration"], ego["angular_velocity_deg"], ego["yaw_deg"])
    return {"x": float(xy[0]), "y": float(xy[1]), "z": float(ego["z"]), "heading": heading,
            "vx": st.vx, "vy": st.vy, "yaw_rate": st.yaw_rate}


class PoseHistory:
    """Ego poses by simulation time, to place a trajectory planned from an older frame."""

    def __init__(self, keep_s: float = POSE_HISTORY_S):
        self.keep_s = keep_s
        self.times: deque = deque()
        self.poses: deque = deque()

    def add(self, t: float, xy, heading: float) -> None:
        self.times.append(t)
        self.poses.append((tuple(xy), heading))
        while self.times and self.times[0] < t - self.keep_s:
            self.times.popleft()
            self.poses.popleft()

    def at(self, t: float):
        """The pose nearest in time to `t` (None when empty)."""
        if not self.times:
            return None
        times = list(self.times)
        i = bisect.bisect_left(times, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t))
        return self.poses[best]


def carla_mount(sensor: dict) -> CameraMount:
    """A CARLA camera's mounting (x forward, y right, z up, metres; roll, pitch up, yaw right, degrees, relative
    to the vehicle) in the right-handed base frame (x forward, y left, z up): (x, -y, z), roll, -pitch, -yaw."""
    xyz = (float(sensor["x"]), -float(sensor["y"]), float(sensor["z"]))
    rotation = quaternion_from_rpy(math.radians(sensor["roll"]), -math.radians(sensor["pitch"]),
                                   -math.radians(sensor["yaw"]))
    return CameraMount(str(sensor["id"]), xyz, rotation)


def sim_stamp(t: float):
    """Simulation time `t` (s) as a builtin_interfaces/Time."""
    from builtin_interfaces.msg import Time

    ns = int(round(t * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def camera_image(bgra, frame_id: str, stamp):
    """A CARLA BGRA frame as sensor_msgs/Image (rgb8)."""
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header

    from wam_diff_ros.carla.agent import bgra_to_rgb

    rgb = bgra_to_rgb(bgra)
    h, w = rgb.shape[:2]
    return Image(header=Header(stamp=stamp, frame_id=frame_id), height=h, width=w, encoding="rgb8", is_bigendian=0,
                 step=3 * w, data=rgb.tobytes())


def odometry_msg(odo: dict, stamp, map_frame: str, base_frame: str):
    """nav_msgs/Odometry of `odometry_fields`: pose in `map_frame`, twist in `base_frame`."""
    from nav_msgs.msg import Odometry
    from std_msgs.msg import Header

    msg = Odometry(header=Header(stamp=stamp, frame_id=map_frame), child_frame_id=base_frame)
    msg.pose.pose.position.x, msg.pose.pose.position.y, msg.pose.pose.position.z = odo["x"], odo["y"], odo["z"]
    msg.pose.pose.orientation.z = math.sin(odo["heading"] / 2.0)
    msg.pose.pose.orientation.w = math.cos(odo["heading"] / 2.0)
    msg.twist.twist.linear.x, msg.twist.twist.linear.y = odo["vx"], odo["vy"]
    msg.twist.twist.angular.z = odo["yaw_rate"]
    return msg


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Bridge:
    """The bridge's ROS node and driving state: per tick it publishes the simulator's outputs, takes the
    trajectories that arrived and turns the held plan into the next control."""

    def __init__(self, cfg: BridgeConfig, context):
        import rclpy
        import rclpy.executors
        from nav_msgs.msg import Odometry
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image
        from std_msgs.msg import String
        from wam_diff_msgs.msg import Trajectory

        from wam_diff_ros.topic_qos import COMMAND_QOS

        self.cfg, self.context = cfg, context
        self.node = rclpy.create_node("wam_diff_carla_bridge", context=context)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.cameras = {cam: self.node.create_publisher(Image, topic, 1) for cam, topic in cfg.topics.items()}
        self.odometry = self.node.create_publisher(Odometry, cfg.odometry_topic, 10)
        self.clock = self.node.create_publisher(Clock, "/clock", 10)
        self.command = self.node.create_publisher(String, cfg.command_topic, COMMAND_QOS)
        self.mounts = {s["id"]: carla_mount(s) for s in cfg.sensors if s["id"] in cfg.topics}
        self.static_tf = StaticTransforms(self.node)  # held: /tf_static answers late subscribers while the node lives
        self.static_tf.publish(list(self.mounts.values()), cfg.base_frame)
        self.controller = Controller(cfg.controller)
        self.history = PoseHistory()
        self.held: Optional[HeldPlan] = None
        self.counts = Counter()
        self.ticks = 0
        self.period = cfg.fixed_delta_s / cfg.realtime_factor if cfg.realtime_factor > 0 else 0.0  # wall s per tick
        self.node.create_subscription(Trajectory, cfg.trajectory_topic, self.on_trajectory, 10)

    def on_trajectory(self, msg) -> None:
        """Hold a valid plan with the ego pose at its stamp; an invalid one brakes until the next valid plan."""
        self.counts["trajectories"] += 1
        pts = [(p.pose.position.x, p.pose.position.y) for p in msg.points]
        if not msg.valid or not valid_trajectory(pts if pts else None):
            self.counts["invalid"] += 1
            self.held = None
            return
        t = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        pose = self.history.at(t)
        if pose is None:
            return
        self.held = HeldPlan(np.asarray(pts, dtype=np.float64), np.asarray(pose[0]), pose[1], t)

    def publish(self, now: float, data: dict, odo: dict) -> None:
        """Clock, camera images, odometry and the navigation command of one tick."""
        from rosgraph_msgs.msg import Clock
        from std_msgs.msg import String

        self.clock.publish(Clock(clock=sim_stamp(now)))
        for cam, pub in self.cameras.items():
            pub.publish(camera_image(data[cam], self.mounts[cam].optical_frame, sim_stamp(now)))
        self.odometry.publish(odometry_msg(odo, sim_stamp(now), self.cfg.map_frame, self.cfg.base_frame))
        self.command.publish(String(data=self.cfg.command))

    def take_trajectories(self, start: float) -> None:
        """Spin for trajectories until this tick's wall-time slot (from `start`, monotonic) is used up."""
        period = self.period
        while True:
            left = period - (time.monotonic() - start)
            self.executor.spin_once(timeout_sec=0.0 if period == 0 else max(0.0, min(0.005, left)))
            if time.monotonic() - start >= period:
                break

    def tick(self, session, max_steer: float) -> None:
        """One synchronous simulator step: publish, listen, control."""
        cfg = self.cfg
        start = time.monotonic()
        data = session.tick()
        self.ticks += 1
        now = data["time_s"]
        odo = odometry_fields(data["ego"])
        self.history.add(now, (odo["x"], odo["y"]), odo["heading"])
        self.publish(now, data, odo)
        self.take_trajectories(start)
        held = self.held
        wps, age = held.waypoints((odo["x"], odo["y"]), odo["heading"], now) if held else (None, 0.0)
        ctrl = self.controller.step(wps, data["ego"]["speed"], cfg.fixed_delta_s, plan_age_s=age)
        if ctrl.reason in ("invalid plan", "stale plan"):
            self.counts["brake_ticks"] += 1
        session.apply_control(ctrl.throttle, carla_steer(ctrl.steer, max_steer, cfg.steer_scale), ctrl.brake)

    def drive(self, session, stop=None) -> None:
        """Tick until max_ticks, the context shuts down or `stop` is set."""
        cfg = self.cfg
        max_steer = vehicle_max_steer_rad(session.ego) or cfg.controller.max_steer_rad
        self.node.get_logger().info(f"connected to {cfg.host}:{cfg.port}; synchronous at {cfg.fixed_delta_s} s steps; "
                                    f"full lock {math.degrees(max_steer):.1f} deg")
        while self.context.ok() and (cfg.max_ticks <= 0 or self.ticks < cfg.max_ticks) and not (stop and stop.is_set()):
            self.tick(session, max_steer)

    def close(self) -> None:
        self.node.get_logger().info(f"stopped after {self.ticks} ticks: {dict(self.counts)}; actors destroyed, "
                                    "asynchronous mode restored")
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()


def run_bridge(cfg: BridgeConfig, connect_fn=None, context=None, stop=None) -> int:
    """Run until max_ticks, Ctrl-C, SIGTERM or `stop` (a threading.Event) is set.

    connect_fn(host, port, timeout_s) -> (client, world) defaults to session.connect; `context` is an
    initialised rclpy Context to use (default: rclpy.init() of the global one, shut down on exit).
    """
    import threading

    from wam_diff_ros.carla.session import CarlaConnectionError, CarlaSession, SessionConfig, connect

    try:
        client, world = (connect_fn or connect)(cfg.host, cfg.port, cfg.timeout_s)
    except CarlaConnectionError as exc:
        print(f"wam-diff-carla-bridge: error: {exc}", file=sys.stderr, flush=True)
        return 2

    import rclpy

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    own_context = context is None
    if own_context:
        rclpy.init()
        context = rclpy.get_default_context()
    bridge = Bridge(cfg, context)
    session = CarlaSession(client, world, SessionConfig(fixed_delta_s=cfg.fixed_delta_s, town=cfg.town,
                                                        vehicle=cfg.vehicle, spawn_point=cfg.spawn_point,
                                                        sensors=cfg.sensors))
    try:
        with session:
            bridge.drive(session, stop)
    except KeyboardInterrupt:
        pass
    finally:
        bridge.close()
        if own_context:
            rclpy.try_shutdown()
    return 0


@console_main("wam-diff-carla-bridge")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="wam-diff-carla-bridge", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="bridge YAML (sensors, topics, rates)")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, dest="timeout_s", help="CARLA client timeout, seconds")
    p.add_argument("--max-ticks", type=int, default=None, dest="max_ticks")
    p.add_argument("--town", default=None)
    args = p.parse_args(argv)
    try:
        cfg = BridgeConfig.load(args.config, host=args.host, port=args.port, timeout_s=args.timeout_s,
                                max_ticks=args.max_ticks, town=args.town)
    except (ValueError, TypeError) as exc:
        print(f"wam-diff-carla-bridge: error: {exc}", file=sys.stderr)
        return 2
    return run_bridge(cfg)


if __name__ == "__main__":
    sys.exit(main())
