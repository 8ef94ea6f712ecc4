"""Planning with candidates and a scorer wherever a plan is made (`scoring.planner.CandidatePlanner`): one candidate is
the policy's own plan token for token, the scorer's winner is the plan, perception gets this frame's and the previous
frame's detections, the oracle only where a world is, and `wam-diff drive|decode` and the CARLA agent record it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from wam_diff_core.scoring.planner import MAX_PREVIOUS_AGE_S, CandidatePlanner, check_scorer_setting
from wam_diff_core.scoring.registry import ScorerError
from wam_diff_core.types import Candidate, Detection, EgoState, Plan

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module

MODELS = Path(__file__).resolve().parent.parent / "models"
T = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
IMAGE = np.full((128, 256, 3), 100, np.uint8)


def straight(speed: float) -> np.ndarray:
    return np.stack([speed * T, np.zeros_like(T)], axis=1)


def stopping(speed: float, decel: float) -> np.ndarray:
    """Braking at `decel` m/s^2 from `speed` to a stop."""
    t = np.minimum(T, speed / decel)
    return np.stack([speed * t - decel * t ** 2 / 2, np.zeros_like(T)], axis=1)


class CandidatePolicy:
    """DrivingPolicy's plan interface with candidates, for wiring tests: candidate k is `trajectories[k]` (None:
    an answer that did not parse) with mean token log-probability `logprobs[k]`; with the detection task, the
    boxes of `detections` (one list per call, the last repeated). Records every call's keywords."""

    def __init__(self, trajectories, logprobs=None, detections=None, tasks=("planning",)):
        self.trajectories = list(trajectories)
        self.logprobs = list(logprobs) if logprobs is not None else [0.0] * len(self.trajectories)
        self.detections = list(detections or [[]])
        self.tasks = tuple(tasks)
        self.calls: list[dict] = []
        self.closed = False
        self.uses_route_target = True

    def plan(self, images, ego, command, target=None, tasks=None, candidates=1, sampling=None) -> Plan:
        tasks = tuple(tasks or self.tasks)
        self.calls.append({"tasks": tasks, "target": target, "candidates": candidates, "sampling": sampling})
        cands = []
        for k in range(candidates):
            traj = self.trajectories[k % len(self.trajectories)]
            text = "" if traj is None else ",".join(f"{v:.2f}" for v in np.asarray(traj).reshape(-1))
            cands.append(Candidate(k, None if traj is None else np.asarray(traj, dtype=np.float64), text,
                                   self.logprobs[k % len(self.logprobs)], None if traj is not None else "bad answer"))
        plan = Plan(trajectory=cands[0].trajectory, valid=cands[0].valid, raw_text={"planning": cands[0].text},
                    candidates=cands, timings={"plan_total": 0.001})
        if cands[0].error:
            plan.errors["planning"] = cands[0].error
        if "detection" in tasks:
            plan.detections = list(self.detections[min(len(self.calls) - 1, len(self.detections) - 1)])
        return plan

    def ask(self, images, question):
        raise NotImplementedError

    def close(self):
        self.closed = True


def box_at(x: float, y: float, length: float = 5.0, width: float = 2.0) -> Detection:
    """The box the embedded 256x128 top-down camera draws for a vehicle centred at ego-frame (x, y) m."""
    from wam_diff_core.scoring.camera import TopDownCamera

    cam = TopDownCamera(256, 128)
    (u1, v1), (u2, v2) = cam.to_pixels(np.array([[x - length / 2, y + width / 2], [x + length / 2, y - width / 2]]))
    return Detection("car", (u1, v1, u2, v2), (0, 0, 0, 0), 0.9)


class Spy:
    """Wraps a scorer, keeping every context it was given."""

    def __init__(self, inner):
        self.inner, self.name, self.contexts = inner, inner.name, []

    def score(self, candidates, context):
        self.contexts.append(context)
        return self.inner.score(candidates, context)


# ---------------------------------------------------------------------------------------------------- the module

def test_likelihood_winner_is_the_plan_and_invalid_candidates_are_dropped_and_counted():
    policy = CandidatePolicy([straight(5), straight(6), straight(7), None], logprobs=[-0.5, -0.2, -0.9, -0.01])
    planner = CandidatePlanner(policy, candidates=4, scorer="likelihood", sampling="order")
    plan = planner.plan([IMAGE], EgoState(5.0), "follow lane", target=(20.0, 0.0))
    assert (plan.chosen, plan.score) == (1, -0.2)
    assert np.array_equal(plan.trajectory, straight(6)) and plan.raw_text["planning"].startswith("3.00,0.00,6.00")
    assert policy.calls[0]["candidates"] == 4 and policy.calls[0]["sampling"].method == "order"
    assert policy.calls[0]["tasks"] == ("planning",)  # likelihood adds no detection task
    assert list(planner.last_scores[:3]) == [-0.5, -0.2, -0.9] and planner.last_scores[3] == -np.inf
    s = planner.stats
    assert (s.plans, s.scored, s.non_greedy_wins, s.candidates_drawn, s.invalid_candidates) == (1, 1, 1, 4, 1)


