"""Property-based fuzzing of everything the planner node reads from a topic or a service (hypothesis).

Image conversion on arbitrary raw Image fields and on random, truncated and bomb compressed payloads;
the odometry, command, route target and question checks on NaN, infinities, huge, empty and wrong-typed
values; camera matching on arbitrary stamps. Invariants: nothing but the typed error is ever raised, what is
accepted is what the policy may see (finite, bounded, one of the known commands), error messages stay one
short line, and work is bounded: a payload over a limit is rejected before Pillow decodes a pixel (counted),
and rejections that decode nothing return within RETURN_BOUND_S for inputs up to 1 MB.
Examples are derandomized (the same inputs every run) and counted per test, so the file runs in seconds.
"""
import io
import math
import struct
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image as PILImage
from PIL import ImageFile

from wam_diff_core.constants import NAV_COMMANDS
from wam_diff_ros.camera_sync import ApproximateTimeSync, StampedFrame
from wam_diff_ros.image_conversion import (RAW_ENCODINGS, ImageConversionError, ImageLimits, compressed_msg_to_rgb,
                                           image_msg_to_rgb, rgb_to_raw)
from wam_diff_ros.image_headers import MAX_PNG_CHUNKS
from wam_diff_ros.input_checks import (MAX_QUESTION_CHARS, MAX_ROUTE_TARGET_M, MAX_SPEED_MPS, MAX_YAW_RATE_RPS,
                                       InputRejected, command_text, odometry_sample, question_text, route_target)

# Headers between Pillow's warning and error thresholds warn once as they are opened; the limits reject them.
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

MB = 1_000_000
# Rejections that decode nothing take microseconds; 50 ms leaves a loaded 2-core machine a 100-fold margin.
RETURN_BOUND_S = 0.05
# Longest error message: a diagnostic stays one readable line whatever the input held.
MAX_MESSAGE_CHARS = 300


