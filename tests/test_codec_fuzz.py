"""Property-based fuzzing of the three parsers (trajectory, boxes, answers) with hypothesis.

Invariants on any text: a parser returns its typed value or a ParseError (never raises), returns within
RETURN_BOUND_S for inputs up to 1 MB, and never accepts a number written with non-ASCII characters.
Examples are derandomized (the same inputs every run) and counted per test, so the file runs in seconds.
"""
import json
import time
import unicodedata

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wam_diff_core.codec import (
    MAX_TRAJECTORY_TEXT_CHARS,
    PARSE_ERROR_KINDS,
    ParseError,
    format_detections,
    format_trajectory,
    parse_answer,
    parse_detections,
    parse_trajectory,
)
from wam_diff_core.constants import BOX_SCALE, EOS_TOKEN, NUM_WAYPOINTS
from wam_diff_core.types import Detection

SIZE = (640, 480)
MB = 1_000_000
# Rejecting a 1 MB text took 0.2-0.7 s when every number was converted before the count was checked; every
# parser now reads a bounded prefix (MAX_*_TEXT_CHARS) and answers in microseconds to milliseconds.
RETURN_BOUND_S = 0.05


def fuzz(max_examples: int):
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Characters a number could be spelled with outside ASCII: full-width, Arabic-Indic, Devanagari, Bengali and
# mathematical digits (all str.isdecimal, all read by float()), superscripts, and Unicode signs and separators.
UNICODE_DIGITS = "".join(chr(base + d) for base in (0xFF10, 0x0660, 0x0966, 0x09E6, 0x1D7CE) for d in range(10))
UNICODE_NUMBERISH = (UNICODE_DIGITS + "¹²³⁴⁵⁶⁷⁸⁹⁰₁₂" + "\u2212\uff0b\uff0d\u2012\u2013\u00b1"
                     + "\uff0e\uff0c\u066b\u066c\u3000\u00a0")
ASCII_NUMBERISH = "0123456789.,+-eE \n"
NUMBERISH = st.text(alphabet=ASCII_NUMBERISH + UNICODE_NUMBERISH + "naifNIF", max_size=200)
TEXT = st.one_of(st.text(max_size=300), NUMBERISH, st.binary(max_size=200).map(lambda b: b.decode("latin-1")))


