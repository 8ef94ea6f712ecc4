"""`wam-diff score --nuscenes DATA/val.json (--predictions PRED.jsonl | --model MODEL)`: open-loop planning metrics on a
split written by `wam-diff data --nuscenes`, at 1, 2 and 3 s in the two conventions the literature mixes:

  ST-P3 (also VAD's tables): the value at t is the mean over the waypoints up to t (0.5 s, 1.0 s, ... t);
  UniAD: the value at the waypoint at t.

L2: the Euclidean distance (m) between planned and logged ego positions. Collision rate (%): ST-P3's box check
(its `obj_box_col`, which VAD and UniAD report): an ego box of EGO_LENGTH_M x EGO_WIDTH_M, axis-aligned in the
current ego frame (not turned with the plan) and centred EGO_CENTRE_AHEAD_M ahead of each planned waypoint, against
the annotated vehicle.* boxes at that future keyframe (OUT/future_boxes_<split>.jsonl); a waypoint where the logged
trajectory itself collides is not counted. Box overlap is tested exactly, where ST-P3 rasterises onto 0.5 m cells.

PRED.jsonl lines are {"id", "text"} (the form `wam-diff score --predictions` reads); `--model` decodes the split's
planning samples with DrivingPolicy first and writes them (`--save-predictions`, default next to --out).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from ..errors import UsageError
from .geometry import EGO_CENTRE_AHEAD_M, EGO_LENGTH_M, EGO_WIDTH_M, box_corners, boxes_overlap

HORIZONS_S = (1.0, 2.0, 3.0)
CONVENTIONS = {"stp3": "ST-P3 (mean up to t)", "uniad": "UniAD (at t)"}


def by_convention(per_waypoint: np.ndarray) -> dict:
    """Per-sample, per-waypoint values (N, NUM_WAYPOINTS) -> {"stp3"|"uniad": {"1s", "2s", "3s", "avg"}}: ST-P3's
    mean over the waypoints up to t and UniAD's value at t, each averaged over samples; avg = mean of the three."""
    v = np.asarray(per_waypoint, dtype=np.float64)
    out = {}
    for name in CONVENTIONS:
        row = {}
        for t in HORIZONS_S:
            n = int(round(t / WAYPOINT_DT_S))
            row[f"{t:g}s"] = float(v[:, :n].mean()) if name == "stp3" else float(v[:, n - 1].mean())
        row["avg"] = float(np.mean([row[f"{t:g}s"] for t in HORIZONS_S]))
        out[name] = row
    return out


def collisions(trajectory: np.ndarray, boxes: list) -> np.ndarray:
    """(NUM_WAYPOINTS,) bool: does the ego box at waypoint j overlap an annotated box of future keyframe j?
    trajectory: (NUM_WAYPOINTS, 2) m; boxes[j]: [[x, y, yaw, length, width], ...] in the same frame."""
    out = np.zeros(NUM_WAYPOINTS, dtype=bool)
    for j, (x, y) in enumerate(np.asarray(trajectory, dtype=np.float64)):
        ego = box_corners(x + EGO_CENTRE_AHEAD_M, y, 0.0, EGO_LENGTH_M, EGO_WIDTH_M)
        out[j] = any(boxes_overlap(ego, box_corners(*b)) for b in boxes[j])
    return out


def read_predictions(path: Path) -> dict[str, str]:
    if not Path(path).is_file():
        raise UsageError(f"--predictions {path}: not a file (expected JSONL of {{id, text}})")
    preds = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                preds[str(row["id"])] = str(row["text"])
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"{path}:{n}: expected a JSON object with 'id' and 'text' ({exc})") from None
    return preds


def planning_samples(dataset: Path) -> list[dict]:
    """The planning samples of a split file written by `wam-diff data --nuscenes`."""
    if not Path(dataset).is_file():
        raise UsageError(f"--nuscenes {dataset}: not a file (expected OUT/val.json of `wam-diff data --nuscenes`)")
    samples = [s for s in json.loads(Path(dataset).read_text()) if s.get("task") == "planning"]
    if not samples:
        raise UsageError(f"--nuscenes {dataset}: no planning samples")
    return samples


def default_boxes(dataset: Path) -> Path:
    return Path(dataset).parent / f"future_boxes_{Path(dataset).stem}.jsonl"


