"""The box head: 2D boxes read from the vision tower's outputs, without decoding a token.

A text box list costs a B = 32 model 4-6 extra blocks per frame and, at nano scale, never localised the
small cars of a 256 x 128 frame (docs/perception.md). The head reads what the vision encoder already
computes for every plan: for each merged visual token (a `token_px` square of the resized frame) the
features named in `features`, and predicts on a finer grid of `cells` x `cells` cells per token, per
label, a centre heat map, plus the centre's offset inside its cell and the box's log width and height
(CenterNet style). `peaks.boxes_from_maps` turns the maps into `Detection`s.

Features (all (tokens, width) per image, in the processor's merged-token order, row-major):
- "patches": the vision tower's last hidden state of the merge x merge patches of each token, side by side;
- "tokens": the merged visual tokens the language model reads;
- "deepstack": the deepstack features the language model adds at its first layers, side by side.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import WamDiffError

FEATURES = ("patches", "tokens", "deepstack")
BOX_REGRESSION = 4  # centre offset x, y in cells; log width, log height in resized pixels
REFINE_CHANNELS = 32


class BoxHeadError(WamDiffError, ValueError):
    """A box head's configuration or features do not fit (the message names the value and what was expected)."""


@dataclass(frozen=True)
class BoxHeadConfig:
    """`in_channels`: the width of the features together (`feature_width`); `cells`: heat-map cells per visual
    token side; `width`: hidden channels; `token_px`: a merged visual token's side in resized pixels."""

    in_channels: int
    labels: tuple[str, ...] = ("car",)
    features: tuple[str, ...] = FEATURES
    cells: int = 8
    width: int = 256
    token_px: int = 32

    def __post_init__(self):
        names = self.features
        if not names or any(f not in FEATURES for f in names) or len(set(names)) != len(names):
            raise BoxHeadError(f"features {list(self.features)}: expected distinct names from {list(FEATURES)}")
        if not self.labels or any(not isinstance(x, str) or not x for x in self.labels):
            raise BoxHeadError(f"labels {list(self.labels)}: expected a non-empty list of names")
        for name in ("in_channels", "cells", "width", "token_px"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BoxHeadError(f"{name} {value!r}: expected a positive integer")
        if self.token_px % self.cells:
            raise BoxHeadError(f"cells {self.cells}: expected a divisor of the token side {self.token_px} px")

    @property
    def cell_px(self) -> float:
        """A heat-map cell's side in resized pixels."""
        return self.token_px / self.cells

    @property
    def channels(self) -> int:
        """Map channels: one heat map per label, then the box regression."""
        return len(self.labels) + BOX_REGRESSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "labels": list(self.labels), "features": list(self.features)}

    @classmethod
    def from_dict(cls, raw: Any) -> "BoxHeadConfig":
        if not isinstance(raw, dict):
            raise BoxHeadError(f"expected a JSON object, got {type(raw).__name__}")
        known = set(cls.__dataclass_fields__)
        if set(raw) - known or "in_channels" not in raw:
            raise BoxHeadError(f"keys {sorted(raw)}: expected in_channels and some of {sorted(known)}")
        for key in ("labels", "features"):
            if key in raw and not isinstance(raw[key], list):
                raise BoxHeadError(f"{key} {raw[key]!r}: expected a list")
        return cls(**{**raw, **{k: tuple(raw[k]) for k in ("labels", "features") if k in raw}})


def feature_width(vision_config, features: Sequence[str]) -> int:
    """The width of `features` together for a Qwen3-VL vision config."""
    merge = vision_config.spatial_merge_size
    widths = {"patches": vision_config.hidden_size * merge * merge, "tokens": vision_config.out_hidden_size,
              "deepstack": vision_config.out_hidden_size * len(vision_config.deepstack_visual_indexes)}
    return sum(widths[f] for f in features)


def resized_size(grid_thw: torch.Tensor, patch_size: int, image: int = 0) -> tuple[int, int]:
    """(W, H) in pixels of image `image` as the processor resized it: its patch grid times the patch size."""
    _, gh, gw = (int(v) for v in grid_thw[image])
    return gw * patch_size, gh * patch_size


def vision_features(vision, grid_thw: torch.Tensor, merge: int, features: Sequence[str], image: int = 0
                    ) -> torch.Tensor:
    """Image `image`'s features (1, width, rows, cols) on its merged-token grid, from the vision encoder's output
    (`get_image_features(..., return_dict=True)`: last_hidden_state, pooler_output, deepstack_features) for the
    images of `grid_thw` (n_images, 3)."""
    t, gh, gw = (int(v) for v in grid_thw[image])
    rows, cols = gh // merge, gw // merge
    tokens = rows * cols * t
    parts = []
    for name in features:
        if name == "patches":
            start = int(grid_thw[:image].prod(dim=-1).sum()) if image else 0
            parts.append(vision.last_hidden_state[start:start + tokens * merge * merge].reshape(tokens, -1))
        elif name == "tokens":
            parts.append(vision.pooler_output[image])
        else:
            parts.append(torch.cat([layer[image] for layer in vision.deepstack_features], dim=-1))
    x = torch.cat(parts, dim=-1).float()
    return x[: rows * cols].T.reshape(1, x.shape[-1], rows, cols)


class BoxHead(nn.Module):
    """(n, in_channels, rows, cols) features -> (n, channels, rows * cells, cols * cells) maps: heat logits per
    label, then centre offset and log size. The features are standardised with the statistics of its training set
    (buffers `mean`, `std`), so the head does not depend on the encoder's scale."""

    def __init__(self, config: BoxHeadConfig):
        super().__init__()
        c = config
        self.config = c
        self.register_buffer("mean", torch.zeros(c.in_channels))
        self.register_buffer("std", torch.ones(c.in_channels))
        self.body = nn.Sequential(
            nn.Conv2d(c.in_channels, c.width, 1), nn.GELU(),
            nn.Conv2d(c.width, c.width, 3, padding=1), nn.GELU(),
            nn.Conv2d(c.width, c.cells * c.cells * c.channels, 1),
        )
        self.refine = nn.Sequential(
            nn.Conv2d(c.channels, REFINE_CHANNELS, 3, padding=1), nn.GELU(),
            nn.Conv2d(REFINE_CHANNELS, c.channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.config.in_channels:
            raise BoxHeadError(f"features of shape {tuple(x.shape)}: expected (n, {self.config.in_channels}, rows, "
                               f"cols)")
        x = (x - self.mean[:, None, None]) / self.std[:, None, None]
        maps = F.pixel_shuffle(self.body(x), self.config.cells)
        return maps + self.refine(maps)
