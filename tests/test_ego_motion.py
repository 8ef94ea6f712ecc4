"""The ego state the planner asks with, from odometry twists, equals the training prompts' (the world's
observation: world-frame velocity change in the current ego frame) on a drive of the embedded world."""
import math

import pytest

from wam_diff_ros.ego_motion import EgoMotion
from wam_diff_ros.input_checks import OdometrySample


def _sample(t_s: float, vx: float, vy: float, yaw_rate: float) -> OdometrySample:
    return OdometrySample(int(round(t_s * 1e9)), vx, vy, yaw_rate)


def test_a_steady_turn_has_its_centripetal_acceleration_and_a_straight_none():
    motion = EgoMotion()
    for k in range(3):
        state = motion.add(_sample(0.1 * k, 20.0, 0.0, 0.2))
    assert state.ay == pytest.approx(20.0 * math.sin(0.02) / 0.1, rel=1e-12)  # 3.9997 m/s^2, about v x yaw rate
    assert state.ax == pytest.approx(20.0 * (1 - math.cos(0.02)) / 0.1, abs=1e-12)
    straight = EgoMotion()
    straight.add(_sample(0.0, 10.0, 0.0, 0.0))
    assert straight.add(_sample(0.1, 11.0, 0.0, 0.0)).ax == pytest.approx(10.0)  # 1 m/s in 0.1 s


def test_out_of_order_or_far_apart_samples_give_no_acceleration():
    motion = EgoMotion()
    assert not motion.seen and motion.state.vx == 0.0
    motion.add(_sample(1.0, 10.0, 0.0, 0.0))
    assert motion.add(_sample(0.9, 12.0, 0.0, 0.0)).ax == 0.0  # older stamp
    assert motion.add(_sample(2.5, 14.0, 0.0, 0.0)).ax == 0.0  # 1.6 s later
    assert motion.seen and motion.state.vx == 14.0


def test_the_node_rule_reproduces_the_worlds_own_ego_states_on_a_drive():
    """A junction route of the embedded world, 60 ticks: from the twists the world publishes (vx, vy, yaw rate),
    EgoMotion gives the world's own ax, ay to 1e-9 m/s^2 at every tick after the first."""
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import load_routes

    route = next(r for r in load_routes() if r.scenario == "roundabout")
    world = HighwayWorld(route, driver="expert", render=False)
    tick = world.reset()
    motion, worst, turned = EgoMotion(), 0.0, 0.0
    for k in range(60):
        ego = tick.ego
        state = motion.add(_sample(tick.t, ego.vx, ego.vy, ego.yaw_rate))
        if k:
            worst = max(worst, abs(state.ax - ego.ax), abs(state.ay - ego.ay))
            turned = max(turned, abs(ego.ay))
        tick = world.step(frame=False)
    assert worst < 1e-9 and turned > 0.5  # the drive did turn
