"""CARLA connection errors (no server, hung server), session cleanup, bridge odometry, with the real client."""
import copy
import math
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

carla = pytest.importorskip("carla")

from wam_diff_ros.carla.session import CarlaConnectionError, CarlaSession, SessionConfig, connect  # noqa: E402
from wam_diff_ros.carla_bridge_node import DEFAULT_CONFIG, BridgeConfig, PoseHistory, odometry_fields  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_bridge_exits_with_clear_error_and_leaves_no_process():
    port = free_port()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "wam_diff_ros.carla_bridge_node", "--host", "127.0.0.1",
                             "--port", str(port), "--timeout", "1.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in err and "1 s" in err and "Traceback" not in err
    assert time.monotonic() - start < 30
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left
        os.killpg(proc.pid, 0)


def test_hung_server_fails_within_the_client_timeout():
    # a socket that listens but never answers: the TCP handshake succeeds, the RPC never returns
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(CarlaConnectionError, match=rf"127\.0\.0\.1:{port} within the 1\.5 s client timeout"):
            connect("127.0.0.1", port, 1.5)
        elapsed = time.monotonic() - start
    assert 1.4 < elapsed < 15.0


def _bridge(port: int, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "wam_diff_ros.carla_bridge_node", "--host", "127.0.0.1",
                          "--port", str(port), *extra], capture_output=True, text=True, timeout=60)
    return res, time.monotonic() - start


def test_no_server_with_the_default_10_s_timeout_is_one_line_at_once():
    """A refused port does not wait for the client timeout (10 s, config/carla_bridge.yaml): 0.3 s measured."""
    port = free_port()
    res, elapsed = _bridge(port)
    assert res.returncode == 2 and elapsed < 5.0, (res.returncode, elapsed, res.stderr)
    assert res.stderr.splitlines() == [res.stderr.strip()] and res.stderr.startswith("wam-diff-carla-bridge: error: ")
    assert f"no CARLA server at 127.0.0.1:{port} (Connection refused; client timeout 10 s)" in res.stderr


def test_hung_server_through_the_bridge_is_one_line_after_the_timeout():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        res, elapsed = _bridge(port, "--timeout", "1")
    assert res.returncode == 2 and 1.0 < elapsed < 15.0, (res.returncode, elapsed, res.stderr)
    assert res.stderr.splitlines() == [res.stderr.strip()] and "Traceback" not in res.stderr
    assert f"no CARLA server answered at 127.0.0.1:{port} within the 1 s client timeout" in res.stderr


