"""Bench2Drive closed-loop statistics (leaderboard 2.0 scoring as Bench2Drive uses it).

World-agnostic: the embedded highway world and the CARLA agent both hand in per-route records
(plain dicts, the per-route JSON written by `wam-diff drive`):

    {"route_id": str, "scenario": str, "abilities": [str], "status": str,
     "completion": float (percent 0..100),
     "infractions": [{"kind": str, "time_s": float, ...}],   # kinds: PENALTIES keys, "outside_route_lanes"
                                                           #   (with "pct"), "min_speed", ...
     "efficiency": {"ego_mean_speed": m/s, "traffic_mean_speed": m/s},
     "comfort": {"dt": s, "lon_accel": [...], "lat_accel": [...], "yaw_rate": [...]}}
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from .comfort import comfort_windows

# Multiplicative penalty per infraction event (reference-facts.md).
PENALTIES: dict[str, float] = {
    "collision_pedestrian": 0.5,
    "collision_vehicle": 0.6,
    "collision_static": 0.65,
    "red_light": 0.7,
    "stop_sign": 0.8,
    "scenario_timeout": 0.7,
    "yield_emergency_vehicle": 0.7,
}
OUTSIDE_LANES = "outside_route_lanes"
# Infractions that never break success (Bench2Drive excepts min speed).
NON_FAILING = ("min_speed",)
ABILITIES = ("merging", "overtaking", "emergency_brake", "give_way", "traffic_signs")


def penalty(infractions: Iterable[dict]) -> float:
    """Product of the penalty coefficients of every infraction event; unknown kinds cost nothing."""
    p = 1.0
    for inf in infractions:
        kind = inf["kind"]
        if kind in PENALTIES:
            p *= PENALTIES[kind]
        elif kind == OUTSIDE_LANES:
            p *= 1.0 - float(inf["pct"]) / 100.0
    return p


def route_score(completion_pct: float, infractions: Iterable[dict]) -> float:
    """Route score = completion (percent) x penalty, in 0..100."""
    if not 0.0 <= completion_pct <= 100.0 + 1e-9:
        raise ValueError(f"completion must be a percentage in [0, 100], got {completion_pct}")
    return float(min(completion_pct, 100.0) * penalty(infractions))


def route_success(record: dict) -> bool:
    """Completed (100 %) with no infraction other than NON_FAILING kinds."""
    failing = [i for i in record.get("infractions", []) if i["kind"] not in NON_FAILING]
    return record["completion"] >= 100.0 - 1e-6 and not failing


def comfort_score(record: dict) -> Optional[float]:
    """Share (0..1) of comfortable 20-frame windows of one route, None without comfort inputs."""
    c = record.get("comfort")
    if not c or len(c.get("lon_accel", [])) == 0:
        return None
    res = comfort_windows(c["lon_accel"], c["lat_accel"], c["yaw_rate"], float(c["dt"]))
    return res.score if res.windows_ok else None


def efficiency_score(record: dict) -> Optional[float]:
    """Ego mean speed / mean speed of surrounding traffic x 100, None when traffic never moved/was absent."""
    e = record.get("efficiency")
    if not e or not e.get("traffic_mean_speed"):
        return None
    return 100.0 * float(e["ego_mean_speed"]) / float(e["traffic_mean_speed"])


def summarize(records: list[dict], expected_route_ids: Optional[Iterable[str]] = None) -> dict:
    """Driving score, success rate, per-ability success, efficiency and comfort over routes.

    Routes in `expected_route_ids` with no record count as score 0 and failure.
    """
    by_id = {r["route_id"]: r for r in records}
    ids = list(expected_route_ids) if expected_route_ids is not None else list(by_id)
    scores, successes, per_route = [], [], {}
    ability_hits: dict[str, list[bool]] = {a: [] for a in ABILITIES}
    effs, comforts = [], []
    for rid in ids:
        rec = by_id.get(rid)
        if rec is None:
            scores.append(0.0)
            successes.append(False)
            per_route[rid] = {"score": 0.0, "success": False, "status": "missing"}
            continue
        s = route_score(rec["completion"], rec.get("infractions", []))
        ok = route_success(rec)
        scores.append(s)
        successes.append(ok)
        for a in rec.get("abilities", []):
            ability_hits.setdefault(a, []).append(ok)
        eff, com = efficiency_score(rec), comfort_score(rec)
        if eff is not None:
            effs.append(eff)
        if com is not None:
            comforts.append(com)
        per_route[rid] = {
            "score": s, "success": ok, "status": rec.get("status", ""), "completion": rec["completion"],
            "penalty": penalty(rec.get("infractions", [])), "scenario": rec.get("scenario", ""),
            "infractions": [i["kind"] for i in rec.get("infractions", [])],
            "efficiency": eff, "comfort": com,
        }
    abilities = {a: (100.0 * float(np.mean(v)) if v else None) for a, v in ability_hits.items()}
    present = [v for v in abilities.values() if v is not None]
    return {
        "driving_score": float(np.mean(scores)) if scores else 0.0,
        "success_rate": 100.0 * float(np.mean(successes)) if successes else 0.0,
        "abilities": abilities,
        "abilities_mean": float(np.mean(present)) if present else None,
        "efficiency": float(np.mean(effs)) if effs else None,
        "comfort": 100.0 * float(np.mean(comforts)) if comforts else None,
        "num_routes": len(ids),
        "routes": per_route,
    }


def format_table(summary: dict) -> str:
    """Plain-text table of the per-route results and the totals."""
    lines = [f"{'route':<28} {'scenario':<16} {'status':<26} {'compl%':>7} {'pen':>5} {'score':>6}"]
    for rid, r in summary["routes"].items():
        lines.append(
            f"{rid:<28} {r.get('scenario', ''):<16} {r.get('status', '')[:26]:<26} "
            f"{r.get('completion', 0.0):7.1f} {r.get('penalty', 0.0):5.2f} {r['score']:6.1f}"
        )
    lines.append("")
    lines.append(f"driving score {summary['driving_score']:.2f}   success rate {summary['success_rate']:.1f} %   "
                 f"routes {summary['num_routes']}")
    ab = "  ".join(f"{a} {v:.1f}" if v is not None else f"{a} -" for a, v in summary["abilities"].items())
    lines.append(f"abilities: {ab}")
    eff = summary["efficiency"]
    com = summary["comfort"]
    lines.append(f"efficiency {eff:.1f}" if eff is not None else "efficiency -")
    lines[-1] += f"   comfort {com:.1f}" if com is not None else "   comfort -"
    return "\n".join(lines)
