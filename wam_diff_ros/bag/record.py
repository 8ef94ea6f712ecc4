"""`wam-diff-bag record`: the embedded world driven by the expert or a policy, written as a rosbag2 of the planner's
inputs at the world's 10 Hz: camera, odometry, navigation command, route target (junction routes) and /clock, on the
planner's default topics with the types the highway bridge publishes, stamped with simulated time.

As the bridge: each tick goes out in the order clock, odometry, command (only when it changes; latched), route
target, camera (in camera_front_optical_frame), all with the tick's stamp as receive time; the camera's mounting goes
once on /tf_static. The world steps as in `wam-diff data` (the expert) or `wam-diff drive` (a policy, lockstep, same
controller and replanning), so the same route and seed give the same drive.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from wam_diff_core.constants import JUNCTION_SCENARIOS, REPLAN_EVERY
from wam_diff_core.scoring.camera import TOP_DOWN_EGO_ANCHOR, TOP_DOWN_PX_PER_M

from ..camera_tf import OPTICAL_ROTATION, top_down_mount
from . import topics as T
from .messages import blank, header, stamp
from .writing import BagWriter

IMAGE_FORMATS = ("raw", "png", "jpeg")
# --seconds on a road route: its target distance grows to what this speed covers in that time, so the drive lasts
MAX_ROAD_SPEED_MPS = 40.0


def bag_size_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def lasting(route, seconds: Optional[float]):
    """The route driven for `seconds`: its time limit set to them and, on a road route, its target distance made
    long enough not to end the drive first. A junction route still ends where it does (the expert wanders after it)."""
    if seconds is None:
        return route
    if not seconds > 0:
        raise ValueError(f"--seconds {seconds}: expected a positive number of seconds")
    if route.scenario in JUNCTION_SCENARIOS:
        return dataclasses.replace(route, time_limit_s=min(route.time_limit_s, float(seconds)))
    return dataclasses.replace(route, time_limit_s=float(seconds),
                               target_distance_m=max(route.target_distance_m, MAX_ROAD_SPEED_MPS * float(seconds)))


def expert_ticks(route, frame_size) -> Iterator:
    """Every tick of the expert driving `route` (frames rendered), until `route_over`."""
    from wam_diff_core.sim.highway import ExpertDrive

    for _, tick in ExpertDrive(route, frame_size=frame_size, every=1):
        yield tick


def policy_ticks(route, policy, frame_size, replan_every: int = REPLAN_EVERY) -> Iterator:
    """Every tick of `policy` driving `route` in `wam-diff drive`'s lockstep loop (controller, replanning every
    `replan_every` ticks), until the route ends as an expert drive does (`route_over`)."""
    from wam_diff_core.control import Controller, ControllerConfig
    from wam_diff_core.sim.closed_loop import _Plans, route_target_scenarios
    from wam_diff_core.sim.highway import WHEELBASE_M, HighwayWorld, route_over

    world = HighwayWorld(route, frame_size=frame_size, driver="policy", render=True,
                         route_target_scenarios=route_target_scenarios(policy))
    if hasattr(policy, "bind"):
        policy.bind(world)
    ctl = Controller(ControllerConfig(wheelbase_m=WHEELBASE_M))
    plans = _Plans(policy, world.dt, replan_every, False)
    tick = world.reset()
    try:
        while True:
            yield tick
            if route_over(route, tick):
                return
            k = world._ticks
            plans.update(k, tick)
            c = ctl.step(plans.tracked(k, tick.pose), tick.ego.speed, world.dt, plan_age_s=plans.age_s(k))
            tick = world.step(c.accel, c.steer)
    finally:
        world.close()


def camera_msg(store, tick, stamp_ns: int, image: str):
    """(topic, type, message) of the tick's frame: rgb8 Image as the bridge publishes, or a PNG / JPEG
    CompressedImage on <camera topic>/compressed."""
    frame = np.ascontiguousarray(tick.frame)
    head = header(store, stamp_ns, T.CAMERA_FRAME_ID)
    if image == "raw":
        h, w = frame.shape[:2]
        return T.CAMERA_TOPIC, T.IMAGE, blank(store, T.IMAGE, header=head, height=h, width=w, encoding="rgb8",
                                              is_bigendian=0, step=w * 3, data=frame.reshape(-1))
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format=image.upper(), **({"quality": 95} if image == "jpeg" else {}))
    data = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    return f"{T.CAMERA_TOPIC}/compressed", T.COMPRESSED_IMAGE, blank(store, T.COMPRESSED_IMAGE, header=head,
                                                                      format=image, data=data)


def odometry_msg(store, tick, stamp_ns: int):
    """nav_msgs/Odometry as the highway bridge publishes it: pose in the world (x, y left, yaw CCW) in the odom
    frame, twist in the ego frame (velocity, yaw rate)."""
    x, y, yaw = tick.pose
    pose = blank(store, "geometry_msgs/msg/Pose",
                 position=blank(store, "geometry_msgs/msg/Point", x=float(x), y=float(y), z=0.0),
                 orientation=blank(store, "geometry_msgs/msg/Quaternion", z=math.sin(yaw / 2), w=math.cos(yaw / 2)))
    twist = blank(store, "geometry_msgs/msg/Twist",
                  linear=blank(store, "geometry_msgs/msg/Vector3", x=float(tick.ego.vx), y=float(tick.ego.vy)),
                  angular=blank(store, "geometry_msgs/msg/Vector3", z=float(tick.ego.yaw_rate)))
    return blank(store, T.ODOMETRY, header=header(store, stamp_ns, T.ODOM_FRAME_ID), child_frame_id=T.BASE_FRAME_ID,
                 pose=blank(store, "geometry_msgs/msg/PoseWithCovariance", pose=pose),
                 twist=blank(store, "geometry_msgs/msg/TwistWithCovariance", twist=twist))


def camera_tf_msg(store, stamp_ns: int, width: int, height: int, scaling: float = TOP_DOWN_PX_PER_M,
                  anchor=TOP_DOWN_EGO_ANCHOR):
    """tf2_msgs/TFMessage of the world's camera: base_link -> camera_front_link (above the image centre) ->
    camera_front_optical_frame, as the highway bridge sends on /tf_static (camera_tf.py)."""
    mount = top_down_mount(T.CAMERA_NAME, width, height, scaling, anchor)

    def transform(parent, child, xyz, rotation):
        x, y, z, w = (float(v) for v in rotation)
        return blank(store, "geometry_msgs/msg/TransformStamped", header=header(store, stamp_ns, parent),
                     child_frame_id=child, transform=blank(
                         store, "geometry_msgs/msg/Transform",
                         translation=blank(store, "geometry_msgs/msg/Vector3", **dict(zip("xyz", map(float, xyz)))),
                         rotation=blank(store, "geometry_msgs/msg/Quaternion", x=x, y=y, z=z, w=w)))

    return blank(store, T.TF_MESSAGE, transforms=[
        transform(T.BASE_FRAME_ID, mount.link_frame, mount.xyz, mount.rotation),
        transform(mount.link_frame, mount.optical_frame, (0.0, 0.0, 0.0), OPTICAL_ROTATION)])


def tick_messages(store, tick, stamp_ns: int, image: str = "raw", last_command: Optional[str] = None) -> list:
    """(topic, type, message) of one tick in the bridge's publishing order; the command only when it differs from
    `last_command`."""
    out = [(T.CLOCK_TOPIC, T.CLOCK, blank(store, T.CLOCK, clock=stamp(store, stamp_ns))),
           (T.ODOMETRY_TOPIC, T.ODOMETRY, odometry_msg(store, tick, stamp_ns))]
    if tick.command != last_command:
        out.append((T.COMMAND_TOPIC, T.STRING, blank(store, T.STRING, data=tick.command)))
    if tick.route_target is not None:
        x, y = tick.route_target
        out.append((T.ROUTE_TARGET_TOPIC, T.POINT_STAMPED, blank(
            store, T.POINT_STAMPED, header=header(store, stamp_ns, T.BASE_FRAME_ID),
            point=blank(store, "geometry_msgs/msg/Point", x=float(x), y=float(y), z=0.0))))
    out.append(camera_msg(store, tick, stamp_ns, image))
    return out


def record(route, out, *, policy=None, driver: str = "expert", frame_size=(256, 128), seconds: Optional[float] = None,
           image: str = "raw", storage: str = "mcap", replan_every: int = REPLAN_EVERY, progress: bool = True,
           start_ns: int = 0) -> dict:
    """Drive `route` (the expert, or `policy` when given; `driver` names it in the bag) and write the bag `out`.
    Returns the summary: ticks, simulated seconds, messages per topic, bag bytes, wall seconds."""
    from .typestore import typestore

    if image not in IMAGE_FORMATS:
        raise ValueError(f"image {image!r}: expected one of {list(IMAGE_FORMATS)}")
    route = lasting(route, seconds)
    store = typestore()
    custom = {"wam_diff.route": json.dumps(route.to_dict()), "wam_diff.driver": driver,
              "wam_diff.frame_size": f"{frame_size[0]}x{frame_size[1]}"}
    ticks = expert_ticks(route, frame_size) if policy is None else policy_ticks(route, policy, frame_size, replan_every)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=int(round(route.time_limit_s * 10)) + 1, desc=f"record {route.route_id}", unit="tick")
    t0, n, last_t, command = time.perf_counter(), 0, 0.0, None
    with BagWriter(out, store, storage, custom) as bag:
        for tick in ticks:
            stamp_ns = start_ns + int(round(tick.t * 1e9))
            if n == 0:
                bag.write(T.TF_STATIC_TOPIC, T.TF_MESSAGE, stamp_ns, camera_tf_msg(store, stamp_ns, *frame_size))
            for topic, msgtype, msg in tick_messages(store, tick, stamp_ns, image, command):
                bag.write(topic, msgtype, stamp_ns, msg)
            n, last_t, command = n + 1, tick.t, tick.command
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return {"bag": str(out), "route": route.route_id, "driver": driver, "storage": storage, "image": image,
            "ticks": n, "duration_s": round(last_t, 3), "messages": dict(bag.counts),
            "bag_bytes": bag_size_bytes(out), "wall_s": round(time.perf_counter() - t0, 2)}
