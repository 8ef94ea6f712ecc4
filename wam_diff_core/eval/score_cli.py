"""`wam-diff score`: re-score saved closed-loop results, or score open-loop predictions.

  wam-diff score RUN_DIR                      closed loop: RUN_DIR/routes/*.json -> Bench2Drive summary
  wam-diff score --leaderboard RESULTS.json   a leaderboard / Bench2Drive result file (_checkpoint.records):
                                              every route re-scored from its infractions -> DS, SR, abilities,
                                              and the routes whose score_composed disagrees
  wam-diff score --dataset DATA_DIR/val.json --predictions PRED.jsonl
                                              open loop: L2 per horizon + PDMS (planning), COCO mAP
                                              (detection), QA accuracy; PRED.jsonl lines {"id", "text"}
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from . import bench2drive
from ..errors import UsageError


def load_route_records(run_dir: Path) -> list[dict]:
    d = Path(run_dir)
    route_dir = d / "routes" if (d / "routes").is_dir() else d
    files = sorted(p for p in route_dir.glob("*.json") if p.name != "summary.json")
    if not files:
        raise FileNotFoundError(f"no per-route JSON files in {route_dir}")
    return [json.loads(p.read_text()) for p in files]


def rescore(run_dir: Path, suite: str | None = None) -> dict:
    """Bench2Drive summary of saved per-route records (missing suite routes count 0 when a suite is given)."""
    records = load_route_records(run_dir)
    expected = None
    if suite:
        from ..sim.routes import load_routes

        expected = [r.route_id for r in load_routes(suite)]
    return bench2drive.summarize(records, expected_route_ids=expected)


def score_open_loop(dataset: Path, predictions: Path, scenes: Path | None = None) -> dict:
    """Open-loop metrics of predictions against a dataset split written by `wam-diff data`."""
    from ..codec import ParseError, parse_detections, parse_trajectory
    from .coco import coco_map
    from .l2 import l2_report
    from .pdm import mean_pdms, pdm_score, scene_from_dict
    from .qa import qa_accuracy

    samples = {s["id"]: s for s in json.loads(Path(dataset).read_text())}
    preds = {}
    for line in Path(predictions).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            preds[row["id"]] = row["text"]
    scene_file = Path(scenes) if scenes else Path(dataset).parent / "scenes_val.jsonl"
    scene_map = {}
    if scene_file.is_file():
        for line in scene_file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                scene_map[row["id"]] = row
    out: dict = {"dataset": str(dataset), "predictions": len(preds)}
    # planning
    p_traj, g_traj, pdms, invalid = [], [], [], 0
    det_pred, det_gt, qa_p, qa_g = [], [], [], []
    for sid, s in samples.items():
        if sid not in preds:
            continue
        ref = s["conversations"][1]["value"]
        if s["task"] == "planning":
            gt = parse_trajectory(ref)
            pr = parse_trajectory(preds[sid])
            if isinstance(pr, ParseError):
                invalid += 1
                continue
            p_traj.append(pr)
            g_traj.append(gt)
            if sid in scene_map:
                pdms.append(pdm_score(pr, scene_from_dict(scene_map[sid])))
        elif s["task"] == "detection":
            size = (1000, 1000)
            gt = parse_detections(ref, size)
            pr = parse_detections(preds[sid], size)
            det_gt.append([] if isinstance(gt, ParseError) else [d.box_norm for d in gt])
            det_pred.append([] if isinstance(pr, ParseError) else [d.box_norm for d in pr])
        elif s["task"] == "qa":
            qa_p.append(preds[sid])
            qa_g.append(ref)
    if p_traj:
        out["planning"] = {**l2_report(np.stack(p_traj), np.stack(g_traj)), "invalid": invalid, "pdm": mean_pdms(pdms)}
    elif invalid:
        out["planning"] = {"invalid": invalid}
    if det_gt:
        out["detection"] = coco_map(det_pred, det_gt)
    if qa_g:
        out["qa"] = qa_accuracy(qa_p, qa_g)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", nargs="?", help="closed-loop output directory of `wam-diff drive`")
    parser.add_argument("--leaderboard", default=None, metavar="RESULTS.json",
                        help="re-score a leaderboard / Bench2Drive result file (the evaluator's --checkpoint "
                             "file or a merged one)")
    parser.add_argument("--suite", default=None, help="route suite: missing routes count as 0")
    parser.add_argument("--dataset", default=None, help="open loop: a split JSON written by `wam-diff data`")
    parser.add_argument("--predictions", default=None, help="open loop: JSONL of {id, text}")
    parser.add_argument("--scenes", default=None, help="open loop: PDM scenes JSONL (default next to the dataset)")
    parser.add_argument("--out", default=None, help="write the result JSON here")


def score_leaderboard(path: Path) -> dict:
    """Re-score every route of a leaderboard result file (wam_diff_core.eval.leaderboard.score_results)."""
    from . import leaderboard

    return leaderboard.score_results(leaderboard.load_results(path), source=str(path))


def run(args) -> int:
    if args.leaderboard:
        if args.run_dir or args.dataset or args.predictions:
            raise UsageError("--leaderboard takes no run directory, --dataset or --predictions")
        from .leaderboard import format_report

        result = score_leaderboard(Path(args.leaderboard))
        print(format_report(result))
    elif args.dataset or args.predictions:
        if not (args.dataset and args.predictions):
            raise UsageError("open-loop scoring needs both --dataset and --predictions")
        result = score_open_loop(Path(args.dataset), Path(args.predictions), args.scenes)
        print(json.dumps(result, indent=2))
    else:
        if not args.run_dir:
            raise UsageError("give a run directory (closed loop) or --dataset/--predictions (open loop)")
        result = rescore(Path(args.run_dir), args.suite)
        print(bench2drive.format_table(result))
    out = Path(args.out) if args.out else (Path(args.run_dir) / "summary_rescored.json" if args.run_dir else None)
    if out and args.leaderboard and not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    if out:
        out.write_text(json.dumps(result, indent=2))
        print(f"written: {out}")
    return 0
