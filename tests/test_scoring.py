"""Scorers of candidate trajectories: the PDM-style terms (collision, envelope, progress, TTC, comfort), the
perception scorer's ground positions and forecasts, the oracle on a live world, likelihood, and `choose`."""
import math

import numpy as np
import pytest

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from wam_diff_core.errors import WamDiffError
from wam_diff_core.eval.pdm import Agent
from wam_diff_core.scoring.base import ScoringContext, choose
from wam_diff_core.scoring.camera import TopDownCamera
from wam_diff_core.scoring.likelihood import LikelihoodScorer
from wam_diff_core.scoring.oracle import OracleScorer
from wam_diff_core.scoring.perception import PerceptionScorer, perceived_agents
from wam_diff_core.scoring.registry import SCORERS, ScorerError, make_scorer
from wam_diff_core.scoring.terms import combine, inside_envelope, progress_m, trajectory_terms
from wam_diff_core.types import Candidate, Detection, EgoState, Plan

T = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S  # waypoint times (s)


def constant_speed(v: float, vy: float = 0.0) -> np.ndarray:
    return np.stack([v * T, vy * T], axis=1)


def braking(v: float, decel: float) -> np.ndarray:
    """From speed v, braking at `decel` m/s^2 to a stop and standing there."""
    t = np.minimum(T, v / decel)
    return np.stack([v * t - 0.5 * decel * t ** 2, np.zeros_like(t)], axis=1)


def box_of(camera: TopDownCamera, xy, length: float = 5.0, width: float = 2.0, score: float = 1.0) -> Detection:
    """The pixel box the world draws for an ego-aligned vehicle centred at xy (m)."""
    corners = np.array([[xy[0] - length / 2, xy[1] - width / 2], [xy[0] + length / 2, xy[1] + width / 2]])
    (u1, v2), (u2, v1) = camera.to_pixels(corners)
    return Detection("car", (float(u1), float(v1), float(u2), float(v2)), (0, 0, 0, 0), score)


def candidates(*trajectories, logprobs=None) -> list[Candidate]:
    logprobs = logprobs or [0.0] * len(trajectories)
    return [Candidate(index=k, trajectory=None if t is None else np.asarray(t, dtype=np.float64), logprob=lp,
                      text=f"answer {k}", error=None if t is not None else "did not parse")
            for k, (t, lp) in enumerate(zip(trajectories, logprobs))]


# ---------------------------------------------------------------- the camera
@pytest.mark.parametrize("size", [(256, 128), (384, 192), (640, 320)])
def test_pixel_to_ground_inversion_round_trips_to_a_micrometre(size):
    camera = TopDownCamera(*size)
    points = np.random.default_rng(0).uniform(-60, 60, size=(500, 2))
    assert np.abs(camera.to_ground(camera.to_pixels(points)) - points).max() < 1e-6
    pixels = np.random.default_rng(1).uniform(0, size[0], size=(500, 2))
    assert np.abs(camera.to_pixels(camera.to_ground(pixels)) - pixels).max() < 1e-6
    # the ego sits at the anchor, 1 m ahead is `scaling` px to the right, 1 m left is `scaling` px up
    np.testing.assert_allclose(camera.to_pixels([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]),
                               [[size[0] / 4, size[1] / 2], [size[0] / 4 + 3, size[1] / 2], [size[0] / 4, size[1] / 2 - 3]])


def test_world_pixels_to_ego_inverts_ego_to_pixels_to_a_micrometre():
    pytest.importorskip("highway_env")
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import Route

    world = HighwayWorld(Route("t_cam", "highway", 1, 1.0, 50.0, 5.0, {}), frame_size=(320, 160), render=False)
    points = np.random.default_rng(2).uniform(-50, 50, size=(200, 2))
    assert np.abs(world.pixels_to_ego(world.ego_to_pixels(points)) - points).max() < 1e-6
    assert world.camera == TopDownCamera(320, 160, 3.0, (0.25, 0.5))


