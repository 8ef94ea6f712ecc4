"""Paired planning L2 gap: how far one model's mean L2 lies from a reference's on the same plans, with a
bootstrap interval.

Planning samples differ far more among themselves than two models differ on them, so each model's own
interval is wide while the gap, resampled with one draw of plans for all models (paired), is much tighter.
A gap is "within" a bound when its whole 95 % interval lies at or below it, "outside" when the whole interval
lies above it, else "undecided" (more plans needed). Used by the report (a column per model against its AR
reference) and `wam-diff-train l2-gap` (many models on many plans).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from wam_diff_core.codec import ParseError, parse_trajectory
from wam_diff_core.eval.l2 import l2_per_sample

DRAWS = 2000
LEVEL = 0.95
BOUND = 0.05  # the target: "planning L2 within 5 % of AR"
TAIL = 0.03  # the share of plans whose part of a gap `tail` reports
WORST = 5  # plans listed per model by `tail`


def ground_truth(split: Path) -> dict:
    """id -> (NUM_WAYPOINTS, 2) reference trajectory of every planning sample of a split."""
    return {s["id"]: parse_trajectory(s["conversations"][1]["value"])
            for s in json.loads(Path(split).read_text()) if s.get("task") == "planning"}


def plans_by_id(predictions: Path) -> tuple[dict, list[str]]:
    """id -> (NUM_WAYPOINTS, 2) plan of each parsable line of an OUT/predictions/*_planning.jsonl; the ids that
    do not parse."""
    plans, invalid = {}, []
    for line in Path(predictions).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        plan = parse_trajectory(row["text"])
        if isinstance(plan, ParseError):
            invalid.append(row["id"])
        else:
            plans[row["id"]] = plan
    return plans, invalid


def errors_by_id(truth: dict, predictions: Path) -> tuple[dict, list[str]]:
    """id -> (NUM_WAYPOINTS,) L2 errors of each parsable planning prediction; the ids that do not parse."""
    plans, invalid = plans_by_id(predictions)
    return {i: l2_per_sample(plan, truth[i])[0] for i, plan in plans.items()}, invalid


def interval(values: np.ndarray) -> list[float]:
    lo, hi = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(lo), float(hi)]


def verdict(ci: list[float], bound: float) -> str:
    return "within" if ci[1] <= bound else "outside" if ci[0] > bound else "undecided"


def tail(ref_plan: np.ndarray, plan: np.ndarray, ids: list[str] | None = None) -> dict:
    """Where a gap lives: the median per-plan difference (m) and the share of the summed difference held by
    the worst TAIL of plans (None unless the model is worse in sum); with `ids`, the WORST plans.

    ref_plan, plan: (N,) mean L2 per plan of the reference and the model on the same plans."""
    diff = plan - ref_plan
    order = np.argsort(-diff, kind="stable")
    n_tail = max(1, int(round(TAIL * diff.size)))
    total = float(diff.sum())
    out = {"median_diff": float(np.median(diff)),
           "tail_share": float(diff[order[:n_tail]].sum() / total) if total > 0 else None, "tail_plans": n_tail}
    if ids is not None:
        out["worst"] = [{"id": ids[i], "reference": float(ref_plan[i]), "model": float(plan[i])} for i in order[:WORST]]
    return out


def compare(errors: list[np.ndarray], bound: float = BOUND, seed: int = 0, ids: list[str] | None = None) -> list[dict]:
    """errors: per model (N, NUM_WAYPOINTS) on the same N plans, the first the reference; ids: the N plan ids
    (listed in each row's `worst`)."""
    n = errors[0].shape[0]
    draws = np.random.default_rng(seed).integers(0, n, size=(DRAWS, n))
    ref_plan = errors[0].mean(-1)  # (N,) the reference's mean L2 per plan
    ref = ref_plan[draws].mean(-1)  # (DRAWS,) the reference's mean L2 per draw
    ref_horizon = errors[0][draws].mean(1)  # (DRAWS, NUM_WAYPOINTS)
    rows = []
    for e in errors:
        per_plan = e.mean(-1)
        boot = per_plan[draws].mean(-1)
        horizon_boot = e[draws].mean(1)  # (DRAWS, NUM_WAYPOINTS)
        gap_ci = interval(boot / ref - 1.0)
        rows.append({"l2_mean": float(per_plan.mean()), "l2_mean_ci": interval(boot),
                     "per_horizon": e.mean(0).tolist(),
                     "per_horizon_ci": [interval(horizon_boot[:, h]) for h in range(e.shape[1])],
                     # paired difference to the reference per waypoint (m): is the gap at long horizons real?
                     "per_horizon_diff": (e.mean(0) - errors[0].mean(0)).tolist(),
                     "per_horizon_diff_ci": [interval(horizon_boot[:, h] - ref_horizon[:, h])
                                             for h in range(e.shape[1])],
                     "gap": float(per_plan.mean() / ref_plan.mean() - 1.0), "gap_ci": gap_ci,
                     "verdict": verdict(gap_ci, bound)} | tail(ref_plan, per_plan, ids))
    return rows


def gap_to_reference(truth: dict, reference: Path, predictions: Path, bound: float = BOUND) -> dict | None:
    """The paired gap of one model's planning predictions to a reference's, over the plans both parse
    (None when there are none); `truth`: `ground_truth(split)`."""
    ref, _ = errors_by_id(truth, reference)
    mine, _ = errors_by_id(truth, predictions)
    ids = sorted(set(ref) & set(mine))
    if not ids:
        return None
    row = compare([np.stack([ref[i] for i in ids]), np.stack([mine[i] for i in ids])], bound)[1]
    return {"plans": len(ids), "gap": row["gap"], "gap_ci": row["gap_ci"], "bound": bound, "verdict": row["verdict"]}
