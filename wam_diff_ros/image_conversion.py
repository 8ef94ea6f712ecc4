"""sensor_msgs Image / CompressedImage <-> numpy RGB, without cv_bridge (not installable here).

Works on any object with the message's fields (duck typing), so it imports no ROS module.
Every rejection raises ImageConversionError naming the bad value and what was expected; the
planner node turns it into a diagnostic ERROR and keeps serving the next frame.
"""
from __future__ import annotations

import io

import numpy as np

from wam_diff_core.errors import WamDiffError

# encoding -> (channels, channel order to take for RGB); all 8-bit per channel.
RAW_ENCODINGS = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}

# Largest image side accepted; guards against a corrupt header asking for a huge allocation.
MAX_SIDE_PX = 16384


class ImageConversionError(WamDiffError, ValueError):
    """A camera message that cannot be turned into an RGB frame (the message says why)."""


def raw_to_rgb(data, height: int, width: int, encoding: str, step: int) -> np.ndarray:
    """Bytes of a sensor_msgs/Image -> (height, width, 3) uint8 RGB, honouring `step` row padding.

    The result never aliases `data` (the message buffer may be reused by the middleware).
    """
    enc = str(encoding).strip().lower()
    if enc not in RAW_ENCODINGS:
        raise ImageConversionError(
            f"unsupported image encoding {encoding!r}; expected one of {sorted(RAW_ENCODINGS)}")
    channels, order = RAW_ENCODINGS[enc]
    height, width, step = int(height), int(width), int(step)
    if height <= 0 or width <= 0:
        raise ImageConversionError(f"empty image {width}x{height} (width x height must both be > 0)")
    if height > MAX_SIDE_PX or width > MAX_SIDE_PX:
        raise ImageConversionError(f"image {width}x{height} exceeds {MAX_SIDE_PX} px per side")
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageConversionError(
            f"step {step} too small for {enc} width {width}: need at least {row_bytes} bytes per row")
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != step * height:
        raise ImageConversionError(
            f"data length {buf.size} != step {step} x height {height} = {step * height} for {enc}")
    pixels = buf.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    if enc == "rgb8":
        return pixels.copy()
    if enc == "mono8":
        return np.repeat(pixels, 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, list(order)])


def image_msg_to_rgb(msg) -> np.ndarray:
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB. Raises ImageConversionError on a malformed message."""
    # is_bigendian only matters for >8-bit encodings, none of which are accepted.
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.encoding, msg.step)


def compressed_msg_to_rgb(msg) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg, png, ... anything Pillow decodes) -> (H, W, 3) uint8 RGB."""
    from PIL import Image, UnidentifiedImageError

    data = bytes(msg.data)
    fmt = str(getattr(msg, "format", ""))
    if not data:
        raise ImageConversionError(f"empty CompressedImage data (format {fmt!r})")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width <= 0 or img.height <= 0 or max(img.width, img.height) > MAX_SIDE_PX:
                raise ImageConversionError(f"compressed image size {img.width}x{img.height} out of range")
            img.load()  # decode now: a truncated stream raises here, not later
            rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except ImageConversionError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ImageConversionError(f"cannot decode CompressedImage (format {fmt!r}, {len(data)} bytes): {exc}") from exc
    return np.ascontiguousarray(rgb)


def rgb_to_raw(rgb: np.ndarray, encoding: str = "rgb8", row_padding: int = 0) -> tuple[bytes, int]:
    """(H, W, 3) uint8 RGB -> (data, step) for a sensor_msgs/Image of `encoding` (used by bridges and tests)."""
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected (H, W, 3) uint8 RGB, got shape {rgb.shape} dtype {rgb.dtype}")
    enc = encoding.lower()
    if enc == "rgb8":
        pixels = rgb
    elif enc == "bgr8":
        pixels = rgb[:, :, ::-1]
    elif enc == "rgba8":
        pixels = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    elif enc == "bgra8":
        pixels = np.concatenate([rgb[:, :, ::-1], np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    elif enc == "mono8":
        pixels = rgb.mean(axis=2, keepdims=True).round().astype(np.uint8)
    else:
        raise ValueError(f"unsupported image encoding {encoding!r}; expected one of {sorted(RAW_ENCODINGS)}")
    h, w, c = pixels.shape
    rows = pixels.reshape(h, w * c)
    if row_padding:
        rows = np.concatenate([rows, np.zeros((h, row_padding), np.uint8)], axis=1)
    return np.ascontiguousarray(rows).tobytes(), w * c + row_padding
