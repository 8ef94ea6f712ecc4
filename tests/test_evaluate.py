"""`wam-diff evaluate`: COCO metrics, the per-box account, QA per template, sample selection and the command."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wam_diff_core.codec import ParseError, format_detections, format_trajectory, parse_detections
from wam_diff_core.eval.coco import coco_map
from wam_diff_core.evaluate import Answer, model_slugs, parse_data, score_planning, score_qa
from wam_diff_core.evaluate_data import EvalSample, pick
from wam_diff_core.evaluate_detection import box_breakdown, detection_scores, greedy_match, iou_matrix
from wam_diff_core.evaluate_qa import qa_scores
from wam_diff_core.errors import UsageError
from wam_diff_core.prompts import IMAGE_PLACEHOLDER, detection_prompt, planning_prompt, qa_prompt
from wam_diff_core.types import Detection, EgoState

FRAME = (256, 128)


def _det(x1, y1, x2, y2, label="car", score=1.0) -> Detection:
    w, h = FRAME
    return Detection(label, (x1 * w / 1000, y1 * h / 1000, x2 * w / 1000, y2 * h / 1000), (x1, y1, x2, y2), score)


def test_perfect_boxes_give_map_ap50_ap75_and_recall_of_1_and_every_true_box_found_tight():
    truth = [[_det(100, 100, 160, 150), _det(500, 400, 560, 450)], [_det(800, 600, 860, 650)]]
    out = detection_scores(truth, truth)
    assert (out["map"], out["ap50"], out["ap75"], out["recall_10"]) == pytest.approx((1.0, 1.0, 1.0, 1.0))
    assert out["per_class"] == {"car": pytest.approx(1.0)}
    assert out["breakdown"]["gt_fate"]["found_tight"] == 3 and out["breakdown"]["parsed_share"] == 1.0
    assert out["breakdown"]["count"]["exact_share"] == 1.0 and out["breakdown"]["false_positive_share"] == 0.0


def test_a_box_shifted_by_a_tenth_of_its_width_has_iou_9_11_and_ap_07_passing_7_of_10_thresholds():
    # IoU 90/110 = 0.818 passes the thresholds 0.50 .. 0.80 (7 of 10): mAP 0.7, AP50 = AP75 = 1
    out = detection_scores([[_det(110, 100, 210, 200)]], [[_det(100, 100, 200, 200)]])
    assert iou_matrix([[110, 100, 210, 200]], [[100, 100, 200, 200]])[0, 0] == pytest.approx(90 / 110)
    assert (out["map"], out["ap50"], out["ap75"]) == pytest.approx((0.7, 1.0, 1.0))
    assert out["recall_10"] == pytest.approx(0.7) and out["recall_10_iou50"] == pytest.approx(1.0)
    assert out["breakdown"]["centre_error_px"]["dx_p50"] == pytest.approx(10 * 256 / 1000)


def test_an_unparsable_answer_loses_its_frames_boxes_and_halves_the_parsed_share():
    truth = [[_det(100, 100, 160, 150), _det(500, 400, 560, 450)], [_det(800, 600, 860, 650)]]
    preds = [ParseError("truncated", "cut"), [_det(800, 600, 860, 650)]]
    out = detection_scores(preds, truth)
    b = out["breakdown"]
    assert b["parsed_share"] == 0.5 and b["parse_errors"] == {"truncated": 1}
    assert b["gt_fate"]["answer_unparsed"] == 2 and b["gt_fate"]["found_tight"] == 1
    # one of three true boxes found at every threshold: precision 1 up to recall 1/3 -> 34 of 101 recall points
    assert out["map"] == pytest.approx(34 / 101) and out["recall_10"] == pytest.approx(1 / 3)


def test_per_box_fates_split_localisation_from_missed_objects_and_count_errors():
    truth = [[_det(0, 0, 100, 100), _det(300, 0, 400, 100), _det(600, 0, 700, 100), _det(900, 0, 1000, 100)]]
    # tight (IoU 1), loose (IoU 75 / 125 = 0.6), poorly localised (IoU 20 / 180 = 0.11), one no box overlaps
    preds = [[_det(0, 0, 100, 100), _det(325, 0, 425, 100), _det(680, 0, 780, 100)]]
    b = box_breakdown(preds, truth)
    assert b["gt_fate"] == {"found_tight": 1, "found_loose": 1, "poorly_localised": 1, "missed": 1,
                            "answer_unparsed": 0}
    assert b["count"]["mean_error"] == -1.0 and b["false_positive_share"] == pytest.approx(1 / 3)
    assert greedy_match(np.array([[0, 0, 10, 10]]), np.array([[20, 20, 30, 30]])) == [(0, None, 0.0)]


def test_a_wrong_label_is_a_found_box_of_another_class_and_scores_zero_ap_for_the_true_class():
    out = detection_scores([[_det(100, 100, 200, 200, "truck")]], [[_det(100, 100, 200, 200, "car")]])
    assert out["per_class"] == {"car": 0.0} and out["map"] == 0.0
    assert out["breakdown"]["found_with_right_label_share"] == 0.0
    assert coco_map([[]], [[]])["map"] is None


def test_qa_scores_per_template_with_the_majority_answer_baseline():
    templates = ["count", "count", "count", "lane", "lane"]
    refs = ["2", "2", "3", "yes", "no"]
    preds = ["2", "two", "2", "yes, it is free", "yes"]
    out = qa_scores(templates, preds, refs)
    assert out["accuracy"] == pytest.approx(60.0) and out["exact"] == pytest.approx(20.0)
    count, lane = out["per_template"]["count"], out["per_template"]["lane"]
    assert count["accuracy"] == pytest.approx(200 / 3) and count["numeric"] is True
    assert count["majority_answer"] == "2" and count["majority_accuracy"] == pytest.approx(200 / 3)
    assert lane["accuracy"] == pytest.approx(50.0) and lane["majority_accuracy"] == pytest.approx(50.0)
    assert qa_scores(["a"], ["x"], ["x"])["per_template"]["a"]["accuracy"] == 100.0


def _sample(task: str, reference: str, template: str = "", ego=None) -> EvalSample:
    return EvalSample("s", task, "p", reference, (), template or task, ego)


def test_perfect_answers_score_accuracy_100_and_l2_0_and_an_unparsable_plan_is_counted():
    plan = format_trajectory(np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1))
    samples = [_sample("planning", plan)] * 3
    answers = [Answer(plan, [], None, True), Answer(plan, [], None, True), Answer("1.0,2.", [], None, False)]
    out = score_planning(samples, answers)
    assert out["l2_mean"] == 0.0 and out["samples"] == 3 and out["unparsable"] == 1
    assert out["unparsable_share"] == pytest.approx(1 / 3) and out["parse_errors"] == {"truncated": 1}
    qa = score_qa([_sample("qa", "3 m", "lead"), _sample("qa", "no", "left")],
                  [Answer("3 m", [], None, True), Answer("no", [], None, True)])
    assert qa["accuracy"] == 100.0 and qa["exact"] == 100.0


def test_qa_samples_are_shared_out_evenly_among_templates_where_a_stride_would_ask_one():
    # a frame's six questions follow one another: every 6th sample is the same template
    samples = [{"id": f"{i}", "task": "qa", "meta": {"qa_kind": f"t{i % 6}"}} for i in range(600)]
    chosen = pick(samples, "qa", 100)
    kinds = [s["meta"]["qa_kind"] for s in chosen]
    assert len(chosen) == 100 and {kinds.count(f"t{k}") for k in range(6)} == {16, 17}
    assert [s["id"] for s in pick(samples + [{"id": "d", "task": "detection"}], "detection", 5)] == ["d"]


def test_models_sharing_a_directory_name_get_numbered_prediction_files():
    assert model_slugs(["models/nano-s-b32", "runs/x/nano-s-b32", "nano"]) == ["nano-s-b32-1", "nano-s-b32-2", "nano"]


def test_data_paths_apply_to_every_task_unless_one_is_given_for_a_task():
    assert parse_data(["all.json", "planning=plan.json"], ["detection", "planning"]) == {
        "detection": Path("all.json"), "planning": Path("plan.json")}
    with pytest.raises(UsageError, match="no --data for \\['qa'\\]"):
        parse_data(["planning=plan.json"], ["qa", "planning"])
    with pytest.raises(UsageError, match="'detectoin' is not a task"):
        parse_data(["detectoin=a.json"], ["detection"])


def _tiny_split(tmp_path) -> tuple:
    from PIL import Image

    (tmp_path / "images").mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (128, 256, 3), dtype=np.uint8)).save(tmp_path / "images" / "f.png")
    boxes = [[_det(100, 100, 160, 150), _det(500, 400, 560, 450)], [_det(800, 600, 860, 650)]]
    plan = format_trajectory(np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1))

    def sample(sid, task, human, answer, kind=None):
        meta = {"scenario": "highway"} | ({"qa_kind": kind} if kind else {})
        return {"id": sid, "datasource": "test", "task": task, "image": ["images/f.png"], "meta": meta,
                "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{human}"},
                                  {"from": "gpt", "value": answer}]}

    split = [sample(f"d{i}", "detection", detection_prompt(), format_detections(b)) for i, b in enumerate(boxes)]
    split += [sample("q0", "qa", qa_prompt("How many vehicles are visible?"), "2", "visible_count"),
              sample("q1", "qa", qa_prompt("Is the lane to my left free?"), "yes", "left_free")]
    split += [sample(f"p{i}", "planning", planning_prompt(EgoState(4.0), "follow lane"), plan) for i in range(2)]
    path = tmp_path / "val.json"
    path.write_text(json.dumps(split))
    return path, boxes


def test_evaluate_command_scores_every_task_of_a_split_and_writes_json_markdown_and_predictions(tmp_path, capsys):
    from wam_diff_core.cli import main

    path, boxes = _tiny_split(tmp_path)
    out = tmp_path / "out"
    assert main(["evaluate", "--model", "models/nano-s-b32", "--data", str(path), "--samples", "5",
                 "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "evaluate.json").read_text())
    tasks = report["models"][0]["tasks"]
    assert report["models"][0]["decoding"]["block_size"] == 32 and report["models"][0]["decoding"]["steps"] == 4
    assert tasks["detection"]["samples"] == 2 and tasks["detection"]["gt_boxes"] == 3
    assert tasks["detection"]["source"] == "head" and report["models"][0]["detections"] == "head"
    assert tasks["qa"]["budget"] == 64
    assert set(tasks["qa"]["per_template"]) == {"visible_count", "left_free"}
    assert tasks["qa"]["per_template"]["left_free"]["majority_accuracy"] == 100.0
    assert tasks["planning"]["samples"] == 2 and tasks["planning"]["unparsable"] + \
        (0 if "l2_mean" not in tasks["planning"] else 2) == 2
    rows = [json.loads(line) for line in (out / "predictions" / "nano-s-b32_detection.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["d0", "d1"]
    assert "| detection mAP@[.5:.95] |" in capsys.readouterr().out
    assert (out / "evaluate.md").read_text().count("| QA ") == 2 + 2 * 2
    assert isinstance(parse_detections(format_detections(boxes[0]), FRAME), list)


def test_evaluate_scores_the_text_box_list_when_asked(tmp_path):
    from wam_diff_core.cli import main

    path, _ = _tiny_split(tmp_path)
    out = tmp_path / "out"
    assert main(["evaluate", "--model", "models/nano-s-b32", "--data", str(path), "--tasks", "detection",
                 "--detections", "text", "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "evaluate.json").read_text())
    det = report["models"][0]["tasks"]["detection"]
    assert report["models"][0]["detections"] == "text" and det["budget"] == 192 and "source" not in det
    assert det["samples"] == 2 and "answer_tokens" in det


def test_evaluate_names_a_missing_split_in_one_line(tmp_path, capsys):
    from wam_diff_core.cli import main

    assert main(["evaluate", "--data", str(tmp_path / "nope.json"), "--tasks", "qa", "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "wam-diff evaluate: error: data file not found" in err and "nope.json" in err
