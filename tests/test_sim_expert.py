"""Expert building blocks: junction detection, same-direction leader corridor, roundabout yielding."""
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.sim.closed_loop import run_route  # noqa: E402
from wam_diff_core.sim.expert import is_junction_lane  # noqa: E402
from wam_diff_core.sim.policies import ExpertPolicy  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_core.sim.traffic import geometric_leader  # noqa: E402


def _car(x, y, heading):
    return SimpleNamespace(position=np.array([x, y]), heading=heading, WIDTH=2.0, LENGTH=5.0)


def test_junction_lanes():
    assert is_junction_lane(("ir0", "il2", 0)) and is_junction_lane(("se", "ex", 1))
    assert not is_junction_lane(("o0", "ir0", 0)) and not is_junction_lane(("ses", "se", 0))


def test_leader_is_the_nearest_same_direction_vehicle_in_the_corridor():
    me = _car(0.0, 0.0, 0.0)
    ahead_far, ahead_near = _car(20.0, 0.5, 0.1), _car(12.0, -1.0, -0.2)
    crossing = _car(6.0, 0.0, np.pi / 2)      # crossing right in front: right-of-way rules handle it
    beside = _car(8.0, 4.0, 0.0)              # next lane
    behind = _car(-8.0, 0.0, 0.0)
    leader, gap = geometric_leader(me, [me, ahead_far, ahead_near, crossing, beside, behind])
    assert leader is ahead_near and gap == pytest.approx(12.0 - 5.0)
    assert geometric_leader(me, [me, crossing, beside, behind]) == (None, None)


@pytest.mark.parametrize("exit_node", ["wxs"])
def test_expert_drives_through_a_roundabout_without_collision(exit_node):
    route = Route("t_round", "roundabout", 502, 1.0, 70.0, 30.0, {"exit": exit_node})
    rec = run_route(route, ExpertPolicy())
    assert rec["status"] == "Completed" and not rec["infractions"]
