"""COCO mAP of 2D detections, computed with pycocotools.

Boxes are (x1, y1, x2, y2) in any consistent unit (pixels or the 0..1000 Qwen3-VL scale) per image.
"""
from __future__ import annotations

import contextlib
import io
from typing import Sequence

import numpy as np


def _box(b) -> list[float]:
    if hasattr(b, "box_px"):
        b = b.box_px
    if isinstance(b, dict):
        b = b["bbox_2d"]
    x1, y1, x2, y2 = (float(v) for v in b)
    return [x1, y1, max(x2 - x1, 0.0), max(y2 - y1, 0.0)]


def _label(b, default: str) -> str:
    if hasattr(b, "label"):
        return b.label
    if isinstance(b, dict):
        return b.get("label", default)
    return default


def _score(b) -> float:
    if hasattr(b, "score"):
        return float(b.score)
    if isinstance(b, dict):
        return float(b.get("score", 1.0))
    return 1.0


def coco_map(predictions: Sequence[Sequence], ground_truth: Sequence[Sequence], default_label: str = "car") -> dict:
    """mAP@[.5:.95], AP50 and AP75 over images.

    predictions[i], ground_truth[i]: boxes of image i, each a Detection, a {"bbox_2d", "label"[, "score"]}
    dict or an (x1, y1, x2, y2) sequence. Returns {"map", "ap50", "ap75", "images", "gt_boxes"};
    -1 values (no ground truth at all) are reported as None.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if len(predictions) != len(ground_truth):
        raise ValueError(f"{len(predictions)} prediction lists for {len(ground_truth)} images")
    labels = sorted({_label(b, default_label) for img in ground_truth for b in img}
                    | {_label(b, default_label) for img in predictions for b in img})
    cat = {name: i + 1 for i, name in enumerate(labels)}
    images, anns, dets = [], [], []
    for i, (pred, gt) in enumerate(zip(predictions, ground_truth)):
        images.append({"id": i + 1, "width": 1000, "height": 1000})
        for b in gt:
            box = _box(b)
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cat[_label(b, default_label)],
                         "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
        for b in pred:
            dets.append({"image_id": i + 1, "category_id": cat[_label(b, default_label)], "bbox": _box(b),
                         "score": _score(b)})
    n_gt = len(anns)
    if n_gt == 0:
        return {"map": None, "ap50": None, "ap75": None, "images": len(images), "gt_boxes": 0}
    if not dets:
        return {"map": 0.0, "ap50": 0.0, "ap75": 0.0, "images": len(images), "gt_boxes": n_gt}
    with contextlib.redirect_stdout(io.StringIO()):
        gt_api = COCO()
        gt_api.dataset = {"images": images, "annotations": anns, "categories": [{"id": v, "name": k} for k, v in cat.items()]}
        gt_api.createIndex()
        dt_api = gt_api.loadRes(dets)
        ev = COCOeval(gt_api, dt_api, "bbox")
        # all areas and up to 100 boxes per image; our boxes are usually "small" in COCO terms
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    stats = ev.stats

    def clean(v):
        return None if v < 0 else float(v)

    return {"map": clean(stats[0]), "ap50": clean(stats[1]), "ap75": clean(stats[2]),
            "images": len(images), "gt_boxes": n_gt}
