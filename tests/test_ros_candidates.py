"""The planner node with candidates and a scorer (parameters `candidates`, `scorer`, `candidate_sampling`) over real
rclpy + Fast DDS (the harness of tests/test_ros_planner_node.py): the published Trajectory is the scorer's winner and
says so, the markers draw every candidate thin beside the winner, candidates 1 is the plan it always was, and a bad
setting is refused with one line."""
from __future__ import annotations

import math

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from lifecycle_msgs.msg import State, Transition  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

from test_candidate_planner import CandidatePolicy, Spy, box_at, straight  # noqa: E402
from test_ros_lifecycle import Lifecycle, record_log  # noqa: E402
from test_ros_parameters import ParamClient  # noqa: E402
from test_ros_planner_node import _ns, _stamp, image_msg, ros  # noqa: E402,F401 - ros: the fixture
from wam_diff_core.types import EgoState  # noqa: E402
from wam_diff_ros.fake_policy import FakePolicy  # noqa: E402
from wam_diff_ros.planner_parameters import SAMPLING_CHOICES, SCORER_CHOICES  # noqa: E402


def _plan(ros, node, sec):
    """Publish one frame stamped `sec` and return (its Trajectory, its MarkerArray)."""
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: all(s.get_publisher_count() >= 1 for s in probe.node.subscriptions
                               if s.topic_name.endswith("markers")), what="markers")
    stamp = _ns(_stamp(sec))
    cam.publish(image_msg(sec, h=128, w=256))
    probe.wait_for(lambda: probe.trajectories(stamp) and any(
        _ns(m.markers[0].header.stamp) == stamp for m in probe.received["markers"]), what="trajectory + markers")
    markers = [m for m in probe.received["markers"] if _ns(m.markers[0].header.stamp) == stamp][0]
    return probe.trajectories(stamp)[0], markers.markers


def test_the_node_names_the_core_scorers_and_sampling_methods_it_offers():
    from wam_diff_core.decoding.candidates import SAMPLING_METHODS
    from wam_diff_core.scoring.planner import WORLD_SCORERS
    from wam_diff_core.scoring.registry import SCORERS

    assert SCORER_CHOICES == ("",) + tuple(s for s in SCORERS if s not in WORLD_SCORERS)
    assert SAMPLING_CHOICES == SAMPLING_METHODS


