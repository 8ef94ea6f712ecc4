"""`wam-diff-demo` (planner + highway bridge over rclpy + Fast DDS) on one short route, as a subprocess;
the bridge's planning tick in-process against a probe node."""
import json
import os
import random
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

SHORT_ROUTE = {"route_id": "short_highway", "scenario": "highway", "seed": 7, "density": 0.5,
               "target_distance_m": 60.0, "time_limit_s": 8.0,
               "options": {"lanes": 3, "vehicles": 2, "ego_speed": 20.0}}


def test_demo_drives_a_route_through_the_planner_node_and_writes_scores_and_video(tmp_path):
    pytest.importorskip("highway_env", reason="embedded world dependencies not installed")
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"version": "test", "routes": [SHORT_ROUTE]}))
    out = tmp_path / "out"
    # relative topic names, so the run stays inside its namespace even if another run shares the domain
    topics = tmp_path / "topics.yaml"
    topics.write_text(
        "/**/wam_diff_planner:\n  ros__parameters:\n    camera_topics: [camera/image_raw]\n    odometry_topic: odom\n"
        "/**/wam_diff_highway_bridge:\n  ros__parameters:\n    camera_topic: camera/image_raw\n    odometry_topic: odom\n")
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               ROS_DOMAIN_ID=str(random.Random(os.getpid() + 7).randrange(151, 200)))
    cmd = [sys.executable, "-m", "wam_diff_ros.demo", "--model", "fake", "--routes-file", str(routes),
           "--out", str(out), "--replan-every", "5", "--namespace", f"demo{os.getpid()}", "--params-file", str(topics)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    summary = json.loads((out / "summary.json").read_text())
    record = json.loads((out / "routes" / "short_highway.json").read_text())
    # the fake planner keeps the lane at the current speed: the short route completes
    assert record["status"] == "Completed" and record["completion"] == 100.0, record["status"]
    assert record["invalid_plans"] == 0 and summary["plan_timeouts"] == 0
    ticks = record["ticks"]
    assert summary["plan_round_trip_ms"]["count"] == -(-ticks // 5)  # one plan every 5 ticks, lockstep
    assert summary["policy"] == f"ros:/demo{os.getpid()}/wam_diff_planner" and "driving score" in log
    assert f"/demo{os.getpid()}/camera/image_raw" in log  # the extra parameter file was applied
    assert summary["videos"] and os.path.getsize(summary["videos"][0]) > 1000


def test_planning_tick_publishes_the_route_target_with_the_image_stamp_when_given_and_none_without(monkeypatch):
    from geometry_msgs.msg import PointStamped
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import Image

    from wam_diff_core.types import EgoState
    from wam_diff_msgs.msg import Trajectory
    from wam_diff_ros.highway_bridge_node import HighwayBridgeNode, RosPlannerPolicy

    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    context = Context()
    rclpy.init(context=context, domain_id=random.Random(os.getpid() + 11).randrange(201, 231))
    ns = f"/bridge{os.getpid()}"
    bridge = HighwayBridgeNode(namespace=ns, context=context, parameter_overrides=[
        Parameter("camera_topic", value="camera/image_raw"), Parameter("odometry_topic", value="odom"),
        Parameter("plan_timeout_s", value=10.0)])
    probe = rclpy.create_node("probe", namespace=ns, context=context)
    events = []  # ("target" | "image", message) in arrival order
    answer = probe.create_publisher(Trajectory, "trajectory", 10)

    def on_image(msg):
        events.append(("image", msg))
        answer.publish(Trajectory(header=msg.header, valid=False, error="probe answer"))

    probe.create_subscription(PointStamped, "route_target", lambda m: events.append(("target", m)), 10)
    probe.create_subscription(Image, "camera/image_raw", on_image, 10)
    executor = MultiThreadedExecutor(num_threads=2, context=context)
    executor.add_node(bridge)
    executor.add_node(probe)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert bridge.wait_for_planner()
        deadline = time.monotonic() + 10
        while bridge._target_pub.get_subscription_count() < 1:
            assert time.monotonic() < deadline, "no route target subscriber"
            time.sleep(0.02)
        world = SimpleNamespace(t=12.5, snapshot=lambda: {"t": world.t}, width=16, height=8, scaling=2.0,
                                anchor=(0.25, 0.5))
        policy = RosPlannerPolicy(bridge)
        policy.bind(world)
        frame = np.zeros((8, 16, 3), np.uint8)
        plan = policy.plan([frame], EgoState(5.0), "turn left", target=(24.75, 3.5))
        assert plan.errors == {"planning": "probe answer"}  # the Trajectory with the tick's stamp came back
        deadline = time.monotonic() + 10
        while len(events) < 2:  # the two topics' callbacks on the probe may run in either order
            assert time.monotonic() < deadline, f"route target not received: {[k for k, _ in events]}"
            time.sleep(0.02)
        assert sorted(k for k, _ in events) == ["image", "target"]
        target, image = (next(m for k, m in events if k == kind) for kind in ("target", "image"))
        assert (target.header.stamp.sec, target.header.stamp.nanosec) == (12, 500_000_000)
        assert target.header.stamp == image.header.stamp and target.header.frame_id == "base_link"
        assert image.header.frame_id == "camera_front_optical_frame"
        assert (target.point.x, target.point.y) == (24.75, 3.5)

        world.t = 13.0
        plan = policy.plan([frame], EgoState(5.0), "turn left")  # no target: nothing on the topic
        assert plan.errors == {"planning": "probe answer"}
        time.sleep(0.3)  # a target would have been published before this tick's image, which already arrived
        assert sorted(k for k, _ in events) == ["image", "image", "target"]
        assert [m.header.stamp.sec for k, m in events if k == "image"] == [12, 13]
        _assert_late_subscribers_get_the_command_and_the_camera_transforms(probe, ns)
    finally:
        executor.shutdown(timeout_sec=2.0)
        bridge.destroy_node()
        probe.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(2.0)


def _assert_late_subscribers_get_the_command_and_the_camera_transforms(probe, ns):
    """Subscribed after the bridge published: the last command (once, before the two ticks) and /tf_static."""
    from std_msgs.msg import String

    from wam_diff_ros.topic_qos import COMMAND_QOS, STATIC_TF_QOS

    got = {"command": [], "tf": []}
    probe.create_subscription(String, f"{ns}/command", got["command"].append, COMMAND_QOS)
    try:
        from tf2_msgs.msg import TFMessage
    except ImportError:  # PyPI has no tf2_msgs wheel: only the transforms' content is checked (test_camera_tf.py)
        TFMessage = None
    if TFMessage is not None:
        probe.create_subscription(TFMessage, "/tf_static", got["tf"].append, STATIC_TF_QOS)
    deadline = time.monotonic() + 10
    while not got["command"] or (TFMessage is not None and not got["tf"]):
        assert time.monotonic() < deadline, f"late subscriber got {[(k, len(v)) for k, v in got.items()]}"
        time.sleep(0.02)
    assert [m.data for m in got["command"]] == ["turn left"]
    if TFMessage is not None:
        transforms = {t.child_frame_id: t for t in got["tf"][-1].transforms}
        link = transforms["camera_front_link"].transform
        assert transforms["camera_front_link"].header.frame_id == "base_link"
        # 16 x 8 px at 2 px/m with the ego at (0.25, 0.5): the image centre is 2 m ahead, on the centre line
        assert (link.translation.x, link.translation.y, link.translation.z) == (2.0, 0.0, 20.0)
        assert (link.rotation.x, link.rotation.y, link.rotation.z, link.rotation.w) == (-0.5, 0.5, 0.5, 0.5)
        optical = transforms["camera_front_optical_frame"].transform.rotation
        assert (optical.x, optical.y, optical.z, optical.w) == (-0.5, 0.5, -0.5, 0.5)


def test_the_top_down_camera_maps_its_image_onto_the_ground_where_the_world_draws_it():
    """base_link -> optical frame (translation + rotation of both transforms) applied to a pixel's point on the
    ground agrees with the world's own ego -> pixel mapping (HighwayWorld.ego_to_pixels)."""
    highway = pytest.importorskip("wam_diff_core.sim.highway", reason="embedded world dependencies not installed")
    from wam_diff_ros.camera_tf import OPTICAL_ROTATION
    from wam_diff_ros.highway_bridge_node import TOP_DOWN_HEIGHT_M, top_down_mount

    world = SimpleNamespace(width=256, height=128, scaling=3.0, anchor=(0.25, 0.5))
    world.camera = highway.HighwayWorld.camera.fget(world)  # the world's own camera from its size, scaling and anchor
    mount = top_down_mount("camera_front", world.width, world.height, world.scaling, world.anchor)
    assert mount.xyz == pytest.approx((64 / 3, 0.0, TOP_DOWN_HEIGHT_M))
    link = _rotation_matrix(mount.rotation)
    base_from_optical = link @ _rotation_matrix(OPTICAL_ROTATION)
    assert np.allclose(base_from_optical, np.diag([1.0, -1.0, -1.0]))  # right = forward, down = right, view = down
    ego = np.array([[12.0, 4.5], [-5.0, -7.25], [0.0, 0.0]])
    u, v = highway.HighwayWorld.ego_to_pixels(world, ego).T
    # the optical frame's origin is the image centre; pixels are 1 / scaling metres; the ground is TOP_DOWN_HEIGHT_M away
    in_optical = np.stack([(u - world.width / 2) / world.scaling, (v - world.height / 2) / world.scaling,
                           np.full(len(u), TOP_DOWN_HEIGHT_M)], axis=1)
    in_base = in_optical @ base_from_optical.T + np.array(mount.xyz)
    assert np.allclose(in_base, np.column_stack([ego, np.zeros(len(ego))]))


def _rotation_matrix(q):
    x, y, z, w = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
