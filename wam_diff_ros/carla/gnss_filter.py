"""Ego position from noisy GNSS fixes: a Kalman filter dead-reckoning from speed, compass and IMU yaw rate.

The leaderboard's GNSS adds zero-mean Gaussian noise of 5e-6 degrees to latitude and to longitude at every
reading (`noise_lat_stddev` / `noise_lon_stddev` of its sensor set-up): about 0.56 m north-south, and
0.56 m x cos(latitude of the map's geo-reference) east-west, independent from tick to tick. Its speedometer
and compass carry no noise, its gyroscope 0.001 rad/s. So between fixes the position is carried forward from
the speed along the mean heading over the tick (the compass heading taken back half a tick with the yaw rate);
each fix then pulls the estimate towards it with the Kalman gain. Velocity is measured, not estimated, and
the noise is independent per axis: the filter is one scalar filter per axis, on the right-handed world frame
of wam_diff_ros.carla.frames (metres). The motion between fixes is the kinematic bicycle's: the rear axle moves
along the heading at the measured speed, and a GNSS mounted `gnss_ahead_of_rear_axle_m` ahead of it also moves
sideways at that lever times the yaw rate (on a 30 m curve the vehicle centre's velocity points ~2.8 degrees
inside the heading; ignoring that would leave the estimate half a metre outside the curve).

What matters for steering is not the estimate's absolute error but how much it moves while a plan is held
(the plan is anchored at the pose of its frame and re-expressed at the pose of now): the filtered error drifts
slowly (a time constant of seconds) where raw fixes jump by ~0.8 m between two ticks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

LEADERBOARD_GNSS_STD_DEG = 5.0e-6  # the leaderboard's noise_lat_stddev / noise_lon_stddev, degrees


@dataclass(frozen=True)
class GnssFilterConfig:
    """enabled: filter the fixes (False: use every raw fix as the pose); gnss_std_deg: the GNSS noise per
    reading (degrees of latitude / longitude); speed_std_mps: how far dead reckoning may stray per second
    (side slip, speedometer pitch), the filter's process noise; reset_m: a fix farther than this from the
    prediction restarts the filter at the fix (a teleport, a new route); max_gap_s: a longer gap between
    two readings (simulation seconds) restarts it too; gnss_ahead_of_rear_axle_m: the GNSS mount's distance
    ahead of the rear axle (Bench2Drive's ego, a Lincoln MKZ 2020 with a 2.9 m wheelbase, has its origin about
    mid-wheelbase, and the agent's GNSS sits at the origin)."""

    enabled: bool = True
    gnss_std_deg: float = LEADERBOARD_GNSS_STD_DEG
    speed_std_mps: float = 0.3
    gnss_ahead_of_rear_axle_m: float = 1.45
    reset_m: float = 10.0
    max_gap_s: float = 1.0

    def problems(self) -> list[str]:
        """What is wrong with the values, one phrase each (empty when valid)."""
        out = [] if isinstance(self.enabled, bool) else [f"enabled must be true or false, got {self.enabled!r}"]
        for name in ("gnss_std_deg", "speed_std_mps", "reset_m", "max_gap_s", "gnss_ahead_of_rear_axle_m"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                out.append(f"{name} must be a number, got {v!r}")
            elif v <= 0 and name != "gnss_ahead_of_rear_axle_m":
                out.append(f"{name} must be a positive number, got {v!r}")
        return out


class PositionFilter:
    """Kalman filter on the ego position (x, y) in metres, one independent scalar filter per axis.

    gnss_std_m: the GNSS noise per axis in metres (`GeoProjection.gnss_noise_m` converts degrees)."""

    def __init__(self, config: GnssFilterConfig, gnss_std_m: Sequence[float]):
        self.cfg = config
        self.meas_var = np.square(np.asarray(gnss_std_m, dtype=np.float64).reshape(2))
        self.position: Optional[np.ndarray] = None
        self.variance = self.meas_var.copy()
        self.resets = 0
        self._time: Optional[float] = None
        self._speed = 0.0

    def _restart(self, fix: np.ndarray, speed: float, time_s: float) -> np.ndarray:
        if self.position is not None:  # the first fix starts the filter; later starts are counted
            self.resets += 1
        self.position = fix.copy()
        self.variance = self.meas_var.copy()
        self._time, self._speed = time_s, speed
        return self.position.copy()

    def update(self, fix_xy, speed: float, heading: float, yaw_rate: float, time_s: float) -> np.ndarray:
        """One reading: fix (x, y) m, forward speed m/s, heading rad (CCW) and yaw rate rad/s at `time_s`
        (simulation seconds). Returns the position estimate (2,) m."""
        fix = np.asarray(fix_xy, dtype=np.float64).reshape(2)
        dt = None if self._time is None else time_s - self._time
        if self.position is None or dt is None or not 0.0 < dt <= self.cfg.max_gap_s:
            return self._restart(fix, speed, time_s)
        mean_heading = heading - 0.5 * yaw_rate * dt
        c, s = math.cos(mean_heading), math.sin(mean_heading)
        forward = 0.5 * (speed + self._speed) * dt
        sideways = self.cfg.gnss_ahead_of_rear_axle_m * yaw_rate * dt
        predicted = self.position + np.array([forward * c - sideways * s, forward * s + sideways * c])
        variance = self.variance + (self.cfg.speed_std_mps * dt) ** 2
        innovation = fix - predicted
        if float(np.hypot(*innovation)) > self.cfg.reset_m:
            return self._restart(fix, speed, time_s)
        gain = variance / (variance + self.meas_var)
        self.position = predicted + gain * innovation
        self.variance = (1.0 - gain) * variance
        self._time, self._speed = time_s, speed
        return self.position.copy()
