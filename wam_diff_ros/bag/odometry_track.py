"""The ego's recorded path from nav_msgs/Odometry poses: where the ego was at any time the samples cover, and the
trajectory label of a frame (the next HORIZON_S of that path at WAYPOINT_DT_S steps in the frame's ego frame: x
forward, y left, metres), the convention of `wam-diff data`. Times between samples are interpolated linearly (yaw
unwrapped); a time outside the samples, or between two samples more than `max_gap_s` apart, has no pose."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S

MAX_GAP_S = 0.25  # odometry at 10 Hz or faster leaves no gap this long
NO_FUTURE = f"no {NUM_WAYPOINTS * WAYPOINT_DT_S:g} s of future"


def yaw_of(q) -> float:
    """Heading (rad, CCW about +z) of a geometry_msgs/Quaternion."""
    return math.atan2(2.0 * (q.w * q.z + q.x * q.y), 1.0 - 2.0 * (q.y * q.y + q.z * q.z))


def world_to_ego(points: np.ndarray, xy: np.ndarray, yaw: float) -> np.ndarray:
    """World (x, y) points (..., 2) into the ego frame at `xy`, `yaw` (as wam_diff_core.sim.highway.world_to_ego)."""
    d = np.asarray(points, dtype=np.float64) - xy
    c, s = math.cos(yaw), math.sin(yaw)
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


class OdometryTrack:
    """Collect poses with `add(stamp_ns, msg)` (any order), then ask `pose_at` / `label`."""

    def __init__(self, max_gap_s: float = MAX_GAP_S):
        self.max_gap_ns = max_gap_s * 1e9
        self._rows: list[tuple[int, float, float, float]] = []
        self._arrays = None

    def add(self, stamp_ns: int, msg) -> None:
        p = msg.pose.pose
        values = (float(p.position.x), float(p.position.y), yaw_of(p.orientation))
        if all(math.isfinite(v) for v in values):
            self._rows.append((int(stamp_ns), *values))
            self._arrays = None

    def __len__(self) -> int:
        return len(self._rows)

    def _sorted(self):
        if self._arrays is None:
            rows = sorted(dict((r[0], r) for r in self._rows).values())  # one pose per stamp, the last given
            a = np.array(rows, dtype=np.float64).reshape(-1, 4)
            a[:, 3] = np.unwrap(a[:, 3])
            self._arrays = a
        return self._arrays

    def pose_at(self, t_ns: int) -> Optional[tuple[float, float, float]]:
        """(x, y, yaw) at `t_ns`, or None outside the samples or inside a gap."""
        a = self._sorted()
        if len(a) == 0 or t_ns < a[0, 0] or t_ns > a[-1, 0]:
            return None
        i = int(np.searchsorted(a[:, 0], t_ns))
        if a[i, 0] == t_ns:
            return float(a[i, 1]), float(a[i, 2]), float(a[i, 3])
        t0, t1 = a[i - 1, 0], a[i, 0]
        if t1 - t0 > self.max_gap_ns:
            return None
        w = (t_ns - t0) / (t1 - t0)
        x, y, yaw = (1.0 - w) * a[i - 1, 1:] + w * a[i, 1:]
        return float(x), float(y), float(yaw)

    def covers_until(self) -> Optional[int]:
        a = self._sorted()
        return int(a[-1, 0]) if len(a) else None

    def label(self, t_ns: int) -> tuple[Optional[np.ndarray], str]:
        """(the (NUM_WAYPOINTS, 2) future path in the ego frame at `t_ns`, "") or (None, why not)."""
        here = self.pose_at(t_ns)
        if here is None:
            return None, "no odometry at the frame"
        step_ns = int(round(WAYPOINT_DT_S * 1e9))
        future = [self.pose_at(t_ns + k * step_ns) for k in range(1, NUM_WAYPOINTS + 1)]
        if any(p is None for p in future):
            end = self.covers_until()
            horizon_end = t_ns + NUM_WAYPOINTS * step_ns
            return None, NO_FUTURE if end is None or horizon_end > end else "odometry gap"
        pts = np.array([p[:2] for p in future], dtype=np.float64)
        return world_to_ego(pts, np.array(here[:2]), here[2]), ""
