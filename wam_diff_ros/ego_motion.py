"""The ego state a plan is asked with, from a stream of odometry twists, in the convention of the training prompts
(`wam-diff data`, wam_diff_core/sim/highway.py): velocity and yaw rate as the twist states them; acceleration the
change of the world-frame velocity since the previous sample, expressed in the current ego frame, so a steady turn
shows its centripetal part (about v x yaw rate). The heading change between two samples is the newer sample's yaw
rate times their time step (the world's yaw rate is that backward difference), so no pose is needed. Samples out
of order or further apart than MAX_DT_S give zero acceleration. No rclpy: the node and the bag tools share it."""
from __future__ import annotations

import math
from typing import Optional

from wam_diff_core.types import EgoState

from .input_checks import OdometrySample

MIN_DT_S, MAX_DT_S = 1e-3, 1.0  # finite differences only between close, ordered samples


class EgoMotion:
    """`add(sample)` returns (and keeps as `state`) the ego state after that odometry sample."""

    def __init__(self):
        self.state = EgoState(0.0)
        self.seen = False
        self._last: Optional[tuple[float, float, float]] = None  # (t s, vx, vy) of the previous sample

    def add(self, sample: OdometrySample) -> EgoState:
        t = sample.stamp_ns * 1e-9
        ax = ay = 0.0
        if self._last is not None and MIN_DT_S < t - self._last[0] < MAX_DT_S:
            dt = t - self._last[0]
            c, s = math.cos(sample.yaw_rate * dt), math.sin(sample.yaw_rate * dt)
            # the previous velocity in the current ego frame (turned back by the heading change)
            px, py = c * self._last[1] + s * self._last[2], -s * self._last[1] + c * self._last[2]
            ax, ay = (sample.vx - px) / dt, (sample.vy - py) / dt
        self.state = EgoState(sample.vx, sample.vy, ax, ay, sample.yaw_rate)
        self._last = (t, sample.vx, sample.vy)
        self.seen = True
        return self.state