def test_without_a_scorer_candidates_are_drawn_and_candidate_0_is_kept():
    policy = CandidatePolicy([straight(5), straight(9)], logprobs=[-0.9, -0.1])
    plan = CandidatePlanner(policy, candidates=2).plan([IMAGE], EgoState(5.0), "follow lane")
    assert plan.chosen == 0 and plan.score is None and len(plan.candidates) == 2
    assert np.array_equal(plan.trajectory, straight(5))


def test_perception_adds_the_detection_task_and_picks_the_candidate_that_stops_short_of_a_detected_car():
    # a car standing in the ego's lane: 24 m ahead, and 0.4 s later (the ego drove 4 m) 20 m ahead
    policy = CandidatePolicy([straight(10), stopping(10, 5)], detections=[[box_at(24.0, 0.0)], [box_at(20.0, 0.0)]])
    planner = CandidatePlanner(policy, candidates=2, scorer="perception")
    first = planner.plan([IMAGE], EgoState(10.0), "follow lane", tasks=("planning",), time_s=2.6)
    assert first.chosen == 0  # no previous frame: it moves like the ego, candidate 0 keeps clear of it
    plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", tasks=("planning",), time_s=3.0)
    assert policy.calls[0]["tasks"] == ("planning", "detection")
    assert planner.last_scores[0] == 0.0 and planner.last_scores[1] > 0.5  # candidate 0 runs into it: NC 0
    assert plan.chosen == 1 and np.array_equal(plan.trajectory, stopping(10, 5))


def test_perception_reads_another_detectors_boxes_in_place_of_the_models_without_a_detection_task():
    policy = CandidatePolicy([straight(10), stopping(10, 5)], detections=[[]])
    planner = CandidatePlanner(policy, candidates=2, scorer="perception")
    planner.plan([IMAGE], EgoState(10.0), "follow lane", detections=[box_at(24.0, 0.0)], time_s=0.6)
    plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", detections=[box_at(20.0, 0.0)], time_s=1.0)
    assert policy.calls[0]["tasks"] == ("planning",) and plan.chosen == 1 and planner.last_scores[0] == 0.0
    assert planner._previous[0] == (box_at(20.0, 0.0),)  # the next frame's forecast reads them too


def test_perception_sees_the_previous_frames_detections_with_their_age_until_they_are_older_than_1_s():
    a, b = [box_at(30.0, 4.0)], [box_at(31.0, 4.0)]
    policy = CandidatePolicy([straight(10), straight(9)], detections=[a, b, b])
    planner = CandidatePlanner(policy, candidates=2, scorer="perception")
    spy = planner.scorer.inner = Spy(planner.scorer.inner)
    for t in (10.0, 10.4, 10.4 + MAX_PREVIOUS_AGE_S + 0.1):
        planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=t)
    first, second, third = spy.contexts
    assert first.previous_detections is None and first.detections == tuple(a)
    assert second.previous_detections == tuple(a) and second.previous_age_s == pytest.approx(0.4)
    assert (second.camera.width, second.camera.height) == (256, 128)  # the frame's size
    assert third.previous_detections is None  # 1.1 s old: not matched
    planner.reset()
    planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=10.6)
    assert spy.contexts[-1].previous_detections is None and planner.stats.plans == 1


def test_oracle_reads_the_truth_it_is_given_and_is_refused_where_no_world_is():
    from wam_diff_core.eval.pdm import Agent
    from wam_diff_core.scoring.base import ScoringContext

    with pytest.raises(ScorerError) as caught:
        CandidatePlanner(CandidatePolicy([straight(5)]), candidates=4, scorer="oracle", where="a ROS node")
    assert str(caught.value) == ("scorer 'oracle' reads the embedded world's true vehicles and lanes; a ROS node has "
                                 "no world: use perception or likelihood")
    assert check_scorer_setting("", has_world=False) is None and check_scorer_setting(" Likelihood ", False) == "likelihood"
    with pytest.raises(ScorerError, match="unknown scorer 'best'"):
        check_scorer_setting("best", has_world=True)
    ego = EgoState(10.0)
    truth = ScoringContext(ego=ego, agents=(Agent(xy=(20.0, 0.0), heading=0.0, velocity=(0.0, 0.0)),), lanes=None)
    policy = CandidatePolicy([straight(10), stopping(10, 5)])
    planner = CandidatePlanner(policy, candidates=2, scorer="oracle", has_world=True)
    calls = []
    plan = planner.plan([IMAGE], ego, "follow lane", truth=lambda: calls.append(1) or truth)
    assert plan.chosen == 1 and calls == [1] and policy.calls[0]["tasks"] == ("planning",)


