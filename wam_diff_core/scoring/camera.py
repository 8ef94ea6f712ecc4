"""The embedded world's top-down camera: ego-frame metres <-> frame pixels.

The world renders an ego-aligned top-down frame (the ego faces right: +x = image right, +y = image up) at
`scaling` px/m with the ego at `anchor` (fractions of width, height). The mapping is a scale and a shift, so its
inverse is exact: a detected box's pixels give the ground position it was drawn at.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import FRAME_SIZE

TOP_DOWN_PX_PER_M = 3.0  # the world's fixed drawing scale
TOP_DOWN_EGO_ANCHOR = (0.25, 0.5)  # the ego's pixel position as fractions of (width, height)


@dataclass(frozen=True)
class TopDownCamera:
    """Frame size (width, height) in pixels, `scaling` px/m, the ego's `anchor` as fractions of (width, height)."""

    width: int = FRAME_SIZE[0]
    height: int = FRAME_SIZE[1]
    scaling: float = TOP_DOWN_PX_PER_M
    anchor: tuple[float, float] = TOP_DOWN_EGO_ANCHOR

    def __post_init__(self):
        if int(self.width) <= 0 or int(self.height) <= 0:
            raise ValueError(f"camera frame size {self.width}x{self.height}: expected positive pixels")
        if not float(self.scaling) > 0:
            raise ValueError(f"camera scaling {self.scaling!r}: expected a positive number of px/m")
        object.__setattr__(self, "anchor", (float(self.anchor[0]), float(self.anchor[1])))

    @property
    def origin_px(self) -> np.ndarray:
        """The ego's pixel (u, v)."""
        return np.array([self.anchor[0] * self.width, self.anchor[1] * self.height])

    def to_pixels(self, points_ego) -> np.ndarray:
        """Ego-frame points (..., 2) metres -> frame pixels (..., 2) (u right, v down)."""
        p = np.asarray(points_ego, dtype=np.float64)
        u0, v0 = self.origin_px
        return np.stack([u0 + p[..., 0] * self.scaling, v0 - p[..., 1] * self.scaling], axis=-1)

    def to_ground(self, pixels) -> np.ndarray:
        """Frame pixels (..., 2) (u right, v down) -> ego-frame points (..., 2) metres on the ground."""
        q = np.asarray(pixels, dtype=np.float64)
        u0, v0 = self.origin_px
        return np.stack([(q[..., 0] - u0) / self.scaling, (v0 - q[..., 1]) / self.scaling], axis=-1)
