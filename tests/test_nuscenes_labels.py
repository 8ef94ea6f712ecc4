"""The nuScenes converter's labels and geometry, without the devkit: ST-P3's command threshold, the trajectory's
regular-spacing rule, the 2D box of projected corners clipped to the image (two independent constructions agree),
box overlap, and the embedded world's QA answered from boxes."""
import math

import numpy as np
import pytest

from wam_diff_core.nuscenes import fixture
from wam_diff_core.nuscenes.geometry import (EGO_CENTRE_AHEAD_M, box_corners, boxes_overlap, image_box, to_frame,
                                             yaw_of, yaw_quaternion)
from wam_diff_core.nuscenes.labels import (COMMAND_WAYPOINT, future_trajectory, navigation_command, qa_answers)
from wam_diff_core.nuscenes.reader import PlaneObject
from wam_diff_core.types import EgoState


def _straight(lateral_at_3s: float, lateral_at_4s: float = 0.0) -> np.ndarray:
    traj = np.stack([np.arange(1, 9) * 5.0, np.zeros(8)], axis=1)
    traj[COMMAND_WAYPOINT, 1], traj[7, 1] = lateral_at_3s, lateral_at_4s
    return traj


def test_command_is_set_by_a_2m_lateral_offset_at_3s():
    assert COMMAND_WAYPOINT == 5
    assert navigation_command(_straight(2.0)) == "turn left"
    assert navigation_command(_straight(1.99)) == "go straight"
    assert navigation_command(_straight(-2.0)) == "turn right"
    assert navigation_command(_straight(-1.99)) == "go straight"
    assert navigation_command(_straight(0.0, lateral_at_4s=6.0)) == "go straight"  # the 4 s point does not decide


def test_trajectory_needs_8_following_keyframes_at_regular_spacing():
    t = np.arange(12) * 0.5
    xy = np.stack([np.arange(12) * 4.0, np.zeros(12)], axis=1)
    yaw = np.zeros(12)
    traj, why = future_trajectory(t, xy, yaw, 3)
    assert why == "" and traj[:, 0] == pytest.approx(np.arange(1, 9) * 4.0)
    assert future_trajectory(t, xy, yaw, 4) == (None, "no_future")
    late = t.copy()
    late[6:] += 0.1  # one interval of 0.6 s: within the 0.1 s tolerance
    assert future_trajectory(late, xy, yaw, 0)[1] == ""
    late[6:] += 0.01
    assert future_trajectory(late, xy, yaw, 0) == (None, "irregular_spacing")
    assert future_trajectory(late, xy, yaw, 0, dt_tolerance=0.12)[1] == ""


def test_trajectory_is_in_the_current_ego_frame():
    t = np.arange(9) * 0.5
    xy = np.stack([np.full(9, 10.0), 5.0 + np.arange(9) * 2.0], axis=1)  # driving north
    traj, _ = future_trajectory(t, xy, np.full(9, math.pi / 2), 0)
    assert traj[:, 0] == pytest.approx(np.arange(1, 9) * 2.0) and traj[:, 1] == pytest.approx(np.zeros(8), abs=1e-12)


def test_yaw_quaternion_round_trips():
    for yaw in np.linspace(-3.1, 3.1, 13):
        assert yaw_of(yaw_quaternion(float(yaw))) == pytest.approx(yaw)


def test_image_box_clips_the_hull_not_its_bounding_box():
    inside = np.array([[10.0, 20.0], [50.0, 20.0], [50.0, 60.0], [10.0, 60.0]])
    assert image_box(inside, 100, 100) == pytest.approx((10, 20, 50, 60))
    # a thin sliver crossing the top-left corner: its bounding box clipped would be (0, 0, 31, 31)
    sliver = np.array([[-20.0, 30.0], [-19.0, 31.0], [30.0, -20.0], [31.0, -19.0]])
    assert image_box(sliver, 100, 100) == pytest.approx((0, 0, 12, 12))
    assert image_box(np.array([[-5.0, -5.0], [-1.0, -5.0], [-1.0, -1.0]]), 100, 100) is None


def test_image_box_agrees_with_the_fixtures_independent_construction():
    rng = np.random.default_rng(0)
    compared = 0
    for _ in range(300):
        pts = rng.uniform(-150, 550, size=(8, 2)) * [1.0, 0.6]
        a, b = image_box(pts, 400, 225), fixture.clipped_box(pts, 400, 225)
        assert (a is None) == (b is None)
        if a is not None:
            assert a == pytest.approx(b, abs=1e-6)
            compared += 1
    assert compared > 200


def test_box_overlap_uses_orientation_not_bounding_boxes():
    a = box_corners(0.0, 0.0, 0.0, 4.0, 2.0)
    assert boxes_overlap(a, box_corners(3.9, 0.0, 0.0, 4.0, 2.0))
    assert not boxes_overlap(a, box_corners(4.1, 0.0, 0.0, 4.0, 2.0))
    # a diagonal box whose axis-aligned bounds cover a's corner, while the box itself stays clear
    diagonal = box_corners(3.6, 2.6, math.pi / 4, 4.0, 1.0)
    lo, hi = diagonal.min(axis=0), diagonal.max(axis=0)
    assert lo[0] < 2.0 and lo[1] < 1.0 and hi[0] > 2.0 and hi[1] > 1.0
    assert not boxes_overlap(a, diagonal)
    assert boxes_overlap(a, box_corners(2.0, 1.0, math.pi / 4, 1.0, 1.0))


def test_to_frame_inverts_a_pose():
    pts = to_frame(np.array([[1.0, 1.0], [1.0, 2.0]]), (1.0, 1.0), math.pi / 2)
    assert pts == pytest.approx(np.array([[0.0, 0.0], [1.0, 0.0]]))


def test_qa_answers_use_the_worlds_templates_on_boxes():
    car = lambda x, y: PlaneObject("vehicle.car", x, y, 0.0, 4.5, 1.9)  # noqa: E731
    ahead = car(EGO_CENTRE_AHEAD_M + 20.0, 0.5)
    far = car(EGO_CENTRE_AHEAD_M + 60.0, -0.3)
    beside = car(EGO_CENTRE_AHEAD_M + 5.0, 3.5)
    future = np.stack([np.arange(1, 9) * 5.0, np.zeros(8)], axis=1)
    qa = {k: (q, a) for k, q, a in qa_answers([far, beside, ahead], 2, EgoState(vx=10.2), "go straight", future)}
    assert list(qa) == ["count_ahead", "lead_distance", "visible_count", "next_action", "ego_speed"]
    assert qa["count_ahead"] == ("How many vehicles are ahead of me in my lane within 50 m?", "1")
    assert qa["lead_distance"][1] == f"{20.0 - (4.5 + 5.0) / 2:.0f} m"
    assert qa["visible_count"][1] == "2" and qa["next_action"][1] == "keep lane" and qa["ego_speed"][1] == "10 m/s"
