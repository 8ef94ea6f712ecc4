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
    """mAP@[.5:.95], AP50, AP75, per-class AP and recall at 10 boxes over images.

    predictions[i], ground_truth[i]: boxes of image i, each a Detection, a {"bbox_2d", "label"[, "score"]}
    dict or an (x1, y1, x2, y2) sequence. Returns {"map", "ap50", "ap75", "per_class": {label: AP@[.5:.95]
    of each ground-truth label}, "recall_10": COCO AR@10 (recall with the 10 best-scored boxes per image,
    averaged over IoU .5:.95), "recall_10_iou50": the same at IoU 0.5 alone, "images", "gt_boxes"}; -1
    values (no ground truth at all) are reported as None.
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
    gt_labels = sorted({_label(b, default_label) for img in ground_truth for b in img})
    if n_gt == 0:
        return {"map": None, "ap50": None, "ap75": None, "per_class": {}, "recall_10": None, "recall_10_iou50": None,
                "images": len(images), "gt_boxes": 0}
    if not dets:
        return {"map": 0.0, "ap50": 0.0, "ap75": 0.0, "per_class": {k: 0.0 for k in gt_labels}, "recall_10": 0.0,
                "recall_10_iou50": 0.0, "images": len(images), "gt_boxes": n_gt}
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
    return {"map": _clean(stats[0]), "ap50": _clean(stats[1]), "ap75": _clean(stats[2]),
            "per_class": {k: _class_ap(ev.eval["precision"], cat[k] - 1) for k in gt_labels},
            "recall_10": _clean(stats[7]), "recall_10_iou50": _recall_at(ev, iou=0.5, max_dets=10),
            "images": len(images), "gt_boxes": n_gt}


def _clean(v) -> float | None:
    return None if v < 0 else float(v)


def _class_ap(precision: np.ndarray, k: int) -> float | None:
    """AP@[.5:.95] of category index k from COCOeval's precision (iou, recall, category, area, max dets): all
    areas, 100 boxes; None when the category has no ground truth (every entry -1)."""
    p = precision[:, :, k, 0, -1]
    p = p[p > -1]
    return float(p.mean()) if p.size else None


def _recall_at(ev, iou: float, max_dets: int) -> float | None:
    """Recall over all categories (mean of those with ground truth) at one IoU threshold, all areas, with the
    `max_dets` best-scored boxes per image."""
    t = int(np.argmin(np.abs(ev.params.iouThrs - iou)))
    m = list(ev.params.maxDets).index(max_dets)
    r = ev.eval["recall"][t, :, 0, m]
    r = r[r > -1]
    return float(r.mean()) if r.size else None
