"""`wam-diff counterfactual`: pairs that differ only in the traffic in view, on training routes only."""
import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.codec import parse_trajectory  # noqa: E402
from wam_diff_core.sim.counterfactual import generate, generate_route  # noqa: E402
from wam_diff_core.sim.datagen import VAL_FRACTION, assign_splits  # noqa: E402
from wam_diff_core.sim.routes import Route, load_routes  # noqa: E402

# dense traffic from the start: the expert's plan with traffic differs from its plan on an empty road
DENSE = Route("t_dense", "highway_dense", 21, 2.0, 120.0, 3.0, {"lanes": 3, "vehicles": 30, "ego_speed": 22.0})


def test_pairs_share_state_and_command_and_differ_in_frame_and_answer(tmp_path):
    res = generate_route(DENSE, tmp_path, every=10, min_change_m=0.0)
    part = json.loads((tmp_path / "parts" / "t_dense.json").read_text())
    samples = part["samples"]
    assert res["probes"] == 4 and res["pairs"] == 4 == len(samples) // 2  # t = 0, 1, 2, 3 s
    for real, empty in zip(samples[0::2], samples[1::2]):
        assert real["meta"]["traffic"] is True and empty["meta"]["traffic"] is False
        assert real["meta"]["pair"] == empty["id"] and empty["meta"]["pair"] == real["id"]
        # the same question: ego state and command
        assert real["conversations"][0]["value"] == empty["conversations"][0]["value"]
        assert real["meta"]["ego"] == empty["meta"]["ego"]
        a = np.asarray(parse_trajectory(real["conversations"][1]["value"]))
        b = np.asarray(parse_trajectory(empty["conversations"][1]["value"]))
        assert np.linalg.norm(a - b, axis=1).mean() == pytest.approx(real["meta"]["plan_change_m"], abs=0.02)
        frames = [np.asarray(Image.open(tmp_path / s["image"][0])) for s in (real, empty)]
        assert frames[0].shape == frames[1].shape and not np.array_equal(*frames)
    # on an empty road the expert never plans a shorter 4 s than behind traffic
    assert all(parse_trajectory(e["conversations"][1]["value"])[-1][0] >= parse_trajectory(r["conversations"][1]["value"])[-1][0] - 0.5
               for r, e in zip(samples[0::2], samples[1::2]))


def test_small_changes_are_left_out(tmp_path):
    res = generate_route(DENSE, tmp_path, every=10, min_change_m=1e6)
    part = json.loads((tmp_path / "parts" / "t_dense.json").read_text())
    assert res["pairs"] == 0 and part["samples"] == [] and part["skipped_small_change"] == 4


def test_a_selection_never_drives_a_route_the_whole_suite_holds_out(tmp_path):
    suite = load_routes()
    held = sorted(rid for rid, s in assign_splits(suite, VAL_FRACTION).items() if s == "val")
    # one held-out route selected alone: within the selection it would be "train"; over the suite it is not
    stats = generate([r for r in suite if r.route_id == held[0]], tmp_path, seed_offsets=(5000,), progress=False,
                     split_over=suite)
    assert stats["pairs"] == 0 and stats["held_out_routes"] == [held[0]]
    assert not (tmp_path / "parts").exists() or not list((tmp_path / "parts").iterdir())
    with pytest.raises(ValueError, match="every 0"):
        generate(suite[:1], tmp_path, every=0, progress=False)
