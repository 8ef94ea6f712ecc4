"""Braking plans along the greedy path when every candidate is forecast to collide (`scoring.braking`): the braked
plans follow the path and brake as asked, are added only when no candidate is collision-free, win when they keep
clear, the hardest wins when nothing can, and the candidate planner counts them (and leaves them out when told)."""
from __future__ import annotations

import numpy as np
import pytest

from test_candidate_planner import IMAGE, CandidatePolicy, box_at, stopping, straight
from wam_diff_core.codec import parse_trajectory
from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from wam_diff_core.eval.pdm import Agent
from wam_diff_core.scoring.base import ScoringContext
from wam_diff_core.scoring.braking import (BRAKING_DECELERATIONS_MPS2, BRAKING_SOURCE, brake_along,
                                           braking_candidates, choose_or_brake, collision_free)
from wam_diff_core.scoring.planner import CandidatePlanner
from wam_diff_core.scoring.terms import candidate_terms
from wam_diff_core.types import Candidate, EgoState, Plan

T = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S


class AgentScorer:
    """The perception scorer's terms against agents given in metres (no camera, no map)."""

    name = "agents"

    def __init__(self, agents):
        self.agents = list(agents)

    def terms(self, candidates, context):
        return candidate_terms(candidates, context.ego, self.agents, None, context.route_target)


def plan_of(*trajectories) -> Plan:
    cands = [Candidate(k, np.asarray(t, dtype=np.float64), "x") for k, t in enumerate(trajectories)]
    return Plan(trajectory=cands[0].trajectory, valid=True, raw_text={"planning": "x"}, candidates=cands)


def standing(x: float, y: float = 0.0) -> Agent:
    return Agent(xy=(x, y), heading=0.0, velocity=(0.0, 0.0), length=5.0, width=2.0)


def test_a_straight_path_braked_travels_v_t_minus_half_a_t_squared_and_then_stands():
    braked = brake_along(straight(20.0), 20.0, 4.0)  # still moving at 4 s: 80 - 32 m
    assert np.allclose(braked[:, 0], 20.0 * T - 2.0 * T ** 2) and np.allclose(braked[:, 1], 0.0)
    braked = brake_along(straight(20.0), 20.0, 8.0)  # standing from 2.5 s, v^2 / 2a = 25 m ahead
    t = np.minimum(T, 2.5)
    assert np.allclose(braked[:, 0], 20.0 * t - 4.0 * t ** 2) and braked[-1, 0] == pytest.approx(25.0)
    assert np.allclose(brake_along(straight(20.0), 0.0, 4.0), 0.0)  # a standing ego stays


def test_a_braked_plan_stays_on_the_curved_path_and_never_gets_ahead_of_it():
    yaw = 0.1 * T  # a left curve
    path = np.stack([np.cumsum(np.full(NUM_WAYPOINTS, 5.0) * np.cos(yaw)),
                     np.cumsum(np.full(NUM_WAYPOINTS, 5.0) * np.sin(yaw))], axis=1)
    knots = np.vstack([[0.0, 0.0], path])
    along = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(knots, axis=0), axis=1))])
    braked = brake_along(path, 14.0, 3.0)  # faster than the plan's 10 m/s at first: held to the plan
    for p in braked:  # every point on one of the path's segments
        seg = np.argmin([np.linalg.norm(p - a) + np.linalg.norm(p - b) - np.linalg.norm(b - a)
                         for a, b in zip(knots[:-1], knots[1:])])
        a, b = knots[seg], knots[seg + 1]
        assert abs(np.linalg.norm(p - a) + np.linalg.norm(p - b) - np.linalg.norm(b - a)) < 1e-9
    walked = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(np.vstack([[0, 0], braked]), axis=0), axis=1))])
    assert np.all(walked[1:] <= along[1:] + 1e-9) and walked[-1] < along[-1]


def test_braking_candidates_are_numbered_after_the_models_marked_and_their_text_parses_to_their_plan():
    base = Candidate(0, straight(10.0), "x")
    extra = braking_candidates(base, 10.0, 8)
    assert [c.index for c in extra] == list(range(8, 8 + len(BRAKING_DECELERATIONS_MPS2)))
    assert {c.source for c in extra} == {BRAKING_SOURCE} and base.source == "model"
    for c in extra:
        assert np.allclose(parse_trajectory(c.text), c.trajectory)
    for bad in (0.0, -3.0, float("nan"), "4"):
        with pytest.raises(ValueError, match=f"expected finite numbers > 0 m/s\\^2, got {bad!r}"):
            braking_candidates(base, 10.0, 8, (3.0, bad))


def test_nothing_is_added_while_one_candidate_is_collision_free():
    plan = plan_of(straight(10.0), stopping(10.0, 5.0))
    context = ScoringContext(ego=EgoState(10.0))
    chosen, scores = choose_or_brake(plan, AgentScorer([standing(20.0)]), context)
    assert len(chosen.candidates) == 2 and chosen.chosen == 1 and scores.shape == (2,)
    assert scores[0] == 0.0 and scores[1] > 0.5