# ---------------------------------------------------------------------------------------------------- shipped model

@pytest.fixture(scope="module")
def shipped():
    from wam_diff_core.policy import DrivingPolicy

    return DrivingPolicy.load(str(MODELS / "nano-s-b32"))


def test_one_candidate_through_the_planner_is_the_policys_own_plan_token_for_token(shipped, camera_image):
    ego, target = EgoState(vx=8.0, ax=0.3), (20.0, 4.0)
    alone = shipped.plan([camera_image], ego, "turn left", target=target)
    for scorer, braking in ((None, True), ("perception", False), ("likelihood", True)):
        planner = CandidatePlanner(shipped, candidates=1, scorer=scorer, braking=braking)
        plan = planner.plan([camera_image], ego, "turn left", target=target, time_s=1.0)
        assert plan.raw_text == alone.raw_text and np.array_equal(plan.trajectory, alone.trajectory)
        assert plan.chosen == 0 and plan.score is None and plan.detections is None  # no detection task added
    # perception with braking checks the one plan: the same tokens, scored, the detections it was checked against
    planner = CandidatePlanner(shipped, candidates=1, scorer="perception")
    plan = planner.plan([camera_image], ego, "turn left", target=target, time_s=1.0)
    assert plan.candidates[0].text == alone.raw_text["planning"] and plan.score is not None
    assert plan.detections is not None and planner.stats.scored == 1
    four = CandidatePlanner(shipped, candidates=4).plan([camera_image], ego, "turn left", target=target)
    assert four.raw_text["planning"] == alone.raw_text["planning"] and len(four.candidates) == 4


def test_candidates_on_cuda_graphs_are_a_one_line_error_before_any_plan(shipped):
    from dataclasses import replace

    from wam_diff_core.policy import PolicySettingsError

    class Graphs:
        config = replace(shipped.config, cuda_graphs=True)

    with pytest.raises(PolicySettingsError, match="candidates=4 decode on the eager path"):
        CandidatePlanner(Graphs(), candidates=4, scorer="likelihood")


