"""Leaderboard 2.0 / Bench2Drive result files: read one, re-score every route from its infractions, write one.

The layout, as the evaluator's statistics manager writes it (`--checkpoint`) and Bench2Drive's tools read it:

    {"_checkpoint": {"global_record": {...}, "progress": [routes done, routes total],
                     "records": [{"index": 0, "route_id": "RouteScenario_1711_rep0",
                                  "scenario_name": "ParkingCutIn_1", "weather_id": .., "save_name": "..",
                                  "town_name": "Town12", "status": "Completed" | "Perfect" | "Failed - ...",
                                  "num_infractions": 2,
                                  "infractions": {OFFICIAL_KINDS name: [message, ...], ...},
                                  "scores": {"score_route": %, "score_penalty": 0..1, "score_composed": 0..100},
                                  "meta": {"route_length": m, "duration_game": s, "duration_system": s}}, ...]},
     "entry_status": "Finished", "eligible": true, "sensors": [..], "values": [..], "labels": [..]}

Re-scoring multiplies one coefficient per message (bench2drive.PENALTIES); an outside_route_lanes message
multiplies by 1 - pct / 100 with pct read from its text ("... (12.5% of the completed route)"); min_speed
messages are unused in Bench2Drive (no penalty, success kept); route_dev, vehicle_blocked and route_timeout
end the route, their cost is the lost completion. An unknown list name, a route completion outside 0..100
and NaN are errors naming the route and the key.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from . import bench2drive as b2d

# Official infraction list name (statistics_manager.PENALTY_NAME_DICT + route_timeout) -> bench2drive kind.
OFFICIAL_KINDS: dict[str, str] = {
    "collisions_layout": "collision_static",
    "collisions_pedestrian": "collision_pedestrian",
    "collisions_vehicle": "collision_vehicle",
    "red_light": "red_light",
    "stop_infraction": "stop_sign",
    "outside_route_lanes": b2d.OUTSIDE_LANES,
    "min_speed_infractions": b2d.MIN_SPEED,  # unused in Bench2Drive: no penalty
    "yield_emergency_vehicle_infractions": "yield_emergency_vehicle",
    "scenario_timeouts": "scenario_timeout",
    "route_dev": "route_deviation",
    "vehicle_blocked": "agent_blocked",
    "route_timeout": "route_timeout",
}
# Bench2Drive tools/ability_benchmark.py: scenario types per ability (ability names as bench2drive.ABILITIES).
ABILITY_SCENARIOS: dict[str, tuple[str, ...]] = {
    "overtaking": ("Accident", "AccidentTwoWays", "ConstructionObstacle", "ConstructionObstacleTwoWays",
                   "HazardAtSideLaneTwoWays", "HazardAtSideLane", "ParkedObstacleTwoWays", "ParkedObstacle",
                   "VehicleOpenDoorTwoWays"),
    "merging": ("CrossingBicycleFlow", "EnterActorFlow", "HighwayExit", "InterurbanActorFlow", "HighwayCutIn",
                "InterurbanAdvancedActorFlow", "MergerIntoSlowTrafficV2", "MergeIntoSlowTraffic",
                "NonSignalizedJunctionLeftTurn", "NonSignalizedJunctionRightTurn",
                "NonSignalizedJunctionLeftTurnEnterFlow", "ParkingExit", "SequentialLaneChange",
                "SignalizedJunctionLeftTurn", "SignalizedJunctionRightTurn", "SignalizedJunctionLeftTurnEnterFlow"),
    "emergency_brake": ("BlockedIntersection", "DynamicObjectCrossing", "HardBreakRoute", "OppositeVehicleTakingPriority",
                        "OppositeVehicleRunningRedLight", "ParkingCutIn", "PedestrianCrossing",
                        "ParkingCrossingPedestrain", "StaticCutIn", "VehicleTurningRoute",
                        "VehicleTurningRoutePedestrian", "ControlLoss"),
    "give_way": ("InvadingTurn", "YieldToEmergencyVehicle"),
    "traffic_signs": ("BlockedIntersection", "OppositeVehicleTakingPriority", "OppositeVehicleRunningRedLight",
                      "PedestrianCrossing", "VehicleTurningRoute", "VehicleTurningRoutePedestrian", "EnterActorFlow",
                      "CrossingBicycleFlow", "NonSignalizedJunctionLeftTurn", "NonSignalizedJunctionRightTurn",
                      "NonSignalizedJunctionLeftTurnEnterFlow", "SignalizedJunctionLeftTurn",
                      "SignalizedJunctionRightTurn", "SignalizedJunctionLeftTurnEnterFlow", "T_Junction",
                      "VanillaNonSignalizedTurn", "VanillaSignalizedTurnEncounterGreenLight",
                      "VanillaSignalizedTurnEncounterRedLight", "VanillaNonSignalizedTurnEncouterStopsign"),
}
# The evaluator penalises the unrounded percentage but writes it rounded to 2 decimals, and rounds scores to
# 6: a faithful recomputation stays within 0.005 points of score_composed.
SCORE_TOLERANCE = 0.01
SUCCESS_STATUSES = ("Completed", "Perfect")
_OUTSIDE_PCT = re.compile(r"\(([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf)% of the completed route\)",
                          re.ASCII | re.IGNORECASE)
_OUTSIDE_M = re.compile(r"for about ([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?) meters", re.ASCII)
_PERCENT = re.compile(r"\b\d+\.?\d*%", re.ASCII)
_SCENARIO_INDEX = re.compile(r"_\d+$")
SCORE_KEYS = ("score_route", "score_penalty", "score_composed")
META_KEYS = ("route_length", "duration_game", "duration_system")
LABELS = ("Avg. driving score", "Avg. route completion", "Avg. infraction penalty", "Collisions with pedestrians",
          "Collisions with vehicles", "Collisions with layout", "Red lights infractions", "Stop sign infractions",
          "Off-road infractions", "Route deviations", "Route timeouts", "Agent blocked",
          "Yield emergency vehicles infractions", "Scenario timeouts", "Min speed infractions")
_LABEL_KEYS = ("collisions_pedestrian", "collisions_vehicle", "collisions_layout", "red_light", "stop_infraction",
               "outside_route_lanes", "route_dev", "route_timeout", "vehicle_blocked",
               "yield_emergency_vehicle_infractions", "scenario_timeouts", "min_speed_infractions")


class LeaderboardError(b2d.ScoreError):
    """A leaderboard result file or record that cannot be read or scored; names the file or route and the key."""


def route_key(route_id) -> str:
    """"RouteScenario_1711_rep0" -> "1711" ("1711_rep1" for later repetitions); other ids pass through."""
    parts = str(route_id).split("_")
    if len(parts) >= 3 and parts[0] == "RouteScenario":
        rep = parts[-1]
        return parts[1] if rep in ("rep0", "") else f"{parts[1]}_{rep}"
    return str(route_id)


def scenario_type(scenario_name) -> str:
    """Record scenario_name "ParkingCutIn_1" (the route's first scenario) -> its type "ParkingCutIn"."""
    return _SCENARIO_INDEX.sub("", str(scenario_name or ""))


def abilities_of(scenario: str) -> list[str]:
    return [a for a, types in ABILITY_SCENARIOS.items() if scenario in types]


def load_results(path: str | Path) -> dict:
    """The parsed result file; LeaderboardError when it is missing, not JSON or lacks _checkpoint.records."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LeaderboardError(f"{path}: no such result file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LeaderboardError(f"{path}: not a JSON leaderboard result file ({exc})") from None
    records_of(data, str(path))
    return data


def records_of(data, source: str = "results") -> list[dict]:
    """`_checkpoint.records` of a parsed result file, checked to be a list of objects with a route_id."""
    checkpoint = data.get("_checkpoint") if isinstance(data, dict) else None
    records = checkpoint.get("records") if isinstance(checkpoint, dict) else None
    if not isinstance(records, list):
        raise LeaderboardError(f"{source}: expected a leaderboard result file with a _checkpoint.records list")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or "route_id" not in rec:
            raise LeaderboardError(f"{source}: _checkpoint.records[{i}] is not a route record with a route_id")
    return records


def progress_total(data) -> int:
    """Routes the run was given (`_checkpoint.progress[1]`), 0 when the file does not say."""
    checkpoint = data.get("_checkpoint") if isinstance(data, dict) else None
    p = checkpoint.get("progress") if isinstance(checkpoint, dict) else None
    try:
        return int(p[1]) if isinstance(p, (list, tuple)) and len(p) == 2 else 0
    except (TypeError, ValueError):
        return 0


def outside_lanes_pct(message, route_id) -> float:
    """The percentage in an outside_route_lanes message, as the leaderboard writes it."""
    m = _OUTSIDE_PCT.search(str(message))
    if m is None:
        raise LeaderboardError(f"route {route_id}: infractions.outside_route_lanes message {str(message)!r} holds no "
                               f"'(<pct>% of the completed route)'")
    return b2d.check_percentage(m.group(1), route_id, "infractions.outside_route_lanes percentage")


def infractions_of(rec: dict, route_id) -> list[dict]:
    """The record's infraction lists as bench2drive infractions ({"kind", "message"[, "pct"]}), one per message."""
    lists = rec.get("infractions")
    if lists is None:
        return []
    if not isinstance(lists, dict):
        raise LeaderboardError(f"route {route_id}: infractions is {type(lists).__name__}; expected an object of lists")
    out = []
    for name, messages in lists.items():
        if name not in OFFICIAL_KINDS:
            raise LeaderboardError(f"route {route_id}: infractions.{name} is not a leaderboard infraction; expected "
                                   f"one of {', '.join(OFFICIAL_KINDS)}")
        if not isinstance(messages, list):
            raise LeaderboardError(f"route {route_id}: infractions.{name} is {messages!r}; expected a list of messages")
        for msg in messages:
            inf = {"kind": OFFICIAL_KINDS[name], "message": str(msg)}
            if name == "outside_route_lanes":
                inf["pct"] = outside_lanes_pct(msg, route_id)
            out.append(inf)
    return out


def _stored_score(scores: dict, key: str, route_id) -> Optional[float]:
    value = scores.get(key)
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v):
        raise LeaderboardError(f"route {route_id}: scores.{key} is {value!r}; expected a finite number")
    return v


