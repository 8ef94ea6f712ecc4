#!/usr/bin/env python3
"""Open-loop effect of candidates and scorers on the planning validation frames: L2 against the expert and PDMS.

Each frame is planned once with N candidates and the detection task in the same batch (candidate 0 is the plan
without candidates, token for token); each scorer then picks among the same candidates:
  perception  the model's own boxes of this frame and, with --previous-frame, of the split's frame 0.3 s earlier
              on the same route (the forecasts then move; without it every vehicle stands still), the ego state
              and the route target the frame's prompt states;
  oracle      the frame's PDM scene: the true vehicles with their logged futures and the lanes (the scene the
              PDMS is computed on, so this is the ceiling of scoring, not a method);
  likelihood  the mean token log-probability of each answer.
Perception and oracle are also scored with braking plans (`scoring.braking`: the greedy path braked, added when
every candidate is forecast to collide), as `wam-diff drive` scores by default ("..._braking" variants).
Frames and scenes are the validation split the shipped models are evaluated on (`wam_diff_core.bench.frames`,
rendered into --cache on first use). One JSON line per frame lands in --rows (a rerun resumes); the summary
(L2 per horizon, PDMS and its terms, the share of plans won by a candidate other than 0, the mean pairwise
distance of the candidates' last waypoints) is printed and written to --json.

  scripts/candidates_open_loop.py --model models/nano-s-b32 --candidates 8 --samples 1640 \
      --rows runs/cand/open_loop_rows.jsonl --json results/candidates/open_loop_node.json \
      [--steps 2 --threshold 0.3 --dtype auto]   # decoding options; default the checkpoint's own
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from wam_diff_core.bench.frames import planning_frames, route_target_for
from wam_diff_core.decoding.options import add_decoding_arguments, decoding_arguments
from wam_diff_core.eval.l2 import l2_report
from wam_diff_core.eval.pdm import mean_pdms, pdm_score, scene_from_dict
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.scoring.base import ScoringContext, choose
from wam_diff_core.scoring.braking import choose_or_brake
from wam_diff_core.scoring.camera import TopDownCamera
from wam_diff_core.scoring.registry import make_scorer
from wam_diff_core.types import Detection

FRAME_SIZE = (256, 128)
FRAME_EVERY_S = 0.3  # the validation split's frames: every third 10 Hz tick of a route


def previous_id(frame_id: str) -> str | None:
    """The id of the split's frame before `frame_id` on the same route ('<route>_<tick>_plan', ticks 3 apart)."""
    head, tick, tail = frame_id.rsplit("_", 2)
    return f"{head}_{int(tick) - 3:04d}_{tail}" if tick.isdigit() and int(tick) >= 3 else None


def load_scenes(cache: Path) -> tuple[dict, dict]:
    """The PDM scenes of the rendered split and the world's boxes of each frame (pixels), by sample id."""
    scenes, boxes = {}, {}
    for part in sorted((cache / f"val_{FRAME_SIZE[0]}x{FRAME_SIZE[1]}" / "parts").glob("*.json")):
        data = json.loads(part.read_text())
        for scene in data.get("scenes", []):
            scenes[scene["id"]] = scene
        for sample in data.get("samples", []):
            boxes[sample["id"]] = (sample.get("meta") or {}).get("boxes_px") or []
    return scenes, boxes


def contexts(frame, plan, scene, boxes, previous=None) -> dict:
    """What each scorer sees on one frame; `perception_true_boxes`: the perception scorer on the world's own boxes
    of the frame (what it would see with a perfect detector); `previous`: the model's boxes FRAME_EVERY_S earlier."""
    camera = TopDownCamera(int(frame.image.shape[1]), int(frame.image.shape[0]))
    base = dict(ego=frame.ego, command=frame.command, route_target=frame.target)
    true = tuple(Detection("car", tuple(b), (0, 0, 0, 0), 1.0) for b in boxes)
    earlier = {} if previous is None else {"previous_detections": tuple(previous), "previous_age_s": FRAME_EVERY_S}
    return {"perception": ScoringContext(**base, detections=tuple(plan.detections or ()), camera=camera, **earlier),
            "perception_true_boxes": ScoringContext(**base, detections=true, camera=camera),
            "oracle": ScoringContext(**base, agents=tuple(scene.agents), lanes=tuple(scene.lanes)),
            "likelihood": ScoringContext(**base)}


def plan_row(policy, frame, scene, boxes, n: int, sampling: str, previous_frame=None) -> dict:
    """Plan one frame with n candidates and detections; each scorer's choice and scores (`previous_frame`: the
    route's frame before it, whose detections the perception scorer forecasts from)."""
    settings = policy.loaded.settings
    target = route_target_for(frame, settings.route_target, settings.route_targets_only_on)
    t0 = time.perf_counter()
    plan = policy.plan([frame.image], frame.ego, frame.command, target=target, tasks=("planning", "detection"),
                       candidates=n, sampling=sampling)
    wall = time.perf_counter() - t0
    row = {"id": frame.id, "scenario": frame.scenario, "wall_s": round(wall, 4), "truth": frame.truth.tolist(),
           "detections": len(plan.detections or ()), "detection_parsed": "detection" not in plan.errors,
           "candidates": [None if c.trajectory is None else c.trajectory.tolist() for c in plan.candidates],
           "logprobs": [round(float(c.logprob), 5) for c in plan.candidates], "chosen": {}, "scores": {}}
    previous = None if previous_frame is None else \
        policy.plan([previous_frame.image], previous_frame.ego, previous_frame.command, tasks=("detection",)).detections
    row["previous_frame"] = previous is not None
    row["braking"] = {}
    for name, context in contexts(frame, plan, scene, boxes, previous).items():
        scorer = make_scorer(name.split("_")[0])
        scores = np.asarray(scorer.score(plan.candidates, context), dtype=np.float64)
        row["chosen"][name] = choose(plan, scorer, context).chosen
        row["scores"][name] = [round(float(s), 5) if np.isfinite(s) else None for s in scores]
        if hasattr(scorer, "terms"):  # the same scorer with braking plans where every candidate collides
            braked, _ = choose_or_brake(plan, scorer, context)
            row["chosen"][f"{name}_braking"] = braked.chosen
            if braked.chosen >= n:
                row["braking"][name] = braked.trajectory.tolist()
    return row


