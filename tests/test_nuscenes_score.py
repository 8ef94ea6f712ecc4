"""`wam-diff score --nuscenes`: L2 at 1 / 2 / 3 s in ST-P3's convention (mean over the waypoints up to t) and
UniAD's (at t), ST-P3's box collision rate with waypoints where the logged trajectory collides left out, on a
split written in the converter's format."""
import json

import numpy as np
import pytest
from PIL import Image

from wam_diff_core.cli import main as wam_diff
from wam_diff_core.codec import format_trajectory
from wam_diff_core.nuscenes.geometry import EGO_CENTRE_AHEAD_M, EGO_LENGTH_M
from wam_diff_core.nuscenes.score import by_convention, collisions, score
from wam_diff_core.prompts import planning_prompt
from wam_diff_core.types import EgoState

STRAIGHT = np.stack([np.arange(1, 9) * 5.0, np.zeros(8)], axis=1)  # 10 m/s ahead


def _split(tmp_path, boxes_at_waypoint: dict) -> tuple:
    """A val.json of 3 planning samples driving STRAIGHT, with its future boxes: sample 0 meets a parked car at
    the waypoints of `boxes_at_waypoint` {waypoint index: [x, y, yaw, length, width]}."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (64, 32), (90, 90, 90)).save(tmp_path / "images" / "f.jpg")
    samples, rows = [], []
    for i in range(3):
        sid = f"scene-0103_{i:03d}_plan"
        samples.append({"id": sid, "datasource": "nuscenes", "task": "planning", "image": ["images/f.jpg"],
                        "conversations": [{"from": "human", "value": "<image>\n" + planning_prompt(EgoState(10.0), "go straight")},
                                          {"from": "gpt", "value": format_trajectory(STRAIGHT)}],
                        "meta": {"command": "go straight", "scene": "scene-0103"}})
        boxes = [[] for _ in range(8)]
        if i == 0:
            for j, b in boxes_at_waypoint.items():
                boxes[j] = [b]
        rows.append({"id": sid, "boxes": boxes})
    (tmp_path / "val.json").write_text(json.dumps(samples))
    (tmp_path / "future_boxes_val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "val.json", [s["id"] for s in samples]


def test_conventions_average_up_to_t_or_take_the_value_at_t():
    errors = np.tile(np.arange(1, 9) * 0.1, (2, 1))
    res = by_convention(errors)
    assert res["stp3"]["1s"] == pytest.approx(0.15) and res["stp3"]["2s"] == pytest.approx(0.25)
    assert res["stp3"]["3s"] == pytest.approx(0.35) and res["stp3"]["avg"] == pytest.approx(0.25)
    assert res["uniad"]["1s"] == pytest.approx(0.2) and res["uniad"]["2s"] == pytest.approx(0.4)
    assert res["uniad"]["3s"] == pytest.approx(0.6) and res["uniad"]["avg"] == pytest.approx(0.4)


def test_collision_flags_the_waypoints_whose_ego_box_meets_a_box():
    boxes = [[] for _ in range(8)]
    # the ego box at waypoint 3 (15 m) spans x 15 + 1.44 +- 2.04; a car ending 0.1 m inside its front
    front = 15.0 + EGO_CENTRE_AHEAD_M + EGO_LENGTH_M / 2
    boxes[2] = [[front + 2.0 - 0.1, 0.0, 0.0, 4.0, 1.8]]
    boxes[5] = [[30.0 + EGO_CENTRE_AHEAD_M, 3.0, 0.0, 4.0, 1.8]]  # one lane to the left: 3 m > (1.85 + 1.8) / 2
    assert collisions(STRAIGHT, boxes).tolist() == [False, False, True, False, False, False, False, False]


def test_logged_trajectory_scores_zero_and_a_1m_offset_scores_1m(tmp_path):
    split, ids = _split(tmp_path, {})
    exact = {i: format_trajectory(STRAIGHT) for i in ids}
    res = score(split, exact)
    assert res["plans"] == 3 and res["l2_m"]["stp3"]["3s"] == 0.0 and res["collision_pct"]["uniad"]["3s"] == 0.0
    shifted = {i: format_trajectory(STRAIGHT + [0.0, 1.0]) for i in ids}
    res = score(split, shifted | {ids[2]: "not a trajectory"})
    assert res["plans"] == 2 and res["invalid"] == 1
    for name in ("stp3", "uniad"):
        assert [res["l2_m"][name][t] for t in ("1s", "2s", "3s")] == pytest.approx([1.0, 1.0, 1.0])


def test_collision_rate_counts_plan_collisions_and_leaves_out_the_logs_own(tmp_path):
    # a car 3 m to the left at waypoint 4 (2 s): the logged path passes it, a plan 3 m to the left hits it;
    # a car on the logged path at waypoint 8 collides with the log itself and is not counted
    split, ids = _split(tmp_path, {3: [20.0 + EGO_CENTRE_AHEAD_M, 3.0, 0.0, 4.0, 1.8],
                                   7: [40.0 + EGO_CENTRE_AHEAD_M, 0.0, 0.0, 4.0, 1.8]})
    left = STRAIGHT + [0.0, 3.0]
    res = score(split, {ids[0]: format_trajectory(left), ids[1]: format_trajectory(STRAIGHT)})
    assert res["gt_collision_waypoints"] == 1
    # sample 0 collides at waypoint 4 only; sample 1 never: UniAD at 2 s = 1 / 2, ST-P3 at 2 s = (1 / 4) / 2
    assert res["collision_pct"]["uniad"]["2s"] == pytest.approx(50.0)
    assert res["collision_pct"]["stp3"]["2s"] == pytest.approx(12.5)
    assert res["collision_pct"]["stp3"]["1s"] == 0.0 and res["collision_pct"]["uniad"]["3s"] == 0.0


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    split, ids = _split(tmp_path, {})
    preds = tmp_path / "pred.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "text": format_trajectory(STRAIGHT * 1.1)}) + "\n" for i in ids))
    assert wam_diff(["score", "--nuscenes", str(split), "--predictions", str(preds), "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "L2 (m) ST-P3" in out and "Collision (%) UniAD" in out
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["l2_m"]["uniad"]["1s"] == pytest.approx(1.0)  # 10 % of 10 m
    assert wam_diff(["score", "--nuscenes", str(split)]) == 2
    assert capsys.readouterr().err.strip() == "wam-diff score: error: give one of --predictions PRED.jsonl or --model MODEL"
    assert wam_diff(["score", "--nuscenes", str(split), "--predictions", str(tmp_path / "none.jsonl")]) == 2
    assert "error: --predictions" in capsys.readouterr().err


def test_cli_decodes_with_a_model_and_keeps_its_predictions(tmp_path, capsys):
    split, _ = _split(tmp_path, {})
    out = tmp_path / "r.json"
    assert wam_diff(["score", "--nuscenes", str(split), "--model", "nano-s-b32", "--limit", "2", "--out", str(out),
                     "--no-progress"]) == 0
    res = json.loads(out.read_text())
    lines = out.with_suffix(".predictions.jsonl").read_text().splitlines()
    assert res["decode"]["plans"] == 2 and len(lines) == 2 and res["plans"] + res["invalid"] == 2
