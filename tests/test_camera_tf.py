"""Camera frames of the bridges: REP 103 optical rotation, CARLA mountings in the right-handed base frame,
the two static transforms per camera."""
import math
import sys

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")

from wam_diff_ros.camera_tf import (OPTICAL_ROTATION, CameraMount, StaticTransforms,  # noqa: E402
                                    camera_transforms, quaternion_from_rpy)
from wam_diff_ros.carla_bridge_node import carla_mount  # noqa: E402

H = math.sqrt(0.5)


def rotation_matrix(q):
    x, y, z, w = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def test_rpy_quaternions_of_quarter_turns_about_each_axis():
    assert quaternion_from_rpy(math.pi / 2, 0, 0) == pytest.approx((H, 0, 0, H))
    assert quaternion_from_rpy(0, math.pi / 2, 0) == pytest.approx((0, H, 0, H))
    assert quaternion_from_rpy(0, 0, math.pi / 2) == pytest.approx((0, 0, H, H))
    assert quaternion_from_rpy(-math.pi / 2, 0, -math.pi / 2) == pytest.approx(OPTICAL_ROTATION)


def test_the_optical_frame_looks_along_the_links_x_with_x_right_and_y_down():
    R = rotation_matrix(OPTICAL_ROTATION)  # columns: optical axes in the link frame (x forward, y left, z up)
    assert np.allclose(R[:, 2], [1, 0, 0])  # optical z: the view
    assert np.allclose(R[:, 0], [0, -1, 0])  # optical x: right
    assert np.allclose(R[:, 1], [0, 0, -1])  # optical y: down


def test_a_carla_camera_yawed_right_and_pitched_down_looks_right_and_down_in_the_base_frame():
    sensor = {"id": "rgb_front", "x": 0.8, "y": 0.3, "z": 1.6, "roll": 0.0, "pitch": -15.0, "yaw": 30.0}
    mount = carla_mount(sensor)
    assert (mount.link_frame, mount.optical_frame) == ("rgb_front_link", "rgb_front_optical_frame")
    assert mount.xyz == (0.8, -0.3, 1.6)  # CARLA's y right -> y left
    p, y = math.radians(15.0), math.radians(-30.0)
    assert mount.rotation == pytest.approx(quaternion_from_rpy(0.0, p, y))
    assert mount.rotation == pytest.approx((0.0338, 0.1261, -0.2566, 0.9577), abs=1e-4)
    view = rotation_matrix(mount.rotation)[:, 0]
    c15, s15, c30, s30 = math.cos(p), math.sin(p), math.cos(math.radians(30)), math.sin(math.radians(30))
    assert view == pytest.approx([c15 * c30, -c15 * s30, -s15])  # to the right (y < 0) and down (z < 0)


def test_each_camera_gets_a_mounting_and_an_optical_transform_under_the_base_frame():
    from builtin_interfaces.msg import Time

    mounts = [CameraMount("cam_a", (1.0, 2.0, 3.0), (0.0, 0.0, H, H)), CameraMount("cam_b", (0.5, 0.0, 1.5))]
    ts = camera_transforms(mounts, "base_link", Time(sec=7))
    assert [(t.header.frame_id, t.child_frame_id) for t in ts] == [
        ("base_link", "cam_a_link"), ("cam_a_link", "cam_a_optical_frame"),
        ("base_link", "cam_b_link"), ("cam_b_link", "cam_b_optical_frame")]
    a = ts[0].transform
    assert (a.translation.x, a.translation.y, a.translation.z) == (1.0, 2.0, 3.0)
    assert (a.rotation.x, a.rotation.y, a.rotation.z, a.rotation.w) == pytest.approx((0.0, 0.0, H, H))
    optical = ts[3].transform
    assert (optical.translation.x, optical.translation.y, optical.translation.z) == (0.0, 0.0, 0.0)
    assert (optical.rotation.x, optical.rotation.y, optical.rotation.z, optical.rotation.w) == (-0.5, 0.5, -0.5, 0.5)
    assert all(t.header.stamp.sec == 7 for t in ts)


class _Node:
    def __init__(self):
        self.lines = []

    def get_logger(self):
        return self

    def info(self, line):
        self.lines.append(line)


def test_without_tf2_msgs_nothing_is_published_and_the_bridge_says_so_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "tf2_msgs", None)  # what a PyPI-only install has (no tf2_msgs wheel)
    node = _Node()
    tf = StaticTransforms(node)
    assert tf.publisher is None
    assert tf.publish([CameraMount("cam", (0.0, 0.0, 1.0))], "base_link") is None
    assert len(node.lines) == 1 and "tf2_msgs" in node.lines[0] and "/tf_static" in node.lines[0]
