"""`wam-diff compare-drives`: closed-loop runs side by side: DS, SR, collisions, plans, realtime latency and DS
per scenario.

Each argument is LABEL=PATH with PATH a `wam-diff drive` output directory or its summary.json. Writes
OUT/compare.json, OUT/compare.md (the table) and OUT/compare.png (DS per scenario, one bar per run), and prints
the table.

    wam-diff compare-drives --out runs/compare "B32 lockstep=runs/drive_b32" "B32 realtime=runs/drive_b32_rt"

A PATH may be several runs joined by '+' (their routes pooled; a route id in two of them is an error), each
optionally followed by '#OFFSETS' (comma-separated traffic seed offsets of `wam-diff drive --seed-offsets`; 0: the
suite's own traffic), which keeps only those routes. DS and SR are then recomputed over the routes kept (plans,
latency and the run settings are left out when a selection or pooling makes them partial):

    "nano-s-b32 new traffic=runs/drive_seeds#50000,60000" "nano-s-b32 all=runs/drive_suite+runs/drive_seeds"
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ..errors import WamDiffError

_OFFSET = re.compile(r"_s(\d+)$")
PARTIAL_KEYS = ("plans", "latency_ticks_mean")  # whole-run counts a route selection cannot split
STEM = "compare"


class DriveSummaryError(WamDiffError, ValueError):
    """A run argument that is malformed, unreadable, not a drive summary, or selects no route."""


def scenario_scores(summary: dict) -> dict:
    """DS per scenario type and the number of routes that ended in (or recorded) a vehicle collision."""
    per, collisions = {}, 0
    for rec in (summary.get("routes") or {}).values():
        per.setdefault(rec.get("scenario", "?"), []).append(float(rec.get("score", 0.0)))
        collisions += any("collision" in str(i) for i in rec.get("infractions") or [])
    return {"per_scenario": {k: sum(v) / len(v) for k, v in sorted(per.items())}, "collisions": collisions}


def traffic_offset(route_id: str) -> int:
    """The traffic seed offset a `wam-diff drive --seed-offsets` route id carries (`<route>_s<offset>`; else 0)."""
    m = _OFFSET.search(route_id)
    return int(m.group(1)) if m else 0


def restrict(summary: dict, routes: dict) -> dict:
    """`summary` over `routes` (not empty) only: DS and SR recomputed, whole-run counts dropped."""
    out = {k: v for k, v in summary.items() if k not in PARTIAL_KEYS}
    out["routes"] = routes
    out["num_routes"] = len(routes)
    out["driving_score"] = sum(float(r.get("score", 0.0)) for r in routes.values()) / len(routes)
    out["success_rate"] = 100.0 * sum(bool(r.get("success")) for r in routes.values()) / len(routes)
    return out


def load_run(spec: str) -> tuple[str, dict]:
    """'LABEL=PATH[#OFFSETS][+PATH[#OFFSETS]...]' -> (label, summary); exits naming the argument when it is
    malformed or unreadable."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise DriveSummaryError(f"{spec!r}: expected LABEL=PATH (a drive output directory or its summary.json)")
    parts = path.split("+")
    if len(parts) == 1 and "#" not in path:
        return label, _read_summary(spec, path)
    pooled, first = {}, None
    for part in parts:
        where, _, offsets = part.partition("#")
        summary = _read_summary(spec, where)
        first = first or summary
        routes = summary["routes"]
        if offsets:
            try:
                keep = {int(o) for o in offsets.split(",")}
            except ValueError:
                raise DriveSummaryError(f"{spec!r}: after '#' expected comma-separated seed offsets, "
                                        f"got {offsets!r}") from None
            routes = {rid: r for rid, r in routes.items() if traffic_offset(rid) in keep}
        twice = sorted(set(routes) & set(pooled))
        if twice:
            raise DriveSummaryError(f"{spec!r}: route(s) {twice[:3]} in more than one pooled run")
        pooled.update(routes)
    if not pooled:
        raise DriveSummaryError(f"{spec!r}: the selection keeps no route")
    return label, restrict(first, pooled)


def _read_summary(spec: str, path: str) -> dict:
    p = Path(path)
    p = p / "summary.json" if p.is_dir() else p
    try:
        summary = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DriveSummaryError(f"{spec!r}: cannot read {p} ({exc})") from None
    if "routes" not in summary or "driving_score" not in summary:
        raise DriveSummaryError(f"{spec!r}: {p} is not a wam-diff drive summary (no routes / driving_score)")
    return summary


def row(label: str, summary: dict) -> dict:
    per = scenario_scores(summary)
    return {"label": label, "driving_score": summary["driving_score"], "success_rate": summary["success_rate"],
            "routes": summary.get("num_routes"), "collisions": per["collisions"], "plans": summary.get("plans"),
            "frame_size": summary.get("frame_size"), "replan_every": summary.get("replan_every"),
            "realtime": summary.get("realtime", False), "latency_ticks_mean": summary.get("latency_ticks_mean"),
            "stale_after_s": summary.get("stale_after_s"), "per_scenario": per["per_scenario"]}


def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, list):
        return "x".join(map(str, v))
    return str(v)


def markdown(rows: list[dict]) -> str:
    scenarios = sorted({s for r in rows for s in r["per_scenario"]})
    head = ["run", "DS", "SR %", "collisions", "plans", "frames", "replan", "realtime", "latency (ticks)",
            "stale after (s)", *scenarios]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["label"], _fmt(r["driving_score"]), _fmt(r["success_rate"]), _fmt(r["collisions"]), _fmt(r["plans"]),
                 _fmt(r["frame_size"]), _fmt(r["replan_every"]), _fmt(r["realtime"]), _fmt(r["latency_ticks_mean"], 2),
                 _fmt(r["stale_after_s"]), *(_fmt(r["per_scenario"].get(s)) for s in scenarios)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = ["all", *sorted({s for r in rows for s in r["per_scenario"]})]
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(groups)) + 3, 4))
    for i, r in enumerate(rows):
        vals = [r["driving_score"], *(r["per_scenario"].get(g, 0.0) for g in groups[1:])]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, vals, width, label=r["label"])
    ax.set_xticks(x, groups, rotation=20)
    ax.set_ylabel("driving score")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("closed loop on the embedded suite")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="LABEL=PATH (drive output directory or summary.json)")
    parser.add_argument("--out", required=True, help="directory for compare.json / .md / .png")


def run(args: argparse.Namespace) -> int:
    rows = [row(*load_run(spec)) for spec in args.runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows)
    (out / f"{STEM}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / f"{STEM}.md").write_text(table)
    plot(rows, out / f"{STEM}.png")
    print(table, end="")
    print(f"written: {out / STEM}.json, {out / STEM}.md, {out / STEM}.png")
    return 0
