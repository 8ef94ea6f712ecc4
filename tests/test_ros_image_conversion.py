"""Image / CompressedImage -> RGB conversion (numpy only; messages faked with SimpleNamespace)."""
import io
import re
import struct
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image as PILImage

from wam_diff_ros.image_conversion import (MAX_PIXELS, MAX_SIDE_PX, ImageConversionError, ImageLimits,
                                           compressed_msg_to_rgb, image_msg_to_rgb, raw_to_rgb, rgb_to_raw)
from wam_diff_ros.image_headers import MAX_PNG_CHUNKS, ImageHeader, read_header


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


# ---------------------------------------------------------------------------------------------- limits

def chunk(kind, data):
    """One PNG chunk: length, type, data, CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header(width, height, idat=b""):
    """A PNG whose IHDR states width x height (8-bit RGB) and whose pixel data is `idat` (zlib), often empty."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat or zlib.compress(b""))
            + chunk(b"IEND", b""))


@pytest.fixture
def decodes(monkeypatch):
    """Counts pixel decodes (ImageFile.load calls): a frame rejected from its header must cost none."""
    from PIL import ImageFile

    calls = []
    original = ImageFile.ImageFile.load

    def load(self):
        calls.append(self.size)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return calls


def test_a_16000_px_png_header_is_rejected_as_a_typed_error_without_decoding(decodes):
    # 65 bytes claiming 256 M px: over Pillow's own decompression-bomb limit, whose error ended the node
    data = png_header(16000, 16000)
    assert len(data) == 65
    with pytest.raises(ImageConversionError, match="compressed PNG image 16000x16000 exceeds max_image_side 4096"):
        compressed_msg_to_rgb(SimpleNamespace(format="png", data=data))
    assert decodes == []


@pytest.mark.parametrize("width, height, limits, fragment", [
    (4097, 10, ImageLimits(), "4097x10 exceeds max_image_side 4096 px"),
    (10, 5000, ImageLimits(), "10x5000 exceeds max_image_side 4096 px"),
    (4096, 4096, ImageLimits(max_pixels=4096 * 2048), "4096x4096 = 16777216 px exceeds max_image_pixels 8388608"),
    (11, 10, ImageLimits(max_pixels=100), "11x10 = 110 px exceeds max_image_pixels 100"),
])
def test_compressed_headers_over_the_side_or_pixel_limit_are_rejected_before_decoding(
        decodes, width, height, limits, fragment):
    with pytest.raises(ImageConversionError, match=fragment):
        compressed_msg_to_rgb(SimpleNamespace(format="png", data=png_header(width, height)), limits)
    assert decodes == []


def test_a_compressed_image_over_max_bytes_is_rejected_before_pillow_reads_it(monkeypatch):
    from PIL import Image

    opened = []
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a) or pytest.fail("opened"))
    data = b"\xff\xd8" + bytes(ImageLimits.max_bytes - 1)
    with pytest.raises(ImageConversionError, match=f"of {ImageLimits.max_bytes + 1} bytes .* exceeds max_image_bytes"):
        compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=data))
    with pytest.raises(ImageConversionError, match="of 101 bytes"):
        compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=bytes(101)), ImageLimits(max_bytes=100))
    assert opened == []


def test_a_real_zero_filled_8000_px_png_is_rejected_from_its_header_not_decoded(decodes):
    # 187 kB that decodes to 183 MiB: before the limits it took about 4 s and 0.9 GB to decode
    row = b"\x00" * (1 + 3 * 8000)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(8000)) + comp.flush()
    data = png_header(8000, 8000, idat)
    assert len(data) < 200_000
    with pytest.raises(ImageConversionError, match="8000x8000 exceeds max_image_side 4096"):
        compressed_msg_to_rgb(SimpleNamespace(format="png", data=data))
    assert decodes == []


@pytest.mark.parametrize("pil_format", ["GIF", "BMP", "TIFF"])
def test_compressed_formats_other_than_jpeg_and_png_are_rejected_naming_the_expected_ones(pil_format):
    buf = io.BytesIO()
    PILImage.fromarray(_rgb(8, 8)).save(buf, format=pil_format)
    with pytest.raises(ImageConversionError, match=r"data starting b'.{3,40}' is neither JPEG nor PNG"):
        compressed_msg_to_rgb(SimpleNamespace(format=pil_format.lower(), data=buf.getvalue()))


def test_raw_images_over_the_side_or_pixel_limit_are_rejected_before_the_data_is_read():
    with pytest.raises(ImageConversionError, match="image 5000x1 exceeds max_image_side 4096"):
        raw_to_rgb(None, 1, 5000, "rgb8", 15000)  # data is never looked at
    with pytest.raises(ImageConversionError, match="image 20x10 = 200 px exceeds max_image_pixels 199"):
        raw_to_rgb(None, 10, 20, "mono8", 20, ImageLimits(max_pixels=199))
    small = _rgb(10, 20)
    np.testing.assert_array_equal(raw_to_rgb(small.tobytes(), 10, 20, "rgb8", 60, ImageLimits(max_pixels=200)), small)


@pytest.mark.parametrize("field, value, fragment", [
    ("height", "5", "image height must be an unsigned integer, got '5'"),
    ("width", 7.0, "image width must be an unsigned integer, got 7.0"),
    ("step", None, "image step must be an unsigned integer, got None"),
    ("encoding", None, "unsupported image encoding None"),
    ("data", "text", "image data must be bytes, got str"),
])
def test_raw_fields_of_the_wrong_type_are_typed_errors(field, value, fragment):
    fields = dict(data=b"\0" * 105, height=5, width=7, encoding="rgb8", step=21)
    fields[field] = value
    with pytest.raises(ImageConversionError, match=re.escape(fragment)):
        image_msg_to_rgb(SimpleNamespace(**fields))


