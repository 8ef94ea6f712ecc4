"""Comfort signals and windows shared by the Bench2Drive statistics and the PDM score.

Thresholds are nuPlan's, as Bench2Drive and NAVSIM use them (reference-facts.md). Signals are
smoothed with a Savitzky-Golay filter (window 7, order 2) before the bounds are checked.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SAVGOL_WINDOW = 7
SAVGOL_ORDER = 2
COMFORT_WINDOW_FRAMES = 20

# name -> (low, high); every bound is inclusive-exclusive like "stays within".
COMFORT_BOUNDS: dict[str, tuple[float, float]] = {
    "lon_accel": (-4.05, 2.40),
    "lat_accel": (-4.89, 4.89),
    "jerk": (-8.37, 8.37),
    "lon_jerk": (-4.13, 4.13),
    "yaw_accel": (-1.93, 1.93),
    "yaw_rate": (-0.95, 0.95),
}


@lru_cache(maxsize=None)
def _savgol_coeffs(window: int, order: int, pos: int) -> np.ndarray:
    """Least-squares polynomial smoothing weights evaluating the fit at sample `pos` of the window (computed once
    per window, order and position; read-only)."""
    t = np.arange(window, dtype=np.float64) - pos
    vander = np.vander(t, order + 1, increasing=True)  # (window, order+1)
    # value of the fitted polynomial at t=0 is the first coefficient: row 0 of the pseudo-inverse.
    coeffs = np.linalg.pinv(vander)[0]
    coeffs.flags.writeable = False
    return coeffs


def savgol(signal: np.ndarray, window: int = SAVGOL_WINDOW, order: int = SAVGOL_ORDER) -> np.ndarray:
    """Savitzky-Golay smoothing of a 1-D signal (scipy's mode='interp': edges use the end windows' fits)."""
    x = np.asarray(signal, dtype=np.float64)
    n = x.shape[0]
    if n < window:
        if n <= order:
            return x.copy()
        window = n if n % 2 == 1 else n - 1
        if window <= order:
            return x.copy()
    half = window // 2
    out = np.empty_like(x)
    centre = _savgol_coeffs(window, order, half)
    out[half:n - half] = np.convolve(x, centre[::-1], mode="valid")
    for i in range(half):
        out[i] = _savgol_coeffs(window, order, i) @ x[:window]
        out[n - 1 - i] = _savgol_coeffs(window, order, window - 1 - i) @ x[n - window:]
    return out


@dataclass
class ComfortResult:
    """Per-window verdicts and which signals broke which window."""

    windows_ok: list[bool]
    violations: list[list[str]]

    @property
    def score(self) -> float:
        """Share of windows within every bound (1.0 when there is no full window)."""
        return float(np.mean(self.windows_ok)) if self.windows_ok else 1.0


def comfort_signals(lon_accel, lat_accel, yaw_rate, dt: float) -> dict[str, np.ndarray]:
    """Smoothed comfort signals from per-frame ego-frame accelerations (m/s^2) and yaw rate (rad/s).

    Jerks and yaw acceleration are time derivatives of the smoothed signals.
    """
    lon = savgol(np.asarray(lon_accel, dtype=np.float64))
    lat = savgol(np.asarray(lat_accel, dtype=np.float64))
    yaw = savgol(np.asarray(yaw_rate, dtype=np.float64))
    if lon.shape[0] >= 2:
        lon_jerk = np.gradient(lon, dt)
        lat_jerk = np.gradient(lat, dt)
        yaw_accel = np.gradient(yaw, dt)
    else:
        lon_jerk = lat_jerk = yaw_accel = np.zeros_like(lon)
    return {
        "lon_accel": lon,
        "lat_accel": lat,
        "jerk": np.hypot(lon_jerk, lat_jerk),
        "lon_jerk": lon_jerk,
        "yaw_accel": yaw_accel,
        "yaw_rate": yaw,
    }


def frame_violations(signals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Boolean per-frame mask of bound violations, per signal."""
    out = {}
    for name, (low, high) in COMFORT_BOUNDS.items():
        s = signals[name]
        out[name] = (s < low) | (s > high)
    return out


def comfort_windows(lon_accel, lat_accel, yaw_rate, dt: float, window: int = COMFORT_WINDOW_FRAMES) -> ComfortResult:
    """Split the run into consecutive, non-overlapping `window`-frame windows; a window is comfortable
    when every smoothed signal stays within COMFORT_BOUNDS on all its frames. A trailing partial
    window is dropped."""
    bad = frame_violations(comfort_signals(lon_accel, lat_accel, yaw_rate, dt))
    n = len(np.asarray(lon_accel))
    ok, why = [], []
    for start in range(0, n - window + 1, window):
        names = [k for k, m in bad.items() if m[start:start + window].any()]
        ok.append(not names)
        why.append(names)
    return ComfortResult(ok, why)


def trajectory_is_comfortable(xy: np.ndarray, dt: float) -> tuple[bool, list[str]]:
    """Comfort of a planned path (T, 2) in the ego frame sampled every `dt` seconds (starting at the ego,
    which should be included as the first row). Returns (ok, violated signal names)."""
    xy = np.asarray(xy, dtype=np.float64)
    if xy.shape[0] < 4:
        return True, []
    vel = np.gradient(xy, dt, axis=0)
    acc = np.gradient(vel, dt, axis=0)
    speed = np.linalg.norm(vel, axis=1)
    heading = np.unwrap(np.arctan2(vel[:, 1], vel[:, 0]))
    # stationary points have no heading: hold the last defined one
    moving = speed > 0.2
    if moving.any():
        idx = np.maximum.accumulate(np.where(moving, np.arange(len(speed)), 0))
        first = np.argmax(moving)
        idx[:first] = first
        heading = heading[idx]
    else:
        heading = np.zeros_like(speed)
    cos, sin = np.cos(heading), np.sin(heading)
    lon = acc[:, 0] * cos + acc[:, 1] * sin
    lat = -acc[:, 0] * sin + acc[:, 1] * cos
    yaw_rate = np.gradient(heading, dt)
    bad = frame_violations(comfort_signals(lon, lat, yaw_rate, dt))
    names = [k for k, m in bad.items() if m.any()]
    return not names, names
