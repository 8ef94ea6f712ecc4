"""Bench2Drive closed-loop statistics (leaderboard 2.0 scoring as Bench2Drive uses it).

World-agnostic: the embedded highway world and the CARLA agent both hand in per-route records
(plain dicts, the per-route JSON written by `wam-diff drive`; leaderboard.py converts the official
result file into them):

    {"route_id": str, "scenario": str, "abilities": [str], "status": str,
     "completion": float (percent 0..100),
     "infractions": [{"kind": str, "time_s": float, ...}],   # kinds: KINDS ("outside_route_lanes" with "pct")
     "efficiency": {"ego_mean_speed": m/s, "traffic_mean_speed": m/s},
     "comfort": {"dt": s, "lon_accel": [...], "lat_accel": [...], "yaw_rate": [...]}}

An infraction kind outside KINDS, a completion or percentage outside 0..100 and NaN raise ScoreError
naming the route and the key: a misspelt kind must never score as a clean drive.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import numpy as np

from ..errors import WamDiffError
from .comfort import comfort_windows

# Multiplicative penalty per infraction event (leaderboard 2.0 statistics_manager.PENALTY_VALUE_DICT).
PENALTIES: dict[str, float] = {
    "collision_pedestrian": 0.5,
    "collision_vehicle": 0.6,
    "collision_static": 0.65,
    "red_light": 0.7,
    "stop_sign": 0.8,
    "scenario_timeout": 0.7,
    "yield_emergency_vehicle": 0.7,
}
# Multiplies the penalty by 1 - pct / 100 (pct: share of the completed route driven outside the route lanes).
OUTSIDE_LANES = "outside_route_lanes"
# The leaderboard penalises min speed by 1 - 0.3 (1 - pct / 100); Bench2Drive marks it "unused": no penalty,
# and it does not break success (its percentages feed efficiency instead).
MIN_SPEED = "min_speed"
# Events that end a route without a penalty of their own: the lost completion is their cost.
ROUTE_ENDING = ("route_deviation", "agent_blocked", "route_timeout")
KINDS = (*PENALTIES, OUTSIDE_LANES, MIN_SPEED, *ROUTE_ENDING)
# Infractions that never break success (Bench2Drive excepts min speed).
NON_FAILING = (MIN_SPEED,)
ABILITIES = ("merging", "overtaking", "emergency_brake", "give_way", "traffic_signs")


class ScoreError(WamDiffError, ValueError):
    """A route record that cannot be scored (unknown infraction, completion outside 0..100, NaN); names route and key."""


def _route(route_id) -> str:
    return f"route {route_id}" if route_id not in (None, "") else "route record"


def check_percentage(value, route_id, key: str) -> float:
    """`value` as a float in [0, 100] (1e-9 over 100 is read as 100), else ScoreError naming route and key."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ScoreError(f"{_route(route_id)}: {key} is {value!r}; expected a percentage in 0..100") from None
    if isinstance(value, bool) or not math.isfinite(v) or not 0.0 <= v <= 100.0 + 1e-9:
        raise ScoreError(f"{_route(route_id)}: {key} is {value!r}; expected a percentage in 0..100")
    return min(v, 100.0)


def _kind(inf, route_id) -> str:
    kind = inf.get("kind") if isinstance(inf, dict) else None
    if kind not in KINDS:
        raise ScoreError(f"{_route(route_id)}: infraction kind {kind!r} is unknown; expected one of {', '.join(KINDS)}")
    return kind


def penalty(infractions: Iterable[dict], route_id=None) -> float:
    """Product of the penalty coefficients of every infraction event (1.0 for none); unknown kinds raise ScoreError."""
    p = 1.0
    for inf in infractions:
        kind = _kind(inf, route_id)
        if kind in PENALTIES:
            p *= PENALTIES[kind]
        elif kind == OUTSIDE_LANES:
            p *= 1.0 - check_percentage(inf.get("pct"), route_id, f"{OUTSIDE_LANES} pct") / 100.0
    return p


def route_score(completion_pct: float, infractions: Iterable[dict], route_id=None) -> float:
    """Route score = completion (percent) x penalty, in 0..100."""
    return float(check_percentage(completion_pct, route_id, "completion") * penalty(infractions, route_id))


def route_success(record: dict) -> bool:
    """Completed (100 %), not marked failed, with no infraction other than NON_FAILING kinds."""
    rid = record.get("route_id")
    failing = [k for k in (_kind(i, rid) for i in record.get("infractions", [])) if k not in NON_FAILING]
    done = check_percentage(record.get("completion"), rid, "completion") >= 100.0 - 1e-6
    return done and not str(record.get("status", "")).startswith("Failed") and not failing


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
        s = route_score(rec.get("completion"), rec.get("infractions", []), rid)
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
            "penalty": penalty(rec.get("infractions", []), rid), "scenario": rec.get("scenario", ""),
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
