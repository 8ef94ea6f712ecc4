"""A supervised perception loss on the visual tokens: where the other vehicles are.

The planning loss alone never taught the vision tower to localise vehicles (detection mAP 0.0 for every
model of the project; a linear probe finds "a vehicle ahead" in random tower weights better than in
trained ones). This loss gives the tower a dense, direct signal: every merged visual token (the
patch_size x merge_size square of pixels the language model reads as one token) predicts, through a
linear head used only in training, how much of each of its `cells x cells` sub-squares vehicles cover.
The targets come from the world's own boxes (`meta.boxes_px`, `meta.frame_size` of `wam-diff data`
samples); samples without them (other datasets, older data) simply add nothing.

Token order: the processor lays patches out merge group by merge group, row-major over the merged grid,
so merged token i covers merged row i // (grid_w / merge), column i % (grid_w / merge).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

OCCUPANCY_CELLS = (1, 2, 4, 8, 16, 32)  # cells per token side (must divide the token's pixel side)


def _overlap_1d(lo: float, hi: float, n: int, size: float) -> torch.Tensor:
    """Share of each of n cells [j size, (j + 1) size) that [lo, hi) covers (n,)."""
    edges = torch.arange(n, dtype=torch.float32) * size
    return ((torch.clamp(edges + size, max=hi) - torch.clamp(edges, min=lo)).clamp(min=0.0) / size)


def occupancy_targets(boxes_px: Sequence[Sequence[float]], frame_size: Sequence[int], grid_thw: Sequence[int],
                      patch_size: int, merge_size: int, cells: int) -> torch.Tensor:
    """(tokens, cells * cells) share of each token's sub-squares that the boxes cover, clipped to 1.

    boxes_px: (x1, y1, x2, y2) in the original frame's pixels; frame_size: (width, height) of that frame;
    grid_thw: the image's patch grid (1, h, w) after the processor's resize (boxes are scaled with it).
    """
    t, gh, gw = (int(v) for v in grid_thw)
    token_px = patch_size * merge_size
    if t != 1:
        raise ValueError(f"occupancy targets need a single image (grid t = 1), got grid {tuple(grid_thw)}")
    if cells not in OCCUPANCY_CELLS or token_px % cells:
        raise ValueError(f"cells {cells}: expected one of {OCCUPANCY_CELLS} dividing the token side {token_px} px")
    if gh % merge_size or gw % merge_size:
        raise ValueError(f"grid {tuple(grid_thw)} is not a multiple of merge size {merge_size}")
    fw, fh = (float(v) for v in frame_size)
    if fw <= 0 or fh <= 0:
        raise ValueError(f"frame_size {tuple(frame_size)}: expected a positive width and height")
    sx, sy = gw * patch_size / fw, gh * patch_size / fh
    rows, cols = gh // merge_size * cells, gw // merge_size * cells
    size = token_px / cells
    cover = torch.zeros(rows, cols)
    for box in boxes_px:
        if len(box) != 4:
            raise ValueError(f"box {box!r}: expected x1, y1, x2, y2")
        x1, y1, x2, y2 = (float(v) for v in box)
        if not (x2 > x1 and y2 > y1):
            continue
        cover += torch.outer(_overlap_1d(y1 * sy, y2 * sy, rows, size), _overlap_1d(x1 * sx, x2 * sx, cols, size))
    cover = cover.clamp(max=1.0)
    mh, mw = gh // merge_size, gw // merge_size
    return cover.view(mh, cells, mw, cells).permute(0, 2, 1, 3).reshape(mh * mw, cells * cells)


class OccupancyHead(nn.Module):
    """Visual token (hidden,) -> logits of its cells x cells occupancy (training only, never exported)."""

    def __init__(self, hidden_size: int, cells: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, cells * cells)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(tokens)


def occupancy_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Class-balanced binary cross-entropy (soft targets) over the cells of tokens with targets (NaN rows
    have none): the mean of the occupied cells' term and the empty cells' term, each weighted by its
    share of the target, so the few occupied cells (a few per cent of a frame) weigh as much as the rest
    (a plain mean is solved by predicting every cell empty). Statistics: `occ_bce` (the loss),
    `occ_recall` (occupied cells, target >= 0.5, predicted >= 0.5), `occ_false_pos` (empty cells
    predicted occupied) and `occ_precision` (cells predicted occupied that are). logits / targets:
    (tokens, cells^2)."""
    # masks as weights rather than indexing: no host sync in the training step
    valid = (~torch.isnan(targets[:, :1])).to(logits.device, torch.float32)
    tg = torch.nan_to_num(targets.to(logits.device, torch.float32)) * valid
    lg = logits.float()
    pos_w, neg_w = tg, (1.0 - tg) * valid
    pos = -(pos_w * F.logsigmoid(lg)).sum() / pos_w.sum().clamp(min=1e-6)
    neg = -(neg_w * F.logsigmoid(-lg)).sum() / neg_w.sum().clamp(min=1e-6)
    bce = 0.5 * (pos + neg)
    with torch.no_grad():
        pred, occ = (lg >= 0.0) & (valid > 0), tg >= 0.5
        empty = (valid > 0) & ~occ
        recall = (pred & occ).sum() / occ.sum().clamp(min=1)
        false_pos = (pred & empty).sum() / empty.sum().clamp(min=1)
        precision = (pred & occ).sum() / pred.sum().clamp(min=1)
    return bce, {"occ_bce": bce.detach(), "occ_recall": recall, "occ_false_pos": false_pos, "occ_precision": precision}


def batch_occupancy(examples: Sequence) -> Optional[torch.Tensor]:
    """Targets (tokens, cells^2) over a batch's images in collate order (the order of the visual tokens),
    from each Example's `occupancy` (NaN rows: that image has no boxes); None when the dataset did not
    compute any (the perception loss is off)."""
    occ = [x.occupancy for x in examples if x.image_grid_thw is not None]
    if not occ or any(o is None for o in occ):
        return None
    return torch.cat(occ)


def sample_occupancy(meta, grid_thw: torch.Tensor, patch_size: int, merge_size: int, cells: int) -> torch.Tensor:
    """One sample's targets (tokens, cells^2): from meta boxes_px / frame_size when it has them, else NaN
    rows (no supervision for that image). Raises ValueError naming a malformed meta."""
    grids = [tuple(int(v) for v in g) for g in grid_thw.tolist()]
    n = sum(t * h * w // merge_size**2 for t, h, w in grids)
    if not isinstance(meta, dict) or "boxes_px" not in meta or len(grids) != 1:
        return torch.full((n, cells * cells), float("nan"))
    if "frame_size" not in meta:
        raise ValueError("meta has boxes_px but no frame_size (the frame's width, height in pixels)")
    boxes = meta["boxes_px"]
    if not isinstance(boxes, list):
        raise ValueError(f"meta boxes_px {boxes!r}: expected a list of [x1, y1, x2, y2]")
    return occupancy_targets(boxes, meta["frame_size"], grids[0], patch_size, merge_size, cells)
