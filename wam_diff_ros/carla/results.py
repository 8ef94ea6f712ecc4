"""Leaderboard result files -> merged Bench2Drive checkpoint -> project scoring records.

The leaderboard evaluator writes one checkpoint JSON per run (`--checkpoint`), route records under
`_checkpoint.records` (route_id "RouteScenario_<id>_rep<k>", status, scores, infractions as lists of
messages, save_name). Parallel shards and resumed runs give several files: `merge_checkpoints`
keeps one record per route (a finished one over an unfinished one, the later file on ties) and
writes Bench2Drive's merged form. `to_record` converts a record into the per-route dict of
wam_diff_core.eval.bench2drive, whose `summarize` computes DS, SR, abilities, efficiency, comfort.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Optional, Sequence

from wam_diff_core.errors import WamDiffError

# Bench2Drive tools/ability_benchmark.py: scenario types per ability (ability names as the project's).
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

# leaderboard infraction list name -> project infraction kind (wam_diff_core.eval.bench2drive)
INFRACTION_KINDS = {
    "collisions_pedestrian": "collision_pedestrian",
    "collisions_vehicle": "collision_vehicle",
    "collisions_layout": "collision_static",
    "red_light": "red_light",
    "stop_infraction": "stop_sign",
    "scenario_timeouts": "scenario_timeout",
    "yield_emergency_vehicle_infractions": "yield_emergency_vehicle",
    "outside_route_lanes": "outside_route_lanes",
    "min_speed_infractions": "min_speed",
    "route_dev": "route_deviation",
    "vehicle_blocked": "vehicle_blocked",
    "route_timeout": "route_timeout",
}
_OUTSIDE_PCT = re.compile(r"\(([-+0-9.eE]+)% of the completed route\)")
_PERCENT = re.compile(r"\b\d+\.?\d*%")
AGENT_FILE = "wam_diff_agent.json"


class ResultsError(WamDiffError, ValueError):
    """A result file that cannot be read as a leaderboard checkpoint; names the file."""


def route_key(route_id: str) -> str:
    """Leaderboard record id "RouteScenario_1711_rep0" -> route file id "1711"; plain ids pass through."""
    parts = str(route_id).split("_")
    return parts[1] if len(parts) >= 3 and parts[0] == "RouteScenario" else str(route_id)


def abilities_of(scenario_type: str) -> list[str]:
    return [a for a, types in ABILITY_SCENARIOS.items() if scenario_type in types]


def load_records(path: str | Path) -> list[dict]:
    """Route records of one checkpoint file (empty list for an empty file: a run that never started)."""
    path = Path(path)
    text = path.read_text() if path.is_file() else ""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
        records = data["_checkpoint"]["records"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path}: not a leaderboard checkpoint (expected _checkpoint.records): {exc}") from None
    return list(records)


def progress(path: str | Path) -> Optional[tuple[int, int]]:
    """(routes done, routes total) of a checkpoint file, None when absent/empty."""
    path = Path(path)
    if not path.is_file() or not path.read_text().strip():
        return None
    try:
        p = json.loads(path.read_text())["_checkpoint"]["progress"]
        return (int(p[0]), int(p[1])) if len(p) == 2 else None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _finished(rec: dict) -> bool:
    return rec.get("status", "Started") not in ("Started", "") and "Simulation crashed" not in rec.get("status", "")


def merge_checkpoints(paths: Sequence[str | Path]) -> dict:
    """One record per route over several checkpoint files, in Bench2Drive's merged-JSON form."""
    chosen: dict[str, dict] = {}
    for path in paths:
        for rec in load_records(path):
            key = route_key(rec["route_id"])
            old = chosen.get(key)
            if old is None or _finished(rec) or not _finished(old):
                chosen[key] = rec
    records = sorted(chosen.values(), key=lambda r: (int(route_key(r["route_id"])) if route_key(r["route_id"]).isdigit()
                                                     else 0, route_key(r["route_id"])))
    for i, rec in enumerate(records):
        rec["index"] = i
    return {"_checkpoint": {"records": records, "progress": [len(records), len(records)], "global_record": {}},
            "entry_status": "Finished", "eligible": True, "sensors": [], "values": [], "labels": []}


def _infractions(rec: dict) -> list[dict]:
    out = []
    for name, messages in (rec.get("infractions") or {}).items():
        kind = INFRACTION_KINDS.get(name, name)
        for msg in messages or []:
            inf = {"kind": kind, "message": str(msg)}
            if kind == "outside_route_lanes":
                m = _OUTSIDE_PCT.search(str(msg))
                inf["pct"] = float(m.group(1)) if m else 0.0
            out.append(inf)
    return out


def _efficiency(rec: dict) -> Optional[dict]:
    """Bench2Drive's efficiency: mean of the min-speed percentages (ego vs traffic speed) of the route."""
    pcts = []
    for msg in (rec.get("infractions") or {}).get("min_speed_infractions", []) or []:
        m = _PERCENT.search(str(msg))
        if m and float(m.group().rstrip("%")) <= 1000:
            pcts.append(float(m.group().rstrip("%")))
    if not pcts:
        return None
    return {"ego_mean_speed": sum(pcts) / len(pcts), "traffic_mean_speed": 100.0}


def to_record(rec: dict, route_types: Optional[dict[str, str]] = None, agent_dir: Optional[str | Path] = None) -> dict:
    """A leaderboard route record -> wam_diff_core.eval.bench2drive per-route record.

    route_types: route id -> scenario type (from the route file; else the record's scenario_name).
    agent_dir: SAVE_PATH of the agent; its <save_name>/wam_diff_agent.json gives comfort and plan stats.
    """
    key = route_key(rec["route_id"])
    scenario = (route_types or {}).get(key) or str(rec.get("scenario_name") or "")
    out = {
        "route_id": key,
        "scenario": scenario,
        "abilities": abilities_of(scenario),
        "status": rec.get("status", ""),
        "completion": float(min(max(rec.get("scores", {}).get("score_route", 0.0), 0.0), 100.0)),
        "infractions": _infractions(rec),
    }
    eff = _efficiency(rec)
    if eff is not None:
        out["efficiency"] = eff
    if agent_dir is not None and rec.get("save_name"):
        f = Path(agent_dir) / rec["save_name"] / AGENT_FILE
        if f.is_file():
            data = json.loads(f.read_text())
            out["comfort"] = data.get("comfort")
            out["agent"] = data.get("stats")
    return out


def score(records: Iterable[dict], expected_ids: Optional[Iterable[str]] = None,
          route_types: Optional[dict[str, str]] = None, agent_dir: Optional[str | Path] = None) -> dict:
    """DS, SR, abilities, efficiency and comfort of leaderboard records (missing expected routes score 0)."""
    from wam_diff_core.eval.bench2drive import summarize

    converted = [to_record(r, route_types, agent_dir) for r in records]
    summary = summarize(converted, expected_route_ids=list(expected_ids) if expected_ids is not None else None)
    agents = [r["agent"] for r in converted if r.get("agent")]
    if agents:
        summary["agent"] = {k: sum(int(a.get(k, 0)) for a in agents)
                            for k in ("ticks", "plans", "valid_plans", "invalid_plans", "late_plans", "brake_ticks")}
    return summary
