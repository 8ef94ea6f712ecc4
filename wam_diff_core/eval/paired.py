"""Paired gap of one model's mean planning L2 to a reference's on the same plans, with a bootstrap interval.

Plans differ far more among themselves than two models differ on them, so the gap is resampled with one
draw of plans for both models (paired): its interval is much tighter than either model's own.
"""
from __future__ import annotations

import numpy as np

DRAWS = 2000
LEVEL = 0.95


def paired_gap(reference: np.ndarray, model: np.ndarray, draws: int = DRAWS, level: float = LEVEL,
               seed: int = 0) -> dict:
    """reference, model: (N,) mean L2 (m) of each plan, the same N plans in the same order. Returns the relative
    gap mean(model) / mean(reference) - 1 and the difference of means (m), each with its `level` bootstrap
    interval over `draws` paired resamples of the plans."""
    ref = np.asarray(reference, dtype=np.float64)
    mine = np.asarray(model, dtype=np.float64)
    if ref.shape != mine.shape or ref.ndim != 1 or ref.size == 0:
        raise ValueError(f"expected two (N,) arrays of the same N >= 1, got {ref.shape} and {mine.shape}")
    idx = np.random.default_rng(seed).integers(0, ref.size, size=(draws, ref.size))
    ref_boot, mine_boot = ref[idx].mean(-1), mine[idx].mean(-1)
    tails = [(1 - level) / 2, (1 + level) / 2]
    gap_boot = mine_boot / np.maximum(ref_boot, 1e-12) - 1.0
    return {"plans": int(ref.size), "gap": float(mine.mean() / max(ref.mean(), 1e-12) - 1.0),
            "gap_ci": [float(v) for v in np.quantile(gap_boot, tails)],
            "diff_m": float(mine.mean() - ref.mean()),
            "diff_m_ci": [float(v) for v in np.quantile(mine_boot - ref_boot, tails)], "level": level}
