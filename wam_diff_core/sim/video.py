"""Route videos: frames with the predicted trajectory drawn, written as MP4 (imageio-ffmpeg) or GIF."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

PLAN_COLOR = (255, 40, 200)


def draw_plan(frame: np.ndarray, plan_px: Optional[np.ndarray], text: str = "") -> np.ndarray:
    """Copy of the frame with the plan (N, 2) pixels drawn as a polyline with dots, and a caption."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(frame)
    d = ImageDraw.Draw(img)
    if plan_px is not None and len(plan_px):
        pts = [tuple(map(float, p)) for p in plan_px]
        if len(pts) > 1:
            d.line(pts, fill=PLAN_COLOR, width=2)
        for x, y in pts[1:]:
            d.ellipse((x - 2, y - 2, x + 2, y + 2), fill=PLAN_COLOR)
    if text:
        d.text((4, 2), text, fill=(255, 255, 255))
    return np.asarray(img)


def write_video(frames: Sequence[np.ndarray], path: str | Path, fps: int = 10) -> Path:
    """Write frames (H, W, 3) uint8; MP4 when the path ends in .mp4 and ffmpeg is available, else GIF.
    Returns the path written."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".mp4":
        try:
            # even sizes for yuv420p
            h, w = frames[0].shape[:2]
            fr = [f[: h - h % 2, : w - w % 2] for f in frames]
            imageio.mimwrite(path, fr, fps=fps, codec="libx264", quality=7, macro_block_size=1)
            return path
        except Exception:  # no ffmpeg binary: fall back to GIF
            path = path.with_suffix(".gif")
    imageio.mimwrite(path, list(frames), duration=1000.0 / fps, loop=0)
    return path