def test_a_megabyte_encoding_or_format_string_gives_a_short_error_message():
    with pytest.raises(ImageConversionError) as raw:
        raw_to_rgb(b"", 1, 1, "x" * 1_000_000, 3)
    with pytest.raises(ImageConversionError) as compressed:
        compressed_msg_to_rgb(SimpleNamespace(format="y" * 1_000_000, data=b"garbage"))
    assert "(1000000 characters)" in str(raw.value) and len(str(raw.value)) < 200
    assert "(1000000 characters)" in str(compressed.value) and len(str(compressed.value)) < 250


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_bytes=0), "max_bytes must be an integer in >= 1, got 0"),
    (dict(max_side=MAX_SIDE_PX + 1), f"max_side must be an integer in 1..{MAX_SIDE_PX}"),
    (dict(max_pixels=MAX_PIXELS + 1), f"max_pixels must be an integer in 1..{MAX_PIXELS}"),
    (dict(max_side=True), "max_side must be an integer"),
])
def test_image_limits_outside_their_range_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        ImageLimits(**kwargs)


# ------------------------------------------------------------------------------------ header structure

def _jpeg_of(rgb, **kw):
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, format="JPEG", **kw)
    return out.getvalue()


def _crafted():
    """Files Pillow's header parser walks one byte or one chunk at a time in Python (0.24-0.29 s a megabyte)."""
    jpeg = _jpeg_of(_rgb(16, 16))
    png = io.BytesIO()
    PILImage.fromarray(_rgb(16, 16)).save(png, format="PNG")
    png = png.getvalue()
    return [
        ("1 MB of 0xFF fill bytes after SOI", jpeg[:2] + b"\xff" * 1_000_000 + jpeg[2:], "over 64 fill bytes at 2"),
        ("100,000 empty PNG chunks", png[:33] + chunk(b"quUx", b"") * 100_000 + png[33:], "more than 4096 chunks"),
        ("201 JPEG scans", jpeg[:-2] + b"\xff\xda" * 200 + jpeg[-2:], "201 scans, at most 100"),
        ("junk between JPEG segments", jpeg[:2] + b"\x00" * 10 + jpeg[2:], "byte 0x00 at 2 where a marker belongs"),
        ("a scan before the frame header", b"\xff\xd8\xff\xda\x00\x02", "scan starts before any frame header"),
        ("a PNG without IHDR first", png[:12] + b"IHDX" + png[16:], "does not start with its 13-byte IHDR"),
    ]


@pytest.mark.parametrize("name, data, fragment", _crafted(), ids=[c[0] for c in _crafted()])
def test_crafted_header_structures_are_refused_in_bounded_time_before_pillow_walks_them(decodes, name, data, fragment):
    best = 1.0
    for _ in range(3):
        start = time.perf_counter()
        with pytest.raises(ImageConversionError, match=re.escape(fragment)):
            compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=data))
        best = min(best, time.perf_counter() - start)
    assert best < 0.05, f"{name}: {best * 1e3:.1f} ms"  # Pillow's own walk of the first two took 240-290 ms
    assert decodes == []


@pytest.mark.parametrize("encode", [
    lambda rgb: _jpeg_of(rgb), lambda rgb: _jpeg_of(rgb, progressive=True), lambda rgb: _jpeg_of(rgb, optimize=True),
    lambda rgb: _jpeg_of(rgb, exif=b"Exif\x00\x00" + bytes(3000), quality=50, subsampling=0),
    lambda rgb: _png_of(PILImage.fromarray(rgb)), lambda rgb: _png_of(PILImage.fromarray(rgb).convert("L")),
    lambda rgb: _png_of(PILImage.fromarray(rgb).convert("P")), lambda rgb: _png_of(PILImage.fromarray(rgb).convert("RGBA")),
    lambda rgb: _png_of(PILImage.fromarray(rgb[..., 0].astype(np.uint16) * 257)),  # 16-bit grey
], ids=["jpeg", "jpeg-progressive", "jpeg-optimized", "jpeg-exif-444", "png-rgb", "png-grey", "png-palette",
        "png-rgba", "png-grey16"])
def test_what_encoders_write_passes_the_header_checks_and_decodes_at_its_size(encode):
    rgb = _rgb(60, 90, seed=3)
    out = compressed_msg_to_rgb(SimpleNamespace(format="", data=encode(rgb)))
    assert out.shape == (60, 90, 3) and out.dtype == np.uint8


def _png_of(image):
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_a_png_of_many_8_kib_chunks_as_libpng_writes_it_is_accepted():
    rows = b"".join(b"\x00" + _rgb(1, 1024, seed=r).tobytes() for r in range(1024))  # 1024 x 1024 noise: 3 MiB
    idat = zlib.compress(rows, 1)
    chunks = [chunk(b"IDAT", idat[i:i + 8192]) for i in range(0, len(idat), 8192)]
    data = png_header(1024, 1024)[:33] + b"".join(chunks) + chunk(b"IEND", b"")
    assert len(chunks) > 300 and read_header(data) == ImageHeader("PNG", 1024, 1024)
    assert compressed_msg_to_rgb(SimpleNamespace(format="png", data=data)).shape == (1024, 1024, 3)
    assert MAX_PNG_CHUNKS * 8192 >= ImageLimits().max_bytes * 4  # libpng's 8 KiB chunks: 4x headroom at 8 MiB