def _efficiency(infractions: list[dict]) -> Optional[dict]:
    """Bench2Drive's efficiency: mean of the min-speed percentages (ego vs traffic speed) of the route."""
    found = [_PERCENT.search(i["message"]) for i in infractions if i["kind"] == b2d.MIN_SPEED]
    pcts = [float(m.group().rstrip("%")) for m in found if m]
    pcts = [p for p in pcts if p <= 1000]
    return {"ego_mean_speed": sum(pcts) / len(pcts), "traffic_mean_speed": 100.0} if pcts else None


def to_route_record(rec: dict, route_types: Optional[dict[str, str]] = None) -> dict:
    """A leaderboard route record -> a bench2drive per-route record, plus "stored": the file's own scores.

    route_types: route id -> scenario type (from the route file); else the type in the record's scenario_name."""
    key = route_key(rec["route_id"])
    scores = rec.get("scores")
    if not isinstance(scores, dict) or "score_route" not in scores:
        raise LeaderboardError(f"route {key}: scores.score_route is missing; expected the route completion in 0..100")
    completion = b2d.check_percentage(scores["score_route"], key, "scores.score_route")
    scenario = (route_types or {}).get(key) or scenario_type(rec.get("scenario_name"))
    infractions = infractions_of(rec, key)
    out = {"route_id": key, "scenario": scenario, "abilities": abilities_of(scenario),
           "status": str(rec.get("status", "")), "completion": completion, "infractions": infractions,
           "stored": {k: _stored_score(scores, k, key) for k in SCORE_KEYS}}
    eff = _efficiency(infractions)
    if eff is not None:
        out["efficiency"] = eff
    return out