# ---------------------------------------------------------------- the terms
def parked(camera: TopDownCamera, xy, ego_speed: float, age: float = 0.4) -> dict:
    """Context keywords for a vehicle standing at xy now and seen `age` s earlier, the ego driving along x at
    `ego_speed` in between (it was that much farther ahead then)."""
    earlier = (xy[0] + ego_speed * age, xy[1])
    return dict(detections=[box_of(camera, xy)], previous_detections=[box_of(camera, earlier)], previous_age_s=age)


def test_a_candidate_driving_into_a_detected_vehicle_scores_below_one_that_stops():
    ego = EgoState(vx=10.0)
    context = ScoringContext(ego=ego, **parked(TopDownCamera(), (20.0, 0.0), 10.0))
    scores = PerceptionScorer().score(candidates(constant_speed(10.0), braking(10.0, 5.0)), context)
    assert scores[0] == 0.0  # NC = 0: the plan reaches the parked car at 1.25 s
    # the stop 10 m ahead: no collision, no TTC hit, the only safe progress (EP 1); braking at 5 m/s^2 is past
    # the comfort bound (-4.05 m/s^2), so C = 0
    assert scores[1] == pytest.approx(10 / 12)
    agents = perceived_agents(context)
    assert len(agents) == 1 and np.allclose(agents[0].velocity, (0.0, 0.0), atol=1e-9)
    np.testing.assert_allclose([*agents[0].xy, agents[0].length, agents[0].width], [20.0, 0.0, 5.0, 2.0], atol=1e-9)


def test_a_lead_vehicle_seen_twice_moves_at_its_velocity_and_is_not_hit():
    ego, camera, age = EgoState(vx=10.0), TopDownCamera(), 0.4
    # the lead kept 20 m ahead while both drove 4 m: over the ground it moves at 10 m/s like the ego
    context = ScoringContext(ego=ego, detections=[box_of(camera, (20.0, 0.0)), box_of(camera, (-12.0, 4.0))],
                             previous_detections=[box_of(camera, (20.0, 0.0)), box_of(camera, (-8.0, 4.0))],
                             previous_age_s=age)
    agents = perceived_agents(context)
    np.testing.assert_allclose([a.velocity for a in agents], [[10.0, 0.0], [0.0, 0.0]], atol=1e-9)
    scores = PerceptionScorer().score(candidates(constant_speed(10.0)), context)
    assert scores[0] > 0.99  # nothing hit, nothing within TTC, comfortable, EP 1
    once = ScoringContext(ego=ego, detections=context.detections)
    # no previous frame: every vehicle moves like the ego (not parked: the plan keeping its speed is clear)
    np.testing.assert_allclose([a.velocity for a in perceived_agents(once)], [[10.0, 0.0], [10.0, 0.0]], atol=1e-9)
    assert PerceptionScorer().score(candidates(constant_speed(10.0)), once)[0] > 0.99


def test_without_a_previous_frame_everything_moves_like_the_ego_with_one_a_new_box_stands():
    camera, ego = TopDownCamera(), EgoState(vx=8.0, vy=0.5)
    boxes = [box_of(camera, (20.0, 0.0)), box_of(camera, (-10.0, -8.0))]
    np.testing.assert_allclose([a.velocity for a in perceived_agents(ScoringContext(ego=ego, detections=boxes))],
                               [[8.0, 0.5], [8.0, 0.5]], atol=1e-9)
    # the first box was 3.2 m farther ahead 0.4 s ago: standing over the ground; the second is new (30 m away from
    # every earlier box, beyond the gate of 30 m/s x 0.4 s + 2 m): standing, the cautious reading
    context = ScoringContext(ego=ego, detections=boxes, previous_detections=[box_of(camera, (23.2, 0.2))],
                             previous_age_s=0.4)
    np.testing.assert_allclose([a.velocity for a in perceived_agents(context)], [[0.0, 0.0], [0.0, 0.0]], atol=1e-9)
    # a previous frame that saw nothing: every box is new and stands
    empty = ScoringContext(ego=ego, detections=boxes, previous_detections=[], previous_age_s=0.4)
    np.testing.assert_allclose([a.velocity for a in perceived_agents(empty)], [[0.0, 0.0], [0.0, 0.0]], atol=1e-9)


