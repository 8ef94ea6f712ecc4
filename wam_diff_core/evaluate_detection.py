"""Detection answers scored box by box: COCO metrics, and where the boxes that are not found went.

COCO mAP alone says how good the boxes are, not why they are bad. `box_breakdown` reads the same answers
as a per-box account: answers that parse, boxes per frame against the ground truth, and each
ground-truth box's fate under a one-to-one greedy IoU matching (found at IoU >= 0.5, tight at >= 0.75;
poorly localised at 0.1 .. 0.5; missed when no box of the answer overlaps it by IoU 0.1; lost in an
answer that does not parse), with the labels of the found boxes and the centre errors of the matched
ones in pixels.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

import numpy as np

from .codec import ParseError
from .eval.coco import coco_map
from .types import Detection

FOUND_IOU = 0.5  # COCO's AP50 threshold: a box this close counts as found
TIGHT_IOU = 0.75
OVERLAP_IOU = 0.1  # below this a matched box has nothing to do with its ground truth: the object is missed
FATES = ("found_tight", "found_loose", "poorly_localised", "missed", "answer_unparsed")


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) IoU of (x1, y1, x2, y2) boxes a (n, 4) and b (m, 4), any consistent unit."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    w = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    h = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = w * h
    area = lambda x: np.clip(x[:, 2] - x[:, 0], 0, None) * np.clip(x[:, 3] - x[:, 1], 0, None)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def greedy_match(gt: np.ndarray, pred: np.ndarray) -> list[tuple[int, Optional[int], float]]:
    """One-to-one matching, highest IoU first: for every ground-truth box i, (i, its prediction's index or None,
    their IoU (0 without one)). Pairs with no overlap are never matched."""
    ious = iou_matrix(gt, pred)
    out: dict[int, tuple[Optional[int], float]] = {}
    used: set[int] = set()
    for flat in np.argsort(-ious, axis=None, kind="stable"):
        i, j = divmod(int(flat), ious.shape[1])
        if ious[i, j] <= 0:
            break
        if i not in out and j not in used:
            out[i] = (j, float(ious[i, j]))
            used.add(j)
    return [(i, *out.get(i, (None, 0.0))) for i in range(len(gt))]


def _fate(iou: float) -> str:
    if iou >= TIGHT_IOU:
        return "found_tight"
    if iou >= FOUND_IOU:
        return "found_loose"
    return "poorly_localised" if iou >= OVERLAP_IOU else "missed"


def _centres(boxes: Sequence[Detection]) -> np.ndarray:
    return np.array([[(d.box_px[0] + d.box_px[2]) / 2, (d.box_px[1] + d.box_px[3]) / 2] for d in boxes]).reshape(-1, 2)


def _norm(boxes: Sequence[Detection]) -> np.ndarray:
    return np.array([d.box_norm for d in boxes], dtype=np.float64).reshape(-1, 4)


def _share(n: int, total: int) -> Optional[float]:
    return n / total if total else None


def box_breakdown(predictions: Sequence[list[Detection] | ParseError], truths: Sequence[list[Detection]]) -> dict:
    """The per-box account of detection answers (module docstring). predictions[i]: image i's parsed boxes or the
    ParseError of its answer; truths[i]: its ground-truth boxes (box_norm for the IoU, box_px for centre errors in
    the frame's pixels). Shares are of images, ground-truth boxes or predicted boxes as named."""
    if len(predictions) != len(truths):
        raise ValueError(f"{len(predictions)} answers for {len(truths)} images")
    fates, kinds, labels, count_err = Counter(), Counter(), Counter(), []
    ious, dx, dy, label_ok, false_pos, n_pred = [], [], [], 0, 0, 0
    for pred, gt in zip(predictions, truths):
        if isinstance(pred, ParseError):
            kinds[pred.kind] += 1
            fates["answer_unparsed"] += len(gt)
            continue
        count_err.append(len(pred) - len(gt))
        n_pred += len(pred)
        labels.update(d.label for d in pred)
        matched = greedy_match(_norm(gt), _norm(pred))
        pc, gc = _centres(pred), _centres(gt)
        for i, j, iou in matched:
            fates[_fate(iou)] += 1
            if j is not None:
                ious.append(iou)
                dx.append(abs(pc[j, 0] - gc[i, 0]))
                dy.append(abs(pc[j, 1] - gc[i, 1]))
                label_ok += int(iou >= FOUND_IOU and pred[j].label == gt[i].label)
        false_pos += len(pred) - sum(1 for _, j, iou in matched if j is not None and iou >= FOUND_IOU)
    n_img, n_gt = len(truths), sum(len(g) for g in truths)
    found = fates["found_tight"] + fates["found_loose"]
    err = np.array(count_err, dtype=np.float64)
    q = lambda v, p: float(np.percentile(v, p)) if len(v) else None  # noqa: E731
    return {
        "images": n_img, "parsed_images": len(count_err), "parsed_share": _share(len(count_err), n_img),
        "parse_errors": dict(kinds.most_common()),
        "gt_boxes": n_gt, "predicted_boxes": n_pred, "predicted_labels": dict(labels.most_common()),
        "count": {"exact_share": _share(int((err == 0).sum()), len(err)),
                  "mean_error": float(err.mean()) if len(err) else None,
                  "mean_abs_error": float(np.abs(err).mean()) if len(err) else None},
        "gt_fate": {k: fates[k] for k in FATES},
        "gt_fate_share": {k: _share(fates[k], n_gt) for k in FATES},
        "found_with_right_label_share": _share(label_ok, found),
        "false_positive_share": _share(false_pos, n_pred),
        "matched_iou": {"pairs": len(ious), "p10": q(ious, 10), "p50": q(ious, 50), "p90": q(ious, 90)},
        "centre_error_px": {"dx_p50": q(dx, 50), "dy_p50": q(dy, 50), "dx_p90": q(dx, 90), "dy_p90": q(dy, 90)},
    }


def detection_scores(predictions: Sequence[list[Detection] | ParseError], truths: Sequence[list[Detection]]) -> dict:
    """COCO metrics (`eval.coco.coco_map`: mAP, AP50, AP75, per-class AP, recall at 10 boxes) on the 0..1000 box
    scale with each box's label and score (an answer that does not parse has no boxes), and `box_breakdown`."""
    pred_boxes = [[] if isinstance(p, ParseError) else
                  [{"bbox_2d": d.box_norm, "label": d.label, "score": d.score} for d in p] for p in predictions]
    gt_boxes = [[{"bbox_2d": d.box_norm, "label": d.label} for d in g] for g in truths]
    return {**coco_map(pred_boxes, gt_boxes), "breakdown": box_breakdown(predictions, truths)}
