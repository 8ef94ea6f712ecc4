#!/usr/bin/env python3
"""What planning with candidates and a scorer costs, whole plans through `CandidatePlanner` as `wam-diff drive` makes
them: every configuration plans the same validation frames, taking turns frame by frame (so the machine's load
falls on all alike; a first pass over the first frame warms every configuration up, untimed); ms per plan (median, p95) and the median per-frame ratio to N = 1 at the same decoding.

Configurations: N = 1; N = 4 and 8 with perception (the detection task in the batch), oracle (the frame's PDM
scene as the truth) and likelihood; at the checkpoint's decoding and, with --k2, at K = 2, threshold 0.3 too.

  scripts/candidates_timing.py --frames 30 --k2 --json results/candidates/timing.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from wam_diff_core.bench.frames import planning_frames, route_target_for
from wam_diff_core.eval.pdm import scene_from_dict
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.scoring.base import ScoringContext
from wam_diff_core.scoring.planner import CandidatePlanner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from candidates_open_loop import FRAME_SIZE, load_scenes  # noqa: E402


def configurations(k2: bool) -> list[tuple[str, dict, int, str]]:
    """(label, decoding overrides, N, scorer)."""
    decodings = [("K=4", {})] + ([("K=2 t=0.3", {"steps": 2, "threshold": 0.3})] if k2 else [])
    out = []
    for dlabel, decoding in decodings:
        out.append((f"{dlabel} N=1", decoding, 1, None))
        for n in (4, 8):
            for scorer in ("perception", "oracle", "likelihood"):
                out.append((f"{dlabel} N={n} {scorer}", decoding, n, scorer))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/nano-s-b32")
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--cache", default="runs/bench")
    parser.add_argument("--k2", action="store_true", help="also at K = 2, threshold 0.3")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    frames = planning_frames(None, args.cache, FRAME_SIZE, args.frames)
    scenes, _ = load_scenes(Path(args.cache))
    configs = configurations(args.k2)
    policies = {}
    for _, decoding, _, _ in configs:
        key = json.dumps(decoding, sort_keys=True)
        if key not in policies:
            policies[key] = DrivingPolicy.load(args.model, **decoding)
    planners = [CandidatePlanner(policies[json.dumps(d, sort_keys=True)], n, s, has_world=True) for _, d, n, s in configs]
    ms = np.zeros((len(frames), len(configs)))
    load_before = os.getloadavg()
    for i, frame in enumerate(tqdm([frames[0]] + frames, desc="timing", unit="frame")):  # the first: warm-up
        i -= 1
        settings = policies["{}"].loaded.settings
        target = route_target_for(frame, settings.route_target, settings.route_targets_only_on)
        scene = scene_from_dict(scenes[frame.id])
        truth = ScoringContext(ego=frame.ego, command=frame.command, route_target=frame.target,
                               agents=tuple(scene.agents), lanes=tuple(scene.lanes))
        for j, planner in enumerate(planners):
            planner.reset()
            t0 = time.perf_counter()
            planner.plan([frame.image], frame.ego, frame.command, target=target, route_target=frame.target,
                         time_s=0.0, truth=truth)
            if i >= 0:
                ms[i, j] = 1000 * (time.perf_counter() - t0)
    rows = {}
    for j, (label, decoding, n, scorer) in enumerate(configs):
        base = [k for k, c in enumerate(configs) if c[1] == decoding and c[2] == 1][0]
        rows[label] = {"decoding": decoding, "candidates": n, "scorer": scorer,
                       "ms_p50": round(float(np.median(ms[:, j])), 1), "ms_p95": round(float(np.percentile(ms[:, j], 95)), 1),
                       "x_n1_p50": round(float(np.median(ms[:, j] / ms[:, base])), 2)}
    out = {"model": args.model, "frames": len(frames), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
           f"{torch.get_num_threads()} torch threads, torch {torch.__version__}",
           "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in os.getloadavg()],
           "command": "scripts/candidates_timing.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"| configuration | ms/plan p50 | p95 | x N=1 |\n| --- | --- | --- | --- |")
    for label, r in rows.items():
        print(f"| {label} | {r['ms_p50']:.0f} | {r['ms_p95']:.0f} | {r['x_n1_p50']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