def test_an_explicit_previous_pose_replaces_dead_reckoning():
    camera = TopDownCamera()
    # the ego turned 90 degrees left and moved: a vehicle standing at (10, 0) back then is at (0, -10) - (2, 3) now
    context = ScoringContext(ego=EgoState(vx=0.0), detections=[box_of(camera, (-2.0, -13.0), 2.0, 2.0)],
                             previous_detections=[box_of(camera, (10.0, 0.0), 2.0, 2.0)], previous_age_s=0.5,
                             previous_pose=(-2.0, -3.0, -math.pi / 2))
    np.testing.assert_allclose(perceived_agents(context)[0].velocity, [0.0, 0.0], atol=1e-9)


def test_the_egos_own_box_and_low_scored_boxes_are_not_road_users():
    camera = TopDownCamera()
    context = ScoringContext(ego=EgoState(vx=5.0), detections=[box_of(camera, (0.0, 0.0)),
                                                               box_of(camera, (15.0, 4.0), score=0.2)])
    assert len(perceived_agents(context)) == 1
    assert len(perceived_agents(context, min_score=0.5)) == 0


def test_progress_prefers_the_candidate_reaching_the_route_target():
    target = (20.0, 10.0)
    turning = np.stack([5.0 * T, 0.625 * T ** 2], axis=1)  # ends on the target, 1.25 m/s^2 to the left
    straight = constant_speed(5.0)
    assert progress_m(turning, target) == pytest.approx(math.hypot(*target), abs=1e-9)
    assert progress_m(straight, target) == pytest.approx(math.hypot(*target) - 10.0, abs=1e-9)
    assert progress_m(straight, None) == pytest.approx(20.0)
    context = ScoringContext(ego=EgoState(vx=5.0), route_target=target, command="turn left")
    scores = PerceptionScorer().score(candidates(straight, turning), context)
    assert scores[1] == pytest.approx(1.0)
    ep_straight = (math.hypot(*target) - 10.0) / math.hypot(*target)
    assert scores[0] == pytest.approx((5 * ep_straight + 5 + 2) / 12)


def test_comfort_penalises_a_jerky_candidate():
    ego = EgoState(vx=10.0)
    smooth = constant_speed(10.0)
    # cruising, then 6 m/s^2 of braking from one interval to the next for 1.5 s, then cruising again: inside the
    # envelope, past the comfort bounds on deceleration and jerk (the smoothing averages out faster flips)
    accel = np.array([0.0, 0.0, -6.0, -6.0, -6.0, 0.0, 0.0, 0.0])
    speed = 10.0 + np.cumsum(accel) * WAYPOINT_DT_S
    jerky = np.stack([np.cumsum(speed) * WAYPOINT_DT_S, np.zeros(NUM_WAYPOINTS)], axis=1)
    a, b = (trajectory_terms(t, ego, [], None, None) for t in (smooth, jerky))
    assert (a.comfort, b.comfort) == (1.0, 0.0)
    assert (a.envelope, b.envelope) == (1.0, 1.0)
    scores = combine([a, b])
    progress = 0.5 * np.cumsum(speed)[-1]
    assert scores[0] - scores[1] == pytest.approx(2 / 12 + 5 / 12 * (1 - progress / 40.0))  # C's weight, EP's


def test_a_plan_outside_the_kinematic_envelope_or_driving_backwards_scores_zero():
    ego = EgoState(vx=10.0)
    assert inside_envelope(constant_speed(10.0), ego)
    assert not inside_envelope(constant_speed(20.0), ego)  # 10 -> 20 m/s in one interval: 20 m/s^2
    assert not inside_envelope(constant_speed(10.0, vy=4.0), ego)  # 4 m/s sideways at once: 8 m/s^2 lateral
    backwards = braking(2.0, 4.0)
    backwards[4:, 0] -= 0.5
    assert not inside_envelope(backwards, EgoState(vx=2.0))
    wobble = braking(2.0, 4.0)
    wobble[5, 0] -= 0.01  # a hundredth back: rounding, not reversing
    assert inside_envelope(wobble, EgoState(vx=2.0))
    scores = PerceptionScorer().score(candidates(constant_speed(20.0)), ScoringContext(ego=ego))
    assert scores[0] == 0.0


