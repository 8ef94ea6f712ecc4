"""The planner node's outputs of one frame set as rosbags messages, field for field what wam_diff_ros/plan_messages.py
builds with rclpy (tests/test_bag_outputs.py compares the two serialized): Trajectory, Path and MarkerArray in the ego
frame, Detection2DArray in the camera frame, DrivingAnswer; every header carries the frame set's stamp."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from wam_diff_core.constants import WAYPOINT_DT_S
from wam_diff_core.types import Detection, Plan

from ..marker_style import CANDIDATE_LINE_M, CANDIDATE_RGBA, PLAN_LINE_M, PLAN_RGBA, WAYPOINT_M
from .messages import blank, duration, header

# as plan_messages._MIN_STEP_M: headings of shorter steps are unreliable; the previous heading is kept
_MIN_STEP_M = 1e-3
MARKER_LINE_STRIP, MARKER_SPHERE_LIST, MARKER_ADD, MARKER_DELETE = 4, 7, 0, 2  # visualization_msgs/Marker constants


def _valid(plan: Plan) -> bool:
    return bool(plan.valid and plan.trajectory is not None)


def waypoint_poses(store, trajectory: np.ndarray) -> list:
    """(N, 2) ego-frame waypoints, metres -> N geometry_msgs/Pose whose heading follows the path from the origin."""
    poses, prev, yaw = [], np.zeros(2), 0.0
    for x, y in np.asarray(trajectory, dtype=float).reshape(-1, 2):
        step = np.array([x, y]) - prev
        if float(np.hypot(*step)) > _MIN_STEP_M:
            yaw = math.atan2(step[1], step[0])
        orientation = blank(store, "geometry_msgs/msg/Quaternion", x=0.0, y=0.0, z=math.sin(yaw / 2.0),
                            w=math.cos(yaw / 2.0))
        position = blank(store, "geometry_msgs/msg/Point", x=float(x), y=float(y), z=0.0)
        poses.append(blank(store, "geometry_msgs/msg/Pose", position=position, orientation=orientation))
        prev = np.array([x, y])
    return poses


def trajectory_msg(store, plan: Plan, stamp_ns: int, frame_id: str, command: str, block_size: int, steps: int,
                   decode_time_s: float, scorer: str = ""):
    """The node's Trajectory (`plan_messages.trajectory_msg`), candidate fields included."""
    valid = _valid(plan)
    points, error = [], ""
    if valid:
        points = [blank(store, "wam_diff_msgs/msg/TrajectoryPoint", pose=pose,
                        time_from_start=duration(store, (k + 1) * WAYPOINT_DT_S))
                  for k, pose in enumerate(waypoint_poses(store, plan.trajectory))]
    else:
        error = "; ".join(f"{task}: {err}" for task, err in (plan.errors or {}).items()) or "no trajectory"
    raw = str(plan.raw_text.get("planning", "")) if plan.raw_text else ""
    return blank(store, "wam_diff_msgs/msg/Trajectory", header=header(store, stamp_ns, frame_id), points=points,
                 valid=valid, error=error, command=command, block_size=int(block_size), denoising_steps=int(steps),
                 decode_time_s=float(decode_time_s), raw_text=raw, candidates=max(len(plan.candidates), 1),
                 candidate_index=int(plan.chosen),
                 candidate_score=float("nan") if plan.score is None else float(plan.score),
                 scorer=str(scorer) if plan.score is not None else "")


def path_msg(store, plan: Plan, stamp_ns: int, frame_id: str):
    """nav_msgs/Path of the waypoints (empty when the plan is not valid)."""
    poses = []
    if _valid(plan):
        poses = [blank(store, "geometry_msgs/msg/PoseStamped", header=header(store, stamp_ns, frame_id), pose=pose)
                 for pose in waypoint_poses(store, plan.trajectory)]
    return blank(store, "nav_msgs/msg/Path", header=header(store, stamp_ns, frame_id), poses=poses)


