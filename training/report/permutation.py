"""Do two groups of runs differ beyond their scatter? An exact permutation test on one number per run.

Small models trained a few hundred steps scatter from seed to seed (and from rounding to rounding) by as much as a
training switch is suspected to cost, so one run each way says little. With a handful of runs per group the
exchangeable splits can all be counted: the p value is the share of the C(n, k) ways to pick the second group's k
runs out of all n whose mean difference is at least the one observed (one-sided, "second above first") or at
least as large in size (two-sided). The smallest one-sided p a test can give is 1 / C(n, k).
"""
from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np

MAX_SPLITS = 1_000_000  # counting every split beyond this would take too long to be worth it


def group_stats(values) -> dict:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("a group needs at least one run")
    return {"runs": int(v.size), "mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()),
            "sd": float(v.std(ddof=1)) if v.size > 1 else None}


def exact_test(first, second) -> dict:
    """Mean of `second` minus mean of `first`, with exact one- and two-sided permutation p values."""
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"both groups need runs, got {a.size} and {b.size}")
    pooled = np.concatenate([a, b])
    n, k = pooled.size, b.size
    splits = comb(n, k)
    if splits > MAX_SPLITS:
        raise ValueError(f"{splits} splits of {n} runs into {n - k} + {k}: more than {MAX_SPLITS} to count")
    observed = b.mean() - a.mean()
    total = pooled.sum()
    picked = np.array([pooled[list(idx)].sum() for idx in combinations(range(n), k)])
    diffs = picked / k - (total - picked) / (n - k)
    tol = 1e-12 * max(1.0, abs(observed))
    return {"difference": float(observed), "splits": int(splits),
            "p_one_sided": float(np.mean(diffs >= observed - tol)),
            "p_two_sided": float(np.mean(np.abs(diffs) >= abs(observed) - tol)),
            "smallest_p": 1.0 / splits}