def test_time_to_collision_costs_five_twelfths_when_closing_in_without_contact():
    ego = EgoState(vx=10.0)
    # a car standing beside the end of the plan's path (0.2 m between the boxes): neither touched nor closed in on;
    # one standing 1 m beyond its end: not touched, but the plan's 0.9 s projection at 10 m/s reaches it
    agent = Agent(xy=(44.0, 2.2), heading=0.0, velocity=(0.0, 0.0))
    terms = trajectory_terms(constant_speed(10.0), ego, [agent], None, None)
    assert (terms.nc, terms.ttc) == (1.0, 1.0)
    close = Agent(xy=(46.0, 0.0), heading=0.0, velocity=(0.0, 0.0))
    terms = trajectory_terms(constant_speed(10.0), ego, [close], None, None)
    assert (terms.nc, terms.ttc) == (1.0, 0.0)
    assert combine([terms])[0] == pytest.approx(7 / 12)


# ---------------------------------------------------------------- likelihood, choose, names
def test_likelihood_orders_candidates_by_mean_logprob():
    cands = candidates(constant_speed(5.0), constant_speed(6.0), None, constant_speed(7.0),
                       logprobs=[-0.40, -0.05, 0.0, -0.20])
    scores = LikelihoodScorer().score(cands, ScoringContext(ego=EgoState(vx=5.0)))
    np.testing.assert_array_equal(scores, [-0.40, -0.05, -np.inf, -0.20])
    plan = choose(Plan(trajectory=cands[0].trajectory, valid=True, candidates=cands), LikelihoodScorer(),
                  ScoringContext(ego=EgoState(vx=5.0)))
    assert (plan.chosen, plan.score) == (1, -0.05)


class Fixed:
    name = "fixed"

    def __init__(self, scores):
        self.scores = np.asarray(scores, dtype=np.float64)

    def score(self, candidates, context):
        return self.scores


def test_choose_picks_the_best_valid_candidate_and_keeps_candidate_0_on_ties():
    context = ScoringContext(ego=EgoState(vx=5.0))
    cands = candidates(constant_speed(5.0), None, constant_speed(6.0), constant_speed(7.0))
    plan = Plan(trajectory=cands[0].trajectory, valid=True, candidates=cands, raw_text={"planning": "answer 0"})
    best = choose(plan, Fixed([0.5, 9.0, 0.8, 0.7]), context)  # the invalid candidate's 9.0 never wins
    assert (best.chosen, best.score, best.valid) == (2, 0.8, True)
    np.testing.assert_array_equal(best.trajectory, cands[2].trajectory)
    assert best.raw_text["planning"] == "answer 2"
    assert (plan.chosen, plan.score) == (0, None) and plan.trajectory is cands[0].trajectory  # a copy
    tie = choose(plan, Fixed([0.8, -np.inf, 0.8, 0.8]), context)
    assert (tie.chosen, tie.score) == (0, 0.8)
    later_tie = choose(plan, Fixed([0.1, -np.inf, 0.8, 0.8]), context)
    assert later_tie.chosen == 2


def test_choose_turns_an_invalid_greedy_plan_valid_and_leaves_a_plan_without_valid_candidates_alone():
    context = ScoringContext(ego=EgoState(vx=5.0))
    cands = candidates(None, constant_speed(6.0))
    plan = Plan(trajectory=None, valid=False, candidates=cands, errors={"planning": "did not parse"})
    best = choose(plan, make_scorer("perception"), context)
    assert (best.valid, best.chosen, best.errors) == (True, 1, {})
    none = Plan(trajectory=None, valid=False, candidates=candidates(None, None))
    assert choose(none, make_scorer("likelihood"), context) is none