def detections_msg(store, detections: Optional[Sequence[Detection]], stamp_ns: int, frame_id: str):
    """Boxes in pixels -> Detection2DArray: one hypothesis (label, score clipped to 0..1) per box, centre and size."""
    out = []
    for det in detections or ():
        x1, y1, x2, y2 = (float(v) for v in det.box_px)
        hypothesis = blank(store, "wam_diff_msgs/msg/ObjectHypothesis", class_id=str(det.label),
                           score=min(max(float(det.score), 0.0), 1.0))
        centre = blank(store, "wam_diff_msgs/msg/Pose2D", position=blank(
            store, "wam_diff_msgs/msg/Point2D", x=(x1 + x2) / 2.0, y=(y1 + y2) / 2.0))
        bbox = blank(store, "wam_diff_msgs/msg/BoundingBox2D", center=centre, size_x=abs(x2 - x1), size_y=abs(y2 - y1))
        out.append(blank(store, "wam_diff_msgs/msg/Detection2D", header=header(store, stamp_ns, frame_id),
                         results=[blank(store, "wam_diff_msgs/msg/ObjectHypothesisWithPose", hypothesis=hypothesis)],
                         bbox=bbox))
    return blank(store, "wam_diff_msgs/msg/Detection2DArray", header=header(store, stamp_ns, frame_id), detections=out)


def marker_array_msg(store, plan: Plan, stamp_ns: int, frame_id: str, ns: str = "wam_diff"):
    """A line strip and spheres along the plan (green), or a DELETE of both when the plan is not valid; with
    candidates, a thin line per candidate after them (the node's `plan_messages.marker_array_msg`)."""
    def marker(mid: int, kind: int, suffix: str, **fields):
        return blank(store, "visualization_msgs/msg/Marker", header=header(store, stamp_ns, frame_id),
                     ns=f"{ns}/{suffix}", id=mid, type=kind, **fields)

    pose = blank(store, "geometry_msgs/msg/Pose", orientation=blank(store, "geometry_msgs/msg/Quaternion", w=1.0))

    def styled(rgba: dict, x: float, y: float = 0.0, z: float = 0.0) -> dict:
        return dict(action=MARKER_ADD, pose=pose, scale=blank(store, "geometry_msgs/msg/Vector3", x=x, y=y, z=z),
                    color=blank(store, "std_msgs/msg/ColorRGBA", **rgba))

    def path(trajectory) -> list:
        origin = blank(store, "geometry_msgs/msg/Point", x=0.0, y=0.0, z=0.0)
        return [origin] + [p.position for p in waypoint_poses(store, trajectory)]

    candidates = [marker(int(c.index), MARKER_LINE_STRIP, "candidates", action=MARKER_DELETE) if c.trajectory is None
                  else marker(int(c.index), MARKER_LINE_STRIP, "candidates", points=path(c.trajectory),
                              **styled(CANDIDATE_RGBA, CANDIDATE_LINE_M))
                  for c in (plan.candidates if len(plan.candidates) > 1 else ())]
    if not _valid(plan):
        return blank(store, "visualization_msgs/msg/MarkerArray", markers=[
            marker(0, MARKER_LINE_STRIP, "trajectory", action=MARKER_DELETE),
            marker(1, MARKER_SPHERE_LIST, "waypoints", action=MARKER_DELETE)] + candidates)
    points = path(plan.trajectory)
    return blank(store, "visualization_msgs/msg/MarkerArray", markers=[
        marker(0, MARKER_LINE_STRIP, "trajectory", points=points, **styled(PLAN_RGBA, *(PLAN_LINE_M,) * 3)),
        marker(1, MARKER_SPHERE_LIST, "waypoints", points=points[1:], **styled(PLAN_RGBA, *(WAYPOINT_M,) * 3))]
        + candidates)


def answer_msg(store, stamp_ns: int, frame_id: str, question: str, answer: str, latency_s: float):
    return blank(store, "wam_diff_msgs/msg/DrivingAnswer", header=header(store, stamp_ns, frame_id), question=question,
                 answer=answer, latency_s=float(latency_s))
