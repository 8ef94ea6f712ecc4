"""sensor_msgs Image / CompressedImage <-> numpy RGB, without cv_bridge (not installable here).

Works on any object with the message's fields (duck typing), so it imports no ROS module.
Camera topics are an attack surface: every check that bounds memory or time runs before any
pixel is decoded (sizes from the fields of a raw Image, from the header of a compressed one,
read by image_headers.py), and whatever a decoder raises becomes ImageConversionError naming the
bad value and what was expected; the planner node turns it into a diagnostic ERROR and keeps
serving the next frame.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from wam_diff_core.errors import WamDiffError

from .image_headers import HeaderError, read_header

# encoding -> (channels, channel order to take for RGB); all 8-bit per channel. Wider encodings (mono16,
# rgb16, ...) are rejected by name, so is_bigendian never matters.
RAW_ENCODINGS = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}

# Ceilings of the limits below: the largest side any camera here could mean, and Pillow's own decompression-bomb
# threshold (its default Image.MAX_IMAGE_PIXELS, which it warns past), so the node's pixel check speaks first.
MAX_SIDE_PX = 16384
MAX_PIXELS = 89_478_485

# Longest piece of a hostile field (encoding, format) quoted in an error: diagnostics stay one short line.
_QUOTE_CHARS = 40


class ImageConversionError(WamDiffError, ValueError):
    """A camera message that cannot be turned into an RGB frame (the message says why)."""


@dataclass(frozen=True)
class ImageLimits:
    """Largest camera frame converted: compressed size in bytes, pixels per side, pixels in all (W x H).

    The defaults are the planner node's parameter defaults (max_image_bytes, max_image_side,
    max_image_pixels): 8 MiB of JPEG / PNG, 4096 px a side, 4096 x 4096 px.
    """

    max_bytes: int = 8 * 1024 * 1024
    max_side: int = 4096
    max_pixels: int = 4096 * 4096

    def __post_init__(self):
        for name, ceiling in (("max_bytes", None), ("max_side", MAX_SIDE_PX), ("max_pixels", MAX_PIXELS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (ceiling and value > ceiling):
                bound = f"1..{ceiling}" if ceiling else ">= 1"
                raise ValueError(f"image limit {name} must be an integer in {bound}, got {value!r}")

    def check_size(self, width: int, height: int, what: str) -> None:
        """Raise ImageConversionError unless 0 < width, height <= max_side and width * height <= max_pixels."""
        if width <= 0 or height <= 0:
            raise ImageConversionError(f"empty {what} {width}x{height} (width x height must both be > 0)")
        if width > self.max_side or height > self.max_side:
            raise ImageConversionError(
                f"{what} {width}x{height} exceeds max_image_side {self.max_side} px (width and height)")
        if width * height > self.max_pixels:
            raise ImageConversionError(
                f"{what} {width}x{height} = {width * height} px exceeds max_image_pixels {self.max_pixels}")


DEFAULT_LIMITS = ImageLimits()


def quote(value, limit: int = _QUOTE_CHARS) -> str:
    """repr() of a message field, cut to `limit` characters and a length note (a hostile field may be
    megabytes long); what is shown is the start of the field."""
    long = isinstance(value, (str, bytes)) and len(value) > limit
    text = repr(value[:limit] if long else value)
    if len(text) > limit + 2:
        text = text[:limit] + "..."
    elif long:
        text += "..."
    if long:
        text += f" ({len(value)} {'characters' if isinstance(value, str) else 'bytes'})"
    return text


def _as_int(value, name: str) -> int:
    if isinstance(value, (bool, float)) or not hasattr(value, "__index__"):
        raise ImageConversionError(f"image {name} must be an unsigned integer, got {quote(value)}")
    return int(value.__index__())


def raw_to_rgb(data, height: int, width: int, encoding: str, step: int,
               limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Bytes of a sensor_msgs/Image -> (height, width, 3) uint8 RGB, honouring `step` row padding.

    Sizes are checked against `limits` before the data is looked at. The result never aliases `data`
    (the message buffer may be reused by the middleware).
    """
    enc = encoding.strip().lower() if isinstance(encoding, str) else None
    if enc not in RAW_ENCODINGS:
        raise ImageConversionError(
            f"unsupported image encoding {quote(encoding)}; expected one of {sorted(RAW_ENCODINGS)}")
    channels, order = RAW_ENCODINGS[enc]
    height, width, step = _as_int(height, "height"), _as_int(width, "width"), _as_int(step, "step")
    limits.check_size(width, height, "image")
    row_bytes = width * channels
    if step < row_bytes:
        raise ImageConversionError(
            f"step {step} too small for {enc} width {width}: need at least {row_bytes} bytes per row")
    try:
        buf = np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as exc:
        raise ImageConversionError(f"image data must be bytes, got {type(data).__name__}: {exc}") from exc
    if buf.size != step * height:
        raise ImageConversionError(
            f"data length {buf.size} != step {step} x height {height} = {step * height} for {enc}")
    pixels = buf.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    if enc == "rgb8":
        return pixels.copy()
    if enc == "mono8":
        return np.repeat(pixels, 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, list(order)])


