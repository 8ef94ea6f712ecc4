"""Hand-computed cases for every scoring metric (Bench2Drive, comfort, PDMS, L2, COCO, QA)."""
import numpy as np
import pytest

from wam_diff_core.eval import bench2drive as b2d
from wam_diff_core.eval.comfort import comfort_windows, savgol
from wam_diff_core.eval.coco import coco_map
from wam_diff_core.eval.l2 import l2_per_horizon, l2_report
from wam_diff_core.eval.pdm import Agent, PdmScene, pdm_score
from wam_diff_core.eval.qa import answer_correct, qa_accuracy


def _rec(rid, completion, infractions=(), abilities=("overtaking",)):
    return {"route_id": rid, "scenario": "highway", "abilities": list(abilities), "status": "x",
            "completion": completion, "infractions": [{"kind": k, "time_s": 1.0} for k in infractions]}


def test_route_score_80pct_with_one_vehicle_collision_is_48():
    assert b2d.route_score(80.0, [{"kind": "collision_vehicle"}]) == pytest.approx(48.0)


def test_penalties_multiply_per_event_and_outside_lanes_scales_by_percentage():
    infs = [{"kind": "collision_vehicle"}, {"kind": "collision_vehicle"}, {"kind": "red_light"},
            {"kind": "outside_route_lanes", "pct": 10.0}]
    assert b2d.route_score(100.0, infs) == pytest.approx(100 * 0.6 * 0.6 * 0.7 * 0.9)
    assert b2d.route_score(50.0, [{"kind": "collision_pedestrian"}, {"kind": "stop_sign"}]) == pytest.approx(20.0)


def test_misspelt_infraction_kind_is_an_error_naming_route_and_key_not_a_clean_100():
    # "collisions_vehicle" is the leaderboard's list name, not a kind: it once scored as no penalty (100)
    with pytest.raises(b2d.ScoreError, match=r"route r7: infraction kind 'collisions_vehicle' is unknown"):
        b2d.summarize([_rec("r7", 100.0, ["collisions_vehicle"])])
    with pytest.raises(b2d.ScoreError, match=r"infraction kind None is unknown"):
        b2d.penalty([{"time_s": 1.0}])


@pytest.mark.parametrize("completion", [float("nan"), float("inf"), 100.5, -1.0, None])
def test_completion_outside_0_to_100_or_nan_is_an_error_naming_route_and_key(completion):
    with pytest.raises(b2d.ScoreError, match=r"route r3: completion is .*; expected a percentage in 0\.\.100"):
        b2d.summarize([_rec("r3", completion)])


def test_outside_lanes_percentage_must_be_a_finite_percentage():
    assert b2d.penalty([{"kind": "outside_route_lanes", "pct": 25.0}]) == pytest.approx(0.75)
    for pct in (float("nan"), 120.0, None):
        with pytest.raises(b2d.ScoreError, match=r"route r1: outside_route_lanes pct is"):
            b2d.route_score(100.0, [{"kind": "outside_route_lanes", "pct": pct}], route_id="r1")


def test_min_speed_and_route_ending_events_cost_no_penalty_but_route_ending_ones_fail():
    assert b2d.route_score(100.0, [{"kind": "min_speed"}]) == 100.0  # unused in Bench2Drive
    assert b2d.route_score(40.0, [{"kind": "agent_blocked"}, {"kind": "route_deviation"}]) == pytest.approx(40.0)
    assert b2d.route_success(_rec("a", 100.0, ["min_speed"])) is True
    assert b2d.route_success(_rec("b", 100.0, ["route_timeout"])) is False


def test_driving_score_counts_missing_routes_as_zero_and_success_needs_clean_completion():
    recs = [_rec("a", 100.0), _rec("b", 80.0, ["collision_vehicle"]), _rec("c", 100.0, ["min_speed"])]
    s = b2d.summarize(recs, expected_route_ids=["a", "b", "c", "d"])
    assert s["driving_score"] == pytest.approx((100 + 48 + 100 + 0) / 4)
    assert s["success_rate"] == pytest.approx(50.0)  # a and c (min speed excepted)
    assert s["routes"]["d"]["status"] == "missing"


def test_abilities_are_success_share_per_group():
    recs = [_rec("a", 100.0, abilities=["merging"]), _rec("b", 90.0, abilities=["merging"]),
            _rec("c", 100.0, abilities=["give_way", "traffic_signs"])]
    s = b2d.summarize(recs)
    assert s["abilities"]["merging"] == pytest.approx(50.0)
    assert s["abilities"]["give_way"] == pytest.approx(100.0)
    assert s["abilities"]["emergency_brake"] is None
    assert s["abilities_mean"] == pytest.approx((50 + 100 + 100) / 3)


def test_efficiency_is_ego_over_traffic_speed_times_100():
    rec = _rec("a", 100.0)
    rec["efficiency"] = {"ego_mean_speed": 18.0, "traffic_mean_speed": 20.0}
    assert b2d.efficiency_score(rec) == pytest.approx(90.0)


def test_savgol_keeps_quadratics_exactly_including_edges():
    t = np.arange(30, dtype=float)
    q = 0.3 * t ** 2 - 2 * t + 1
    np.testing.assert_allclose(savgol(q), q, atol=1e-9)