@pytest.mark.parametrize("name", SCORERS)
def test_invalid_candidates_score_minus_infinity(name):
    context = ScoringContext(ego=EgoState(vx=5.0), agents=(), lanes=None)
    scores = make_scorer(name).score(candidates(None, constant_speed(5.0), None), context)
    assert scores.shape == (3,)
    assert np.isneginf(scores[[0, 2]]).all() and np.isfinite(scores[1])


def test_a_bad_scorer_name_is_one_line_naming_it_and_the_choices():
    with pytest.raises(ScorerError) as err:
        make_scorer("best-of-n")
    message = str(err.value)
    assert isinstance(err.value, WamDiffError) and isinstance(err.value, ValueError)
    assert "\n" not in message and "'best-of-n'" in message
    assert all(name in message for name in ("perception", "oracle", "likelihood"))
    assert make_scorer(" Likelihood ").name == "likelihood"


def test_the_oracle_refuses_a_context_without_true_agents():
    with pytest.raises(ValueError, match="oracle_context"):
        OracleScorer().score(candidates(constant_speed(5.0)), ScoringContext(ego=EgoState(vx=5.0)))


# ---------------------------------------------------------------- a live world
def test_the_oracle_sees_the_worlds_vehicles_and_lanes_and_perception_places_its_boxes():
    pytest.importorskip("highway_env")
    from wam_diff_core.scoring.oracle import oracle_context
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import Route

    world = HighwayWorld(Route("t_oracle", "highway", 11, 1.0, 60.0, 10.0,
                               {"lanes": 3, "vehicles": 8, "ego_speed": 20.0}), render=False)
    tick = world.reset()
    context = oracle_context(world, tick)
    assert len(context.agents) == len(tick.vehicles) > 0 and context.lanes
    # every vehicle's forecast follows its lane at its speed: half a second on, it is where its velocity takes it
    assert all(a.future is not None and a.future.shape == (NUM_WAYPOINTS, 3) for a in context.agents)
    drift = [np.linalg.norm(a.future[0, :2] - (np.asarray(a.xy) + 0.5 * np.asarray(a.velocity))) for a in context.agents]
    assert max(drift) < 0.2
    speed = tick.ego.vx
    keep_lane = constant_speed(speed)
    off_road = np.stack([speed * T, 0.6 * T ** 2 * 4], axis=1)  # 38 m to the left in 4 s: off the 3 lanes
    ahead = min((v for v in tick.vehicles if v.xy[0] > 0), key=lambda v: math.hypot(*v.xy))
    chase = np.array([np.asarray(ahead.xy) + np.asarray(ahead.velocity) * t for t in T])  # onto its centre
    terms = [trajectory_terms(t, context.ego, context.agents, context.lanes, None) for t in (keep_lane, off_road, chase)]
    assert terms[1].dac == 0.0 and terms[2].nc == 0.0
    assert OracleScorer().score(candidates(off_road, chase), context).tolist() == [0.0, 0.0]
    # the world's own boxes, read back by the perception scorer, sit on the true centres of ego-aligned vehicles
    seen = perceived_agents(context)
    truth = [v for v in tick.vehicles if v.box_px is not None and abs(v.heading) < 1e-3]
    assert truth and len(seen) == len([v for v in tick.vehicles if v.box_px is not None])
    for v in truth:
        nearest = min(seen, key=lambda a: math.hypot(a.xy[0] - v.xy[0], a.xy[1] - v.xy[1]))
        gap = math.hypot(nearest.xy[0] - v.xy[0], nearest.xy[1] - v.xy[1])
        inside = 0.0 < v.box_px[0] and v.box_px[2] < world.width
        assert gap < (1e-6 if inside else v.length / 2)
    world.close()


@pytest.mark.parametrize("route, most_kept", [(("highway_dense", 7, {"lanes": 4, "vehicles": 30, "ego_speed": 25.0}),
                                                (0.15, 0.3)), (("roundabout", 3, {"exit": "wxs"}), (0.5, 0.15))])
