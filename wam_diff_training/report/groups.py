"""Planning error by kind of plan: where on the road a model's L2 lives, and whether it over- or undershoots.

A mean over all validation plans hides that a model can plan roads well and junctions badly. Each planning sample
falls in one group by its meta: its scenario when that is a junction (`JUNCTIONS`), else a road plan split by the
ego's forward speed at `SPEED_SPLIT_MPS`. Per group and model: the plans, the mean L2 over the horizon and the
mean along-track bias at the last waypoint (plan x minus reference x, ego frame: + runs ahead, - falls short).
Used by `wam-diff-train l2-gap --by-group`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


JUNCTIONS = ("intersection", "roundabout")
SPEED_SPLIT_MPS = 20.0  # road plans below / at or above this forward speed (m/s)
ALL = "all"


def plan_group(meta: dict) -> str:
    """The group of one planning sample from its meta (scenario, ego = [vx, vy, ax, ay, ...])."""
    scenario = meta.get("scenario")
    if scenario in JUNCTIONS:
        return scenario
    ego = meta.get("ego")
    if not ego:
        raise ValueError(f"planning sample meta without an ego state: {meta!r}")
    return f"road<{SPEED_SPLIT_MPS:g}" if ego[0] < SPEED_SPLIT_MPS else f"road>={SPEED_SPLIT_MPS:g}"


def group_names() -> list[str]:
    return [JUNCTIONS[0], f"road<{SPEED_SPLIT_MPS:g}", f"road>={SPEED_SPLIT_MPS:g}", JUNCTIONS[1], ALL]


def groups_of_split(split: Path) -> dict:
    """id -> group of every planning sample of a split."""
    return {s["id"]: plan_group(s.get("meta", {}))
            for s in json.loads(Path(split).read_text()) if s.get("task") == "planning"}


def by_group(truth: dict, plans: dict, groups: dict, ids: list[str]) -> dict:
    """group -> {"plans", "l2_mean", "x_bias_end"} over `ids` (each in truth, plans and groups); "all" last."""
    pred = np.stack([np.asarray(plans[i], dtype=float) for i in ids])
    ref = np.stack([np.asarray(truth[i], dtype=float) for i in ids])
    l2 = np.linalg.norm(pred - ref, axis=-1).mean(axis=1)
    bias = pred[:, -1, 0] - ref[:, -1, 0]
    labels = np.array([groups[i] for i in ids])
    out = {}
    for name in group_names():
        sel = np.ones(len(ids), bool) if name == ALL else labels == name
        if sel.any():
            out[name] = {"plans": int(sel.sum()), "l2_mean": float(l2[sel].mean()),
                         "x_bias_end": float(bias[sel].mean())}
    return out


def markdown(tables: dict) -> str:
    """tables: model label -> by_group(...) -> one row per model, `L2 (x bias) n` per group."""
    names = [n for n in group_names() if any(n in t for t in tables.values())]
    lines = ["Mean planning L2 over the horizon (m), along-track bias at 4 s (m, + ahead of the reference) and "
             "plans, per group", "", "| model | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, table in tables.items():
        cells = [f"{table[n]['l2_mean']:.2f} ({table[n]['x_bias_end']:+.2f}) n{table[n]['plans']}" if n in table
                 else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
