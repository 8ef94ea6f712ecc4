"""Image / CompressedImage -> RGB conversion (numpy only; messages faked with SimpleNamespace)."""
import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image as PILImage

from wam_diff_ros.image_conversion import (ImageConversionError, compressed_msg_to_rgb, image_msg_to_rgb,
                                           raw_to_rgb, rgb_to_raw)


def _rgb(h=5, w=7, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _msg(rgb, encoding, padding=0):
    data, step = rgb_to_raw(rgb, encoding, row_padding=padding)
    return SimpleNamespace(data=data, height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, step=step,
                           is_bigendian=0)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
@pytest.mark.parametrize("padding", [0, 3])
def test_color_encodings_round_trip_exactly_with_row_padding(encoding, padding):
    rgb = _rgb()
    out = image_msg_to_rgb(_msg(rgb, encoding, padding))
    assert out.shape == (5, 7, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, rgb)


def test_bgr8_swaps_channels():
    data = bytes([10, 20, 30])  # one pixel, B=10 G=20 R=30
    np.testing.assert_array_equal(raw_to_rgb(data, 1, 1, "bgr8", 3)[0, 0], [30, 20, 10])


def test_mono8_is_replicated_to_three_channels_honouring_step():
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    padded = np.concatenate([gray, np.full((3, 2), 99, np.uint8)], axis=1)
    out = raw_to_rgb(padded.tobytes(), 3, 4, "mono8", 6)
    assert out.shape == (3, 4, 3)
    np.testing.assert_array_equal(out[..., 0], gray)
    np.testing.assert_array_equal(out[..., 2], gray)


def test_result_does_not_alias_the_message_buffer():
    buf = bytearray(_rgb(2, 2).tobytes())
    out = raw_to_rgb(buf, 2, 2, "rgb8", 6)
    buf[0] = (buf[0] + 1) % 256
    assert out[0, 0, 0] != buf[0]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(encoding="yuv422"), "'yuv422'"),
    (dict(encoding="16UC1"), "'16UC1'"),
    (dict(step=20), "step 20 too small"),
    (dict(data=b"\0" * 104), "data length 104"),
    (dict(height=0, width=0, data=b""), "empty image 0x0"),
])
def test_malformed_raw_images_are_rejected_with_a_message_naming_the_problem(kwargs, fragment):
    fields = dict(data=b"\0" * 105, height=5, width=7, encoding="rgb8", step=21)
    fields.update(kwargs)
    with pytest.raises(ImageConversionError) as info:
        raw_to_rgb(fields["data"], fields["height"], fields["width"], fields["encoding"], fields["step"])
    assert fragment in str(info.value)


def _jpeg(rgb, quality=95):
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def test_jpeg_and_png_compressed_images_decode_to_rgb():
    rgb = np.zeros((16, 24, 3), np.uint8)
    rgb[:, :12] = (200, 30, 30)
    out = compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=_jpeg(rgb)))
    assert out.shape == (16, 24, 3)
    assert np.abs(out.astype(int) - rgb.astype(int)).mean() < 8  # lossy, but close
    png = io.BytesIO()
    PILImage.fromarray(rgb).save(png, format="PNG")
    np.testing.assert_array_equal(compressed_msg_to_rgb(SimpleNamespace(format="png", data=png.getvalue())), rgb)


@pytest.mark.parametrize("data, fragment", [
    (lambda: _jpeg(_rgb(32, 32))[:200], "cannot decode CompressedImage"),
    (lambda: b"not an image at all", "cannot decode CompressedImage"),
    (lambda: b"", "empty CompressedImage"),
])
def test_truncated_or_garbage_compressed_images_are_rejected(data, fragment):
    with pytest.raises(ImageConversionError, match=fragment):
        compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=data()))
