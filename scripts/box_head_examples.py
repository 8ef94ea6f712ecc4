"""A picture of what the box head sees: validation frames with the world's boxes and the head's.

    .venv/bin/python scripts/box_head_examples.py --model models/nano-s-b32 --data runs/det_val/val.json \\
        --frames 8 --min-score 0.3 --out results/perception/examples.png

Frames evenly spaced over the split, each drawn at 3x with the world's boxes (`meta.boxes_px`, green) and the head's
boxes scored at least `--min-score` (red, with the score), and per frame how many of each there are.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from PIL import Image  # noqa: E402

from wam_diff_core.evaluate_data import spaced_indices  # noqa: E402
from wam_diff_core.policy import DrivingPolicy  # noqa: E402
from wam_diff_core.types import EgoState  # noqa: E402


def _boxes(ax, boxes, colour, scores=None) -> None:
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=1.2))
        if scores is not None:
            ax.text(x1, y1 - 1.5, f"{scores[i]:.2f}", color=colour, fontsize=6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/nano-s-b32")
    ap.add_argument("--data", required=True, help="a `wam-diff data` split whose samples carry meta.boxes_px")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--min-score", type=float, default=0.3)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    samples = [s for s in json.loads(Path(args.data).read_text()) if (s.get("meta") or {}).get("boxes_px")]
    picked = [samples[i] for i in spaced_indices(len(samples), args.frames)]
    policy = DrivingPolicy.load(args.model, tasks=("detection",), detections="head")
    fig, axes = plt.subplots((len(picked) + 1) // 2, 2, figsize=(10, 1.45 * len(picked)))
    for ax, s in zip(np.ravel(axes), picked):
        image = np.asarray(Image.open(Path(args.data).parent / s["image"][0]).convert("RGB"))
        dets = [d for d in policy.plan([image], EgoState(0.0), "follow lane").detections if d.score >= args.min_score]
        ax.imshow(image)
        _boxes(ax, s["meta"]["boxes_px"], "lime")
        _boxes(ax, [d.box_px for d in dets], "red", [d.score for d in dets])
        ax.set_title(f"{s['id']}: {len(s['meta']['boxes_px'])} true (green), {len(dets)} found (red)", fontsize=7)
        ax.axis("off")
    for ax in np.ravel(axes)[len(picked):]:
        ax.axis("off")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
