"""`wam-diff sensitivity`: counterfactual frames without traffic, the probe's numbers, its summary."""
import json

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.cli import main as wam_diff_main  # noqa: E402
from wam_diff_core.sim.highway import HighwayWorld  # noqa: E402
from wam_diff_core.sim.policies import ConstantVelocityPolicy  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_core.sim.sensitivity import CLEAR, bin_name, lead_gap, probe_route, summarize  # noqa: E402
from wam_diff_core.types import Plan  # noqa: E402

DENSE = Route("t_dense", "highway_dense", 21, 2.0, 120.0, 20.0, {"lanes": 3, "vehicles": 30, "ego_speed": 22.0})


class SeesCarsPolicy:
    """Plans constant velocity, at half speed whenever a vehicle pixel (the world's traffic colour,
    read from the frame itself) is in the frame: an image-reading policy with a known response."""

    needs_images = True

    def plan(self, images, ego, command):
        frame = np.asarray(images[0])
        traffic = bool((np.abs(frame.astype(int) - [100, 200, 255]).sum(-1) < 30).any())
        t = (np.arange(8) + 1) * 0.5
        v = ego.vx * (0.5 if traffic else 1.0)
        return Plan(trajectory=np.stack([v * t, np.zeros(8)], axis=1), valid=True)


def test_frame_without_traffic_drops_the_vehicles_and_leaves_the_world_untouched():
    world = HighwayWorld(DENSE, frame_size=(256, 128), driver="expert")
    tick = world.reset()
    try:
        in_view = [v for v in tick.vehicles if v.box_px is not None]
        assert in_view, "the dense scene should have traffic in view"
        before = json.dumps(world.snapshot(), sort_keys=True)
        empty = world.render_without_traffic()
        assert empty.shape == tick.frame.shape and not np.array_equal(empty, tick.frame)
        # the pixels that differ are the vehicles' (inside their boxes, a little margin for outlines)
        diff = np.abs(empty.astype(int) - tick.frame.astype(int)).sum(-1) > 0
        inside = np.zeros_like(diff)
        for v in in_view:
            x1, y1, x2, y2 = v.box_px
            inside[max(int(y1) - 2, 0):int(y2) + 3, max(int(x1) - 2, 0):int(x2) + 3] = True
        assert diff.any() and not (diff & ~inside).any()
        assert json.dumps(world.snapshot(), sort_keys=True) == before
        twin = world.without_traffic()
        assert twin.env.road.vehicles == [twin.ego] and len(world.env.road.vehicles) > 1
        assert json.dumps(world.snapshot(), sort_keys=True) == before
    finally:
        world.close()


def test_lead_gap_and_bins():
    class V:
        def __init__(self, x, same):
            self.xy, self.same_lane = (x, 0.0), same

    assert lead_gap([V(-5.0, True), V(30.0, True), V(12.0, False), V(50.0, True)]) == 30.0
    assert lead_gap([V(-5.0, True)]) is None
    assert [bin_name(g) for g in (5.0, 20.0, 64.9, 65.0, None)] == ["0-20 m", "20-40 m", "40-65 m", CLEAR, CLEAR]


def test_an_image_blind_policy_never_changes_its_plan():
    res = probe_route(DENSE, ConstantVelocityPolicy(), every=10, max_s=3.0)
    assert [p["t"] for p in res["probes"]] == [0.0, 1.0, 2.0, 3.0] and res["invalid"] == 0
    assert all(p["plan_change_m"] == 0.0 and p["shortening_m"] == 0.0 for p in res["probes"])


def test_a_policy_that_sees_traffic_slows_by_the_amount_it_was_built_to():
    res = probe_route(DENSE, SeesCarsPolicy(), every=10, max_s=3.0)
    assert res["probes"]
    for p in res["probes"]:
        # half speed with traffic in the frame, full without: the 4 s waypoint is 4 s * v / 2 nearer
        assert p["shortening_m"] > 5.0
        assert p["plan_change_m"] == pytest.approx(np.mean((np.arange(8) + 1) * 0.5) * p["shortening_m"] / 4.0, rel=1e-3)


def test_summary_means_per_bin_and_response():
    rows = [{"bin": "0-20 m", "plan_change_m": 2.0, "shortening_m": 4.0, "expert_change_m": 6.0, "expert_shortening_m": 8.0},
            {"bin": "0-20 m", "plan_change_m": 0.0, "shortening_m": 0.0, "expert_change_m": 2.0, "expert_shortening_m": 4.0},
            {"bin": CLEAR, "plan_change_m": 1.0, "shortening_m": -1.0, "expert_change_m": 0.0, "expert_shortening_m": 0.0}]
    s = summarize([{"probes": rows, "invalid": 2}])
    near = s["bins"]["0-20 m"]
    assert near["probes"] == 2 and near["shortening_m"] == 2.0 and near["expert_shortening_m"] == 6.0
    assert near["response"] == pytest.approx(1.0 / 3.0)
    assert s["bins"][CLEAR]["response"] is None  # the expert does not slow down there: no ratio
    assert s["bins"]["20-40 m"] == {"probes": 0}
    assert s["all"]["probes"] == 3 and s["invalid"] == 2 and s["routes"] == 1


def test_cli_refuses_the_expert_and_probes_a_checkpoint(nano, tmp_path, capsys):
    from wam_diff_core.model.checkpoint import save_model

    assert wam_diff_main(["sensitivity", "--policy", "expert", "--out", str(tmp_path), "--ids", "highway_00"]) == 2
    assert "wam-diff sensitivity: error:" in capsys.readouterr().err
    ckpt = tmp_path / "nano"
    save_model(nano, ckpt)
    out = tmp_path / "probe"
    assert wam_diff_main(["sensitivity", "--policy", str(ckpt), "--out", str(out), "--ids", "highway_00",
                          "--max-seconds", "1", "--frame-size", "128x64"]) == 0
    res = json.loads((out / "sensitivity.json").read_text())
    # two probes (t = 0 s and 1 s): each a plan pair, or an invalid pair from the random weights
    assert res["summary"]["all"]["probes"] + res["summary"]["invalid"] == 2
    assert res["routes"][0]["route_id"] == "highway_00"
