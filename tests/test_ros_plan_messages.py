"""Plan -> ROS message conversion: headings, waypoint times, invalid plans, detection boxes."""
import math

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from std_msgs.msg import Header  # noqa: E402

from wam_diff_core.types import Detection, Plan  # noqa: E402
from wam_diff_ros.plan_messages import (detections_msg, duration, marker_array_msg, path_msg,  # noqa: E402
                                        trajectory_msg, waypoint_poses)


def _yaw(q):
    return 2.0 * math.atan2(q.z, q.w)


def test_waypoint_headings_follow_the_path_counter_clockwise_positive():
    straight = waypoint_poses(np.stack([np.arange(1, 9) * 2.0, np.zeros(8)], axis=1))
    assert all(abs(_yaw(p.orientation)) < 1e-9 for p in straight)
    # a quarter circle to the left (y left): headings rise from ~0 to ~+90 degrees
    angles = np.linspace(np.pi / 16, np.pi / 2, 8)
    left = waypoint_poses(np.stack([10 * np.sin(angles), 10 * (1 - np.cos(angles))], axis=1))
    yaws = [_yaw(p.orientation) for p in left]
    assert yaws[0] > 0 and yaws[-1] == pytest.approx(np.pi / 2, abs=0.15) and np.all(np.diff(yaws) > 0)


def test_standing_still_keeps_the_previous_heading():
    poses = waypoint_poses(np.array([[0.0, 1.0]] + [[0.0, 1.0]] * 7))
    assert all(_yaw(p.orientation) == pytest.approx(np.pi / 2) for p in poses)


def test_duration_splits_seconds_and_nanoseconds():
    assert (duration(0.5).sec, duration(0.5).nanosec) == (0, 500_000_000)
    assert (duration(4.0).sec, duration(4.0).nanosec) == (4, 0)


def test_invalid_plan_gives_an_empty_trajectory_naming_the_error_and_deletes_markers():
    header = Header(frame_id="base_link")
    plan = Plan(trajectory=None, valid=False, errors={"planning": "expected 16 numbers, got 3"},
                raw_text={"planning": "1,2,3"})
    msg = trajectory_msg(plan, header, "turn left", 32, 4, 0.25)
    assert not msg.valid and msg.points == [] and msg.error == "planning: expected 16 numbers, got 3"
    assert (msg.command, msg.raw_text, msg.block_size, msg.denoising_steps) == ("turn left", "1,2,3", 32, 4)
    assert msg.decode_time_s == pytest.approx(0.25)
    assert path_msg(plan, header).poses == []
    assert {m.action for m in marker_array_msg(plan, header).markers} == {2}  # Marker.DELETE


def test_detection_boxes_become_centre_and_size_in_pixels():
    header = Header(frame_id="camera_front")
    msg = detections_msg([Detection("truck", (10.0, 20.0, 50.0, 40.0), (0, 0, 0, 0), 0.75)], header)
    d = msg.detections[0]
    assert (d.class_id, d.score, d.header.frame_id) == ("truck", 0.75, "camera_front")
    assert (d.bbox.center.x, d.bbox.center.y, d.bbox.size_x, d.bbox.size_y) == (30.0, 30.0, 40.0, 20.0)
    assert detections_msg(None, header).detections == []