def image_msg_to_rgb(msg, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB. Raises ImageConversionError on a malformed message."""
    return raw_to_rgb(msg.data, msg.height, msg.width, msg.encoding, msg.step, limits)


def compressed_msg_to_rgb(msg, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """sensor_msgs/CompressedImage (JPEG or PNG) -> (H, W, 3) uint8 RGB.

    In order, before anything is decoded: the byte size (`limits.max_bytes`), then the format (from the
    data, not the message's `format` string), the structure before the pixel data and the size the
    header states (`limits`), read in bounded work (image_headers.py). Raises ImageConversionError for
    every failure, whatever the decoder raised.
    """
    from PIL import Image

    fmt = quote(getattr(msg, "format", ""))
    try:
        size = len(msg.data)
    except TypeError as exc:
        raise ImageConversionError(f"CompressedImage data must be bytes, got {type(msg.data).__name__}") from exc
    if size == 0:
        raise ImageConversionError(f"empty CompressedImage data (format {fmt})")
    if size > limits.max_bytes:
        raise ImageConversionError(
            f"CompressedImage of {size} bytes (format {fmt}) exceeds max_image_bytes {limits.max_bytes}")
    try:
        data = bytes(msg.data)
        header = read_header(data)
    except (HeaderError, TypeError, ValueError) as exc:
        raise ImageConversionError(f"cannot decode CompressedImage (format {fmt}, {size} bytes): {exc}") from exc
    limits.check_size(header.width, header.height, f"compressed {header.format} image")
    try:
        # JPEG or PNG, what compressed_image_transport sends; every other format Pillow knows is refused
        img = Image.open(io.BytesIO(data), formats=(header.format,))  # reads the header only
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a rejected frame, never a dead callback
        raise _undecodable(fmt, size, exc) from exc
    with img:
        limits.check_size(img.width, img.height, f"compressed {img.format} image")  # as Pillow read it
        try:
            img.load()  # decode now: a truncated stream raises here, not later
            rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except Exception as exc:  # noqa: BLE001 - as above
            raise _undecodable(fmt, size, exc) from exc
    if rgb.shape != (img.height, img.width, 3):
        raise ImageConversionError(f"compressed image decoded to shape {rgb.shape}, header said "
                                   f"{img.width}x{img.height}")
    return np.ascontiguousarray(rgb)


def _undecodable(fmt: str, size: int, exc: Exception) -> ImageConversionError:
    return ImageConversionError(f"cannot decode CompressedImage (format {fmt}, {size} bytes; JPEG or PNG "
                                f"expected): {type(exc).__name__}: {str(exc)[:120]}")


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
