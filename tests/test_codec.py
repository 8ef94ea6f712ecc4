"""Codec: model text <-> trajectories, boxes and answers; parsing never raises."""
import json
import random

import numpy as np
import pytest

from wam_diff_core.codec import (
    MAX_TRAJECTORY_TEXT_CHARS,
    PARSE_ERROR_KINDS,
    ParseError,
    boxes_norm_to_px,
    boxes_px_to_norm,
    format_detections,
    format_trajectory,
    parse_answer,
    parse_detections,
    parse_trajectory,
)
from wam_diff_core.constants import EOS_TOKEN, NUM_WAYPOINTS
from wam_diff_core.types import Detection

KNOWN = np.array(
    [[1.2, -0.05], [2.5, 0.0], [3.75, 0.1], [5.004, -0.001], [6.5, 0.25], [8.0, 0.5], [9.999, 0.75], [11.0, -1.0]]
)
KNOWN_TEXT = "1.20,-0.05,2.50,0.00,3.75,0.10,5.00,0.00,6.50,0.25,8.00,0.50,10.00,0.75,11.00,-1.00"
SIZE = (640, 480)
# KNOWN_TEXT with full-width digits (U+FF10..U+FF19): float() reads each of its numbers, "１．２０" it does not
FULL_WIDTH_TEXT = KNOWN_TEXT.translate(str.maketrans("0123456789", "０１２３４５６７８９"))


def _kind(result):
    assert isinstance(result, ParseError), f"expected a ParseError, got {result!r}"
    assert result.kind in PARSE_ERROR_KINDS
    return result.kind


# --- trajectory -------------------------------------------------------------------------------


def test_format_trajectory_exact_string_two_decimals_no_spaces_no_negative_zero():
    assert format_trajectory(KNOWN) == KNOWN_TEXT


def test_trajectory_round_trip_within_half_centimetre():
    rng = np.random.default_rng(0)
    for _ in range(50):
        arr = rng.uniform(-150, 150, size=(NUM_WAYPOINTS, 2))
        back = parse_trajectory(format_trajectory(arr))
        assert isinstance(back, np.ndarray)
        assert back.shape == (NUM_WAYPOINTS, 2) and back.dtype == np.float32
        assert np.abs(back - arr).max() <= 0.005 + 1e-4  # float32 rounding of values up to 150 m


def test_parse_trajectory_known_values_and_layout_x_then_y():
    arr = parse_trajectory(KNOWN_TEXT)
    assert arr[0, 0] == pytest.approx(1.20) and arr[0, 1] == pytest.approx(-0.05)
    assert arr[7, 0] == pytest.approx(11.0) and arr[7, 1] == pytest.approx(-1.0)


def test_parse_trajectory_ignores_whitespace_and_text_after_eos():
    arr = parse_trajectory(f"  \n{KNOWN_TEXT}{EOS_TOKEN}garbage 1,2,3\n")
    assert isinstance(arr, np.ndarray)
    np.testing.assert_allclose(arr, parse_trajectory(KNOWN_TEXT))


def test_format_trajectory_rejects_wrong_shape_and_nan():
    with pytest.raises(ValueError, match="shape"):
        format_trajectory(np.zeros((7, 2)))
    with pytest.raises(ValueError, match="finite"):
        format_trajectory(np.full((8, 2), np.nan))


