"""`wam-diff data --nuscenes` on a dataset written in the nuScenes schema from embedded-world drives: the converter's
samples against the world's ground truth (trajectories within 1 cm, boxes within 1 px, commands equal), the
official splits kept apart, frames without a regular 4 s future skipped and counted, QA answered from the
annotations, and the output read by the training loader."""
import json
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("nuscenes", reason="needs the nuScenes devkit (requirements-nuscenes.txt)")

from wam_diff_core.cli import main as wam_diff  # noqa: E402
from wam_diff_core.nuscenes import fixture  # noqa: E402
from wam_diff_core.nuscenes.convert import ConvertOptions, convert  # noqa: E402
from wam_diff_core.nuscenes.geometry import EGO_CENTRE_AHEAD_M, to_frame  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("nuscenes")
    truth = fixture.write_fixture(root / "data")
    stats = convert(root / "data", "v1.0-mini", root / "out", progress=False)
    return root, truth, stats


def _samples(out, split):
    return json.loads((out / f"{split}.json").read_text())


def test_trajectories_within_1cm_boxes_within_1px_and_commands_equal_to_the_worlds(converted):
    root, truth, _ = converted
    a = fixture.agreement(truth, root / "out")
    # 3 scenes of 34 + 24 + 28 keyframes; 8 at each scene's end lack a future, 8 span the dropped keyframe
    assert a["planning_expected"] == a["planning_found"] == 54 and a["unexpected_planning"] == 0
    assert a["max_trajectory_error_m"] < 0.01
    assert a["commands_equal"] == 54
    assert a["detection_frames"] == 86 and a["box_count_mismatches"] == 0 and a["boxes_expected"] >= 60
    assert a["max_box_error_px"] < 1.0


def test_commands_cover_left_right_and_straight(converted):
    _, _, stats = converted
    assert set(stats["commands"]) == {"turn left", "turn right", "go straight"}
    assert min(stats["commands"].values()) >= 5


def test_frames_without_a_regular_4s_future_are_skipped_and_counted(converted):
    _, _, stats = converted
    assert stats["keyframes"] == 86 and stats["planning_frames"] == 54
    assert stats["planning_skipped"] == {"no_future": 24, "irregular_spacing": 8}


def test_official_mini_splits_are_kept_apart(converted):
    root, _, stats = converted
    train = {s["meta"]["scene"] for s in _samples(root / "out", "train")}
    val = {s["meta"]["scene"] for s in _samples(root / "out", "val")}
    assert train == {"scene-0061", "scene-0553"} and val == {"scene-0103"}  # mini_train / mini_val
    assert stats["scenes"] == {"train": 2, "val": 1} and stats["scenes_outside_splits"] == []
    boxes = [json.loads(line)["id"] for line in (root / "out" / "future_boxes_val.jsonl").read_text().splitlines()]
    assert boxes == [s["id"] for s in _samples(root / "out", "val") if s["task"] == "planning"]


def test_lower_visibility_bound_keeps_the_boxes_the_filter_dropped(converted):
    root, truth, _ = converted
    convert(root / "data", "v1.0-mini", root / "out_vis1", ConvertOptions(min_visibility=1, tasks=("detection",)),
            progress=False)
    a = fixture.agreement(truth, root / "out_vis1", min_visibility=1)
    default = fixture.agreement(truth, root / "out")
    assert a["box_count_mismatches"] == 0 and a["max_box_error_px"] < 1.0
    assert a["boxes_expected"] > default["boxes_expected"]


def _truth_vehicles(kf):
    pose = kf["pose"]
    out = []
    for o in kf["objects"]:
        if o["category"] in ("vehicle.car", "vehicle.truck"):
            x, y = to_frame(np.array(o["xy"]), pose[:2], pose[2])
            out.append((x - EGO_CENTRE_AHEAD_M, y, o["length"]))
    return out