def test_decode_prints_every_candidate_with_its_score_and_the_winner_is_the_best(capsys):
    from wam_diff_core.cli import main

    assert main(["decode", "--model", str(MODELS / "nano-s-b32"), "--candidates", "3", "--scorer", "likelihood",
                 "--sampling", "tokens", "--vx", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["candidate_list"]
    assert [r["index"] for r in rows] == [0, 1, 2] and (out["candidates"], out["scorer"]) == (3, "likelihood")
    assert {r["source"] for r in rows} == {"model"} and out["braking"] is False  # likelihood forecasts nothing
    scores = [r["score"] if r["score"] is not None else -np.inf for r in rows]
    assert out["chosen"] == int(np.argmax(scores)) and out["score"] == pytest.approx(max(scores), abs=1e-4)
    assert out["trajectory"] == rows[out["chosen"]]["trajectory"]


@pytest.mark.parametrize("argv, message", [
    (["decode", "--candidates", "4", "--scorer", "oracle"],
     "wam-diff decode: error: scorer 'oracle' reads the embedded world's true vehicles and lanes; wam-diff decode has "
     "no world: use perception or likelihood"),
    (["decode", "--candidates", "0"], "wam-diff decode: error: candidates 0: expected an integer >= 1"),
    (["drive", "--policy", "constant-velocity", "--out", "unused", "--ids", "highway_00", "--candidates", "4"],
     "wam-diff drive: error: --candidates/--scorer: the constant-velocity baseline draws no candidates; give a "
     "checkpoint"),
    (["drive", "--policy", "nano", "--out", "unused", "--ids", "highway_00", "--candidates", "4", "--cuda-graphs",
      "on"], "wam-diff drive: error: candidates=4 decode on the eager path"),
], ids=["decode_oracle", "decode_zero", "drive_baseline", "drive_cuda_graphs"])
def test_bad_candidate_settings_are_one_line_errors_before_any_model_loads(argv, message, capsys):
    from wam_diff_core.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------------- closed loop

def test_drive_with_4_candidates_and_the_oracle_records_who_won_on_a_short_route(tmp_path):
    pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")
    from wam_diff_core.sim.closed_loop import drive_suite
    from wam_diff_core.sim.routes import Route

    route = Route("t_highway", "highway", 11, 1.0, 40.0, 6.0, {"lanes": 3, "vehicles": 8, "ego_speed": 20.0})
    settings = {"candidates": 4, "scorer": "oracle", "sampling": "tokens"}
    summary = drive_suite([route], str(MODELS / "nano-s-b32"), tmp_path, frame_size=(256, 128), replan_every=4,
                          progress=False, candidates=settings)
    rec = json.loads((tmp_path / "routes" / "t_highway.json").read_text())
    c = summary["candidates"]
    assert rec["plans"] >= 3 and c["plans"] == c["scored"] == rec["plans"] == rec["candidates"]["plans"]
    assert (c["candidates"], c["scorer"], c["sampling"]) == (4, "oracle", "tokens")
    assert c["candidates_drawn"] == 4 * rec["plans"] and 0 <= c["non_greedy_wins"] <= rec["plans"]
    assert c["non_greedy_share"] == round(c["non_greedy_wins"] / rec["plans"], 4)
    assert summary["ms_per_plan"] == pytest.approx(1000 * rec["plan_s"] / rec["plans"], abs=0.01)
    assert json.loads((tmp_path / "summary.json").read_text())["candidates"] == c


def test_with_a_scorer_the_world_states_every_junction_target_and_the_model_is_asked_as_it_was_trained(monkeypatch):
    from types import SimpleNamespace

    from wam_diff_core.sim.closed_loop import route_target_scenarios
    from wam_diff_core.sim.policies import LearnedPolicy

    plain = LearnedPolicy(str(MODELS / "nano-s-b32"))
    scored = LearnedPolicy(str(MODELS / "nano-s-b32"), candidates={"candidates": 2, "scorer": "likelihood"})
    assert route_target_scenarios(plain) == ("roundabout",)  # the checkpoint learned targets there only
    assert len(route_target_scenarios(scored)) > 1
    seen = []
    monkeypatch.setattr(scored.planner, "plan", lambda *a, **k: seen.append(k) or Plan(None, False))
    for scenario in ("intersection", "roundabout"):
        scored.bind(SimpleNamespace(route=SimpleNamespace(scenario=scenario)))
        scored.plan([IMAGE], EgoState(5.0), "turn left", target=(20.0, 5.0))
    assert [(k["target"], k["route_target"]) for k in seen] == [(None, (20.0, 5.0)), ((20.0, 5.0), (20.0, 5.0))]


# ---------------------------------------------------------------------------------------------------- CARLA agent

def _agent_yaml(tmp_path, **keys) -> str:
    from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG

    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    data.update(keys)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("keys, message", [
    ({"candidates": 4, "scorer": "oracle"}, "scorer 'oracle' reads the embedded world's true vehicles and lanes; a "
                                            "CARLA agent has no world: use perception or likelihood"),
    ({"candidates": 17}, "candidates must be an integer in [1, 16], got 17"),
    ({"candidates": 4, "candidate_sampling": "beam"}, "sampling method 'beam': expected one of"),
    ({"candidates": 4, "decoding": {"cuda_graphs": True}}, "candidates=4 decode on the eager path"),
    ({"candidates": 4, "candidate_braking": "yes"}, "candidate_braking must be true or false, got 'yes'"),
], ids=["oracle", "seventeen", "sampling", "cuda_graphs", "braking"])
def test_carla_agent_config_refuses_bad_candidate_settings_naming_the_file(tmp_path, keys, message):
    from wam_diff_ros.carla.agent_config import AgentConfig, AgentConfigError

    path = _agent_yaml(tmp_path, **keys)
    with pytest.raises(AgentConfigError) as caught:
        AgentConfig.load(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)


def test_carla_agent_drives_the_likelihood_winner_and_records_the_counts(tmp_path):
    pytest.importorskip("carla")
    from test_carla_agent import input_data, straight_route

    from wam_diff_ros.carla import agent as agent_mod

    agent = agent_mod.WamDiffAgent("localhost", 2000, False)
    agent.set_global_plan(*straight_route())
    policy = CandidatePolicy([straight(5), straight(6), None], logprobs=[-0.4, -0.1, 0.0])
    agent.setup(_agent_yaml(tmp_path, candidates=3, scorer="likelihood"), policy=policy)
    for tick in range(11):  # plans on ticks 0 and 10
        agent.run_step(input_data(tick), tick * 0.05)
    assert np.allclose(agent._held.trajectory, straight(6))
    c = agent.summary()["candidates"]
    assert (c["candidates"], c["scorer"], c["plans"], c["non_greedy_wins"], c["invalid_candidates"]) == \
        (3, "likelihood", 2, 2, 2)