@pytest.mark.parametrize(
    "text, kind",
    [
        ("", "empty"),
        ("   \n ", "empty"),
        (EOS_TOKEN + KNOWN_TEXT, "empty"),
        (KNOWN_TEXT.rsplit(",", 1)[0] + ",1.", "truncated"),
        (KNOWN_TEXT.rsplit(",", 1)[0] + ",-", "truncated"),
        (KNOWN_TEXT.rsplit(",", 1)[0] + ",1.2e", "truncated"),
        (KNOWN_TEXT + ",", "truncated"),
        (KNOWN_TEXT.rsplit(",", 1)[0], "wrong_count"),  # 15 numbers
        (KNOWN_TEXT + ",1.00", "wrong_count"),  # 17 numbers
        (KNOWN_TEXT.replace("2.50", "nan"), "non_finite"),
        (KNOWN_TEXT.replace("2.50", "inf"), "non_finite"),
        (KNOWN_TEXT.replace("2.50", "-Infinity"), "non_finite"),
        (KNOWN_TEXT.replace("2.50", "1e999"), "non_finite"),
        (KNOWN_TEXT.replace("2.50", "abc"), "not_a_number"),
        (KNOWN_TEXT.replace("2.50", "1."), "not_a_number"),  # cut mid-number but not at the end
        (KNOWN_TEXT.replace(",2.50,", ",,"), "not_a_number"),
        (KNOWN_TEXT + " and then", "not_a_number"),
        (KNOWN_TEXT.replace("11.00", "200.01"), "out_of_range"),
        (KNOWN_TEXT.replace("-1.00", "-250.00"), "out_of_range"),
        (KNOWN_TEXT + ",abc", "wrong_count"),  # a 17th value ends the reading whatever it is
        (KNOWN_TEXT + ",1.00,2.00", "wrong_count"),
        (FULL_WIDTH_TEXT, "not_a_number"),
        (KNOWN_TEXT.replace("3.75", "3.7\u0665"), "not_a_number"),  # an Arabic-Indic 5 in value 5
        (KNOWN_TEXT.replace("-1.00", "\u22121.00"), "not_a_number"),  # the Unicode minus sign
        ("1," * 500_000, "too_long"),  # 1 MB
        (" " * 600 + KNOWN_TEXT, "too_long"),  # whitespace counts towards the 512 characters
    ],
)
def test_parse_trajectory_malformed_gives_kind(text, kind):
    assert _kind(parse_trajectory(text)) == kind


def test_full_width_digits_float_reads_are_not_a_trajectory_and_the_message_names_the_character():
    assert float(FULL_WIDTH_TEXT.split(",")[0]) == 1.2  # what a \d-based parser accepted
    err = parse_trajectory(FULL_WIDTH_TEXT)
    assert _kind(err) == "not_a_number"
    assert "'１'" in err.message and "U+FF11" in err.message and "value 1 " in err.message


def test_too_long_trajectory_is_rejected_from_a_bounded_prefix_and_a_valid_one_after_eos_junk_still_parses():
    class Guarded(str):
        """Records the slices taken; any whole-text scan (split, strip, find, ...) fails the test."""

        slices = []

        def __getitem__(self, key):
            Guarded.slices.append(key)
            return str.__getitem__(self, key)

    for name in ("split", "strip", "lstrip", "rstrip", "find", "index", "count", "isascii", "encode", "__iter__",
                 "__contains__", "partition"):
        setattr(Guarded, name, lambda self, *a, _n=name: pytest.fail(f"the parser scanned the whole text ({_n})"))
    assert _kind(parse_trajectory(Guarded("1," * 500_000))) == "too_long"
    assert [(s.start, s.stop) for s in Guarded.slices] == [(None, MAX_TRAJECTORY_TEXT_CHARS + len(EOS_TOKEN))]
    assert MAX_TRAJECTORY_TEXT_CHARS == 512
    arr = parse_trajectory(KNOWN_TEXT + EOS_TOKEN + "1," * 500_000)
    assert isinstance(arr, np.ndarray) and arr[7, 1] == pytest.approx(-1.0)
    assert isinstance(parse_trajectory(" " * (512 - len(KNOWN_TEXT)) + KNOWN_TEXT), np.ndarray)  # exactly 512


def test_parse_trajectory_accepts_200m_boundary():
    arr = parse_trajectory(KNOWN_TEXT.replace("11.00", "200.00"))
    assert isinstance(arr, np.ndarray) and arr[7, 0] == pytest.approx(200.0)


def test_parse_trajectory_non_string_is_not_text():
    assert _kind(parse_trajectory(None)) == "not_text"
    assert _kind(parse_trajectory(KNOWN_TEXT.encode())) == "not_text"


# --- boxes ------------------------------------------------------------------------------------