def test_unanswered_tcp_connect_fails_at_the_client_timeout():
    """A host that never answers the TCP handshake (here: a listener whose backlog is full, so the kernel drops
    the SYN) fails in the TCP probe after the timeout, before the CARLA client library is touched."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        waiting = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            waiting.append(s)
        time.sleep(0.2)
        start = time.monotonic()
        try:
            with pytest.raises(CarlaConnectionError, match=rf"127\.0\.0\.1:{port} \(timed out; client timeout 1 s\)"):
                connect("127.0.0.1", port, 1.0)
        finally:
            for s in waiting:
                s.close()
        elapsed = time.monotonic() - start
    assert 0.9 < elapsed < 5.0


# ------------------------------------------------------------------ session with a fake world

class FakeActor:
    def __init__(self, world, kind, tf, fail_destroy=False):
        self.world, self.kind, self.tf = world, kind, tf
        self.alive, self.listening, self.callback, self.fail_destroy = True, False, None, fail_destroy
        self.controls = []

    def listen(self, cb):
        self.listening, self.callback = True, cb

    def stop(self):
        self.listening = False

    def destroy(self):
        if self.fail_destroy:
            raise RuntimeError("server said no")
        self.alive = False

    def apply_control(self, c):
        self.controls.append(c)

    def get_transform(self):
        return carla.Transform(carla.Location(x=10.0, y=20.0, z=0.5), carla.Rotation(yaw=90.0))

    def get_velocity(self):
        return carla.Vector3D(0.0, 5.0, 0.0)

    def get_acceleration(self):
        return carla.Vector3D(0.0, 1.0, 0.0)

    def get_angular_velocity(self):
        return carla.Vector3D(0.0, 0.0, 0.0)


class FakeWorld:
    def __init__(self, fail_on=None):
        self.settings = SimpleNamespace(synchronous_mode=False, fixed_delta_seconds=None)
        self.applied, self.actors, self.frame, self.fail_on = [], [], 0, fail_on

    def get_settings(self):
        return copy.copy(self.settings)

    def apply_settings(self, s):
        self.settings = copy.copy(s)
        self.applied.append((s.synchronous_mode, s.fixed_delta_seconds))

    def get_blueprint_library(self):
        return SimpleNamespace(find=lambda name: SimpleNamespace(name=name, attrs={}, set_attribute=lambda k, v: None))

    def get_map(self):
        return SimpleNamespace(get_spawn_points=lambda: [carla.Transform()])

    def spawn_actor(self, bp, tf, attach_to=None):
        if bp.name == self.fail_on:
            raise RuntimeError(f"cannot spawn {bp.name}")
        a = FakeActor(self, bp.name, tf)
        self.actors.append(a)
        return a

    def tick(self):
        self.frame += 1
        for a in self.actors:
            if a.callback:
                a.callback(SimpleNamespace(frame=self.frame, height=2, width=3, raw_data=bytes(range(24))))
        return self.frame

    def get_snapshot(self):
        return SimpleNamespace(timestamp=SimpleNamespace(elapsed_seconds=self.frame * 0.05))


SENSORS = [{"type": "sensor.camera.rgb", "id": "cam", "x": 0.8, "y": 0.0, "z": 1.6, "roll": 0, "pitch": 0, "yaw": 0,
            "width": 3, "height": 2, "fov": 90}]


def test_session_runs_synchronous_fixed_steps_and_cleans_up_on_exit():
    world = FakeWorld()
    with CarlaSession(None, world, SessionConfig(sensors=SENSORS)) as s:
        assert (world.settings.synchronous_mode, world.settings.fixed_delta_seconds) == (True, 0.05)
        data = s.tick()
        assert data["cam"].shape == (2, 3, 4) and data["cam"].dtype == np.uint8
        assert data["ego"]["speed"] == pytest.approx(5.0, abs=1e-6)  # yaw 90 moving along +y
        s.apply_control(0.3, -0.1, 0.0)
    assert all(not a.alive for a in world.actors) and not any(a.listening for a in world.actors)
    assert world.settings.synchronous_mode is False and world.settings.fixed_delta_seconds is None
    assert isinstance(world.actors[0].controls[0], carla.VehicleControl)


def test_session_error_midway_destroys_spawned_actors_and_restores_async():
    world = FakeWorld(fail_on="sensor.camera.rgb")
    with pytest.raises(RuntimeError, match="cannot spawn"):
        with CarlaSession(None, world, SessionConfig(sensors=SENSORS)):
            pass
    assert len(world.actors) == 1 and not world.actors[0].alive  # the ego
    assert world.applied[-1] == (False, None)


def test_session_error_in_the_loop_still_cleans_up_even_if_a_destroy_fails():
    world = FakeWorld()
    with pytest.raises(ZeroDivisionError):
        with CarlaSession(None, world, SessionConfig(sensors=SENSORS)) as s:
            world.actors[1].fail_destroy = True  # the camera
            s.tick()
            1 / 0
    assert not world.actors[0].alive and world.applied[-1] == (False, None)


# ------------------------------------------------------------------ bridge helpers

def test_odometry_is_right_handed_pose_and_ego_frame_twist():
    ego = {"x": 10.0, "y": 20.0, "z": 0.5, "yaw_deg": 90.0, "velocity": (0.0, 5.0, 0.0),
           "acceleration": (0.0, 0.0, 0.0), "angular_velocity_deg": (0.0, 0.0, 30.0), "speed": 5.0}
    o = odometry_fields(ego)
    assert (o["x"], o["y"]) == (10.0, -20.0) and o["heading"] == pytest.approx(-math.pi / 2)
    assert o["vx"] == pytest.approx(5.0) and o["vy"] == pytest.approx(0.0, abs=1e-12)
    assert o["yaw_rate"] == pytest.approx(-math.radians(30.0))  # CARLA +z turns right


def test_pose_history_returns_the_pose_nearest_the_trajectory_stamp():
    h = PoseHistory(keep_s=1.02)
    for k in range(40):
        h.add(k * 0.05, (k, 0.0), 0.1 * k)
    assert h.at(1.52)[0] == (30, 0.0)
    assert h.at(0.0)[0] == (19, 0.0)  # older poses were dropped: the oldest kept one


def test_bridge_config_loads_and_rejects_unknown_topics(tmp_path):
    cfg = BridgeConfig.load(DEFAULT_CONFIG, port=2345)
    assert cfg.port == 2345 and cfg.fixed_delta_s == 0.05 and cfg.topics == {"rgb_front": "/camera/image_raw"}
    bad = tmp_path / "b.yaml"
    bad.write_text(DEFAULT_CONFIG.read_text().replace("rgb_front: /camera/image_raw", "rgb_back: /x"))
    with pytest.raises(ValueError, match="rgb_back"):
        BridgeConfig.load(bad)


def test_clock_message_type_is_available_for_the_bridge():
    clock = pytest.importorskip("rosgraph_msgs.msg")
    assert hasattr(clock, "Clock")


# ------------------------------------------------------------------ bridge over real rclpy with a fake world

def test_bridge_publishes_image_odometry_clock_and_drives_from_trajectories(monkeypatch):
    import random
    import threading

    rclpy = pytest.importorskip("rclpy")
    pytest.importorskip("wam_diff_msgs")
    from nav_msgs.msg import Odometry
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image
    from wam_diff_msgs.msg import Trajectory, TrajectoryPoint

    from wam_diff_ros.carla_bridge_node import run_bridge

    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    ctx = Context()
    rclpy.init(context=ctx, domain_id=random.Random(os.getpid() + 7).randrange(150, 230))
    world = FakeWorld()
    cfg = BridgeConfig.load(DEFAULT_CONFIG, realtime_factor=0.5, max_ticks=2000)
    cfg.sensors = [dict(SENSORS[0], id="rgb_front")]
    stop = threading.Event()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", run_bridge(
        cfg, connect_fn=lambda h, p, t: (None, world), context=ctx, stop=stop)), daemon=True)
    probe = rclpy.create_node("probe", context=ctx)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(probe)
    got = {"odom": [], "clock": [], "image": []}
    probe.create_subscription(Odometry, "/odom", got["odom"].append, 10)
    probe.create_subscription(Clock, "/clock", got["clock"].append, 10)
    probe.create_subscription(Image, "/camera/image_raw", got["image"].append, 1)
    pub = probe.create_publisher(Trajectory, "trajectory", 10)

    def wait(cond, what, timeout=20.0):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            ex.spin_once(timeout_sec=0.02)

    def trajectory(speed, valid=True):
        clock = got["clock"][-1].clock
        msg = Trajectory(valid=valid, command="follow lane")
        msg.header.stamp = clock
        if valid:
            for k in range(1, 9):
                p = TrajectoryPoint()
                p.pose.position.x = speed * 0.5 * k
                msg.points.append(p)
        return msg

    thread.start()
    try:
        wait(lambda: got["odom"] and len(got["clock"]) > 2 and got["image"], "bridge outputs")
        img = got["image"][-1]
        assert (img.encoding, img.height, img.width) == ("rgb8", 2, 3)
        assert img.header.frame_id == "rgb_front_optical_frame"
        assert bytes(img.data[:3]) == bytes([2, 1, 0])  # first BGRA pixel 0,1,2,3 -> RGB 2,1,0
        odom = got["odom"][-1]
        assert (odom.pose.pose.position.x, odom.pose.pose.position.y) == (10.0, -20.0)
        assert odom.pose.pose.orientation.z == pytest.approx(math.sin(-math.pi / 4))
        assert odom.twist.twist.linear.x == pytest.approx(5.0) and odom.child_frame_id == "base_link"
        t = [c.clock.sec + c.clock.nanosec * 1e-9 for c in got["clock"]]
        assert np.allclose(np.diff(t[-3:]), 0.05)
        ego = world.actors[0]
        assert ego.controls[-1].brake > 0.0 and ego.controls[-1].throttle == 0.0  # no plan yet: brake
        _late_subscribers_get_the_command_and_the_camera_transforms(probe, wait)
        wait(lambda: pub.get_subscription_count() >= 1, "bridge subscription")
        pub.publish(trajectory(10.0))  # faster than the ego's 5 m/s: throttle
        wait(lambda: ego.controls[-1].throttle > 0.0, "throttle from a valid trajectory")
        assert ego.controls[-1].brake == 0.0
        pub.publish(trajectory(0.0, valid=False))
        wait(lambda: ego.controls[-1].brake > 0.0 and ego.controls[-1].throttle == 0.0, "brake on an invalid trajectory")
    finally:
        stop.set()
        thread.join(10.0)
        ex.shutdown(timeout_sec=1.0)
        probe.destroy_node()
        rclpy.try_shutdown(context=ctx)
    assert result.get("rc") == 0
    assert all(not a.alive for a in world.actors) and world.applied[-1] == (False, None)


def _late_subscribers_get_the_command_and_the_camera_transforms(probe, wait):
    """Subscribed after the bridge started: the command (transient local) and, where tf2_msgs is installed, the
    mounting of SENSORS[0] (x 0.8, y 0, z 1.6, no rotation) on /tf_static."""
    from std_msgs.msg import String

    from wam_diff_ros.topic_qos import COMMAND_QOS, STATIC_TF_QOS

    commands, tf = [], []
    probe.create_subscription(String, "command", commands.append, COMMAND_QOS)
    try:
        from tf2_msgs.msg import TFMessage
    except ImportError:  # PyPI has no tf2_msgs wheel: the transforms' content is checked in test_camera_tf.py
        TFMessage = None
    if TFMessage is not None:
        probe.create_subscription(TFMessage, "/tf_static", tf.append, STATIC_TF_QOS)
    wait(lambda: commands and (TFMessage is None or tf), "the command and /tf_static for a late subscriber")
    assert commands[0].data == "follow lane"
    if TFMessage is not None:
        ts = {t.child_frame_id: t for t in tf[-1].transforms}
        link = ts["rgb_front_link"].transform
        assert ts["rgb_front_link"].header.frame_id == "base_link"
        assert (link.translation.x, link.translation.y, link.translation.z) == (0.8, 0.0, 1.6)
        assert (link.rotation.x, link.rotation.y, link.rotation.z, link.rotation.w) == (0.0, 0.0, 0.0, 1.0)
        optical = ts["rgb_front_optical_frame"].transform.rotation
        assert (optical.x, optical.y, optical.z, optical.w) == (-0.5, 0.5, -0.5, 0.5)