def test_qa_answers_follow_the_annotations(converted):
    root, truth, _ = converted
    samples = {s["id"]: s["conversations"][1]["value"] for s in _samples(root / "out", "val")}
    checked = 0
    for kf in truth["scenes"][2]["keyframes"]:
        base = f"scene-0103_{kf['index']:03d}_qa"
        if f"{base}_count_ahead" not in samples:
            continue
        lane = [(x, length) for x, y, length in _truth_vehicles(kf) if abs(y) <= 1.75 and x > 0]
        assert samples[f"{base}_count_ahead"] == str(sum(x <= 50 for x, _ in lane))
        if lane:
            x, length = min(lane)
            assert samples[f"{base}_lead_distance"] == f"{max(x - (length + 5.0) / 2, 0):.0f} m"
        assert samples[f"{base}_visible_count"] == str(len(fixture.expected_boxes(kf)))
        assert "left_free" not in "".join(samples) and samples[f"{base}_ego_speed"].endswith(" m/s")
        checked += 1
    assert checked == 20


def test_ego_speed_from_poses_is_within_0_4_mps_of_the_worlds(converted):
    root, truth, _ = converted
    a = fixture.agreement(truth, root / "out")
    # the world states its car's centre speed; the poses give the rear axle's (0.2 rad/s x 1.44 m apart in turns)
    assert a["max_speed_difference_mps"] < 0.4


def test_a_rerun_resumes_from_the_scene_parts(converted):
    root, _, _ = converted
    parts = sorted((root / "out" / "parts").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in parts]
    stats = convert(root / "data", "v1.0-mini", root / "out", progress=False)
    assert [p.stat().st_mtime_ns for p in parts] == stamps and stats["planning_frames"] == 54


def test_resized_frames_scale_the_boxes(converted):
    root, truth, _ = converted
    convert(root / "data", "v1.0-mini", root / "out_small", ConvertOptions(frame_size=(200, 100), tasks=("detection",)),
            progress=False)
    small = {s["id"]: s for s in _samples(root / "out_small", "val")}
    full = {s["id"]: s for s in _samples(root / "out", "val") if s["task"] == "detection"}
    worst = 0.0
    for sid, s in full.items():
        assert small[sid]["meta"]["frame_size"] == [200, 100]
        assert small[sid]["conversations"][1]["value"] == s["conversations"][1]["value"]  # 0..1000 scale unchanged
        for a, b in zip(small[sid]["meta"]["boxes_px"], s["meta"]["boxes_px"]):
            worst = max(worst, max(abs(a[i] - b[i] * (0.5 if i % 2 == 0 else 100 / 225)) for i in range(4)))
    assert worst <= 0.1  # the boxes' one-decimal rounding


def test_cli_converts_and_names_a_missing_dataroot_or_map_in_one_line(converted, tmp_path, capsys):
    root, _, _ = converted
    assert wam_diff(["data", "--nuscenes", str(root / "data"), "--version", "v1.0-mini", "--out", str(tmp_path / "o"),
                     "--tasks", "planning", "--no-progress"]) == 0
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["per_task"] == {"train/planning": 34, "val/planning": 20}
    capsys.readouterr()
    assert wam_diff(["data", "--nuscenes", str(tmp_path / "nowhere"), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("wam-diff data: error: --nuscenes") and "v1.0-mini/scene.json" in err and "\n" not in err
    (tmp_path / "no_maps").mkdir()
    shutil.copytree(root / "data" / "v1.0-mini", tmp_path / "no_maps" / "v1.0-mini")
    assert wam_diff(["data", "--nuscenes", str(tmp_path / "no_maps"), "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the devkit cannot load v1.0-mini: map mask" in err and "\n" not in err


def test_training_loader_reads_every_sample(converted, nano):
    from wam_diff_training.data import DrivingDataset

    root, _, _ = converted
    ds = DrivingDataset(root / "out" / "val.json", nano.processor, on_bad_sample="error")
    assert len(ds) == 148  # 28 detection + 20 planning + 5 x 20 QA
    plan = next(i for i, s in enumerate(ds.samples) if s[1] == "planning")
    ex = ds.encode(plan)
    assert ex.pixel_values is not None and ex.ego is not None and math.isfinite(ex.ego.vx)
