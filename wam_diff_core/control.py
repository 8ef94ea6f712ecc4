"""Waypoints -> steering / acceleration / throttle / brake, the way Bench2Drive agents do it.

World-agnostic: the embedded highway world and the CARLA agent share it. Input is the plan in the
current ego frame (x forward, y left, metres; NUM_WAYPOINTS points at WAYPOINT_DT_S spacing).
Lateral: pure pursuit on the plan densified from the ego; look-ahead grows with speed.
Longitudinal: PI on a target speed read from the spacing of the first waypoints; the plan says
"stop" when that speed is near zero. An invalid or stale plan brakes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .constants import NUM_WAYPOINTS, WAYPOINT_DT_S


@dataclass
class ControllerConfig:
    wheelbase_m: float = 2.5
    max_steer_rad: float = math.radians(35.0)
    lookahead_gain_s: float = 0.9          # look-ahead distance = gain x speed, clipped below
    lookahead_min_m: float = 5.0
    lookahead_max_m: float = 25.0
    densify_step_m: float = 0.25
    speed_from_waypoints: int = 2          # target speed = mean speed over the first k segments
    stop_speed_mps: float = 0.5            # target below this: the plan says stop
    kp: float = 1.2                        # (m/s^2) per (m/s) speed error
    ki: float = 0.2
    integral_limit: float = 5.0
    max_accel_mps2: float = 3.0
    max_decel_mps2: float = 6.0
    stop_decel_mps2: float = 4.0           # braking used to hold/reach a stop and for invalid plans
    stale_after_s: float = 1.0


@dataclass(frozen=True)
class Control:
    """accel: signed m/s^2; steer: front-wheel angle rad, + left; throttle, brake in 0..1; steer_norm in -1..1 (+ left)."""

    accel: float
    steer: float
    throttle: float
    brake: float
    steer_norm: float
    target_speed: float
    reason: str = "track"


def densify_path(waypoints: np.ndarray, step: float) -> np.ndarray:
    """The path from the ego (0, 0) through the waypoints, resampled every `step` metres (M, 2)."""
    pts = np.vstack([[0.0, 0.0], np.asarray(waypoints, dtype=np.float64)])
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    s = np.concatenate([[0.0], np.cumsum(seg)])
    if s[-1] < 1e-6:
        return pts[:1]
    grid = np.arange(0.0, s[-1] + 1e-9, step)
    keep = np.concatenate([[True], seg > 1e-9])
    return np.stack([np.interp(grid, s[keep], pts[keep, 0]), np.interp(grid, s[keep], pts[keep, 1])], axis=1)


def target_speed(waypoints: np.ndarray, k: int = 2) -> float:
    """Mean speed (m/s) over the first k segments from the ego through the waypoints."""
    pts = np.vstack([[0.0, 0.0], np.asarray(waypoints, dtype=np.float64)[:k]])
    return float(np.linalg.norm(np.diff(pts, axis=0), axis=1).mean() / WAYPOINT_DT_S)


def pure_pursuit_steer(path: np.ndarray, lookahead: float, wheelbase: float) -> float:
    """Front-wheel angle (rad, + left) steering the rear axle at the ego origin onto the path point
    `lookahead` metres away (the path's last point extended along its last direction if shorter)."""
    dist = np.linalg.norm(path, axis=1)
    beyond = np.nonzero(dist >= lookahead)[0]
    if beyond.size:
        target = path[beyond[0]]
    else:
        if path.shape[0] < 2:
            return 0.0
        direction = path[-1] - path[-2]
        n = np.linalg.norm(direction)
        if n < 1e-9:
            return 0.0
        target = path[-1] + direction / n * max(lookahead - dist[-1], 0.0)
    alpha = math.atan2(target[1], target[0])
    ld = max(float(np.linalg.norm(target)), 1e-3)
    return math.atan2(2.0 * wheelbase * math.sin(alpha), ld)


class Controller:
    """Stateful (speed integral) waypoint follower. Call `reset()` between routes."""

    def __init__(self, config: Optional[ControllerConfig] = None):
        self.cfg = config or ControllerConfig()
        self.reset()

    def reset(self) -> None:
        self._integral = 0.0
        self._last_steer = 0.0

    def _make(self, accel: float, steer: float, v_target: float, reason: str) -> Control:
        c = self.cfg
        accel = float(np.clip(accel, -c.max_decel_mps2, c.max_accel_mps2))
        steer = float(np.clip(steer, -c.max_steer_rad, c.max_steer_rad))
        throttle = max(accel, 0.0) / c.max_accel_mps2
        brake = max(-accel, 0.0) / c.max_decel_mps2
        self._last_steer = steer
        return Control(accel, steer, throttle, brake, steer / c.max_steer_rad, v_target, reason)

    def brake(self, speed: float, reason: str) -> Control:
        """Emergency/invalid-plan command: full stop braking, wheels straight, integral cleared."""
        self._integral = 0.0
        return self._make(-self.cfg.stop_decel_mps2 if speed > 0.05 else -0.5, 0.0, 0.0, reason)

    def step(self, waypoints: Optional[np.ndarray], speed: float, dt: float, plan_age_s: float = 0.0) -> Control:
        """One control command. waypoints: (NUM_WAYPOINTS, 2) ego frame or None; speed m/s; dt s."""
        c = self.cfg
        if waypoints is None:
            return self.brake(speed, "invalid plan")
        wp = np.asarray(waypoints, dtype=np.float64)
        if wp.shape != (NUM_WAYPOINTS, 2) or not np.isfinite(wp).all():
            return self.brake(speed, "invalid plan")
        if plan_age_s > c.stale_after_s:
            return self.brake(speed, "stale plan")
        v_target = target_speed(wp, c.speed_from_waypoints)
        if v_target < c.stop_speed_mps:
            self._integral = 0.0
            # a stop: decelerate proportionally, hold with a little brake once stopped
            accel = -min(c.stop_decel_mps2, max(speed / max(dt, 1e-3), 0.5)) if speed > 0.05 else -0.5
            return self._make(accel, self._last_steer if speed > 0.5 else 0.0, 0.0, "stop")
        error = v_target - speed
        integral = float(np.clip(self._integral + error * dt, -c.integral_limit, c.integral_limit))
        accel = c.kp * error + c.ki * integral
        # anti-windup: integrate only while the command is not saturated in the error's direction
        if -c.max_decel_mps2 < accel < c.max_accel_mps2:
            self._integral = integral
        else:
            accel = c.kp * error + c.ki * self._integral
        path = densify_path(wp, c.densify_step_m)
        lookahead = float(np.clip(c.lookahead_gain_s * max(speed, v_target * 0.5), c.lookahead_min_m, c.lookahead_max_m))
        steer = pure_pursuit_steer(path, lookahead, c.wheelbase_m)
        return self._make(accel, steer, v_target, "track")