def test_one_candidate_publishes_the_policys_own_plan_as_candidate_0_without_a_score(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    traj, markers = _plan(ros, node, 2.0)
    own = FakePolicy().plan([np.zeros((128, 256, 3), np.uint8)], EgoState(0.0), "follow lane")
    assert [(p.pose.position.x, p.pose.position.y) for p in traj.points] == [tuple(v) for v in own.trajectory]
    assert (traj.candidates, traj.candidate_index, traj.scorer) == (1, 0, "") and math.isnan(traj.candidate_score)
    assert [m.ns for m in markers] == ["wam_diff/trajectory", "wam_diff/waypoints"]
    assert policy.plan_calls[0]["tasks"] == ("planning",)


def test_the_likelihood_winner_is_published_and_every_candidate_drawn_thin_beside_it(ros):
    policy = CandidatePolicy([straight(5), straight(6), None, straight(8)], logprobs=[-0.5, -0.2, 0.0, -0.7])
    node = ros.planner(policy, candidates=4, scorer="likelihood", candidate_sampling="order")
    traj, markers = _plan(ros, node, 3.0)
    assert (traj.candidates, traj.candidate_index, traj.scorer) == (4, 1, "likelihood")
    assert traj.candidate_score == pytest.approx(-0.2) and traj.valid
    assert traj.points[-1].pose.position.x == pytest.approx(24.0) and traj.raw_text.startswith("3.00,0.00,6.00")
    assert policy.calls[0]["candidates"] == 4 and policy.calls[0]["sampling"].method == "order"
    assert len(markers) == 4 + 2  # N candidates + the winner's line and waypoints
    winner, dots, cands = markers[0], markers[1], markers[2:]
    assert (winner.ns, winner.scale.x, dots.type) == ("wam_diff/trajectory", pytest.approx(0.15), Marker.SPHERE_LIST)
    assert [(m.ns, m.id, m.action) for m in cands] == [("wam_diff/candidates", k, a) for k, a in
                                                       enumerate([Marker.ADD, Marker.ADD, Marker.DELETE, Marker.ADD])]
    assert [m.scale.x for m in cands if m.action == Marker.ADD] == pytest.approx([0.05] * 3)
    assert [(p.x, p.y) for p in cands[1].points] == [(p.x, p.y) for p in winner.points]
    name = node.get_fully_qualified_name()
    ros.probe.wait_for(lambda: any(kv.key == "candidate_wins_not_greedy" and kv.value == "1"
                                   for s in ros.probe.diagnostics(name) for kv in s.values), what="diagnostic counts")


def test_perception_asks_for_detections_and_forecasts_from_the_previous_frame_set_by_stamp(ros):
    policy = CandidatePolicy([straight(10), straight(4)], detections=[[box_at(30.0, 4.0)], [box_at(31.0, 4.0)]])
    node = ros.planner(policy, candidates=2, scorer="perception")
    spy = node._planner.scorer.inner = Spy(node._planner.scorer.inner)
    _plan(ros, node, 5.0)
    _plan(ros, node, 5.4)
    assert [c["tasks"] for c in policy.calls] == [("planning", "detection")] * 2
    assert spy.contexts[0].previous_detections is None
    assert spy.contexts[1].previous_detections == (box_at(30.0, 4.0),)
    assert spy.contexts[1].previous_age_s == pytest.approx(0.4)


def test_candidates_and_scorer_set_at_runtime_apply_to_the_next_frame_and_clear_the_old_candidates(ros):
    policy = CandidatePolicy([straight(5), straight(7), straight(6)], logprobs=[-0.3, -0.6, -0.1])
    node = ros.planner(policy)
    params = ParamClient(ros.probe, node)
    traj, _ = _plan(ros, node, 1.0)
    assert (traj.candidates, traj.candidate_index) == (1, 0) and policy.calls[-1]["candidates"] == 1
    for name, value in (("candidates", 3), ("scorer", "likelihood"), ("candidate_sampling", "order")):
        result = params.set(name, value)
        assert result.successful, (name, result.reason)
    ros.probe.wait_for(lambda: any(m.markers[0].action == Marker.DELETEALL for m in ros.probe.received["markers"]),
                       what="the drawn candidates cleared")
    traj, markers = _plan(ros, node, 2.0)
    assert (traj.candidates, traj.candidate_index, traj.scorer) == (3, 2, "likelihood") and len(markers) == 5
    assert policy.calls[-1]["sampling"].method == "order"


def test_bad_candidate_settings_at_runtime_are_refused_with_a_reason_and_the_old_ones_stay(ros):
    node = ros.planner(FakePolicy())
    params = ParamClient(ros.probe, node)
    cases = [("scorer", "oracle", "scorer 'oracle' reads the embedded world's true vehicles and lanes; a ROS node "
                                  "has no world: use perception or likelihood"),
             ("scorer", "best", "scorer must be one of ['', 'perception', 'likelihood'], got 'best'"),
             ("candidates", 17, "Parameter candidates out of range. Min: 1, Max: 16, value: 17"),
             ("candidates", 0, "Parameter candidates out of range"),
             ("candidate_sampling", "beam", "candidate_sampling must be one of ['tokens', 'order'], got 'beam'")]
    for name, value, reason in cases:
        result = params.set(name, value)
        assert not result.successful and result.reason.startswith(reason), (name, result.reason)
    assert (node._cfg["candidates"], node._cfg["scorer"], node._planner.candidates) == (1, "", 1)


def test_candidates_on_cuda_graphs_are_refused_at_runtime_with_a_reason(ros):
    node = ros.planner(None, autostart=False, cuda_graphs=True)
    result = ParamClient(ros.probe, node).set("candidates", 4)
    assert not result.successful and result.reason.startswith("candidates 4 decode on the eager path")
    assert node.get_parameter("candidates").value == 1


@pytest.mark.parametrize("bad, message", [
    ({"scorer": "oracle"}, "scorer 'oracle' reads the embedded world's true vehicles and lanes; a ROS node has no "
                           "world: use perception or likelihood"),
    ({"candidates": 4, "cuda_graphs": True}, "candidates 4 decode on the eager path: expected cuda_graphs false"),
], ids=["oracle", "cuda_graphs"])
def test_bad_candidate_settings_at_start_fail_configure_with_one_log_line(ros, bad, message):
    node = ros.planner(None, autostart=False, **bad)
    log = record_log(node)
    lc = Lifecycle(ros.probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE) is False
    assert lc.state() == State.PRIMARY_STATE_UNCONFIGURED and len(log.errors) == 1
    assert log.errors[0].startswith(f"configure failed: {message}")


def test_perception_publishes_a_braking_plan_when_every_candidate_would_hit_a_detected_car_and_counts_it(ros):
    policy = CandidatePolicy([straight(10), straight(10.5)], detections=[[box_at(25.0, 0.0)]])
    node = ros.planner(policy, candidates=2, scorer="perception")
    traj, markers = _plan(ros, node, 6.0)
    assert traj.candidates == 2 + 4 and traj.candidate_index >= 2 and traj.scorer == "perception"
    assert traj.candidate_score > 0.5 and traj.points[-1].pose.position.x < 25.0 - 2.5 - 2.0
    assert len(markers) == 6 + 2  # every scored plan drawn thin, braking ones included
    name = node.get_fully_qualified_name()
    ros.probe.wait_for(lambda: any(kv.key == "candidate_braking_wins" and kv.value == "1"
                                   for s in ros.probe.diagnostics(name) for kv in s.values), what="braking counted")
    result = ParamClient(ros.probe, node).set("candidate_braking", False)
    assert result.successful, result.reason
    traj, _ = _plan(ros, node, 7.0)
    assert (traj.candidates, traj.candidate_score) == (2, 0.0)  # both collide; candidate 0 keeps the plan
