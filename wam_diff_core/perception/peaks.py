"""A box head's maps -> detections: the local maxima of each label's heat map, with their regressed boxes."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..constants import BOX_SCALE
from ..types import Detection
from .head import BoxHeadConfig, resized_size, vision_features

MAX_BOXES = 20  # per frame; the embedded world's busiest frames hold 12 vehicles
MIN_SCORE = 0.05  # heat below this is not a box (COCO mAP counts low-scored boxes; a tracker should not)


def boxes_from_maps(maps: torch.Tensor, config: BoxHeadConfig, frame_size: Sequence[int], resized: Sequence[int],
                    max_boxes: int = MAX_BOXES, min_score: float = MIN_SCORE) -> list[Detection]:
    """One frame's maps (channels, H, W) -> at most `max_boxes` detections scored >= `min_score`, best first.

    A box is a heat-map cell that is the maximum of its 3 x 3 neighbourhood (per label); its score is the
    heat's sigmoid, its centre the cell plus the regressed offset, its size the regressed log width and
    height. `resized` (W, H) is the frame as the processor resized it (the maps' pixels), `frame_size` (W, H)
    the frame the caller gave: boxes come back in the caller's pixels, clipped to the frame, and on the
    0..BOX_SCALE scale."""
    n_labels = len(config.labels)
    heat = torch.sigmoid(maps[:n_labels].float())
    peak = heat * (F.max_pool2d(heat[None], 3, stride=1, padding=1)[0] == heat)
    h, w = heat.shape[-2:]
    scores, index = peak.flatten().topk(min(max_boxes, peak.numel()))
    keep = scores >= min_score
    scores, index = scores[keep], index[keep]
    label, cell = index // (h * w), index % (h * w)
    row, col = cell // w, cell % w
    reg = maps[n_labels:].float().flatten(1)[:, cell]
    cx, cy = (col + reg[0]) * config.cell_px, (row + reg[1]) * config.cell_px
    half_w, half_h = reg[2].clamp(max=12.0).exp() / 2, reg[3].clamp(max=12.0).exp() / 2
    fw, fh = (float(v) for v in frame_size)
    sx, sy = fw / float(resized[0]), fh / float(resized[1])
    x1 = ((cx - half_w) * sx).clamp(0, fw)
    x2 = ((cx + half_w) * sx).clamp(0, fw)
    y1 = ((cy - half_h) * sy).clamp(0, fh)
    y2 = ((cy + half_h) * sy).clamp(0, fh)
    boxes = torch.stack([x1, y1, x2, y2], dim=-1).tolist()
    out = []
    for (a, b, c, d), k, s in zip(boxes, label.tolist(), scores.tolist()):
        norm = (a / fw * BOX_SCALE, b / fh * BOX_SCALE, c / fw * BOX_SCALE, d / fh * BOX_SCALE)
        out.append(Detection(config.labels[k], (a, b, c, d), norm, float(s)))
    return out


@torch.inference_mode()
def detect(head, vision, grid_thw: torch.Tensor, merge: int, patch_size: int, frame_size: Sequence[int],
           image: int = 0) -> list[Detection]:
    """Image `image`'s detections from a vision encoder output (`ModelRunner.last_vision`), in the pixels of its
    `frame_size` (W, H) frame."""
    x = vision_features(vision, grid_thw, merge, head.config.features, image).to(head.mean.device)
    return boxes_from_maps(head(x)[0], head.config, frame_size, resized_size(grid_thw, patch_size, image))
