"""L2 displacement error per horizon between planned and ground-truth trajectories."""
from __future__ import annotations

import numpy as np

from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S


def l2_per_sample(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Euclidean error (metres) of each sample at each of the NUM_WAYPOINTS horizons.

    pred, gt: (N, NUM_WAYPOINTS, 2) or (NUM_WAYPOINTS, 2). Returns (N, NUM_WAYPOINTS) (N = 1 for one plan).
    """
    p = np.asarray(pred, dtype=np.float64)
    g = np.asarray(gt, dtype=np.float64)
    if p.ndim == 2:
        p, g = p[None], g[None]
    if p.shape != g.shape or p.shape[1:] != (NUM_WAYPOINTS, 2):
        raise ValueError(f"expected pred and gt of shape (N, {NUM_WAYPOINTS}, 2), got {p.shape} and {g.shape}")
    return np.linalg.norm(p - g, axis=-1)


def l2_per_horizon(pred: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Mean Euclidean error (metres) at each of the NUM_WAYPOINTS horizons (shapes as `l2_per_sample`).
    Returns (NUM_WAYPOINTS,)."""
    return l2_per_sample(pred, gt).mean(axis=0)


def l2_report(pred: np.ndarray, gt: np.ndarray) -> dict:
    """{"l2_<t>s": metres for each horizon, "l2_mean": mean over horizons, "samples": N}."""
    per = l2_per_horizon(pred, gt)
    out = {f"l2_{(i + 1) * WAYPOINT_DT_S:.1f}s": float(v) for i, v in enumerate(per)}
    out["l2_mean"] = float(per.mean())
    out["samples"] = int(np.asarray(pred).reshape(-1, NUM_WAYPOINTS, 2).shape[0])
    return out