def test_leaving_out_far_agents_and_lane_pieces_changes_no_pdm_term(route, most_kept):
    pytest.importorskip("highway_env")
    from wam_diff_core.eval.pdm import PdmScene, densify, pdm_score
    from wam_diff_core.scoring.oracle import oracle_context
    from wam_diff_core.scoring.relevance import nearby_agents, nearby_lanes, tabulate
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import Route

    scenario, seed, options = route
    world = HighwayWorld(Route("t_near", scenario, seed, 2.0, 200.0, 30.0, options), render=False)
    tick = world.reset()
    for _ in range(20):
        tick = world.step()
    context = oracle_context(world, tick)
    tabulated = tabulate(context.agents)
    rng = np.random.default_rng(seed)
    kept, hits = [], []
    for _ in range(40):  # plans from braking to speeding up, swerving either way
        v, a, lateral = tick.ego.speed, rng.uniform(-6.0, 4.0), rng.uniform(-1.5, 1.5)
        plan = np.stack([np.maximum(v * T + 0.5 * a * T ** 2, 0.0), lateral * T ** 2], axis=1)
        _, xy, heading = densify(plan)
        near = nearby_agents(xy, heading, context.ego.speed, tabulated)
        lanes = nearby_lanes(xy, context.lanes)
        full = pdm_score(plan, PdmScene(context.ego.speed, list(context.agents), list(context.lanes)))
        part = pdm_score(plan, PdmScene(context.ego.speed, near, lanes))
        assert (part.nc, part.dac, part.ttc, part.c) == (full.nc, full.dac, full.ttc, full.c)
        hits.append((full.nc < 1, full.ttc < 1, full.dac < 1))
        kept.append((len(near) / len(context.agents), sum(len(c) for c, _ in lanes) / sum(len(c) for c, _ in context.lanes)))
    world.close()
    agents_kept, lane_points_kept = np.mean(kept, axis=0)  # highway: 5 % of 15 agents, 19 % of the lane points
    collisions, ttc_hits, _ = np.sum(hits, axis=0)  # highway: 13 and 10 of the 40 plans, roundabout 36 and 5
    assert collisions >= 3 and ttc_hits >= 3  # the plans do test what is left out
    assert len(context.agents) >= 4 and agents_kept <= most_kept[0] and lane_points_kept <= most_kept[1]


def test_an_agents_states_at_many_times_follow_its_log_then_its_last_step_or_its_velocity():
    from wam_diff_core.eval.pdm import Agent

    times = np.array([0.0, 0.25, 1.0, 4.0, 4.5])  # 4.5: past the 4 s log
    still = Agent(xy=(5.0, 1.0), heading=0.3, velocity=(2.0, -1.0), static=True)
    xy, heading = still.states_at(times)
    assert np.array_equal(xy, np.tile([5.0, 1.0], (5, 1))) and np.array_equal(heading, np.full(5, 0.3))
    moving = Agent(xy=(5.0, 1.0), heading=0.3, velocity=(2.0, -1.0))
    xy, heading = moving.states_at(times)
    assert np.allclose(xy, np.stack([5.0 + 2.0 * times, 1.0 - times], axis=1)) and np.all(heading == 0.3)
    knots_x = 3.0 + 4.0 * np.arange(1, 9) * 0.5  # 4 m/s along x from x = 3, heading 3.0 -> -3.0 (wraps)
    future = np.stack([knots_x, np.zeros(8), np.full(8, -3.0)], axis=1)
    logged = Agent(xy=(3.0, 0.0), heading=3.0, velocity=(0.0, 0.0), future=future)
    xy, heading = logged.states_at(times)
    assert np.allclose(xy[:, 0], 3.0 + 4.0 * times) and np.allclose(xy[:, 1], 0.0)  # past the log: the last 4 m/s
    assert heading[0] == 3.0 and np.allclose(heading[2:], 2 * np.pi - 3.0)  # unwrapped, not a turn through 0
    assert np.allclose(heading[1], 3.0 + (2 * np.pi - 6.0) / 2)
    one = [logged.state_at(float(t)) for t in times]
    assert np.array_equal(xy, np.array([p for p, _ in one])) and np.array_equal(heading, np.array([h for _, h in one]))