def picked(row: dict, variant: str, k: int):
    """The trajectory a variant's choice `k` names: a candidate, or the braking plan it added."""
    if k < len(row["candidates"]):
        return row["candidates"][k]
    return row["braking"][variant[: -len("_braking")]]


def summarize(rows: list[dict], scenes: dict) -> dict:
    """L2 and PDMS of candidate 0 (N = 1) and of each scorer's choice, with diversity and costs."""
    n = len(rows[0]["candidates"])
    variants = {"N=1": (None, lambda r: 0),
                **{f"N={n} {s}": (s, lambda r, s=s: r["chosen"][s]) for s in rows[0]["chosen"]}}
    out = {"frames": len(rows), "variants": {}}
    truth = np.array([r["truth"] for r in rows])
    for name, (variant, pick) in variants.items():
        chosen = [pick(r) for r in rows]
        trajs = [picked(r, variant, k) for r, k in zip(rows, chosen)]
        ok = [i for i, t in enumerate(trajs) if t is not None]
        pred = np.array([trajs[i] for i in ok])
        pdms = [pdm_score(pred[j], scene_from_dict(scenes[rows[i]["id"]])) for j, i in enumerate(ok)]
        out["variants"][name] = {**l2_report(pred, truth[ok]), "invalid": len(rows) - len(ok),
                                 "pdm": mean_pdms(pdms),
                                 "not_candidate_0": round(float(np.mean(np.array(chosen) != 0)), 4),
                                 "braking_won": round(float(np.mean(np.array(chosen) >= n)), 4)}
    ends = []
    for r in rows:
        last = [np.asarray(t)[-1] for t in r["candidates"] if t is not None]
        pairs = [np.linalg.norm(a - b) for a, b in itertools.combinations(last, 2)]
        if pairs:
            ends.append(float(np.mean(pairs)))
    drawn = sum(len(r["candidates"]) for r in rows)
    out["invalid_candidates"] = sum(t is None for r in rows for t in r["candidates"])
    out["invalid_candidate_share"] = round(out["invalid_candidates"] / max(drawn, 1), 4)
    out["mean_pairwise_endpoint_m"] = round(float(np.mean(ends)), 3) if ends else None
    out["plan_ms_mean"] = round(1000 * float(np.mean([r["wall_s"] for r in rows])), 1)
    out["detections_per_frame"] = round(float(np.mean([r["detections"] for r in rows])), 3)
    out["detection_answers_parsed"] = round(float(np.mean([r.get("detection_parsed", True) for r in rows])), 4)
    out["frames_with_previous_frame"] = sum(bool(r.get("previous_frame")) for r in rows)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/nano-s-b32")
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--sampling", default="tokens")
    parser.add_argument("--samples", type=int, default=1640)
    parser.add_argument("--cache", default="runs/bench", help="where the rendered validation frames live")
    parser.add_argument("--rows", required=True, help="JSONL, one line per frame (resumed)")
    parser.add_argument("--json", required=True, help="summary JSON")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--previous-frame", action="store_true",
                        help="the perception scorer also reads the model's boxes of the route's frame 0.3 s earlier")
    add_decoding_arguments(parser)  # default: the checkpoint's own decoding
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    frames = planning_frames(None, args.cache, FRAME_SIZE, args.samples)
    scenes, boxes = load_scenes(Path(args.cache))
    rows_path = Path(args.rows)
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in rows_path.read_text().splitlines()} if rows_path.is_file() else set()
    todo = [f for f in frames if f.id not in done]
    policy = DrivingPolicy.load(args.model, device=args.device, **decoding_arguments(args)) if todo else None
    by_id = {f.id: f for f in frames}
    with open(rows_path, "a") as fh:
        for frame in tqdm(todo, desc="open loop", unit="frame"):
            prev = by_id.get(previous_id(frame.id)) if args.previous_frame else None
            fh.write(json.dumps(plan_row(policy, frame, scene_from_dict(scenes[frame.id]), boxes.get(frame.id, []),
                                         args.candidates, args.sampling, prev)) + "\n")
            fh.flush()
    wanted = {f.id for f in frames}
    rows = [r for r in map(json.loads, rows_path.read_text().splitlines()) if r["id"] in wanted]
    summary = {"model": args.model, "decoding": decoding_arguments(args), "candidates": args.candidates,
               "sampling": args.sampling,
               "command": "scripts/candidates_open_loop.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               **summarize(rows, scenes)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2))
    for name, v in summary["variants"].items():
        print(f"{name:28s} L2 {v['l2_mean']:.3f} m  PDMS {100 * v['pdm']['pdms']:.1f}  invalid {v['invalid']}  "
              f"not candidate 0 {100 * v['not_candidate_0']:.1f} %")
    print(f"frames {summary['frames']}, endpoint spread {summary['mean_pairwise_endpoint_m']} m, "
          f"plan {summary['plan_ms_mean']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
