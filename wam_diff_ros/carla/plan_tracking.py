"""A plan held between planning calls: time-shifted and re-expressed in the current ego frame.

The policy plans 8 waypoints at 0.5 s spacing in the ego frame of its input frame; the controller
runs every simulation tick. Between plans the held plan is read `age` seconds later (positions at
age + k * 0.5 s, linearly extrapolated past the 4 s horizon) and moved into the ego frame of now.
Used by the Bench2Drive agent and the CARLA bridge node.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from wam_diff_ros.carla.frames import ego_to_world, world_to_ego


def shift_plan(trajectory: np.ndarray, age_s: float) -> np.ndarray:
    """The plan's waypoints (NUM_WAYPOINTS, 2) as seen `age_s` seconds after it was made, in the
    planning ego frame: positions at age + k * WAYPOINT_DT_S, extrapolated past the horizon."""
    pts = np.vstack([[0.0, 0.0], np.asarray(trajectory, dtype=np.float64)])
    times = np.arange(NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    query = age_s + np.arange(1, NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    out = np.stack([np.interp(query, times, pts[:, i]) for i in range(2)], axis=1)
    beyond = query > times[-1]
    if beyond.any():
        vel = (pts[-1] - pts[-2]) / WAYPOINT_DT_S
        out[beyond] = pts[-1] + (query[beyond] - times[-1])[:, None] * vel
    return out


def valid_trajectory(trajectory) -> bool:
    """A finite (NUM_WAYPOINTS, 2) array."""
    if trajectory is None:
        return False
    t = np.asarray(trajectory, dtype=np.float64)
    return t.shape == (NUM_WAYPOINTS, 2) and bool(np.isfinite(t).all())


@dataclass(frozen=True)
class HeldPlan:
    """trajectory (8, 2) in the ego frame of the planning pose: origin (right-handed world x, y),
    heading (rad, CCW) and time (s, simulation clock)."""

    trajectory: np.ndarray
    origin: np.ndarray
    heading: float
    time_s: float

    def waypoints(self, ego_xy_rh, heading: float, now_s: float) -> tuple[np.ndarray, float]:
        """(waypoints in the current ego frame, plan age in seconds)."""
        age = max(0.0, now_s - self.time_s)
        world = ego_to_world(shift_plan(self.trajectory, age), self.origin, self.heading)
        return world_to_ego(world, ego_xy_rh, heading), age