def route_success(route: dict) -> bool:
    """Bench2Drive's success: status Completed or Perfect and no infraction but min speed (bench2drive.route_success)."""
    return route["status"] in SUCCESS_STATUSES and b2d.route_success(route)


def _route_rows(routes: dict[str, dict], tolerance: float) -> tuple[dict, list[dict]]:
    rows, mismatches = {}, []
    for rid, r in routes.items():
        pen = b2d.penalty(r["infractions"], rid)
        score = r["completion"] * pen
        stored = r["stored"]["score_composed"]
        rows[rid] = {"scenario": r["scenario"], "abilities": r["abilities"], "status": r["status"],
                     "completion": r["completion"], "penalty": pen, "score": score, "success": route_success(r),
                     "stored_score": stored, "stored_penalty": r["stored"]["score_penalty"],
                     "infractions": [i["kind"] for i in r["infractions"]],
                     "efficiency": b2d.efficiency_score(r)}
        if stored is not None and abs(stored - score) > tolerance:
            mismatches.append({"route_id": rid, "score_composed": stored, "recomputed": score,
                               "difference": score - stored})
    return rows, mismatches


def score_results(data: dict, source: str = "results", route_types: Optional[dict[str, str]] = None,
                  tolerance: float = SCORE_TOLERANCE) -> dict:
    """DS, SR and per-ability success of a parsed result file, every route re-scored from its infractions.

    Routes the run was given (`progress[1]`) without a record score 0 and fail, as in the leaderboard's
    global record. "mismatches": routes whose recomputed score differs from score_composed by > tolerance."""
    routes: dict[str, dict] = {}
    for rec in records_of(data, source):
        r = to_route_record(rec, route_types)
        if r["route_id"] in routes:
            raise LeaderboardError(f"{source}: route {r['route_id']} has two records; merge the files first")
        routes[r["route_id"]] = r
    rows, mismatches = _route_rows(routes, tolerance)
    total = max(len(routes), progress_total(data))
    ability_hits: dict[str, list[bool]] = {a: [] for a in b2d.ABILITIES}
    for row in rows.values():
        for a in row["abilities"]:
            ability_hits[a].append(row["success"])
    abilities = {a: (100.0 * float(np.mean(v)) if v else None) for a, v in ability_hits.items()}
    present = [v for v in abilities.values() if v is not None]
    stored = [r["stored_score"] for r in rows.values()]
    effs = [r["efficiency"] for r in rows.values() if r["efficiency"] is not None]
    return {
        "source": source,
        "driving_score": sum(r["score"] for r in rows.values()) / total if total else 0.0,
        "driving_score_stored": sum(stored) / total if total and None not in stored else None,
        "success_rate": 100.0 * sum(r["success"] for r in rows.values()) / total if total else 0.0,
        "abilities": abilities,
        "abilities_mean": float(np.mean(present)) if present else None,
        "efficiency": float(np.mean(effs)) if effs else None,
        "num_routes": total, "num_records": len(rows), "missing_routes": total - len(rows),
        "tolerance": tolerance, "mismatches": mismatches, "routes": rows,
    }


