"""Policy results (Plan, Answer, Detection) and planner statistics -> ROS 2 messages.

Every output takes the stamp of the input frame set; trajectory-like outputs are in the ego
frame (`base_frame_id`, x forward, y left), detections in the (optical) frame of the input image.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from builtin_interfaces.msg import Duration
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import Point, Pose, PoseStamped, Quaternion
from nav_msgs.msg import Path
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from wam_diff_core.constants import WAYPOINT_DT_S
from wam_diff_core.types import Detection, Plan
from wam_diff_msgs.msg import (Detection2D, Detection2DArray, ObjectHypothesis, ObjectHypothesisWithPose, Trajectory,
                               TrajectoryPoint)

from .marker_style import CANDIDATE_LINE_M, CANDIDATE_RGBA, PLAN_LINE_M, PLAN_RGBA, WAYPOINT_M

# Headings of steps shorter than this are unreliable; the previous heading is kept instead.
_MIN_STEP_M = 1e-3


def yaw_quaternion(yaw: float) -> Quaternion:
    """Rotation about +z by `yaw` radians (counter-clockwise positive)."""
    return Quaternion(x=0.0, y=0.0, z=math.sin(yaw / 2.0), w=math.cos(yaw / 2.0))


def waypoint_poses(trajectory: np.ndarray) -> list[Pose]:
    """(N, 2) ego-frame waypoints, metres -> N poses whose heading follows the path from the origin."""
    poses = []
    prev = np.zeros(2)
    yaw = 0.0
    for x, y in np.asarray(trajectory, dtype=float).reshape(-1, 2):
        step = np.array([x, y]) - prev
        if float(np.hypot(*step)) > _MIN_STEP_M:
            yaw = math.atan2(step[1], step[0])
        poses.append(Pose(position=Point(x=float(x), y=float(y), z=0.0), orientation=yaw_quaternion(yaw)))
        prev = np.array([x, y])
    return poses


def duration(seconds: float) -> Duration:
    nanos = int(round(seconds * 1e9))
    return Duration(sec=nanos // 1_000_000_000, nanosec=nanos % 1_000_000_000)


def trajectory_msg(plan: Plan, header: Header, command: str, block_size: int, steps: int,
                   decode_time_s: float, scorer: str = "") -> Trajectory:
    """The Trajectory of a plan: its waypoints (or why there are none), the decoding it came from, and which of its
    candidates it is (`candidates` drawn, `candidate_index`, `candidate_score`: NaN unless `scorer` ranked them)."""
    msg = Trajectory(header=header, valid=bool(plan.valid and plan.trajectory is not None), command=command,
                     block_size=int(block_size), denoising_steps=int(steps), decode_time_s=float(decode_time_s))
    msg.candidates = max(len(plan.candidates), 1)
    msg.candidate_index = int(plan.chosen)
    msg.candidate_score = float("nan") if plan.score is None else float(plan.score)
    msg.scorer = str(scorer) if plan.score is not None else ""
    msg.raw_text = str(plan.raw_text.get("planning", "")) if plan.raw_text else ""
    if msg.valid:
        msg.points = [TrajectoryPoint(pose=pose, time_from_start=duration((k + 1) * WAYPOINT_DT_S))
                      for k, pose in enumerate(waypoint_poses(plan.trajectory))]
    else:
        msg.error = "; ".join(f"{task}: {err}" for task, err in (plan.errors or {}).items()) or "no trajectory"
    return msg


def path_msg(plan: Plan, header: Header) -> Path:
    """nav_msgs/Path of the waypoints (empty when the plan is not valid)."""
    path = Path(header=header)
    if plan.valid and plan.trajectory is not None:
        path.poses = [PoseStamped(header=header, pose=pose) for pose in waypoint_poses(plan.trajectory)]
    return path


def detections_msg(detections: Optional[Sequence[Detection]], header: Header, min_score: float = 0.0
                   ) -> Detection2DArray:
    """Boxes in pixels -> Detection2DArray laid out like vision_msgs 4.x: bbox centre and size in pixels (theta 0),
    one result per box with its class_id and score (0..1, `Detection.score`), header copied from the input image;
    boxes scored under `min_score` are left out."""
    out = Detection2DArray(header=header)
    for det in detections or ():
        if min_score > 0 and float(det.score) < min_score:  # 0: every box, whatever its score
            continue
        x1, y1, x2, y2 = (float(v) for v in det.box_px)
        hypothesis = ObjectHypothesis(class_id=str(det.label), score=min(max(float(det.score), 0.0), 1.0))
        d = Detection2D(header=header, results=[ObjectHypothesisWithPose(hypothesis=hypothesis)])
        d.bbox.center.position.x = (x1 + x2) / 2.0
        d.bbox.center.position.y = (y1 + y2) / 2.0
        d.bbox.size_x = abs(x2 - x1)
        d.bbox.size_y = abs(y2 - y1)
        out.detections.append(d)
    return out




def _path_points(trajectory) -> list[Point]:
    return [Point(x=0.0, y=0.0, z=0.0)] + [p.position for p in waypoint_poses(trajectory)]


def candidate_markers(plan: Plan, header: Header, ns: str = "wam_diff") -> list[Marker]:
    """One thin line strip per candidate of a plan drawn with several (namespace `<ns>/candidates`, id = the
    candidate's index), a DELETE for an invalid one; none for a plan of one candidate."""
    if len(plan.candidates) < 2:
        return []
    out = []
    for c in plan.candidates:
        m = Marker(header=header, ns=f"{ns}/candidates", id=int(c.index), type=Marker.LINE_STRIP)
        if c.trajectory is None:
            m.action = Marker.DELETE
        else:
            m.action = Marker.ADD
            m.pose.orientation.w = 1.0
            m.scale.x = CANDIDATE_LINE_M
            m.color = ColorRGBA(**CANDIDATE_RGBA)
            m.points = _path_points(c.trajectory)
        out.append(m)
    return out


def marker_array_msg(plan: Plan, header: Header, ns: str = "wam_diff") -> MarkerArray:
    """A line strip and spheres along the plan (green), or a DELETE of both when the plan is invalid; with
    candidates, a thin line per candidate after them (`candidate_markers`)."""
    line = Marker(header=header, ns=f"{ns}/trajectory", id=0, type=Marker.LINE_STRIP)
    dots = Marker(header=header, ns=f"{ns}/waypoints", id=1, type=Marker.SPHERE_LIST)
    if not (plan.valid and plan.trajectory is not None):
        line.action = dots.action = Marker.DELETE
        return MarkerArray(markers=[line, dots] + candidate_markers(plan, header, ns))
    points = _path_points(plan.trajectory)
    color = ColorRGBA(**PLAN_RGBA)
    for marker, scale in ((line, PLAN_LINE_M), (dots, WAYPOINT_M)):
        marker.action = Marker.ADD
        marker.pose.orientation.w = 1.0
        marker.scale.x = marker.scale.y = marker.scale.z = scale
        marker.color = color
    line.points = points
    dots.points = points[1:]
    return MarkerArray(markers=[line, dots] + candidate_markers(plan, header, ns))


def diagnostics_msg(stamp, name: str, hardware_id: str, level: bytes, message: str,
                    values: dict[str, str]) -> DiagnosticArray:
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    return DiagnosticArray(header=Header(stamp=stamp), status=[status])
