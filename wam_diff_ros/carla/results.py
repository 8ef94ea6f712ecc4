"""Leaderboard result files -> merged result file -> project scoring records.

The leaderboard evaluator writes one result file per run (`--checkpoint`): route records under
`_checkpoint.records` in the layout wam_diff_core.eval.leaderboard describes. Parallel shards and
resumed runs give several files: `merge_checkpoints` keeps one record per route (a finished one over an
unfinished one, the later file on ties) and writes one file in the same official layout (full route
records, global record, progress, entry status, values and labels), so `wam-diff score --leaderboard`,
the evaluator's --resume and Bench2Drive's tools all read it. `to_record` converts a record into the
per-route dict of wam_diff_core.eval.bench2drive, whose `summarize` computes DS, SR, abilities,
efficiency, comfort. Unknown infraction names, completions outside 0..100 and NaN raise ResultsError.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional, Sequence

from wam_diff_core.eval import leaderboard
from wam_diff_core.eval.leaderboard import route_key

# leaderboard infraction list name -> project infraction kind (wam_diff_core.eval.bench2drive)
INFRACTION_KINDS = leaderboard.OFFICIAL_KINDS
AGENT_FILE = "wam_diff_agent.json"
ResultsError = leaderboard.LeaderboardError


def load_records(path: str | Path) -> list[dict]:
    """Route records of one checkpoint file (empty list for an empty file: a run that never started)."""
    path = Path(path)
    text = path.read_text() if path.is_file() else ""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not a leaderboard checkpoint (expected _checkpoint.records): {exc}") from None
    return list(leaderboard.records_of(data, str(path)))


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


def _sensors(path: Path) -> list:
    try:
        sensors = json.loads(path.read_text()).get("sensors") if path.is_file() and path.read_text().strip() else None
    except (json.JSONDecodeError, AttributeError):
        return []
    return list(sensors) if isinstance(sensors, list) else []


def merge_checkpoints(paths: Sequence[str | Path], total: Optional[int] = None) -> dict:
    """One record per route over several result files, as one result file in the evaluator's layout.

    total: routes the run was given (progress[1]; routes without a record then score 0), default the records."""
    chosen: dict[str, dict] = {}
    sensors: list = []
    for path in paths:
        for rec in load_records(path):
            key = route_key(rec["route_id"])
            old = chosen.get(key)
            if old is None or _finished(rec) or not _finished(old):
                chosen[key] = dict(rec)
        sensors = sensors or _sensors(Path(path))
    return leaderboard.results_file(chosen.values(), total=total, sensors=sensors)


def to_record(rec: dict, route_types: Optional[dict[str, str]] = None, agent_dir: Optional[str | Path] = None) -> dict:
    """A leaderboard route record -> wam_diff_core.eval.bench2drive per-route record.

    route_types: route id -> scenario type (from the route file; else the record's scenario_name).
    agent_dir: SAVE_PATH of the agent; its <save_name>/wam_diff_agent.json gives comfort and plan stats.
    """
    out = leaderboard.to_route_record(rec, route_types)
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