def format_report(result: dict) -> str:
    """Plain-text table: per route recomputed and stored scores, then DS, SR, abilities and the mismatches."""
    lines = [f"{'route':<12} {'scenario':<28} {'status':<30} {'compl%':>7} {'penalty':>8} {'score':>7} {'stored':>7}"]
    for rid, r in result["routes"].items():
        stored = f"{r['stored_score']:7.2f}" if r["stored_score"] is not None else f"{'-':>7}"
        lines.append(f"{rid:<12} {r['scenario'][:28]:<28} {r['status'][:30]:<30} {r['completion']:7.2f} "
                     f"{r['penalty']:8.4f} {r['score']:7.2f} {stored}")
    lines.append("")
    ds_stored = result["driving_score_stored"]
    lines.append(f"driving score {result['driving_score']:.2f}"
                 + (f" (score_composed in the file: {ds_stored:.2f})" if ds_stored is not None else "")
                 + f"   success rate {result['success_rate']:.2f} %   routes {result['num_routes']}"
                 + (f" ({result['missing_routes']} without a record, scored 0)" if result["missing_routes"] else "")
                 + (f"   efficiency {result['efficiency']:.2f}" if result["efficiency"] is not None else ""))
    ab = "  ".join(f"{a} {v:.2f}" if v is not None else f"{a} -" for a, v in result["abilities"].items())
    mean = result["abilities_mean"]
    lines.append(f"abilities (success %): {ab}   mean {mean:.2f}" if mean is not None else f"abilities: {ab}")
    if result["mismatches"]:
        lines.append(f"recomputed score differs from score_composed (tolerance {result['tolerance']}):")
        lines += [f"  {m['route_id']}: score_composed {m['score_composed']:.4f}, recomputed {m['recomputed']:.4f}"
                  for m in result["mismatches"]]
    else:
        lines.append(f"every recomputed score matches score_composed (tolerance {result['tolerance']})")
    return "\n".join(lines)


# ---------------------------------------------------------------- writing the official layout


