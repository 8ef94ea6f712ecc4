"""What the converter derives from a scene's keyframes (no devkit): the 4 s trajectory label, the navigation
command, and the embedded world's QA answered from annotations.

Trajectory: the ego positions of the next NUM_WAYPOINTS keyframes in the current ego frame. nuScenes keyframes
come at about 2 Hz, not exactly: a frame whose next keyframes are fewer than NUM_WAYPOINTS, or whose keyframe
intervals differ from WAYPOINT_DT_S by more than the tolerance, gets no trajectory (the converter counts why).

Command: ST-P3 / UniAD / VAD derive it from the lateral offset of the ego's position at the end of their 3 s
horizon: >= COMMAND_OFFSET_M to the left is "turn left", to the right "turn right", else "go straight". The same
rule is applied here at COMMAND_HORIZON_S (waypoint 6 of 8), so commands match theirs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from ..types import EgoState
from .geometry import EGO_CENTRE_AHEAD_M, to_frame

COMMAND_OFFSET_M = 2.0
COMMAND_HORIZON_S = 3.0
COMMAND_WAYPOINT = int(round(COMMAND_HORIZON_S / WAYPOINT_DT_S)) - 1  # index into the trajectory
DT_TOLERANCE_S = 0.1  # a keyframe interval within 0.5 +- this counts as 0.5 s
# QA: "in my lane" without a lane map is the corridor |y| <= LANE_HALF_WIDTH_M of the ego frame
LANE_HALF_WIDTH_M = 1.75
# the world's questions about the lanes to the left and right need lane geometry, which the base tables lack
UNANSWERED_QA = ("left_free", "right_free")
EGO_SPEED_QA = ("ego_speed", "How fast am I driving?")


def future_trajectory(times: Sequence[float], xy: np.ndarray, yaw: Sequence[float], i: int,
                      dt_tolerance: float = DT_TOLERANCE_S) -> tuple[Optional[np.ndarray], str]:
    """The trajectory label of keyframe i of a scene: (NUM_WAYPOINTS, 2) metres in its ego frame, "" ; or None
    and why ("no_future": fewer than NUM_WAYPOINTS keyframes follow, "irregular_spacing": an interval off
    WAYPOINT_DT_S by more than dt_tolerance). times: (N,) s; xy: (N, 2) global ego positions; yaw: (N,) rad."""
    if i + NUM_WAYPOINTS >= len(times):
        return None, "no_future"
    gaps = np.diff(np.asarray(times[i:i + NUM_WAYPOINTS + 1], dtype=np.float64))
    if np.any(np.abs(gaps - WAYPOINT_DT_S) > dt_tolerance + 1e-6):  # timestamps are whole microseconds
        return None, "irregular_spacing"
    return to_frame(np.asarray(xy, dtype=np.float64)[i + 1:i + NUM_WAYPOINTS + 1], xy[i], yaw[i]), ""


def navigation_command(future: np.ndarray) -> str:
    """ST-P3 / UniAD's command from the lateral offset at COMMAND_HORIZON_S (y left, metres)."""
    lateral = float(np.asarray(future)[COMMAND_WAYPOINT, 1])
    if lateral >= COMMAND_OFFSET_M:
        return "turn left"
    if lateral <= -COMMAND_OFFSET_M:
        return "turn right"
    return "go straight"


@dataclass(frozen=True)
class _Vehicle:
    """A vehicle as the world's QA reads one: centre relative to the ego's centre (m), length, lane relation."""

    xy: tuple[float, float]
    length: float
    same_lane: bool
    lane_offset: int = 99


@dataclass
class _Frame:
    """The parts of a world tick that `datagen.qa_pairs` reads."""

    vehicles: list
    ego: EgoState
    command: str
    detections: list = field(default_factory=list)
    lane_count: int = 1
    lane_id: int = 0


def qa_answers(vehicles: Sequence, visible: int, ego: EgoState, command: str, future: np.ndarray) -> list[tuple]:
    """(kind, question, answer) for one keyframe: the embedded world's questions (`datagen.qa_pairs`, its answers'
    rules) read from annotations, less UNANSWERED_QA, plus the ego speed. vehicles: PlaneObjects of labelled
    vehicles in the ego frame (rear axle origin); visible: the boxes of the detection answer."""
    from ..sim.datagen import qa_pairs

    frame = _Frame([_Vehicle((v.x - EGO_CENTRE_AHEAD_M, v.y), v.length, abs(v.y) <= LANE_HALF_WIDTH_M)
                    for v in vehicles], ego, command, detections=[None] * visible)
    out = [qa for qa in qa_pairs(frame, future) if qa[0] not in UNANSWERED_QA]
    return out + [(*EGO_SPEED_QA, f"{ego.speed:.0f} m/s")]
