"""What publishing detections costs the planner: `DrivingPolicy.plan` with tasks planning against planning,detection.

    .venv/bin/python scripts/task_latency.py --model models/nano-s-b32 --data runs/nano_s/data_all/val.json \\
        --frames 200 --out results/ablations/detection_diagnosis/latency_tasks.json

The ROS planner calls `plan(images, ego, command, tasks=...)` once per camera frame; with `tasks` holding
detection the boxes come from the checkpoint's box head (`--detections head`, read from the vision encoder's
output of the plan's own decode) or, as text (`--detections text`), are decoded in the same batch as the plan
(a second row) and the batch runs until both rows end, within the larger budget. This measures both settings on the same validation frames (their ego state
and command), taking turns frame by frame (the order swapped every frame, so load on a shared machine falls on
both alike), and prints the wall time per call (p50, p95, mean) and the paired ratio.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from wam_diff_core.constants import DETECTION_SOURCES, DTYPE_CHOICES
from wam_diff_core.evaluate import _images
from wam_diff_core.evaluate_data import load_task
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.prompts import parse_planning_ego


def _command(prompt: str) -> str:
    return prompt.split("Navigation command: ", 1)[1].split(".", 1)[0]


def summary(ms: list[float]) -> dict:
    v = np.asarray(ms)
    return {"p50_ms": float(np.median(v)), "p95_ms": float(np.percentile(v, 95)), "mean_ms": float(v.mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nano-s-b32")
    ap.add_argument("--data", required=True)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--detections", default="auto", choices=DETECTION_SOURCES)
    ap.add_argument("--dtype", default=None, choices=DTYPE_CHOICES)
    ap.add_argument("--steps", type=int, default=None, help="K (default: the checkpoint's)")
    ap.add_argument("--threshold", type=float, default=None, help="remasking threshold (default: the checkpoint's)")
    args = ap.parse_args()
    policy = DrivingPolicy.load(args.model, dtype=args.dtype, detections=args.detections, steps=args.steps,
                                threshold=args.threshold)
    frames = load_task(args.data, "planning", args.frames + args.warmup, policy.loaded.settings.prompt_route_targets)
    settings = {"planning": ("planning",), "planning,detection": ("planning", "detection")}
    ms = {k: [] for k in settings}
    detections, parsed = [], 0
    for i, s in enumerate(frames):
        images, ego = _images(s), parse_planning_ego(s.prompt)
        order = list(settings) if i % 2 == 0 else list(settings)[::-1]
        for name in order:
            t0 = time.perf_counter()
            plan = policy.plan(images, ego, _command(s.prompt), tasks=settings[name])
            dt = (time.perf_counter() - t0) * 1000.0
            if i < args.warmup:
                continue
            ms[name].append(dt)
            if name == "planning,detection":
                parsed += "detection" not in plan.errors
                detections.append(len(plan.detections or []))
    a, b = np.asarray(ms["planning"]), np.asarray(ms["planning,detection"])
    out = {"model": args.model, "frames": len(a), "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} "
           f"torch threads, torch {torch.__version__}", "decoding": {"block_size": policy.config.block_size,
           "steps": policy.config.steps, "threshold": policy.config.threshold,
           "dtype": str(next(policy.loaded.model.parameters()).dtype)}, "detections": policy.detections, **{k: summary(v) for k, v in ms.items()},
           "paired_ratio_p50": float(np.median(b / a)), "added_ms_p50": float(np.median(b - a)),
           "detection_answers_parsed_share": parsed / len(b), "boxes_per_frame_mean": float(np.mean(detections))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
