"""Embedded world: conventions (ego frame, pixels), route suite, determinism of frames and scores."""
import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.eval.bench2drive import ABILITIES  # noqa: E402
from wam_diff_core.sim.closed_loop import run_route  # noqa: E402
from wam_diff_core.sim.highway import HighwayWorld, world_to_ego  # noqa: E402
from wam_diff_core.sim.policies import ConstantVelocityPolicy  # noqa: E402
from wam_diff_core.sim.routes import SCENARIO_ABILITIES, Route, load_routes  # noqa: E402

SHORT_HIGHWAY = Route("t_highway", "highway", 11, 1.0, 60.0, 10.0, {"lanes": 3, "vehicles": 8, "ego_speed": 20.0})
SHORT_ROUNDABOUT = Route("t_round", "roundabout", 3, 1.0, 40.0, 12.0, {"exit": "wxs"})


def _frames_hash(route, ticks, driver="expert"):
    w = HighwayWorld(route, driver=driver)
    tk = w.reset()
    h = hashlib.sha256(tk.frame.tobytes())
    states = []
    for _ in range(ticks):
        tk = w.step(1.0, 0.0)
        h.update(tk.frame.tobytes())
        states.append((tk.pose, tk.ego.speed))
    w.close()
    return h.hexdigest(), states


def test_suite_has_40_plus_routes_covering_all_five_abilities():
    routes = load_routes()
    assert len(routes) >= 40
    covered = {a for r in routes for a in r.abilities}
    assert covered == set(ABILITIES)
    for r in routes:
        assert r.target_distance_m > 0 and r.time_limit_s > 0 and r.scenario in SCENARIO_ABILITIES
    assert len({r.route_id for r in routes}) == len(routes)


def test_same_seed_gives_identical_frames_across_scenario_types():
    # an intersection env in between rewrites IDMVehicle constants process-wide: the world restores them
    a, sa = _frames_hash(SHORT_ROUNDABOUT, 15)
    HighwayWorld(Route("t_int", "intersection", 1, 1.0, 50.0, 5.0, {"destination": "o2"}), render=False).reset()
    b, sb = _frames_hash(SHORT_ROUNDABOUT, 15)
    assert a == b and sa == sb
    c, _ = _frames_hash(Route("t_round2", "roundabout", 4, 1.0, 40.0, 12.0, {"exit": "wxs"}), 15)
    assert c != a  # another seed gives another scene


def test_same_route_twice_gives_identical_scores_and_hashes():
    r1 = run_route(SHORT_HIGHWAY, ConstantVelocityPolicy(), video=False)
    r2 = run_route(SHORT_HIGHWAY, ConstantVelocityPolicy(), video=False)
    for key in ("score", "completion", "status", "state_hash", "ticks", "infractions"):
        assert r1[key] == r2[key]
    assert r1["comfort"] == r2["comfort"]


def test_ego_frame_convention_and_pixel_boxes():
    w = HighwayWorld(SHORT_HIGHWAY, driver="policy", frame_size=(256, 128), scaling=3.0, ego_anchor=(0.25, 0.5))
    tk = w.reset()
    x0 = tk.pose[0]
    for _ in range(5):
        tk = w.step(0.0, 0.0)
    # highway heads along +X; the ego moves forward at its speed, no lateral drift
    assert tk.pose[0] - x0 == pytest.approx(20.0 * 0.5, rel=0.05)
    assert tk.ego.vx == pytest.approx(20.0, abs=0.01) and abs(tk.ego.vy) < 1e-6
    # the ego is drawn at its anchor pixel in the ego colour (green), facing right
    u, v = int(0.25 * 256), int(0.5 * 128)
    r, g, b = tk.frame[v, u].astype(int)
    assert g > 150 and r < 150
    # every ground-truth box is centred on a drawn vehicle (not on grey road)
    assert tk.detections
    for d in tk.detections:
        cx, cy = int((d.box_px[0] + d.box_px[2]) / 2), int((d.box_px[1] + d.box_px[3]) / 2)
        patch = tk.frame[max(cy - 1, 0):cy + 2, max(cx - 1, 0):cx + 2].reshape(-1, 3).astype(int)
        assert (np.abs(patch - [100, 100, 100]).sum(axis=1) > 60).any(), d
        assert all(0 <= c <= 1000 for c in d.box_norm)
    # a vehicle to the left (y > 0) is drawn above the ego (smaller v)
    for veh in tk.vehicles:
        if veh.box_px is not None and abs(veh.xy[1]) > 2:
            assert (veh.box_px[1] + veh.box_px[3]) / 2 < v if veh.xy[1] > 0 else (veh.box_px[1] + veh.box_px[3]) / 2 > v
    w.close()


def test_steering_left_turns_counter_clockwise():
    w = HighwayWorld(SHORT_HIGHWAY, driver="policy", render=False)
    tk = w.reset()
    yaw0 = tk.pose[2]
    for _ in range(5):
        tk = w.step(0.0, 0.05)  # + left
    assert tk.pose[2] > yaw0 and tk.ego.yaw_rate > 0
    w.close()