def test_when_every_candidate_collides_the_gentlest_braking_that_keeps_clear_wins():
    plan = plan_of(straight(10.0), straight(11.0))  # both into a car standing 30 m ahead
    context = ScoringContext(ego=EgoState(10.0))
    scorer = AgentScorer([standing(30.0)])
    assert not any(collision_free(t) for t in scorer.terms(plan.candidates, context))
    chosen, scores = choose_or_brake(plan, scorer, context)
    assert len(chosen.candidates) == 2 + len(BRAKING_DECELERATIONS_MPS2) and list(scores[:2]) == [0.0, 0.0]
    winner = chosen.candidates[chosen.chosen]
    assert winner.source == BRAKING_SOURCE and chosen.score == scores[chosen.chosen] > 0.5
    assert np.array_equal(chosen.trajectory, winner.trajectory) and chosen.raw_text["planning"] == winner.text
    clear = [k for k in range(2, len(scores)) if scores[k] > 0]
    assert chosen.chosen == max(clear, key=lambda k: (scores[k], -k))  # the best-scored braking plan
    decel = BRAKING_DECELERATIONS_MPS2[chosen.chosen - 2]
    assert winner.trajectory[-1, 0] == pytest.approx(100.0 / (2 * decel), abs=0.01)  # it stops v^2 / 2a ahead
    assert winner.trajectory[-1, 0] < 30.0 - 2.5 - 2.0  # short of the car's rear


def test_when_even_braking_collides_the_hardest_braking_is_published():
    plan = plan_of(straight(10.0), straight(12.0))
    chosen, scores = choose_or_brake(plan, AgentScorer([standing(6.0)]), ScoringContext(ego=EgoState(10.0)))
    assert float(np.max(scores)) == 0.0
    assert chosen.chosen == len(chosen.candidates) - 1 and chosen.score == 0.0
    assert chosen.candidates[-1].source == BRAKING_SOURCE
    assert chosen.trajectory[-1, 0] == pytest.approx(100.0 / (2 * max(BRAKING_DECELERATIONS_MPS2)), abs=0.01)


def test_the_planner_brakes_for_a_detected_car_counts_it_and_does_not_when_told_not_to():
    # a car standing 29 m ahead, 25 m 0.4 s later (seen twice: standing); the model's two candidates drive on at 10 m/s
    for braking, wins in ((True, 1), (False, 0)):
        policy = CandidatePolicy([straight(10.0), straight(10.5)],
                                 detections=[[box_at(29.0, 0.0)], [box_at(25.0, 0.0)]])
        planner = CandidatePlanner(policy, candidates=2, scorer="perception", braking=braking)
        planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=0.6)  # no previous frame: it moves like the ego
        plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=1.0)
        s = planner.stats
        assert (s.braking_plans, s.braking_wins, s.candidates_drawn) == (wins, wins, 4)
        assert planner.settings()["braking"] is braking
        assert (plan.candidates[plan.chosen].source == BRAKING_SOURCE) is braking
        assert len(planner.last_scores) == len(plan.candidates)
        if braking:
            assert plan.trajectory[-1, 0] < 25.0 - 2.5 - 2.0
    likelihood = CandidatePlanner(CandidatePolicy([straight(10.0)]), candidates=2, scorer="likelihood")
    assert likelihood.settings()["braking"] is False  # the model's confidence forecasts no collision


def test_one_candidate_with_perception_is_checked_and_braked_when_it_would_hit_a_detected_car():
    # a car standing 29 m, then 25 m ahead; then one 60 m ahead, new (beyond the gate of every earlier box): standing
    policy = CandidatePolicy([straight(10.0)],
                             detections=[[box_at(29.0, 0.0)], [box_at(25.0, 0.0)], [box_at(60.0, 0.0)]])
    planner = CandidatePlanner(policy, candidates=1, scorer="perception")
    plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=0.6)  # no previous frame: it moves like the ego
    assert plan.chosen == 0 and plan.score == pytest.approx(1.0)
    plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=1.0)
    assert policy.calls[0]["tasks"] == ("planning", "detection") and policy.calls[0]["candidates"] == 1
    assert plan.candidates[plan.chosen].source == BRAKING_SOURCE and plan.trajectory[-1, 0] < 25.0 - 2.5 - 2.0
    plan = planner.plan([IMAGE], EgoState(10.0), "follow lane", time_s=1.4)  # the car 60 m ahead: clear
    assert plan.chosen == 0 and len(plan.candidates) == 1 and plan.score == pytest.approx(1.0)
    assert (planner.stats.braking_plans, planner.stats.braking_wins, planner.stats.plans) == (1, 1, 3)
