"""Does a checkpoint's language model use its image?

For evenly spaced samples of a split, the model's own training objective at t = 1 (every response token
masked, blocks of the model's trained size: next-token cross-entropy for B = 1) is measured three times:
with the sample's own image, with another sample's image (same prompt and answer: a derangement of the
images), and with a featureless image (every patch at the processor's mean). A model that reads its
image answers worse with the wrong one; one that ignores it scores the same.

    .venv/bin/python scripts/image_reliance.py --model models/nano-s-b32 --data runs/data_v1/val.json \
        --tasks detection --out runs/image_reliance.json

Prints a table and writes JSON: mean cross-entropy (nats per answer token) per condition, the share of
samples whose own image gives the lower loss, and reliance = (CE other image - CE own) / CE own.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

CONDITIONS = ("own", "other", "blank")


def other_images(examples: list) -> list:
    """Each example with the image of the example half the list away (a derangement when n >= 2).
    Raises ValueError when two examples' image grids differ (the images would not fit the prompt)."""
    n = len(examples)
    if n < 2:
        raise ValueError(f"need at least 2 examples to swap images, got {n}")
    out = []
    for i, ex in enumerate(examples):
        donor = examples[(i + max(1, n // 2)) % n]
        if not torch.equal(ex.image_grid_thw, donor.image_grid_thw):
            raise ValueError(f"samples {ex.sample_id!r} and {donor.sample_id!r} have different image grids "
                             f"{ex.image_grid_thw.tolist()} vs {donor.image_grid_thw.tolist()}")
        out.append(dataclasses.replace(ex, pixel_values=donor.pixel_values))
    return out


def blank_images(examples: list) -> list:
    return [dataclasses.replace(ex, pixel_values=torch.zeros_like(ex.pixel_values)) for ex in examples]


@torch.no_grad()
def answer_ce(loaded, examples: list, block_size: int) -> np.ndarray:
    """Per example: cross-entropy per answer token with every answer token masked (t = 1)."""
    from training.collate import collate
    from training.objective import SelectedLogits, diffusion_loss

    module = SelectedLogits(loaded.model)
    out = []
    for ex in examples:
        batch = collate([ex], loaded.pad_token_id, with_noisy=True)
        res = diffusion_loss(module, loaded.model, batch, block_size, loaded.settings.mask_token_id, force_t=1.0)
        out.append(float(res.stats["ce"]))
    return np.array(out)


def reliance(loaded, examples: list, block_size: int) -> dict:
    ce = {"own": answer_ce(loaded, examples, block_size),
          "other": answer_ce(loaded, other_images(examples), block_size),
          "blank": answer_ce(loaded, blank_images(examples), block_size)}
    own = float(ce["own"].mean())
    return {"samples": len(examples), **{f"ce_{k}": float(v.mean()) for k, v in ce.items()},
            "own_lower_share": float((ce["own"] < ce["other"]).mean()),
            "reliance": (float(ce["other"].mean()) - own) / own if own > 0 else 0.0}


def main() -> int:
    from wam_diff_core.model.checkpoint import load_model
    from training.data import DrivingDataset, spaced_examples

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="checkpoint directory (repeatable)")
    ap.add_argument("--data", action="append", required=True, help="split file (repeatable; one per task below "
                    "or one for all)")
    ap.add_argument("--tasks", default="planning", help="comma-separated tasks, paired with --data in order")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    if len(args.data) not in (1, len(tasks)):
        ap.error(f"give one --data for all tasks or one per task ({len(tasks)}), got {len(args.data)}")
    splits = args.data * len(tasks) if len(args.data) == 1 else args.data
    torch.set_num_threads(args.threads)
    rows, t0 = [], time.perf_counter()
    for path in args.model:
        loaded = load_model(path)
        loaded.model.eval()
        B = loaded.settings.trained_block_size
        for task, split in zip(tasks, splits):
            ds = DrivingDataset(split, loaded.processor, 1 << 16, 1 << 16, "skip", tasks=[task],
                                trajectory_format=loaded.settings.trajectory_format,
                                route_targets=loaded.settings.prompt_route_targets)
            if len(ds) < 2:
                raise SystemExit(f"{split}: fewer than 2 usable {task!r} samples")
            row = {"model": path, "block_size": B, "task": task, "split": split,
                   **reliance(loaded, spaced_examples(ds, args.samples), B)}
            rows.append(row)
            print(f"{path:55s} B={B:<3d} {task:10s} CE own {row['ce_own']:.3f}  other image {row['ce_other']:.3f}  "
                  f"blank {row['ce_blank']:.3f}  own lower {100 * row['own_lower_share']:5.1f} %  "
                  f"reliance {100 * row['reliance']:+.1f} %", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "wall_s": round(time.perf_counter() - t0, 1)}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