def test_world_to_ego_rotation():
    p = world_to_ego(np.array([[1.0, 1.0]]), np.array([1.0, 0.0]), np.pi / 2)
    np.testing.assert_allclose(p, [[1.0, 0.0]], atol=1e-12)


def test_roundabout_route_reference_follows_the_ring_lane_the_expert_drives():
    """Route entries without a lane index take the lane that continues the route (the outer ring lane
    the entry joins); lane 0, the inner one, put the reference about 4 m off the expert's path."""
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import load_routes

    route = load_routes(ids=["roundabout_00"])[0]
    world = HighwayWorld(route, driver="expert", render=False)
    tick = world.reset()
    worst = 0.0
    while tick.progress_m < route.target_distance_m and not tick.collision and tick.t < route.time_limit_s:
        tick = world.step()
        worst = max(worst, tick.route_deviation_m)
    assert tick.progress_m >= route.target_distance_m
    assert worst < 3.5


def test_expert_takeover_off_the_route_starts_at_the_nearest_route_lane():
    """A policy ego whose nearest lane is a ring segment the route does not take (sx -> se, just before
    the entry joins the ring): the expert takes over on the nearest route lane with the route from there,
    never the route's stale head (highway-env then picks its next road by distance)."""
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import load_routes

    route = load_routes(ids=["roundabout_00"])[0]
    world = HighwayWorld(route, driver="policy", render=False)
    world.reset()
    try:
        net = world.env.road.network
        ring = net.get_lane(("sx", "se", 1))
        assert all(tuple(r[:2]) != ("sx", "se") for r in world._route_lanes)
        ego = world.ego
        ego.position = ring.position(ring.length - 1.0, 0.0)
        ego.lane_index, ego.lane = ("sx", "se", 1), ring
        target, ahead = world._route_ahead(ego)
        assert tuple(target[:2]) == tuple(ahead[0][:2]) != ("ser", "ses")
        assert net.get_lane(target).distance(ego.position) < 3.0
        assert len(ahead) < len(world._route_lanes)
    finally:
        world.close()



def test_merge_ramp_command_announces_the_lane_drop():
    """On the on-ramp (j -> k -> b -> c lane 2, which ends at c) the command is "change lane left" exactly
    while the ramp's end is within LANE_DROP_LOOKAHEAD_M and "follow lane" before; once the expert is on the
    main road it is "follow lane" again; a route starting on the main road never sees it."""
    from wam_diff_core.sim.highway import LANE_DROP_LOOKAHEAD_M

    world = HighwayWorld(load_routes(ids=["merge_00"])[0], driver="expert", render=False)
    tick = world.reset()
    net = world.env.road.network
    ramp = [("j", "k", 0), ("k", "b", 0), ("b", "c", 2)]
    on_ramp, on_main = [], []
    while tick.t < 16.0 and not tick.collision:
        lane = tuple(world.ego.lane_index)
        if lane in ramp:
            i = ramp.index(lane)
            left = sum(net.get_lane(li).length for li in ramp[i:]) \
                - net.get_lane(lane).local_coordinates(world.ego.position)[0]
            on_ramp.append((tick.command, float(left)))
        else:
            on_main.append(tick.command)
        tick = world.step()
    assert len(on_ramp) > 50 and len(on_main) > 10
    assert all(c == ("change lane left" if left <= LANE_DROP_LOOKAHEAD_M else "follow lane") for c, left in on_ramp)
    assert {c for c, _ in on_ramp} == {"follow lane", "change lane left"}
    assert set(on_main) == {"follow lane"}

    world = HighwayWorld(load_routes(ids=["merge_01"])[0], driver="expert", render=False)
    tick = world.reset()
    commands = {tick.command}
    while tick.t < 12.0 and not tick.collision:
        tick = world.step()
        commands.add(tick.command)
    assert commands == {"follow lane"}


def test_route_target_lies_on_the_route_ahead_on_junction_routes_and_is_absent_on_roads():
    from wam_diff_core.constants import ROUTE_TARGET_AHEAD_M
    from wam_diff_core.sim.highway import ego_to_world, hw_to_world

    w = HighwayWorld(SHORT_HIGHWAY, driver="expert", render=False)
    assert w.reset().route_target is None
    w.close()
    w = HighwayWorld(SHORT_ROUNDABOUT, driver="expert", render=False)
    tk = w.reset()
    route_world = hw_to_world(w._route_hw)
    lefts = []
    for _ in range(120):
        x, y = tk.route_target
        # on the route centreline (1 m samples), ahead of the ego, no farther than the arc length along the route
        # from the route point nearest the ego (its 1 m sampling and the ego's distance from it added)
        point = ego_to_world(np.array([x, y]), np.array(tk.pose[:2]), tk.pose[2])
        assert np.linalg.norm(route_world - point, axis=1).min() < 1.0
        assert 0.0 < np.hypot(x, y) <= ROUTE_TARGET_AHEAD_M + tk.route_deviation_m + 1.0
        lefts.append(y)
        tk = w.step()
    w.close()
    # the entry bends right, the ring turns left: the target crosses from the right to the left of the ego
    assert min(lefts) < -3.0 and max(lefts) > 3.0