def fuzz(max_examples: int):
    # deadline: a generous per-example bound (the slowest example, a small image decode, takes milliseconds)
    return settings(max_examples=max_examples, deadline=1000, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def warm_pillow():
    """Import Pillow's JPEG and PNG plugins once, so no example pays the import."""
    compressed_msg_to_rgb(SimpleNamespace(format="png", data=_png(_noise(4, 4))))


class DecodeCounter:
    """Counts ImageFile.load calls (pixel decodes) while active; a context manager around one example."""

    def __init__(self):
        self.calls = 0
        self._original = ImageFile.ImageFile.load

    def __enter__(self):
        counter = self

        def load(image):
            counter.calls += 1
            return counter._original(image)

        ImageFile.ImageFile.load = load
        return self

    def __exit__(self, *exc):
        ImageFile.ImageFile.load = self._original


def _noise(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png(rgb):
    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(rgb):
    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header(width, height, bit_depth=8, color_type=2, idat=b""):
    """A PNG stating width x height in its IHDR, followed by `idat` (usually no pixels at all)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def jpeg_header(width, height):
    """JPEG start, a baseline SOF0 stating width x height (3 components) and a scan header, with no tables and
    no scan data after it."""
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"".join(bytes([i, 0x11, 0]) for i in (1, 2, 3))
    sos = bytes([3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0])
    return (b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
            + b"\xff\xda" + struct.pack(">H", len(sos) + 2) + sos)


def _over_limits(width, height, limits=ImageLimits()):
    return width > limits.max_side or height > limits.max_side or width * height > limits.max_pixels


# -------------------------------------------------------------------------------------------- raw Image

ENCODINGS = st.one_of(st.sampled_from(sorted(RAW_ENCODINGS) + ["RGB8", " bgr8 ", "mono16", "rgb16", "16UC1",
                                                               "yuv422", "bayer_rggb8", "32FC1", ""]),
                      st.text(max_size=20), st.none(), st.integers())
SIDE = st.one_of(st.integers(0, 12), st.sampled_from([4096, 4097, 16384, 2**31 - 1, 2**32 - 1]),
                 st.integers(-5, -1), st.floats(allow_nan=True), st.none(), st.text(max_size=3))


@st.composite
def raw_images(draw):
    """Field combinations of a sensor_msgs/Image: mostly near-valid (one field off), sometimes anything."""
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    encoding = draw(st.sampled_from(sorted(RAW_ENCODINGS)))
    data, step = rgb_to_raw(_noise(h, w, draw(st.integers(0, 9))), encoding, row_padding=draw(st.integers(0, 3)))
    fields = dict(height=h, width=w, encoding=encoding, step=step, data=data, is_bigendian=draw(st.integers(0, 255)))
    for name in draw(st.sets(st.sampled_from(sorted(fields)), max_size=3)):
        fields[name] = draw({
            "height": SIDE, "width": SIDE, "encoding": ENCODINGS, "is_bigendian": st.integers(0, 255),
            "step": st.one_of(st.integers(0, 64), st.sampled_from([2**32 - 1]), st.floats(), st.none()),
            "data": st.one_of(st.binary(max_size=300), st.just(data[:-1]), st.just(data + b"\0"), st.none(),
                              st.text(max_size=10), st.lists(st.integers(0, 255), max_size=10))}[name])
    return SimpleNamespace(**fields)


@fuzz(400)
@given(raw_images())
def test_raw_image_fields_give_an_rgb_frame_or_an_image_conversion_error_only(msg):
    try:
        out = image_msg_to_rgb(msg)
    except ImageConversionError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    assert out.dtype == np.uint8 and out.shape == (msg.height, msg.width, 3) and out.flags.c_contiguous
    assert len(msg.data) == msg.step * msg.height and msg.encoding.strip().lower() in RAW_ENCODINGS


# ------------------------------------------------------------------------------------ CompressedImage

@st.composite
def compressed_payloads(draw):
    """Random bytes, truncated or bit-flipped real JPEG / PNG, and headers stating sizes up to 2^31 px a side."""
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "png_header", "jpeg_header", "valid"]))
    if kind == "random":
        return draw(st.one_of(st.binary(max_size=2048), st.binary(min_size=2, max_size=512).map(
            lambda b: b"\x89PNG\r\n\x1a\n" + b), st.binary(max_size=512).map(lambda b: b"\xff\xd8\xff" + b)))
    rgb = _noise(draw(st.integers(1, 24)), draw(st.integers(1, 24)), draw(st.integers(0, 9)))
    real = draw(st.sampled_from([_png, _jpeg]))(rgb)
    if kind == "truncated":
        return real[: draw(st.integers(0, len(real) - 1))]
    if kind == "flipped":
        data = bytearray(real)
        for pos in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=8)):
            data[pos] ^= draw(st.integers(1, 255))
        return bytes(data)
    side = st.one_of(st.integers(0, 64), st.integers(4000, 20000), st.sampled_from([2**16 - 1, 2**31 - 1]))
    if kind == "png_header":
        return png_header(draw(side), draw(side), draw(st.sampled_from([1, 8, 16])), draw(st.sampled_from([0, 2, 6])),
                          draw(st.sampled_from([b"", zlib.compress(b"\0" * 64)])))
    if kind == "jpeg_header":
        return jpeg_header(draw(st.integers(0, 2**16 - 1)), draw(st.integers(0, 2**16 - 1)))
    return real


@fuzz(500)
@given(compressed_payloads(), st.one_of(st.sampled_from(["jpeg", "png", "", "rgb8; jpeg compressed bgr8"]),
                                        st.text(max_size=30)))
def test_compressed_payloads_give_an_rgb_frame_or_an_image_conversion_error_only(data, fmt):
    try:
        out = compressed_msg_to_rgb(SimpleNamespace(format=fmt, data=data))
    except ImageConversionError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
    assert 0 < out.shape[0] <= ImageLimits().max_side and 0 < out.shape[1] <= ImageLimits().max_side


@fuzz(300)
@given(st.integers(1, 2**31 - 1), st.integers(1, 2**31 - 1), st.sampled_from(["png", "jpeg"]))
def test_headers_over_the_limits_are_rejected_without_decoding_a_pixel(width, height, kind):
    if kind == "jpeg":
        width, height = min(width, 2**16 - 1), min(height, 2**16 - 1)  # SOF sides are 16-bit
    data = png_header(width, height, idat=zlib.compress(b"")) if kind == "png" else jpeg_header(width, height)
    with DecodeCounter() as decodes:
        try:
            compressed_msg_to_rgb(SimpleNamespace(format=kind, data=data))
        except ImageConversionError:
            pass
        else:
            raise AssertionError(f"a {kind} header without pixels was accepted as {width}x{height}")
    assert decodes.calls == (0 if _over_limits(width, height) else 1), (width, height)


def _timed(fn, *args):
    """Best of three wall times of fn(*args), which must raise the typed error."""
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        with pytest.raises((ImageConversionError, InputRejected)):
            fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


@fuzz(40)
@given(st.integers(1024, MB), st.sampled_from(["random", "png_bomb", "jpeg_bomb", "zeros", "jpeg_fill", "png_chunks"]),
       st.integers(0, 2**32 - 1))
def test_megabyte_payloads_that_decode_nothing_are_rejected_within_the_bound(size, kind, seed):
    if kind == "random":
        data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    elif kind == "zeros":
        data = bytes(size)
    elif kind == "jpeg_fill":  # fill bytes Pillow would step through one at a time
        data = b"\xff\xd8" + b"\xff" * size + jpeg_header(16, 16)[2:]
    elif kind == "png_chunks":  # more empty chunks than allowed, which Pillow would read one by one
        data = png_header(16, 16)[:33] + _chunk(b"quUx", b"") * max(size // 12, MAX_PNG_CHUNKS) + png_header(16, 16)[33:]
    else:  # a bomb header padded to `size` with chunks or JPEG bytes the header check never reaches
        head = png_header(16000, 16000) if kind == "png_bomb" else jpeg_header(16000, 16000)
        data = head + bytes(size - len(head)) if size > len(head) else head
    with DecodeCounter() as decodes:
        elapsed = _timed(compressed_msg_to_rgb, SimpleNamespace(format="png", data=data))
    assert decodes.calls == 0
    assert elapsed < RETURN_BOUND_S, f"{kind} payload of {len(data)} bytes took {elapsed * 1e3:.1f} ms to reject"


def test_a_payload_over_max_bytes_is_rejected_in_constant_time_whatever_its_size():
    small = _timed(compressed_msg_to_rgb, SimpleNamespace(format="jpeg", data=bytes(101)), ImageLimits(max_bytes=100))
    big = _timed(compressed_msg_to_rgb, SimpleNamespace(format="jpeg", data=bytes(64 * MB)), ImageLimits())
    assert big < RETURN_BOUND_S and small < RETURN_BOUND_S, (small, big)


# ------------------------------------------------------------------------------ odometry, command, target

WILD_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**400), 10**400),
                         st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 1e-320, -0.0, 100.0001]),
                         st.none(), st.text(max_size=5), st.booleans(), st.just(np.float32(3.5)))
# three plausible values for one wild one, so a fair share of messages is accepted and checked as such
NUMBERS = st.one_of(st.floats(-120, 120), st.floats(-12, 12), st.integers(-120, 120), WILD_NUMBERS)
VALID_STAMPS = st.builds(SimpleNamespace, sec=st.integers(0, 2**31 - 1), nanosec=st.integers(0, 10**9 - 1))
STAMPS = st.one_of(VALID_STAMPS, VALID_STAMPS, st.builds(
    SimpleNamespace, sec=st.one_of(st.integers(-(2**31), 2**31 - 1), st.floats(), st.none()),
    nanosec=st.one_of(st.integers(0, 2**32 - 1), st.integers(-5, -1), st.floats(), st.none())))


def _vec(**kw):
    return SimpleNamespace(**kw)


@st.composite
def odometry_msgs(draw):
    return _vec(header=_vec(stamp=draw(STAMPS), frame_id="odom"),
                twist=_vec(twist=_vec(linear=_vec(x=draw(NUMBERS), y=draw(NUMBERS), z=draw(NUMBERS)),
                                      angular=_vec(x=draw(NUMBERS), y=draw(NUMBERS), z=draw(NUMBERS)))))


@fuzz(500)
@given(odometry_msgs())
def test_odometry_gives_a_finite_bounded_sample_or_input_rejected_only(msg):
    try:
        sample = odometry_sample(msg)
    except InputRejected as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    for value, bound in ((sample.vx, MAX_SPEED_MPS), (sample.vy, MAX_SPEED_MPS), (sample.yaw_rate, MAX_YAW_RATE_RPS)):
        assert isinstance(value, float) and math.isfinite(value) and abs(value) <= bound
    stamp = msg.header.stamp
    assert sample.stamp_ns == stamp.sec * 10**9 + stamp.nanosec and stamp.sec >= 0 and 0 <= stamp.nanosec < 10**9


COMMANDS = st.one_of(st.sampled_from(list(NAV_COMMANDS)).map(lambda c: st.sampled_from([c, c.upper(), f"  {c}\n"])
                                                             ).flatmap(lambda s: s),
                     st.text(max_size=40), st.sampled_from(["", " ", "ｆｏｌｌｏｗ ｌａｎｅ", "follow\u00a0lane", "turn left\0"]),
                     st.integers(1, MB).map(lambda n: "follow lane" * (n // 11 + 1)), st.none(), st.binary(max_size=8))


@fuzz(400)
@given(COMMANDS)
def test_a_command_is_one_of_the_navigation_commands_or_input_rejected_only(data):
    try:
        command = command_text(data)
    except InputRejected as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    assert command in NAV_COMMANDS and command == data.strip().lower()


@st.composite
def route_target_msgs(draw):
    frame_id = draw(st.one_of(st.just("base_link"), st.just("base_link"), st.text(max_size=12), st.just("x" * MB)))
    return _vec(header=_vec(stamp=draw(STAMPS), frame_id=frame_id),
                point=_vec(x=draw(NUMBERS), y=draw(NUMBERS), z=draw(NUMBERS)))


@fuzz(500)
@given(route_target_msgs())
def test_a_route_target_is_finite_in_the_ego_frame_or_input_rejected_only(msg):
    try:
        stamp, (x, y) = route_target(msg, "base_link")
    except InputRejected as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    assert msg.header.frame_id == "base_link" and stamp >= 0
    assert all(isinstance(v, float) and math.isfinite(v) and abs(v) <= MAX_ROUTE_TARGET_M for v in (x, y))


QUESTIONS = st.one_of(st.text(max_size=200), st.text(alphabet=st.characters(max_codepoint=0x7f), max_size=50),
                      st.integers(MAX_QUESTION_CHARS - 2, MB).map(lambda n: "Is there a car ahead? "[: 1] * n),
                      st.sampled_from(["", "   ", "\n\t", "What now?\0", "a\x1b[2Jb", "\x7f", "Is it red?"]),
                      st.none(), st.integers())


@fuzz(400)
@given(QUESTIONS)
def test_a_question_is_short_printable_text_or_input_rejected_only(question):
    try:
        accepted = question_text(question)
    except InputRejected as exc:
        assert "\n" not in str(exc) and len(str(exc)) < MAX_MESSAGE_CHARS
        event("rejected")
        return
    event("accepted")
    assert accepted == question and 0 < len(accepted.strip()) and len(accepted) <= MAX_QUESTION_CHARS
    assert all(c >= " " and c != "\x7f" or c in "\t\n\r" for c in accepted)


@pytest.mark.parametrize("check, value", [
    (command_text, "follow lane" * 100_000), (command_text, "\u3000" * MB),
    (question_text, "Is there a car ahead?" * 50_000), (question_text, " " * MB),
    (lambda v: route_target(v, "base_link"), _vec(header=_vec(frame_id="m" * MB, stamp=_vec(sec=0, nanosec=0)),
                                                  point=_vec(x=1.0, y=1.0))),
])
def test_megabyte_strings_are_rejected_within_the_bound_with_a_short_message(check, value):
    assert _timed(check, value) < RETURN_BOUND_S
    with pytest.raises(InputRejected) as info:
        check(value)
    assert len(str(info.value)) < MAX_MESSAGE_CHARS


# -------------------------------------------------------------------------------------------- stamps

@fuzz(300)
@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=30))
def test_one_camera_plans_every_newer_frame_and_every_frame_after_a_jump_back_of_more_than_a_second(stamps):
    sync = ApproximateTimeSync(1, 0.05)
    last = -1
    for ns in stamps:
        matched = sync.add(0, StampedFrame(ns, None))
        expected = ns > last or ns < last - 10**9
        assert (matched is not None) == expected, (ns, last)
        if expected:
            last = ns
    assert sync.resets == sum(1 for a, b in _used_pairs(stamps) if b < a - 10**9)


def _used_pairs(stamps):
    """(last used, next) stamp pairs of a one-camera stream, as the matcher sees them."""
    pairs, last = [], -1
    for ns in stamps:
        pairs.append((last, ns))
        if ns > last or ns < last - 10**9:
            last = ns
    return pairs


def test_one_frame_stamped_far_in_the_future_does_not_stop_the_following_frames():
    sync = ApproximateTimeSync(2, 0.05)
    assert sync.add(0, StampedFrame(10 * 10**9, "a")) is None
    assert sync.add(1, StampedFrame(10 * 10**9 + 1, "b")) is not None
    sync.add(0, StampedFrame(2**31 * 10**9, "hostile"))
    assert sync.add(1, StampedFrame(2**31 * 10**9, "hostile")) is not None  # a far-future pair is a pair
    assert sync.add(0, StampedFrame(11 * 10**9, "c")) is None  # the clock jumped back: start afresh
    matched = sync.add(1, StampedFrame(11 * 10**9 + 5, "d"))
    assert matched is not None and [f.frame for f in matched.frames] == ["c", "d"]
    assert sync.resets == 1  # camera 0 went back and started every camera afresh
