"""A frame's boxes -> the box head's training maps (CenterNet style), on the head's cell grid.

Each box puts a peak of 1 at the cell holding its centre, surrounded by a Gaussian whose spread follows the
box's size (a sixth of its side, at least half a cell), so near misses are penalised less than far ones; the
centre cell also holds the regression targets: the centre's offset inside the cell (cells) and the box's log
width and height (pixels of the resized frame), as `perception.peaks.boxes_from_maps` reads them.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from wam_diff_core.perception import BoxHeadConfig
from wam_diff_core.perception.head import BOX_REGRESSION

SPREAD_PER_SIDE = 1 / 6  # Gaussian sigma per box side, in cells
MIN_SPREAD = 0.5  # cells


def centre_targets(boxes_px: Sequence[Sequence[float]], frame_size: Sequence[int], resized: Sequence[int],
                   config: BoxHeadConfig, rows: int, cols: int, label: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(heat (labels, H, W), regression (4, H, W), centre mask (H, W)) for boxes (x1, y1, x2, y2) in the pixels of
    a `frame_size` (W, H) frame that the processor resized to `resized` (W, H); the maps are the head's
    (rows * cells, cols * cells) grid of tokens `rows` x `cols`."""
    h, w = rows * config.cells, cols * config.cells
    heat = torch.zeros(len(config.labels), h, w)
    reg = torch.zeros(BOX_REGRESSION, h, w)
    mask = torch.zeros(h, w)
    sx, sy = resized[0] / float(frame_size[0]), resized[1] / float(frame_size[1])
    ys, xs = torch.arange(h, dtype=torch.float32)[:, None], torch.arange(w, dtype=torch.float32)[None]
    for box in boxes_px:
        x1, y1, x2, y2 = (float(v) for v in box)
        if not (x2 > x1 and y2 > y1):
            continue
        bw, bh = (x2 - x1) * sx, (y2 - y1) * sy
        cx, cy = (x1 + x2) / 2 * sx / config.cell_px, (y1 + y2) / 2 * sy / config.cell_px
        i, j = min(max(int(cy), 0), h - 1), min(max(int(cx), 0), w - 1)
        sig_x = max(bw / config.cell_px * SPREAD_PER_SIDE, MIN_SPREAD)
        sig_y = max(bh / config.cell_px * SPREAD_PER_SIDE, MIN_SPREAD)
        g = torch.exp(-((xs - j) ** 2 / (2 * sig_x ** 2) + (ys - i) ** 2 / (2 * sig_y ** 2)))
        heat[label] = torch.maximum(heat[label], g)
        reg[:, i, j] = torch.tensor([cx - j, cy - i, math.log(bw), math.log(bh)])
        mask[i, j] = 1.0
    return heat, reg, mask