def _long(unit_strategy):
    """Up to 1 MB: a short unit repeated, optionally after a valid-looking start."""
    starts = st.sampled_from(["", "1.00,2.00,", "[", '[{"bbox_2d":[1,2,3,4],"label":"car"},'])
    lengths = st.one_of(st.just(MB), st.integers(MB // 2, MB), st.integers(1, 4096))
    return st.tuples(starts, unit_strategy, lengths).map(lambda t: (t[0] + t[1] * (MB // len(t[1])))[: t[2]])


LONG = _long(st.one_of(st.sampled_from(["1,", "1", " ", "[", "{", '"', "-", "1.0e", "nan,", "１,", "\u3000"]),
                       st.text(min_size=1, max_size=8)))


def _timed(parse, text, runs: int = 3):
    """The parse's result and its best time of `runs` (the machine is shared: the fastest run is the parser's cost,
    the slower ones include whatever else ran); every run must give the same result."""
    results, times = [], []
    for _ in range(runs):
        start = time.perf_counter()
        results.append(parse(text))  # must not raise
        times.append(time.perf_counter() - start)
    assert all(repr(r) == repr(results[0]) for r in results[1:])
    return results[0], min(times)


def _check(result, ok_type):
    assert isinstance(result, (ParseError, ok_type)), repr(result)[:200]
    if isinstance(result, ParseError):
        assert result.kind in PARSE_ERROR_KINDS and result.message
        assert len(result.message) < 1000  # names the value (a repr of at most 80 characters), never the whole input
    return result


def _answer_part(text: str) -> str:
    return text.split(EOS_TOKEN, 1)[0].strip()


def _check_trajectory(text):
    result, seconds = _timed(parse_trajectory, text)
    _check(result, np.ndarray)
    if isinstance(result, np.ndarray):
        assert result.shape == (NUM_WAYPOINTS, 2) and result.dtype == np.float32
        assert np.isfinite(result).all() and np.abs(result).max() <= 200.0
        assert _answer_part(text).isascii(), f"accepted non-ASCII trajectory text {text[:80]!r}"
    return result, seconds


def _check_detections(text):
    result, seconds = _timed(lambda t: parse_detections(t, SIZE), text)
    _check(result, list)
    if isinstance(result, list):
        for det in result:
            assert isinstance(det, Detection) and det.label and det.label == det.label.strip()
            x1, y1, x2, y2 = det.box_norm
            assert 0 <= x1 <= x2 <= BOX_SCALE and 0 <= y1 <= y2 <= BOX_SCALE
    return result, seconds


def _check_answer(text):
    result, seconds = _timed(parse_answer, text)
    _check(result, str)
    if isinstance(result, str):
        assert result and result == result.strip() and EOS_TOKEN not in result
    return result, seconds


@fuzz(400)
@given(TEXT)
def test_any_text_gives_a_typed_value_or_a_parse_error_from_each_parser(text):
    for check in (_check_trajectory, _check_detections, _check_answer):
        assert check(text)[1] < RETURN_BOUND_S


@fuzz(60)
@given(LONG)
def test_texts_up_to_1mb_return_within_the_bound_and_too_long_ones_are_named(text):
    assert len(text) <= MB
    for check in (_check_trajectory, _check_detections, _check_answer):
        result, seconds = check(text)
        assert seconds < RETURN_BOUND_S, f"{check.__name__} took {seconds * 1e3:.1f} ms on {len(text)} chars"
    if len(text.split(EOS_TOKEN, 1)[0]) > MAX_TRAJECTORY_TEXT_CHARS:
        traj = parse_trajectory(text)
        assert isinstance(traj, ParseError) and traj.kind == "too_long"


def _digit_to_unicode(text: str, which: int, base: int) -> str:
    """`text` with its which-th ASCII digit spelled in the Unicode decimal block starting at `base`."""
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    i = positions[which % len(positions)]
    return text[:i] + chr(base + int(text[i])) + text[i + 1:]


COORD = st.floats(-199.0, 199.0, allow_nan=False)
TRAJECTORIES = st.lists(COORD, min_size=2 * NUM_WAYPOINTS, max_size=2 * NUM_WAYPOINTS).map(
    lambda v: np.asarray(v).reshape(NUM_WAYPOINTS, 2))
DIGIT_BLOCKS = st.sampled_from([0xFF10, 0x0660, 0x0966, 0x09E6, 0x1D7CE])


@fuzz(300)
@given(TRAJECTORIES, st.sampled_from(["official", "fixed"]), st.integers(0, 10_000), DIGIT_BLOCKS)
def test_a_valid_trajectory_with_one_digit_in_another_script_is_rejected_and_the_ascii_one_parses(
        traj, style, which, base):
    text = format_trajectory(traj, style)
    parsed = parse_trajectory(text)
    assert isinstance(parsed, np.ndarray) and np.abs(parsed - traj).max() <= 0.005 + 1e-4
    swapped = _digit_to_unicode(text, which, base)
    assert unicodedata.digit(next(c for c in swapped if not c.isascii())) in range(10)
    result = parse_trajectory(swapped)
    assert isinstance(result, ParseError) and result.kind == "not_a_number", (swapped, result)


@fuzz(300)
@given(TRAJECTORIES, st.sampled_from(["official", "fixed"]), st.integers(0, 10_000),
       st.sampled_from(["\u2212", "\uff0d", "\uff0b", "\u3000", "\u00a0", "\uff0c", "\uff0e", "\u066b"]))
def test_a_valid_trajectory_with_a_unicode_sign_or_separator_inside_is_rejected(traj, style, where, char):
    text = format_trajectory(traj, style)
    i = 1 + where % (len(text) - 1)  # inside the text: surrounding whitespace is stripped, not read
    result = parse_trajectory(text[:i] + char + text[i:])
    assert isinstance(result, ParseError) and result.kind == "not_a_number"


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(), st.text(max_size=12))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                          max_leaves=40)
BOXLIKE = st.lists(st.fixed_dictionaries({}, optional={"bbox_2d": st.one_of(st.lists(JSON_LEAF, max_size=6),
                                                                             JSON_VALUE),
                                                       "label": JSON_VALUE}), max_size=6)


@fuzz(300)
@given(st.one_of(JSON_VALUE, BOXLIKE), st.sampled_from(["", "```json\n{}\n```", "{}" + EOS_TOKEN + "junk"]),
       st.integers(0, 60_000))
def test_nested_and_deep_json_gives_boxes_or_a_parse_error(value, wrapping, depth):
    body = json.dumps(value, allow_nan=True)
    if depth > 30_000:  # nesting far beyond the recursion limit, still under the length limit
        body = "[" * (depth - 30_000) + body + "]" * (depth - 30_000)
    text = wrapping.replace("{}", body) if wrapping else body
    result, seconds = _check_detections(text)
    assert seconds < RETURN_BOUND_S
    _check_trajectory(text)
    _check_answer(text)


BOXES = st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500), st.integers(0, 500), st.integers(0, 500),
                           st.sampled_from(["car", "truck", "pedestrian", "Ampel ４"])), min_size=1, max_size=5)


@fuzz(200)
@given(BOXES, st.integers(0, 10_000), DIGIT_BLOCKS)
def test_valid_boxes_parse_and_a_coordinate_digit_in_another_script_is_rejected(boxes, which, base):
    dets = [Detection(label=lab, box_px=(0, 0, 0, 0), box_norm=(x, y, x + w, y + h)) for x, y, w, h, lab in boxes]
    text = format_detections(dets)
    parsed = parse_detections(text, SIZE)
    assert isinstance(parsed, list) and [d.box_norm for d in parsed] == [tuple(map(float, d.box_norm)) for d in dets]
    numbers = [i for i, c in enumerate(text) if c.isdigit() and c.isascii() and text[:i].count('"') % 2 == 0]
    i = numbers[which % len(numbers)]  # a digit of a coordinate, not of a label
    swapped = text[:i] + chr(base + int(text[i])) + text[i + 1:]
    result = parse_detections(swapped, SIZE)
    assert isinstance(result, ParseError) and result.kind == "bad_json", (swapped, result)