def test_box_px_to_norm_and_back_on_640x480():
    norm = boxes_px_to_norm((64, 48, 320, 480), SIZE)
    assert norm == pytest.approx((100.0, 100.0, 500.0, 1000.0))
    assert boxes_norm_to_px(norm, SIZE) == pytest.approx((64.0, 48.0, 320.0, 480.0))
    assert boxes_norm_to_px((250, 500, 750, 1000), SIZE) == pytest.approx((160.0, 240.0, 480.0, 480.0))


def test_box_conversion_rejects_bad_image_size():
    with pytest.raises(ValueError, match="image_size"):
        boxes_px_to_norm((0, 0, 1, 1), (0, 480))
    with pytest.raises(ValueError, match="image_size"):
        parse_detections("[]", (640,))


def test_parse_detections_fills_norm_and_px_on_640x480():
    text = '[{"bbox_2d": [100, 250, 500, 750], "label": "car"}, {"bbox_2d": [0, 0, 1000, 1000], "label": "truck"}]'
    dets = parse_detections(text, SIZE)
    assert isinstance(dets, list) and len(dets) == 2
    assert dets[0].label == "car"
    assert dets[0].box_norm == pytest.approx((100.0, 250.0, 500.0, 750.0))
    assert dets[0].box_px == pytest.approx((64.0, 120.0, 320.0, 360.0))
    assert dets[1].box_px == pytest.approx((0.0, 0.0, 640.0, 480.0))


def test_parse_detections_accepts_json_fence_eos_and_empty_list():
    fenced = '```json\n[{"bbox_2d": [10, 20, 30, 40], "label": "bus"}]\n```' + EOS_TOKEN
    dets = parse_detections(fenced, SIZE)
    assert [d.label for d in dets] == ["bus"] and dets[0].box_norm == (10.0, 20.0, 30.0, 40.0)
    assert parse_detections("[]", SIZE) == []
    assert parse_detections("```json\n[]\n```", SIZE) == []


def test_detections_round_trip_rounds_to_integer_scale():
    dets = [
        Detection("car", box_px=(0, 0, 0, 0), box_norm=(100.4, 200.6, 300.0, 999.9)),
        Detection("truck", box_px=(0, 0, 0, 0), box_norm=(0.0, 0.0, 1000.0, 1000.0)),
    ]
    text = format_detections(dets)
    assert text == '[{"bbox_2d":[100,201,300,1000],"label":"car"},{"bbox_2d":[0,0,1000,1000],"label":"truck"}]'
    back = parse_detections(text, SIZE)
    assert [d.label for d in back] == ["car", "truck"]
    assert back[0].box_norm == (100.0, 201.0, 300.0, 1000.0)
    assert back[0].box_px == pytest.approx((64.0, 96.48, 192.0, 480.0))
    assert format_detections([]) == "[]"


@pytest.mark.parametrize(
    "text, kind",
    [
        ("", "empty"),
        ("```json\n```", "empty"),
        ("the cars are on the left", "bad_json"),
        ('{"bbox_2d": [1, 2, 3, 4], "label": "car"}', "bad_json"),  # an object, not a list
        ('[{"bbox_2d": [1, 2, 3, 4], "label": "car"}', "truncated"),
        ('[{"bbox_2d": [1, 2, 3', "truncated"),
        ('[{"bbox_2d": [1, 2, 3, 4], "label": "ca', "truncated"),
        ('[{"label": "car"}]', "missing_key"),
        ('[{"bbox_2d": [1, 2, 3, 4]}]', "missing_key"),
        ('[{"bbox_2d": [1, 2, 3, 4], "label": ""}]', "bad_label"),
        ('[{"bbox_2d": [1, 2, 3, 4], "label": 7}]', "bad_label"),
        ('[[1, 2, 3, 4]]', "bad_box"),
        ('[{"bbox_2d": [1, 2, 3], "label": "car"}]', "bad_box"),
        ('[{"bbox_2d": [300, 2, 100, 4], "label": "car"}]', "bad_box"),  # x2 < x1
        ('[{"bbox_2d": [1, 400, 3, 200], "label": "car"}]', "bad_box"),  # y2 < y1
        ('[{"bbox_2d": [1, "2", 3, 4], "label": "car"}]', "not_a_number"),
        ('[{"bbox_2d": [1, true, 3, 4], "label": "car"}]', "not_a_number"),
        ('[{"bbox_2d": [1, NaN, 3, 4], "label": "car"}]', "non_finite"),
        ('[{"bbox_2d": [1, 2, Infinity, 4], "label": "car"}]', "non_finite"),
        ('[{"bbox_2d": [1, 2, 1001, 4], "label": "car"}]', "out_of_range"),
        ('[{"bbox_2d": [-1, 2, 3, 4], "label": "car"}]', "out_of_range"),
        ("[" * 60000, "bad_json"),  # nesting deep enough to blow the recursion limit, under the length limit
        ("[" + "1," * 40000 + "1]", "too_long"),  # more characters than any box list (MAX_DETECTION_TEXT_CHARS)
        ('[{"bbox_2d": [１, 2, 3, 4], "label": "car"}]', "bad_json"),  # a full-width digit is no JSON number
    ],
)
def test_parse_detections_malformed_gives_kind(text, kind):
    assert _kind(parse_detections(text, SIZE)) == kind


