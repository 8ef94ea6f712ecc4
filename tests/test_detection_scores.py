"""A box's score is the geometric mean of the probabilities of the tokens that wrote its label and coordinates."""
import math

import pytest

from wam_diff_core.codec import detection_spans, parse_detections
from wam_diff_core.decoding.result import DecodeResult
from wam_diff_core.text_confidence import score_detections, span_confidence, token_ends
from wam_diff_core.types import EgoState


class PieceTokenizer:
    """Token i is the text pieces[i]; decoding concatenates (the interface `token_ends` uses)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def batch_decode(self, batch, skip_special_tokens=False):
        return ["".join(self.pieces[i] for i in ids) for ids in batch]


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def test_spans_cover_each_boxs_label_and_coordinates_in_a_fenced_answer_with_keys_in_any_order():
    text = ' ```json\n [{"bbox_2d": [12, 20, 300, 400], "label": "car", "extra": {"bbox_2d": [9]}},\n' \
           '  {"label": "bus", "bbox_2d": [5,6,7,8]}]\n```'
    assert len(parse_detections(text, (100, 100))) == 2
    spans = detection_spans(text)
    assert [[text[a:b] for a, b in box] for box in spans] == [["12", "20", "300", "400", "car"],
                                                              ["bus", "5", "6", "7", "8"]]
    assert detection_spans("no boxes here") == [] and detection_spans("[]") == []


def test_a_box_whose_characters_had_known_probabilities_gets_their_geometric_mean():
    text = '[{"bbox_2d":[12,20,300,400],"label":"car"},{"bbox_2d":[5,6,7,8],"label":"bus"}]'
    second = text.index('{"bbox_2d":[5')
    labels = set(range(text.index("car"), text.index("car") + 3)) | set(range(text.index("bus"), text.index("bus") + 3))
    probs = []  # one token per character: digits 0.9 / 0.5, label letters 0.6 / 0.8 (box 1 / box 2), the rest 0.01
    for i, ch in enumerate(text):
        first = i < second
        probs.append((0.9 if first else 0.5) if ch.isdigit() else (0.6 if first else 0.8) if i in labels else 0.01)
    tok = PieceTokenizer(list(text))
    dets = score_detections(parse_detections(text, (100, 100)), text, list(range(len(text))), probs, tok)
    assert [d.label for d in dets] == ["car", "bus"]
    assert dets[0].score == pytest.approx(_geomean([0.9] * 10 + [0.6] * 3), rel=1e-12)
    assert dets[1].score == pytest.approx(_geomean([0.5] * 4 + [0.8] * 3), rel=1e-12)


def test_a_token_counts_once_and_only_tokens_that_wrote_the_box_count():
    pieces = ['[{"bbox_2d":[', '1', ',2', ',', '3', ',4', '],"label":"', 'ca', 'r"}]']
    probs = [0.01, 0.9, 0.8, 0.01, 0.7, 0.6, 0.01, 0.5, 0.4]
    text = "".join(pieces)
    (det,) = score_detections(parse_detections(text, (10, 10)), text, range(len(pieces)), probs,
                              PieceTokenizer(pieces))
    assert det.score == pytest.approx(_geomean([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), rel=1e-12)
    ends = token_ends(PieceTokenizer(pieces), range(len(pieces)))
    assert ends == [13, 14, 16, 17, 18, 20, 31, 33, 37]
    assert span_confidence(ends, probs, [(14, 16)]) == pytest.approx(0.8)  # ",2" wrote "2" (and a comma)
    assert span_confidence(ends, probs, []) is None


def test_scores_stay_in_0_1_for_zero_nan_and_rounding_above_one():
    ends = [1, 2, 3]
    assert span_confidence(ends, [0.0, 0.0, 0.0], [(0, 3)]) == pytest.approx(1e-30)
    assert span_confidence(ends, [float("nan"), 1.0, 1.0], [(0, 1)]) == pytest.approx(1e-30)
    assert span_confidence(ends, [1.0000001, 1.0, 1.0], [(0, 3)]) == 1.0


def test_without_probabilities_the_boxes_keep_the_parsed_score_of_1():
    text = '[{"bbox_2d":[1,2,3,4],"label":"car"}]'
    parsed = parse_detections(text, (10, 10))
    assert [d.score for d in score_detections(parsed, text, [1, 2], None, PieceTokenizer(list(text)))] == [1.0]


def test_plan_scores_each_box_from_the_decoders_token_probabilities_with_the_nano_tokenizer(nano, camera_image,
                                                                                           monkeypatch):
    from wam_diff_core.decoding.config import DecoderConfig
    from wam_diff_core.policy import DrivingPolicy

    policy = DrivingPolicy(nano, DecoderConfig(block_size=8, steps=4, max_new_tokens=64), tasks=("detection",))
    text = '[{"bbox_2d":[102,230,310,455],"label":"car"},{"bbox_2d":[500,510,620,700],"label":"truck"}]'
    tokenizer = nano.processor.tokenizer
    ids = tokenizer(text, add_special_tokens=False).input_ids
    pieces = [tokenizer.decode([i]) for i in ids]
    assert "".join(pieces) == text and len(ids) > 20
    second = text.index('{"bbox_2d":[500')
    starts = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
    probs = [0.04 if start >= second else 0.64 for start in starts]  # every token of box 2 is unsure

    def fake_decode(prompts, images, cfg, tasks, ego=None):
        return DecodeResult([ids], [True], len(ids) + 1, 9, {"total": 0.1}, [probs]), [nano.processor.decode(ids)]

    monkeypatch.setattr(policy, "_decode", fake_decode)
    plan = policy.plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert [d.label for d in plan.detections] == ["car", "truck"]
    assert [d.score for d in plan.detections] == pytest.approx([0.64, 0.04], rel=1e-9)