def score(dataset: Path, predictions: dict[str, str], boxes: Optional[Path] = None) -> dict:
    """L2 and collision rate of the predictions of a split's planning samples, in both conventions. Samples without
    a prediction are left out; unparsable ones are counted as invalid."""
    from ..codec import ParseError, parse_trajectory

    samples = planning_samples(dataset)
    boxes = Path(boxes) if boxes else default_boxes(dataset)
    future_boxes = {}
    if boxes.is_file():
        future_boxes = {r["id"]: r["boxes"] for r in map(json.loads, filter(str.strip, boxes.read_text().splitlines()))}
    pred, gt, ids, invalid = [], [], [], 0
    for s in samples:
        if s["id"] not in predictions:
            continue
        p = parse_trajectory(predictions[s["id"]])
        if isinstance(p, ParseError):
            invalid += 1
            continue
        pred.append(p)
        gt.append(parse_trajectory(s["conversations"][1]["value"]))
        ids.append(s["id"])
    out = {"dataset": str(dataset), "planning_samples": len(samples), "plans": len(pred), "invalid": invalid}
    if not pred:
        return out
    pred, gt = np.stack(pred), np.stack(gt)
    out["l2_m"] = by_convention(np.linalg.norm(pred - gt, axis=-1))
    missing = [i for i in ids if i not in future_boxes]
    if missing:
        out["collision"] = f"not scored: no future boxes for {len(missing)} plans in {boxes}"
        return out
    gt_hits = np.stack([collisions(g, future_boxes[i]) for g, i in zip(gt, ids)])
    hits = np.stack([collisions(p, future_boxes[i]) for p, i in zip(pred, ids)]) & ~gt_hits
    out["collision_pct"] = {k: {t: 100.0 * v for t, v in row.items()} for k, row in by_convention(hits).items()}
    out["gt_collision_waypoints"] = int(gt_hits.sum())
    return out


def format_table(result: dict) -> str:
    lines = [f"nuScenes open loop: {result['plans']} plans ({result['invalid']} invalid) of {result['dataset']}"]
    cols = [f"{t:g}s" for t in HORIZONS_S] + ["avg"]
    lines.append(f"{'':24s}" + "".join(f"{c:>8s}" for c in cols))
    for key, unit in (("l2_m", "L2 (m)"), ("collision_pct", "Collision (%)")):
        for name, label in CONVENTIONS.items():
            if key in result:
                row = result[key][name]
                lines.append(f"{unit + ' ' + label.split()[0]:24s}" + "".join(f"{row[c]:8.3f}" for c in cols))
    if "collision" in result:
        lines.append(f"Collision: {result['collision']}")
    elif "gt_collision_waypoints" in result:
        lines.append(f"(logged-trajectory collisions not counted: {result['gt_collision_waypoints']} waypoints)")
    return "\n".join(lines)


def decode(dataset: Path, model: str, device: str = "cpu", limit: Optional[int] = None,
           progress: bool = True) -> tuple[dict[str, str], dict]:
    """Predictions {id: text} of a split's planning samples (evenly spaced, at most `limit`) by DrivingPolicy, one
    plan per sample as the planner node makes it, and the decode clock {"plans", "seconds", "plans_per_s"}."""
    from PIL import Image
    from tqdm import tqdm

    from ..policy import DrivingPolicy
    from ..prompts import parse_planning_ego

    samples = planning_samples(dataset)
    if limit is not None and limit < len(samples):
        samples = [samples[int(i)] for i in np.unique(np.linspace(0, len(samples) - 1, limit).round())]
    policy = DrivingPolicy.load(model, device=device)
    preds, seconds = {}, 0.0
    for s in tqdm(samples, desc="plan", unit="plan", disable=not progress):
        with Image.open(Path(dataset).parent / s["image"][0]) as img:
            image = np.asarray(img.convert("RGB"))
        ego = parse_planning_ego(s["conversations"][0]["value"])
        t0 = time.perf_counter()
        plan = policy.plan([image], ego, s["meta"]["command"])
        seconds += time.perf_counter() - t0
        preds[s["id"]] = plan.raw_text.get("planning", "")
    return preds, {"plans": len(preds), "seconds": round(seconds, 2), "plans_per_s": round(len(preds) / seconds, 2)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nuscenes", required=True, metavar="SPLIT.json",
                        help="a split written by `wam-diff data --nuscenes` (OUT/val.json)")
    parser.add_argument("--predictions", default=None, help="JSONL of {id, text}")
    parser.add_argument("--model", default=None, help="decode the planning samples with this checkpoint instead")
    parser.add_argument("--device", default="cpu", help="with --model (default cpu)")
    parser.add_argument("--limit", type=int, default=None, help="with --model: at most N evenly spaced samples")
    parser.add_argument("--boxes", default=None, help="future boxes JSONL (default: future_boxes_<split>.jsonl beside it)")
    parser.add_argument("--save-predictions", default=None,
                        help="with --model: write the predictions here (default: <out>.predictions.jsonl with --out)")
    parser.add_argument("--out", default=None, help="write the result JSON here")
    parser.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    if bool(args.predictions) == bool(args.model):
        raise UsageError("give one of --predictions PRED.jsonl or --model MODEL")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: expected a number of samples >= 1")
    out = Path(args.out) if args.out else None
    if out and not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    clock = None
    if args.model:
        preds, clock = decode(Path(args.nuscenes), args.model, args.device, args.limit, not args.no_progress)
        save = Path(args.save_predictions) if args.save_predictions else (out.with_suffix(".predictions.jsonl") if out else None)
        if save:
            save.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in preds.items()))
    else:
        preds = read_predictions(Path(args.predictions))
    result = score(Path(args.nuscenes), preds, args.boxes)
    if clock:
        result["decode"] = {"model": args.model, "device": args.device, **clock}
    print(format_table(result))
    if out:
        out.write_text(json.dumps(result, indent=2))
        print(f"written: {out}")
    return 0
