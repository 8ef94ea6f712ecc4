"""Frames rendered only where they are read (`HighwayWorld.step(frame=...)`), ground-truth vehicle ids that
survive Python's reuse of object ids (neither may change what the world does or what a drive scores), and route
targets stated on the route types a checkpoint learned them on."""
import gc
import time

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S  # noqa: E402
from wam_diff_core.sim import highway  # noqa: E402
from wam_diff_core.sim.closed_loop import route_target_scenarios, run_route  # noqa: E402
from wam_diff_core.sim.highway import HighwayWorld  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_core.types import Plan  # noqa: E402

ROUNDABOUT = Route("t_round", "roundabout", 3, 1.0, 40.0, 3.0, {"exit": "wxs"})
HIGHWAY = Route("t_hw", "highway", 11, 1.0, 500.0, 3.0, {"lanes": 3, "vehicles": 8, "ego_speed": 20.0})


class FramePolicy:
    """Constant velocity from images: records each frame it is given (a learned policy's view of the world);
    `delay_s` of wall time per plan for realtime drives."""

    needs_images = True
    drives_itself = False

    def __init__(self, delay_s: float = 0.0):
        self.frames, self.delay_s = [], delay_s

    def plan(self, images, ego, command, target=None):
        assert len(images) == 1 and images[0] is not None, "a plan was asked for without its frame"
        self.frames.append(images[0].copy())
        time.sleep(self.delay_s)
        t = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
        return Plan(trajectory=np.stack([ego.vx * t, ego.vy * t], axis=1), valid=True)


def _always_render(monkeypatch):
    step = HighwayWorld.step
    monkeypatch.setattr(HighwayWorld, "step", lambda self, accel=0.0, steer=0.0, frame=True: step(self, accel, steer))


def test_an_unread_frame_is_not_rendered_and_changes_nothing():
    every, ticks = 3, 16
    a = HighwayWorld(ROUNDABOUT, driver="expert")
    b = HighwayWorld(ROUNDABOUT, driver="expert")
    ta, tb = a.reset(), b.reset()
    assert np.array_equal(ta.frame, tb.frame)
    for k in range(1, ticks + 1):
        ta, tb = a.step(), b.step(frame=k % every == 0)
        assert ta.pose == tb.pose and ta.ego == tb.ego
        assert np.array_equal(np.asarray(a.snapshot()["vehicles"]), np.asarray(b.snapshot()["vehicles"]))
        if k % every == 0:
            assert np.array_equal(ta.frame, tb.frame)
        else:
            assert tb.frame is None and ta.frame is not None
    a.close()
    b.close()


def test_a_drive_renders_only_the_frames_its_plans_read(monkeypatch):
    renders = []
    render = HighwayWorld._render
    monkeypatch.setattr(HighwayWorld, "_render", lambda self, yaw: renders.append(self._ticks) or render(self, yaw))
    lazy_policy = FramePolicy()
    lazy = run_route(HIGHWAY, lazy_policy, replan_every=4)
    assert lazy["plans"] == 8 and renders == [0, 4, 8, 12, 16, 20, 24, 28]  # 30 ticks, a plan every 4th

    _always_render(monkeypatch)
    renders.clear()
    full_policy = FramePolicy()
    full = run_route(HIGHWAY, full_policy, replan_every=4)
    assert len(renders) == full["ticks"] + 1 == 31
    for key in ("score", "completion", "status", "state_hash", "ticks", "infractions", "comfort", "plans"):
        assert lazy[key] == full[key], key
    assert len(lazy_policy.frames) == len(full_policy.frames) == 8
    assert all(np.array_equal(x, y) for x, y in zip(lazy_policy.frames, full_policy.frames))


def test_a_realtime_drive_renders_the_frame_of_every_late_request():
    # plans arrive 1-2 ticks late (0.15 s at 10 Hz): the next request waits for the arrival; FramePolicy fails
    # on a request without its frame
    policy = FramePolicy(delay_s=0.15)
    rec = run_route(HIGHWAY, policy, replan_every=1, realtime=True)
    assert rec["plans"] == len(policy.frames) >= 8
    assert rec["realtime"]["latency_ticks_max"] >= 2


def test_vehicles_spawned_later_never_inherit_an_earlier_vehicle_id():
    world = HighwayWorld(HIGHWAY, driver="expert", render=False)
    world.reset()
    road = world.env.road
    others = [v for v in road.vehicles if v is not world.ego]
    numbered = [getattr(v, highway._VID_ATTR) for v in others]
    assert numbered == list(range(len(others)))  # in order of first sight
    gone = others[0]
    lane, x, speed, cls = gone.lane_index, float(gone.lane.local_coordinates(gone.position)[0]), gone.speed, type(gone)
    road.vehicles.remove(gone)
    del gone, others
    gc.collect()
    newcomer = cls.make_on_lane(road, lane, x, speed)  # an id(v) key could be the freed vehicle's
    road.vehicles.append(newcomer)
    tick = world.step()
    assert getattr(newcomer, highway._VID_ATTR) == len(numbered)
    assert 0 not in {v.vid for v in tick.vehicles}
    world.close()


JUNCTIONS = [Route("t_int_rt", "intersection", 1, 1.0, 90.0, 2.0, {"destination": "o2"}),
             Route("t_round_rt", "roundabout", 3, 1.0, 40.0, 2.0, {"exit": "wxs"})]


class TargetPolicy(FramePolicy):
    """Records the route target each plan is given."""

    def __init__(self, scenarios=None):
        super().__init__()
        self.targets = []
        if scenarios is not None:
            self.route_target_scenarios = scenarios

    def plan(self, images, ego, command, target=None):
        self.targets.append(target)
        return super().plan(images, ego, command, target)


def test_the_world_states_route_targets_on_the_route_types_a_policy_learned_them_on():
    assert route_target_scenarios(FramePolicy()) == ("intersection", "roundabout")
    assert route_target_scenarios(TargetPolicy(("roundabout",))) == ("roundabout",)
    for route in JUNCTIONS:
        everywhere, roundabouts = TargetPolicy(), TargetPolicy(("roundabout",))
        a, b = run_route(route, everywhere), run_route(route, roundabouts)
        assert len(everywhere.targets) == a["plans"] >= 5 and all(t is not None for t in everywhere.targets)
        assert all((t is not None) == (route.scenario == "roundabout") for t in roundabouts.targets)
    with pytest.raises(ValueError, match="route_target_scenarios \\('highway',\\): expected a non-empty list"):
        HighwayWorld(JUNCTIONS[0], route_target_scenarios=("highway",))
