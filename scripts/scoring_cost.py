#!/usr/bin/env python3
"""What scoring a plan's candidates costs: the PDM-style terms of every candidate (`scoring.terms.candidate_terms`)
of N = 8 open-loop plans against their frames' vehicles, as the perception scorer computes them (no map) and as the
oracle does (with the lanes). Reads the rows `scripts/candidates_open_loop.py` wrote (the candidates) and the
validation scenes it renders into --cache; prints a table and writes JSON.

  scripts/candidates_open_loop.py ... --rows runs/brake/open_loop_rows.jsonl   # the candidates, first
  scripts/scoring_cost.py --rows runs/brake/open_loop_rows.jsonl --plans 300 --json results/candidates/scoring_cost.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from wam_diff_core.bench.frames import planning_frames
from wam_diff_core.eval.pdm import scene_from_dict
from wam_diff_core.scoring.terms import candidate_terms
from wam_diff_core.types import Candidate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from candidates_open_loop import FRAME_SIZE, load_scenes  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True, help="candidates_open_loop.py's JSONL rows")
    parser.add_argument("--plans", type=int, default=300, help="the first N rows")
    parser.add_argument("--cache", default="runs/bench")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines()][: args.plans]
    scenes, _ = load_scenes(Path(args.cache))
    frames = {f.id: f for f in planning_frames(None, args.cache, FRAME_SIZE, 1640)}
    work = []
    for r in rows:
        scene, frame = scene_from_dict(scenes[r["id"]]), frames[r["id"]]
        cands = [Candidate(k, None if t is None else np.asarray(t)) for k, t in enumerate(r["candidates"])]
        work.append((cands, frame, scene))
    variants = {
        "perception terms (vehicles, no map)": lambda c, f, s: candidate_terms(c, f.ego, s.agents, None, f.target),
        "oracle terms (vehicles and lanes)": lambda c, f, s: candidate_terms(c, f.ego, s.agents, s.lanes, f.target)}
    ms = {name: [] for name in variants}
    for cands, frame, scene in work:  # the variants take turns on every plan
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn(cands, frame, scene)
            ms[name].append(1000 * (time.perf_counter() - t0))
    table = {name: {"p50": round(float(np.median(v)), 2), "mean": round(float(np.mean(v)), 2),
                    "p95": round(float(np.percentile(v, 95)), 2)} for name, v in ms.items()}
    out = {"plans": len(work), "candidates_per_plan": len(work[0][0]) if work else 0,
           "vehicles_per_plan": round(float(np.mean([len(s.agents) for _, _, s in work])), 2),
           "ms_per_plan": table, "machine": f"{platform.processor() or platform.machine()}, one process",
           "command": "scripts/scoring_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print("| terms | ms per plan p50 | mean | p95 |\n| --- | --- | --- | --- |")
    for name, t in table.items():
        print(f"| {name} | {t['p50']} | {t['mean']} | {t['p95']} |")
    print(f"{out['plans']} plans of {out['candidates_per_plan']} candidates, {out['vehicles_per_plan']} vehicles each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