def official_record(rec: dict, index: int) -> dict:
    """`rec` (an evaluator record, possibly partial) in the full RouteRecord layout, validated.

    Infraction lists and scores the record holds are kept as written (a re-score can then still find a
    disagreement); missing lists are empty, a missing score_penalty / score_composed is recomputed."""
    r = to_route_record(rec)
    pen = b2d.penalty(r["infractions"], r["route_id"])
    lists = {name: list((rec.get("infractions") or {}).get(name, [])) for name in OFFICIAL_KINDS}
    given = r["stored"]
    scores = {"score_route": rec["scores"]["score_route"],
              "score_penalty": given["score_penalty"] if given["score_penalty"] is not None else round(pen, 6),
              "score_composed": (given["score_composed"] if given["score_composed"] is not None
                                 else round(r["completion"] * pen, 6))}
    meta = {k: (rec.get("meta") or {}).get(k, 0) for k in META_KEYS}
    out = {"index": index, "route_id": rec["route_id"]}
    for k in ("scenario_name", "weather_id", "save_name", "town_name"):
        out[k] = rec.get(k)
    out.update({"status": r["status"] or "Started", "num_infractions": sum(len(v) for v in lists.values()),
                "infractions": lists, "scores": scores, "meta": meta})
    return out


def _per_km(records: list[dict]) -> dict[str, float]:
    """Global infraction counts per driven km (outside_route_lanes: km driven outside lanes), as the evaluator."""
    km = max(sum(float(r["meta"]["route_length"]) / 1000 * float(r["scores"]["score_route"]) / 100 for r in records),
             0.001)
    out = {}
    for name in OFFICIAL_KINDS:
        if name == "outside_route_lanes":
            metres = [_OUTSIDE_M.search(r["infractions"][name][0]) for r in records if r["infractions"][name]]
            out[name] = round(sum(float(m.group(1)) for m in metres if m) / 1000, 3)
        else:
            out[name] = round(sum(len(r["infractions"][name]) for r in records) / km, 3)
    return out


def global_record(records: list[dict], total: int) -> dict:
    """The evaluator's global record of full route records (official_record) out of `total` routes."""
    total = max(total, len(records), 1)
    means = {k: round(sum(float(r["scores"][k]) for r in records) / total, 6)
             for k in ("score_composed", "score_route", "score_penalty")}  # the evaluator's key order
    spread = {k: 0.0 if total == 1 else round(math.sqrt(sum((float(r["scores"][k]) - means[k]) ** 2
                                                            for r in records) / (total - 1)), 3) for k in means}
    status = "Perfect"
    exceptions = []
    for r in records:
        if "Failed" in r["status"]:
            exceptions.append([r["route_id"], r["index"], r["status"]])
            status = "Failed"
        elif status == "Perfect" and r["status"] != "Perfect":
            status = r["status"]
    meta = {"total_length": round(sum(float(r["meta"]["route_length"]) for r in records), 3),
            "duration_game": round(sum(float(r["meta"]["duration_game"]) for r in records), 3),
            "duration_system": round(sum(float(r["meta"]["duration_system"]) for r in records), 3),
            "exceptions": exceptions}
    return {"index": -1, "route_id": -1, "status": status, "infractions": _per_km(records), "scores_mean": means,
            "scores_std_dev": spread, "meta": meta}


def results_file(records: Iterable[dict], total: Optional[int] = None, sensors: Iterable = ()) -> dict:
    """A complete result file in the evaluator's layout from route records (sorted by route id, re-indexed)."""
    def order(rec):
        rid, _, rep = route_key(rec["route_id"]).partition("_rep")
        return (0, int(rid), int(rep or 0), "") if rid.isdigit() and (rep or "0").isdigit() else (1, 0, 0, rid)

    full = [official_record(rec, i) for i, rec in enumerate(sorted(records, key=order))]
    total = max(int(total or 0), len(full))
    glob = global_record(full, total)
    statuses = " ".join(r["status"] for r in full)
    entry = ("Crashed" if "Simulation crashed" in statuses else "Rejected" if "sensors were invalid" in statuses
             else "Started" if len(full) < total else "Finished")
    values = [str(glob["scores_mean"][k]) for k in ("score_composed", "score_route", "score_penalty")]
    values += [str(glob["infractions"][k]) for k in _LABEL_KEYS]
    return {"_checkpoint": {"global_record": glob, "progress": [len(full), total], "records": full},
            "entry_status": entry, "eligible": entry == "Finished", "sensors": list(sensors),
            "values": values, "labels": list(LABELS)}
