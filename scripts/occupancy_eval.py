"""How well a checkpoint's visual tokens say where the vehicles are, on held-out frames.

Reads a stage trained with `perception.occupancy_weight` (its `model/` and the training-only
`occupancy_head.pt` beside it) and scores the head on a split's planning frames (targets from
`meta.boxes_px`, as in training): class-balanced BCE, recall of occupied cells, the share of empty cells
called occupied and the precision of the cells called occupied. `--head` can point another checkpoint at a head (e.g. a B = 32 student's tower
read by its AR teacher's head, to see how far distillation moved the tower).

    .venv/bin/python scripts/occupancy_eval.py --stage runs/occ/nano_s/ar --data runs/occ/data_plan/val.json \
        --out runs/occ/occupancy_eval.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from training.data import DrivingDataset, Example, spaced_indices
from training.perception import OccupancyHead, occupancy_loss
from training.trainer import FINAL_DIR, OCCUPANCY_HEAD_FILE


@torch.no_grad()
def score(model, head: OccupancyHead, examples: list[Example], batch: int = 16) -> dict:
    logits, targets = [], []
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        pix = torch.cat([x.pixel_values for x in chunk])
        grid = torch.cat([x.image_grid_thw for x in chunk])
        feats = model.model.get_image_features(pix, grid, return_dict=True).pooler_output
        logits.append(head(torch.cat(feats)))
        targets.append(torch.cat([x.occupancy for x in chunk]))
    bce, stats = occupancy_loss(torch.cat(logits), torch.cat(targets))
    return {k: float(v) for k, v in stats.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", required=True, help="a stage directory with model/ and occupancy_head.pt")
    ap.add_argument("--model", action="append", default=[], help="other checkpoints read by the same head (repeatable)")
    ap.add_argument("--data", required=True, help="a split written by `wam-diff data` (meta.boxes_px)")
    ap.add_argument("--task", default="planning", help="the split's task whose frames are scored")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from wam_diff_core.model.checkpoint import load

    stage = Path(args.stage)
    head_file = stage / OCCUPANCY_HEAD_FILE
    if not head_file.is_file():
        raise SystemExit(f"{head_file} not found: was {stage} trained with perception.occupancy_weight > 0?")
    state = torch.load(head_file, map_location="cpu")
    cells = int(round(state["proj.weight"].shape[0] ** 0.5))
    head = OccupancyHead(state["proj.weight"].shape[1], cells)
    head.load_state_dict(state)
    head.eval()
    result = {"stage": str(stage), "data": args.data, "cells": cells, "models": {}}
    for path in [str(stage / FINAL_DIR)] + args.model:
        loaded = load(path)
        ds = DrivingDataset(args.data, loaded.processor, tasks=args.task, occupancy_cells=cells, trajectory_format="fixed")
        examples = [x for x in (ds[i] for i in spaced_indices(len(ds), args.samples))
                    if isinstance(x, Example) and not torch.isnan(x.occupancy).all()]  # frames with boxes in meta
        result["models"][path] = {"frames": len(examples), **score(loaded.model.eval(), head, examples)}
        r = result["models"][path]
        print(f"{path:<60} frames {r['frames']:>4}  bce {r['occ_bce']:.3f}  recall {r['occ_recall']:.3f}  "
              f"false pos {r['occ_false_pos']:.3f}  precision {r['occ_precision']:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