# --- QA ---------------------------------------------------------------------------------------


def test_parse_answer_strips_and_cuts_at_eos():
    assert parse_answer("  Slow down, a pedestrian is crossing.\n" + EOS_TOKEN + "junk") == (
        "Slow down, a pedestrian is crossing."
    )


@pytest.mark.parametrize("text, kind", [("", "empty"), ("  \n", "empty"), (EOS_TOKEN + "x", "empty"), (3, "not_text")])
def test_parse_answer_rejects_empty_and_non_text(text, kind):
    assert _kind(parse_answer(text)) == kind


# --- never raises -----------------------------------------------------------------------------


def _check_result(parse, text, ok_type):
    result = parse(text)  # must not raise
    assert isinstance(result, (ParseError, ok_type)), f"{text!r} -> {result!r}"
    if isinstance(result, ParseError):
        assert result.kind in PARSE_ERROR_KINDS and result.message
    return result


def test_fuzz_random_bytes_never_raise_and_return_value_or_parse_error():
    rng = random.Random(1234)
    alphabet = "0123456789.,-+eE[]{}\":nNaIfy \n`" + EOS_TOKEN
    for _ in range(1500):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
        mixed = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        for text in (raw, raw.decode("utf-8", errors="replace"), raw.decode("latin-1"), mixed):
            _check_result(parse_trajectory, text, np.ndarray)
            _check_result(lambda t: parse_detections(t, SIZE), text, list)
            _check_result(parse_answer, text, str)


def test_fuzz_truncations_of_valid_outputs_never_raise_and_only_full_text_parses():
    traj_text = KNOWN_TEXT + EOS_TOKEN
    det_text = '```json\n[{"bbox_2d": [100, 250, 500, 750], "label": "car"}, {"bbox_2d": [0, 0, 10, 10], "label": "bus"}]\n```'
    traj_ok = det_ok = 0
    for cut in range(len(traj_text) + 1):
        if isinstance(_check_result(parse_trajectory, traj_text[:cut], np.ndarray), np.ndarray):
            traj_ok += 1
    for cut in range(len(det_text) + 1):
        if isinstance(_check_result(lambda t: parse_detections(t, SIZE), det_text[:cut], list), list):
            det_ok += 1
    # Trajectory: the last number cut to a complete number ("-1", "-1.0", "-1.00") or the full text
    # with its EOS; a partial EOS is junk after the 16th number.
    assert traj_ok == 4
    # Detections: the full list parses, with or without (any part of) the closing fence.
    assert det_ok == 5  # "...]", "...]\n", "...]\n`", "...]\n``", "...]\n```"


def test_truncated_trajectory_reports_truncated_or_wrong_count():
    last_comma = KNOWN_TEXT.rfind(",")
    for cut in range(1, last_comma + 2):  # every cut that loses at least the 16th number
        kind = _kind(parse_trajectory(KNOWN_TEXT[:cut]))
        assert kind in ("truncated", "wrong_count"), (cut, kind)


def test_parse_error_str_names_kind():
    err = parse_trajectory("")
    assert str(err).startswith("empty: ")
    assert json.dumps({"kind": err.kind, "message": err.message})  # plain strings, serialisable
