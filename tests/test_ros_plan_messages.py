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


def test_detection_boxes_become_centre_and_size_in_pixels_with_one_scored_hypothesis():
    header = Header(frame_id="camera_front_optical_frame")
    msg = detections_msg([Detection("truck", (10.0, 20.0, 50.0, 40.0), (0, 0, 0, 0), 0.75),
                          Detection("car", (0.0, 0.0, 4.0, 2.0), (0, 0, 0, 0), 0.125)], header)
    d = msg.detections[0]
    assert len(d.results) == 1 and d.header.frame_id == "camera_front_optical_frame" and d.id == ""
    assert (d.results[0].hypothesis.class_id, d.results[0].hypothesis.score) == ("truck", 0.75)
    assert (d.bbox.center.position.x, d.bbox.center.position.y, d.bbox.center.theta) == (30.0, 30.0, 0.0)
    assert (d.bbox.size_x, d.bbox.size_y) == (40.0, 20.0)
    assert [(r.hypothesis.class_id, r.hypothesis.score) for r in msg.detections[1].results] == [("car", 0.125)]
    assert detections_msg(None, header).detections == []
    kept = detections_msg([Detection("car", (1.0, 1.0, 2.0, 2.0), (0, 0, 0, 0), s) for s in (0.1, 0.3, 0.9)], header, 0.3)
    assert [d.results[0].hypothesis.score for d in kept.detections] == pytest.approx([0.3, 0.9])


def test_detection_messages_have_the_field_layout_of_vision_msgs_4():
    from wam_diff_msgs.msg import (BoundingBox2D, Detection2D, Detection2DArray, ObjectHypothesis,
                                   ObjectHypothesisWithPose, Point2D, Pose2D)

    def fields(cls):
        return cls.get_fields_and_field_types()

    assert fields(Point2D) == {"x": "double", "y": "double"}
    assert fields(Pose2D) == {"position": "wam_diff_msgs/Point2D", "theta": "double"}
    assert fields(BoundingBox2D) == {"center": "wam_diff_msgs/Pose2D", "size_x": "double", "size_y": "double"}
    assert fields(ObjectHypothesis) == {"class_id": "string", "score": "double"}
    assert fields(ObjectHypothesisWithPose) == {"hypothesis": "wam_diff_msgs/ObjectHypothesis",
                                                "pose": "geometry_msgs/PoseWithCovariance"}
    assert fields(Detection2D) == {"header": "std_msgs/Header",
                                   "results": "sequence<wam_diff_msgs/ObjectHypothesisWithPose>",
                                   "bbox": "wam_diff_msgs/BoundingBox2D", "id": "string"}
    assert fields(Detection2DArray) == {"header": "std_msgs/Header",
                                        "detections": "sequence<wam_diff_msgs/Detection2D>"}


def test_an_out_of_range_score_is_clamped_into_0_1():
    header = Header(frame_id="cam")
    msg = detections_msg([Detection("car", (0.0, 0.0, 1.0, 1.0), (0, 0, 0, 0), 1.0000002),
                          Detection("car", (0.0, 0.0, 1.0, 1.0), (0, 0, 0, 0), -0.5)], header)
    assert [d.results[0].hypothesis.score for d in msg.detections] == [1.0, 0.0]
