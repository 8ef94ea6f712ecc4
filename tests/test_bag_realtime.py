"""`wam-diff-bag replay --realtime`: a tiny bag published over DDS at its recorded rate reaches a subscriber, the
latched command included (what `ros2 bag play` does for a running planner)."""
import os
import random
import threading
import time

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags (requirements-data.txt) not installed")
rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")

from wam_diff_ros.bag import topics as T  # noqa: E402
from wam_diff_ros.bag.messages import blank, header  # noqa: E402
from wam_diff_ros.bag.typestore import typestore  # noqa: E402
from wam_diff_ros.bag.writing import BagWriter  # noqa: E402

TICKS = 10


def tiny_bag(path):
    store = typestore()
    with BagWriter(path, store) as bag:
        for k in range(TICKS):
            ns = 5 * 10**9 + k * 100_000_000
            if k == 0:
                bag.write(T.COMMAND_TOPIC, T.STRING, ns, blank(store, T.STRING, data="turn left"))
            bag.write(T.ODOMETRY_TOPIC, T.ODOMETRY, ns, blank(store, T.ODOMETRY, header=header(store, ns, "odom")))
            bag.write(T.CAMERA_TOPIC, T.IMAGE, ns, blank(store, T.IMAGE, header=header(store, ns, "cam"), height=2,
                                                         width=2, encoding="rgb8", step=6, data=np.full(12, k, np.uint8)))
    return path


def test_realtime_publishes_every_message_at_the_recorded_pace_to_a_running_subscriber(tmp_path, monkeypatch):
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from nav_msgs.msg import Odometry
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from wam_diff_ros.bag.realtime import play

    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.setenv("ROS_DOMAIN_ID", str(random.Random(os.getpid() + 23).randrange(100, 150)))
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    ns = f"/play{os.getpid()}"
    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node("listener", namespace=ns, context=context)
    got = {"images": [], "odom": 0, "command": []}
    reliable = QoSProfile(depth=20, reliability=ReliabilityPolicy.RELIABLE)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    node.create_subscription(Image, "camera/image_raw", lambda m: got["images"].append(
        (m.header.stamp.nanosec, int(m.data[0]))), reliable)
    node.create_subscription(Odometry, "odom", lambda m: got.__setitem__("odom", got["odom"] + 1), reliable)
    node.create_subscription(String, "command", lambda m: got["command"].append(m.data), latched)  # as the planner
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        summary = play(tiny_bag(tmp_path / "tiny"), delay_s=1.5, namespace=ns, progress=False)
        deadline = time.monotonic() + 5.0
        while len(got["images"]) < TICKS and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown(context=context)
    assert summary["published"] == {T.COMMAND_TOPIC: 1, T.ODOMETRY_TOPIC: TICKS, T.CAMERA_TOPIC: TICKS}
    assert got["images"] == [(k * 100_000_000, k) for k in range(TICKS)]  # every frame, in order, stamps kept
    assert got["odom"] == TICKS and got["command"] == ["turn left"]
    assert 0.85 <= summary["wall_s"] <= 3.0  # 0.9 s of recording played at its pace