def test_jerk_spike_fails_only_the_comfort_windows_it_touches():
    n, dt = 100, 0.1
    lon = np.full(n, 0.5)
    lat = np.zeros(n)
    yaw = np.zeros(n)
    assert comfort_windows(lon, lat, yaw, dt).windows_ok == [True] * 5
    spiky = lon.copy()
    spiky[50] = 3.0  # inside window 2 (frames 40..59); smoothed jerk peaks 4.8 > 4.13 at frames 48 and 52
    res = comfort_windows(spiky, lat, yaw, dt)
    assert res.windows_ok == [True, True, False, True, True]
    assert "lon_jerk" in res.violations[2]
    on_edge = lon.copy()
    on_edge[60] = 3.0  # window boundary: smoothing spreads it into windows 2 and 3
    assert comfort_windows(on_edge, lat, yaw, dt).windows_ok == [True, True, False, False, True]
    assert comfort_windows(on_edge, lat, yaw, dt).score == pytest.approx(0.6)


def test_comfort_lateral_acceleration_bound():
    n = 40
    res = comfort_windows(np.zeros(n), np.full(n, 5.0), np.zeros(n), 0.1)
    assert res.windows_ok == [False, False] and "lat_accel" in res.violations[0]


# ---- PDMS: straight two-lane road (lanes at y=0 and y=3.5, 3.5 m wide), ego at 10 m/s ----
ROAD = [(np.array([[-50.0, 0.0], [200.0, 0.0]]), 3.5), (np.array([[-50.0, 3.5], [200.0, 3.5]]), 3.5)]


def _straight(v, n=8):
    return np.stack([v * 0.5 * np.arange(1, n + 1), np.zeros(n)], axis=1)


def test_pdms_clean_straight_plan_is_one():
    r = pdm_score(_straight(10.0), PdmScene(ego_speed=10.0, lanes=ROAD, reference_progress=40.0))
    assert r.as_dict() == {"nc": 1.0, "dac": 1.0, "ttc": 1.0, "ep": 1.0, "c": 1.0, "pdms": 1.0}


def test_pdms_trajectory_leaving_the_road_scores_zero():
    traj = _straight(10.0)
    traj[:, 1] = -np.linspace(0.5, 8.0, 8)  # drifts right, off the road (right edge at y=-1.75)
    r = pdm_score(traj, PdmScene(ego_speed=10.0, lanes=ROAD, reference_progress=40.0))
    assert r.dac == 0.0 and r.score == 0.0


def test_pdms_ep_is_progress_over_reference():
    r = pdm_score(_straight(5.0), PdmScene(ego_speed=5.0, lanes=ROAD, reference_progress=40.0))
    assert (r.nc, r.dac, r.ttc, r.ep, r.c) == (1.0, 1.0, 1.0, 0.5, 1.0)
    assert r.score == pytest.approx((5 * 0.5 + 5 + 2) / 12)


def test_pdms_collision_with_stopped_vehicle_scores_zero():
    agent = Agent(xy=(25.0, 0.0), heading=0.0, velocity=(0.0, 0.0))
    r = pdm_score(_straight(10.0), PdmScene(ego_speed=10.0, agents=[agent], lanes=ROAD, reference_progress=40.0))
    assert r.nc == 0.0 and r.score == 0.0


def test_pdms_hard_stop_short_of_vehicle_fails_ttc_and_comfort_only():
    # brake at 6.25 m/s^2 from 10 m/s: stops after 8 m at t=1.6 s; agent rear 8.5 m ahead of ego's front
    t = np.arange(1, 9) * 0.5
    x = np.where(t < 1.6, 10 * t - 0.5 * 6.25 * t ** 2, 8.0)
    traj = np.stack([x, np.zeros(8)], axis=1)
    agent = Agent(xy=(2.5 + 8.5 + 2.5, 0.0), heading=0.0, velocity=(0.0, 0.0))
    r = pdm_score(traj, PdmScene(ego_speed=10.0, agents=[agent], lanes=ROAD, reference_progress=4.0))
    assert (r.nc, r.dac, r.ttc, r.ep, r.c) == (1.0, 1.0, 0.0, 1.0, 0.0)
    assert r.score == pytest.approx(5 / 12)


def test_l2_per_horizon_hand_computed():
    gt = np.zeros((2, 8, 2))
    pred = np.zeros((2, 8, 2))
    pred[0, :, 0] = np.arange(8)          # errors 0..7
    pred[1, :, 1] = 3 * np.arange(8)      # errors 0, 3, ..., 21
    np.testing.assert_allclose(l2_per_horizon(pred, gt), 2 * np.arange(8))
    rep = l2_report(pred, gt)
    assert rep["l2_4.0s"] == pytest.approx(14.0) and rep["l2_mean"] == pytest.approx(7.0)


def test_coco_map_perfect_half_and_empty():
    gt = [[(10, 10, 50, 50), (100, 100, 150, 140)]]
    assert coco_map([[(10, 10, 50, 50), (100, 100, 150, 140)]], gt)["map"] == pytest.approx(1.0)
    # one of two boxes found: precision 1 up to recall 0.5 -> 51 of 101 recall points
    assert coco_map([[(10, 10, 50, 50)]], gt)["map"] == pytest.approx(51 / 101)
    assert coco_map([[]], gt)["map"] == 0.0


def test_qa_exact_numeric_and_yes_no():
    assert answer_correct("Two.", "2")
    assert answer_correct("about 24 m", "22.5 m")            # within 2 m
    assert not answer_correct("about 30 m", "22.5 m")
    assert answer_correct("yes, it is free", "yes")
    assert not answer_correct("3", "2")
    assert answer_correct("Keep the lane", "keep the lane")
    acc = qa_accuracy(["2", "no", "slow down"], ["2", "yes", "keep the lane"])
    assert acc["exact"] == pytest.approx(100 / 3) and acc["accuracy"] == pytest.approx(100 / 3)
