"""The planner lifecycle node over real rclpy + Fast DDS (localhost discovery, a domain id per test).

The node runs in this process on its own context and MultiThreadedExecutor thread, with a fake
policy injected; a probe node on the same context publishes inputs and records outputs. Every
wait is on a condition with a timeout. The SIGINT test starts the node as a subprocess.
"""
from __future__ import annotations

import io
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from builtin_interfaces.msg import Time  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from geometry_msgs.msg import Point, PointStamped  # noqa: E402
from nav_msgs.msg import Odometry, Path  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from std_msgs.msg import Header, String  # noqa: E402

from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402
from wam_diff_msgs.msg import Detection2DArray, DrivingAnswer, Trajectory  # noqa: E402
from wam_diff_msgs.srv import AskQuestion  # noqa: E402
from wam_diff_ros.fake_policy import FakePolicy  # noqa: E402
from wam_diff_ros.image_conversion import rgb_to_raw  # noqa: E402
from wam_diff_ros.planner_node import PlannerNode  # noqa: E402
from wam_diff_ros.topic_qos import COMMAND_QOS  # noqa: E402

# Distinct domain ids per test, offset per process so concurrent runs on one machine rarely meet;
# every test also lives in its own namespace.
_DOMAINS = itertools.count(random.Random(os.getpid()).randrange(0, 150))
_NAMESPACES = itertools.count()
TIMEOUT_S = 10.0


def _stamp(sec: float) -> Time:
    ns = int(round(sec * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def image_msg(sec: float, value: int = 100, encoding="rgb8", h=48, w=64, frame_id="camera_front") -> Image:
    rgb = np.full((h, w, 3), value, np.uint8)
    data, step = rgb_to_raw(rgb, encoding)
    return Image(header=Header(stamp=_stamp(sec), frame_id=frame_id), height=h, width=w, encoding=encoding,
                 is_bigendian=0, step=step, data=data)


class Probe:
    """A node on the test's context that publishes inputs and records every output of the planner."""

    def __init__(self, context: Context, namespace: str):
        self.node = rclpy.create_node("probe", namespace=namespace, context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.received = defaultdict(list)
        for topic, msg_type in (("trajectory", Trajectory), ("path", Path), ("answer", DrivingAnswer),
                                ("detections", Detection2DArray), ("markers", MarkerArray),
                                ("/diagnostics", DiagnosticArray)):
            self.node.create_subscription(msg_type, topic, lambda m, t=topic: self.received[t].append(m), 50)

    def publisher(self, msg_type, topic, reliable=True, qos=None):
        qos = qos or QoSProfile(depth=1 if not reliable else 10,
                                reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT)
        return self.node.create_publisher(msg_type, topic, qos)

    def wait_for(self, cond, timeout=TIMEOUT_S, what="condition"):
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            self.executor.spin_once(timeout_sec=0.02)

    def wait_connected(self, pub, node: PlannerNode):
        """Wait until `pub` reaches the planner and the planner's outputs reach this probe."""
        self.wait_for(lambda: pub.get_subscription_count() >= 1, what=f"subscriber on {pub.topic_name}")
        self.wait_for(lambda: all(self.node.count_publishers(f"{self.node.get_namespace()}/{t}") >= 1
                                  for t in ("trajectory", "path")), what="planner outputs")
        self.wait_for(lambda: all(s.get_publisher_count() >= 1 for s in self.node.subscriptions
                                  if s.topic_name.endswith(("trajectory", "path"))), what="output matching")

    def trajectories(self, stamp_ns=None, stale_s=3.0):
        """The trajectories received: all, or those stamped `stamp_ns`, the plan of the frame just published with
        that stamp. Asking for a stamp fails at once with one assertion naming the expected and received stamps
        when a plan arrives under another stamp while it is awaited: a newer one (no test publishes a frame
        newer than the one it waits for), or an older one not followed by the awaited plan within `stale_s`
        (in a burst, the plan of an earlier frame still in flight may land first)."""
        msgs = self.received["trajectory"]
        matching = [m for m in msgs if stamp_ns is None or _ns(m.header.stamp) == stamp_ns]
        if stamp_ns is None or matching:
            return matching
        now = time.monotonic()
        awaited = getattr(self, "_awaited", None)  # [stamp, first index received while awaited, count, when]
        if awaited is None or awaited[0] != stamp_ns:
            awaited = self._awaited = [stamp_ns, len(msgs), len(msgs), now]
        if len(msgs) != awaited[2]:
            awaited[2:] = [len(msgs), now]
        others = [_ns(m.header.stamp) for m in msgs[awaited[1]:]]
        if any(ns > stamp_ns for ns in others) or (others and now - awaited[3] > stale_s):
            sec = lambda ns: f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d} s"  # noqa: E731
            raise AssertionError(f"expected a trajectory stamped {sec(stamp_ns)}; received {[sec(n) for n in others]} "
                                 f"while waiting (before: {[sec(_ns(m.header.stamp)) for m in msgs[:awaited[1]]]})")
        return []

    def diagnostics(self, node_name: str):
        return [s for m in self.received["/diagnostics"] for s in m.status if node_name in s.name]


class Ros:
    """One ROS context on a fresh domain id; starts planner nodes and a probe inside a namespace."""

    def __init__(self, executor=None):
        """`executor(context)` builds the planner nodes' executor (default: the MultiThreadedExecutor of 3 threads
        that `wam-diff-planner` runs). `planner(policy, factory=f)`: the policy factory calls f(settings) instead
        of returning `policy`."""
        self.domain_id = next(_DOMAINS) % 150 + 1
        self.namespace = f"/t{os.getpid()}_{next(_NAMESPACES)}"
        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain_id)
        self.executor = (executor or (lambda ctx: MultiThreadedExecutor(num_threads=3, context=ctx)))(self.context)
        self._thread = None
        self.nodes = []
        self.probe = Probe(self.context, self.namespace)

    def planner(self, policy, autostart=True, factory=None, **params) -> PlannerNode:
        params.setdefault("camera_topics", ["camera/image_raw"])
        params.setdefault("warmup", False)
        params.setdefault("diagnostics_period_s", 0.2)
        params.setdefault("image_reliability", "reliable")
        params.setdefault("odometry_topic", "odom")
        overrides = [Parameter(k, value=v) for k, v in params.items()]
        factory_calls = []

        def record(settings):
            factory_calls.append(settings)
            return factory(settings) if factory is not None else policy

        node = PlannerNode(namespace=self.namespace, context=self.context, parameter_overrides=overrides,
                           policy_factory=record)
        node.factory_calls = factory_calls
        self.nodes.append(node)
        if autostart:
            assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
            assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
            assert node.policy is policy
        self.executor.add_node(node)
        if self._thread is None:
            self._thread = threading.Thread(target=self.executor.spin, daemon=True)
            self._thread.start()
        return node

    def close(self):
        for node in self.nodes:
            node.release()
        self.executor.shutdown(timeout_sec=5.0)
        if self._thread is not None:  # spin() has returned before its context goes (else its wait set fails)
            self._thread.join(5.0)
        for node in self.nodes:
            node.destroy_node()
        self.probe.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def ros(monkeypatch):
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    harness = Ros()
    yield harness
    harness.close()


# ---------------------------------------------------------------------------------------------

def test_image_in_gives_trajectory_path_and_diagnostics_out_with_the_input_stamp(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    odom = probe.publisher(Odometry, "odom")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: odom.get_subscription_count() >= 1, what="odometry subscriber")
    o = Odometry()
    o.twist.twist.linear.x = 4.0
    odom.publish(o)
    probe.wait_for(lambda: node._ego_motion.seen, what="odometry received")

    cam.publish(image_msg(1234.5678, value=77))
    stamp_ns = _ns(_stamp(1234.5678))
    probe.wait_for(lambda: probe.trajectories(stamp_ns) and probe.received["path"], what="trajectory + path")
    traj = probe.trajectories(stamp_ns)[0]
    assert traj.valid and traj.header.frame_id == "base_link" and len(traj.points) == 8
    assert traj.points[-1].pose.position.x == pytest.approx(4.0 * 4.0)  # fake: speed x 4 s
    assert traj.points[0].time_from_start.nanosec == 500_000_000 and traj.points[-1].time_from_start.sec == 4
    assert (traj.block_size, traj.denoising_steps) == (0, 0)  # the fake has no decoding: the parameters' "own"
    path = probe.received["path"][0]
    assert _ns(path.header.stamp) == stamp_ns and len(path.poses) == 8
    assert policy.plan_calls[0]["shapes"] == [(48, 64, 3)] and policy.plan_calls[0]["mean"] == 77.0
    assert policy.plan_calls[0]["ego"].vx == 4.0 and policy.plan_calls[0]["command"] == "follow lane"

    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(s.level == DiagnosticStatus.OK for s in probe.diagnostics(name)), what="OK diagnostic")
    status = [s for s in probe.diagnostics(name) if s.level == DiagnosticStatus.OK][-1]
    values = {kv.key: kv.value for kv in status.values}
    assert values["plans_published"] == "1" and values["frames_received"] == "1"
    assert float(values["latency_p50_ms"]) > 0 and float(values["latency_p95_ms"]) >= float(values["latency_p50_ms"])
    assert values["frames_dropped"] == "0" and values["last_error"] == ""


def test_frames_of_another_size_than_the_model_was_trained_on_are_planned_with_a_warn_diagnostic(ros):
    policy = FakePolicy()
    policy.trained_frame_size = (96, 48)  # as DrivingPolicy reports its checkpoint's wam_diff.json frame_size
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(10.0, value=5))  # 64x48
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(10.0))), what="trajectory")
    assert probe.trajectories(_ns(_stamp(10.0)))[0].valid  # still planned
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(s.level == DiagnosticStatus.WARN and "trained on 96x48" in s.message
                               for s in probe.diagnostics(name)), what="off-size WARN diagnostic")
    status = [s for s in probe.diagnostics(name) if "trained on 96x48" in s.message][-1]
    values = {kv.key: kv.value for kv in status.values}
    assert "are 64x48" in status.message
    assert values["frames_off_size"] == "1" and values["trained_frame_size"] == "96x48" and values["frame_size"] == "64x48"


def test_detection_task_publishes_boxes_with_the_image_header_and_markers_follow_the_plan(ros):
    policy = FakePolicy()
    node = ros.planner(policy, tasks=["planning", "detection"])
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: all(s.get_publisher_count() >= 1 for s in probe.node.subscriptions
                               if s.topic_name.endswith(("detections", "markers"))), what="detections/markers")
    cam.publish(image_msg(3.5, h=40, w=80, frame_id="camera_front"))
    probe.wait_for(lambda: probe.received["detections"] and probe.received["markers"], what="detections + markers")
    dets = probe.received["detections"][0]
    assert _ns(dets.header.stamp) == _ns(_stamp(3.5)) and dets.header.frame_id == "camera_front"
    results = [[(r.hypothesis.class_id, r.hypothesis.score) for r in d.results] for d in dets.detections]
    assert results == [[("car", 1.0)]]
    box = dets.detections[0].bbox  # fake box (0.25, 0.5)-(0.5, 0.75) of an 80 x 40 image
    assert (box.center.position.x, box.center.position.y, box.center.theta, box.size_x, box.size_y) == \
        (30.0, 25.0, 0.0, 20.0, 10.0)
    markers = probe.received["markers"][0].markers
    assert [m.type for m in markers] == [Marker.LINE_STRIP, Marker.SPHERE_LIST]
    assert all(_ns(m.header.stamp) == _ns(_stamp(3.5)) and m.header.frame_id == "base_link" for m in markers)
    assert len(markers[0].points) == 9 and markers[0].points[-1].x == pytest.approx(4.0)


def test_deactivate_during_a_plan_publishes_nothing_more_and_frees_the_model_when_it_returns(ros):
    policy = FakePolicy(delay_s=1.5)
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(8.0))
    probe.wait_for(lambda: len(policy.plan_calls) == 1, what="plan started")
    start = time.monotonic()
    assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert time.monotonic() - start < 1.4  # the transition does not wait for the model
    assert node.policy is None
    probe.wait_for(lambda: policy.closed, what="model freed after the plan returned")
    probe.executor.spin_once(timeout_sec=0.3)
    assert probe.trajectories() == []


def test_navigation_command_topic_sets_the_command_and_an_unknown_one_is_a_diagnostic_error(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    cmd = probe.publisher(String, "command", qos=COMMAND_QOS)
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: cmd.get_subscription_count() >= 1, what="command subscriber")
    cmd.publish(String(data="Turn Left"))
    probe.wait_for(lambda: node._command == "turn left", what="command applied")
    cmd.publish(String(data="fly"))
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: _diag_error_containing(probe, name, "'fly'"), what="ERROR naming the command")
    cam.publish(image_msg(6.0))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(6.0))), what="plan")
    assert policy.plan_calls[-1]["command"] == "turn left"
    assert probe.trajectories(_ns(_stamp(6.0)))[0].command == "turn left"


def test_a_command_published_transient_local_before_the_node_activated_reaches_it_on_activation(ros):
    node = ros.planner(FakePolicy(), autostart=False)
    probe = ros.probe
    cmd = probe.publisher(String, "command", qos=COMMAND_QOS)
    cmd.publish(String(data="turn right"))  # nobody subscribes yet: the publisher keeps it
    probe.executor.spin_once(timeout_sec=0.1)
    assert cmd.get_subscription_count() == 0 and node._command == "follow lane"
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    probe.wait_for(lambda: node._command == "turn right", what="the command published before activation")
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(4.0))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(4.0))), what="plan")
    assert probe.trajectories(_ns(_stamp(4.0)))[0].command == "turn right"
    assert node.stats.counts["commands_rejected"] == 0


def target_msg(sec: float, x: float, y: float, frame_id: str = "base_link") -> PointStamped:
    return PointStamped(header=Header(stamp=_stamp(sec), frame_id=frame_id), point=Point(x=x, y=y, z=9.0))


def _publish_target(probe, node, pub, msg):
    """Publish a route target and wait until the node holds it (the plan then reads it deterministically)."""
    pub.publish(msg)
    probe.wait_for(lambda: node._route_target is not None and node._route_target[0] == _ns(msg.header.stamp),
                   what="route target received")


def _plan_frame(probe, cam, sec):
    cam.publish(image_msg(sec))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(sec))), what=f"plan of the frame at {sec} s")


def test_route_target_reaches_the_policy_for_frames_within_max_age_of_its_stamp_and_none_beyond(ros):
    policy = FakePolicy()
    node = ros.planner(policy, route_target_max_age_s=0.5)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    tgt = probe.publisher(PointStamped, "route_target")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: tgt.get_subscription_count() >= 1, what="route target subscriber")

    _plan_frame(probe, cam, 9.0)  # before any target: none
    _publish_target(probe, node, tgt, target_msg(10.0, 23.5, -4.25))
    _plan_frame(probe, cam, 10.0)  # the frame's own stamp
    _plan_frame(probe, cam, 10.4)  # 0.4 s after the target: still within 0.5 s
    _plan_frame(probe, cam, 10.6)  # 0.6 s after: too old, the plan gets no target
    _publish_target(probe, node, tgt, target_msg(12.0, 18.0, 7.5))
    _plan_frame(probe, cam, 11.3)  # 0.7 s before the newest target: not this frame's target either
    _plan_frame(probe, cam, 12.0)
    assert [c["target"] for c in policy.plan_calls] == [None, (23.5, -4.25), (23.5, -4.25), None, None, (18.0, 7.5)]
    assert node.stats.counts["plans_with_route_target"] == 3 and node.stats.counts["plans_published"] == 6
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(dict((kv.key, kv.value) for kv in s.values).get("plans_with_route_target") == "3"
                               for s in probe.diagnostics(name)), what="plans_with_route_target in diagnostics")
    values = {kv.key: kv.value for kv in probe.diagnostics(name)[-1].values}
    assert values["model_uses_route_target"] == "true" and values["route_targets_rejected"] == "0"


def test_route_target_in_another_frame_or_not_finite_is_a_diagnostic_error_and_planning_goes_on(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    tgt = probe.publisher(PointStamped, "route_target")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: tgt.get_subscription_count() >= 1, what="route target subscriber")
    name = node.get_fully_qualified_name()

    tgt.publish(target_msg(5.0, 20.0, 1.0, frame_id="map"))
    probe.wait_for(lambda: _diag_error_containing(probe, name, "frame_id 'map'"), what="ERROR naming the frame")
    tgt.publish(target_msg(5.0, float("nan"), 1.0))
    probe.wait_for(lambda: _diag_error_containing(probe, name, "nan"), what="ERROR naming the non-finite x")
    assert node.stats.counts["route_targets_rejected"] == 2 and node._route_target is None
    _plan_frame(probe, cam, 5.0)  # still planning, without the rejected targets
    _publish_target(probe, node, tgt, target_msg(6.0, 25.0, -2.0))
    _plan_frame(probe, cam, 6.0)
    assert [c["target"] for c in policy.plan_calls] == [None, (25.0, -2.0)]
    assert all(t.valid for t in probe.trajectories())


def test_two_cameras_20ms_apart_are_matched_and_200ms_apart_are_not(ros):
    policy = FakePolicy()
    node = ros.planner(policy, camera_topics=["front/image_raw", "left/image_raw"], sync_slop_s=0.05)
    probe = ros.probe
    front = probe.publisher(Image, "front/image_raw")
    left = probe.publisher(Image, "left/image_raw")
    probe.wait_connected(front, node)
    probe.wait_for(lambda: left.get_subscription_count() >= 1, what="second camera subscriber")

    front.publish(image_msg(10.000, value=10))
    left.publish(image_msg(10.020, value=20, frame_id="camera_left"))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(10.0))), what="matched pair")
    assert [c["mean"] for c in policy.plan_calls] == [10.0]
    assert policy.plan_calls[0]["shapes"] == [(48, 64, 3), (48, 64, 3)]

    front.publish(image_msg(20.000, value=30))
    left.publish(image_msg(20.200, value=40))   # 200 ms apart: must not be planned
    probe.wait_for(lambda: node.stats.counts["frames_received"] == 4, what="unmatched pair received")
    front.publish(image_msg(30.000, value=50))
    left.publish(image_msg(30.020, value=60))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(30.0))), what="second matched pair")
    assert not probe.trajectories(_ns(_stamp(20.0)))
    assert len(probe.trajectories()) == 2 and len(policy.plan_calls) == 2
    assert node.stats.counts["frames_unmatched"] == 2


def test_burst_of_50_images_at_100hz_plans_on_the_newest_and_reports_the_rest_dropped(ros):
    delay_s = 0.3
    policy = FakePolicy(delay_s=delay_s)
    node = ros.planner(policy, image_reliability="best_effort", rate_hz=0.0)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw", reliable=False)
    probe.wait_connected(cam, node)

    msgs = [image_msg(100.0 + 0.01 * i, value=i) for i in range(50)]
    start = time.monotonic()
    for i, msg in enumerate(msgs):
        cam.publish(msg)
        time.sleep(max(0.0, start + 0.01 * (i + 1) - time.monotonic()))  # pace the camera at 100 Hz
    burst_end = time.monotonic()
    last_ns = _ns(msgs[-1].header.stamp)
    probe.wait_for(lambda: probe.trajectories(last_ns), what="plan on the newest image")
    caught_up_s = time.monotonic() - burst_end
    probe.wait_for(lambda: node._worker.idle, what="worker idle")

    planned = len(probe.trajectories())
    counts = node.stats.counts
    delivered = counts["frames_received"] - counts["frames_rejected"] - counts["frames_unmatched"]
    # with a backlog the last plan would come ~50 x 0.3 s = 15 s after the burst
    assert caught_up_s < 20 * delay_s, f"last image planned {caught_up_s:.2f} s after the burst: a queue"
    assert planned < 25, f"{planned} plans for 50 images at {delay_s} s per plan: frames were queued"
    assert planned == len(policy.plan_calls) == counts["plans_published"]
    # best-effort depth-1 delivery may itself discard frames the executor had not taken yet (on a
    # loaded 2-core CI machine only 12 of the 50 reached the node), so the exact drop count is
    # asserted in the deterministic worker test (test_ros_camera_sync); here every frame the node
    # did receive is either planned or reported dropped, and some were dropped
    assert counts["frames_dropped"] == delivered - planned >= 1, (counts, planned)
    assert [c["mean"] for c in policy.plan_calls][-1] == 49.0
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(dict((kv.key, kv.value) for kv in s.values).get("frames_dropped")
                               == str(counts["frames_dropped"]) for s in probe.diagnostics(name)),
                   what="dropped frames in diagnostics")


def _diag_error_containing(probe, name, text):
    return any(s.level == DiagnosticStatus.ERROR and text in s.message for s in probe.diagnostics(name))


def test_malformed_images_give_a_diagnostic_error_and_the_next_good_frame_is_served(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    name = node.get_fully_qualified_name()

    unknown = image_msg(1.0)
    unknown.encoding = "yuv422"
    short_step = image_msg(2.0)
    short_step.step = 10
    bad_length = image_msg(3.0)
    bad_length.data = bytes(len(bad_length.data) - 5)
    empty = Image(header=Header(stamp=_stamp(4.0)), height=0, width=0, encoding="rgb8", step=0)
    cases = [(unknown, "'yuv422'"), (short_step, "step 10 too small"), (bad_length, "data length"),
             (empty, "empty image 0x0")]
    for i, (msg, fragment) in enumerate(cases):
        cam.publish(msg)
        probe.wait_for(lambda: _diag_error_containing(probe, name, fragment), what=f"ERROR naming {fragment}")
        good = image_msg(10.0 + i, value=i)
        cam.publish(good)
        probe.wait_for(lambda: probe.trajectories(_ns(good.header.stamp)), what=f"good frame after {fragment}")
    assert node.stats.counts["frames_rejected"] == 4
    assert len(policy.plan_calls) == 4 and not probe.trajectories(_ns(_stamp(1.0)))
    # after a good plan the node reports OK again
    probe.wait_for(lambda: probe.diagnostics(name)[-1].level == DiagnosticStatus.OK, what="OK after recovery")


def test_truncated_jpeg_gives_a_diagnostic_error_and_the_next_good_jpeg_is_served(ros):
    from PIL import Image as PILImage

    policy = FakePolicy()
    node = ros.planner(policy, camera_topics=["camera/image_raw/compressed"])
    probe = ros.probe
    cam = probe.publisher(CompressedImage, "camera/image_raw/compressed")
    probe.wait_connected(cam, node)
    name = node.get_fully_qualified_name()
    buf = io.BytesIO()
    PILImage.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(buf, format="JPEG")
    jpeg = buf.getvalue()

    cam.publish(CompressedImage(header=Header(stamp=_stamp(1.0)), format="jpeg", data=jpeg[: len(jpeg) // 2]))
    probe.wait_for(lambda: _diag_error_containing(probe, name, "cannot decode CompressedImage"), what="JPEG ERROR")
    cam.publish(CompressedImage(header=Header(stamp=_stamp(2.0)), format="jpeg", data=jpeg))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(2.0))), what="good JPEG planned")
    assert policy.plan_calls[0]["shapes"] == [(40, 60, 3)] and abs(policy.plan_calls[0]["mean"] - 90) < 3
    assert node.stats.counts["frames_rejected"] == 1


def test_ask_question_returns_an_answer_and_publishes_driving_answer(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    client = probe.node.create_client(AskQuestion, "ask")
    probe.wait_for(client.service_is_ready, what="AskQuestion service")

    future = client.call_async(AskQuestion.Request(question="Is the road clear?"))
    probe.wait_for(future.done, what="answer before any frame")
    assert not future.result().success and "no camera frame" in future.result().message

    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(55.5))
    probe.wait_for(lambda: probe.trajectories(), what="first plan")
    future = client.call_async(AskQuestion.Request(question="Is the road clear?"))
    probe.wait_for(future.done, what="answer")
    response = future.result()
    assert response.success, response.message
    assert response.answer == "fake answer to: Is the road clear? (1 image(s))"
    assert _ns(response.stamp) == _ns(_stamp(55.5)) and response.latency_s >= 0
    probe.wait_for(lambda: probe.received["answer"], what="DrivingAnswer")
    answer = probe.received["answer"][0]
    assert answer.answer == response.answer and _ns(answer.header.stamp) == _ns(_stamp(55.5))


@pytest.mark.parametrize("model", ["fake", "nano"])
def test_sigint_shuts_the_node_down_within_2_s_even_while_planning(ros, model):
    """The node runs as its own process (the console-script entry point); SIGINT arrives while the
    policy is planning a frame (nano: a plan takes hundreds of ms on this CPU)."""
    if model == "nano":
        pytest.importorskip("wam_diff_core.policy")
    ns = f"{ros.namespace}_sigint"
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_DOMAIN_ID=str(ros.domain_id),
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "wam_diff_ros.planner_node", "--ros-args", "-r", f"__ns:={ns}",
           "-p", f"model:={model}", "-p", "autostart:=true", "-p", "warmup:=false",
           "-p", "camera_topics:=[camera/image_raw]", "-p", "image_reliability:=reliable"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    probe = ros.probe
    got = []
    traj_sub = probe.node.create_subscription(Trajectory, f"{ns}/trajectory", got.append, 10)
    cam = probe.node.create_publisher(Image, f"{ns}/camera/image_raw", 10)
    try:
        probe.wait_for(lambda: cam.get_subscription_count() >= 1 and traj_sub.get_publisher_count() >= 1,
                       timeout=120, what="planner active")
        # a frame is sent every 0.5 s until a plan comes (one that arrives before activation, or before the
        # reliable writer is matched both ways, is not planned), each with a fresh stamp: the node rightly
        # ignores a frame stamped like one it has already used
        sent = []

        def first_plan():
            if not got and (not sent or time.monotonic() - sent[-1] > 0.5):
                cam.publish(image_msg(1.0 + 0.01 * len(sent), h=96, w=128))
                sent.append(time.monotonic())
            return bool(got)

        probe.wait_for(first_plan, timeout=120, what="first plan")
        cam.publish(image_msg(2.0, h=96, w=128))
        time.sleep(0.05)  # let the second plan start
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(2)
    log = "".join(lines)
    assert rc == 0, log
    assert elapsed < 2.0, f"shutdown took {elapsed:.2f} s"
    assert "Traceback" not in log, log


def test_block_size_and_steps_default_to_the_checkpoints_own(nano, tmp_path):
    """Parameters 0: the checkpoint's wam_diff.json decides B and K (an AR checkpoint decodes at B = 1)."""
    import dataclasses

    from wam_diff_core.model.checkpoint import save_model
    from wam_diff_ros.planner_node import PolicySettings, load_policy

    ar = dataclasses.replace(nano, settings=nano.settings.for_block_size(1))
    save_model(ar, tmp_path / "ar")
    base = PolicySettings(model=str(tmp_path / "ar"), device="cpu", attention_backend="sdpa", cuda_graphs=False,
                          block_size=0, denoising_steps=0, remasking_strategy="low_confidence_dynamic",
                          remasking_threshold=0.9, max_new_tokens=0, tasks=("planning",))
    cfg = load_policy(base).config
    assert (cfg.block_size, cfg.steps) == (1, 1)
    cfg = load_policy(dataclasses.replace(base, denoising_steps=4)).config
    assert (cfg.block_size, cfg.steps) == (1, 1)  # B = 1: one step per token whatever K says
    cfg = load_policy(dataclasses.replace(base, block_size=8, denoising_steps=2)).config
    assert (cfg.block_size, cfg.steps) == (8, 2)
    b16 = dataclasses.replace(nano, settings=nano.settings.for_block_size(16))
    save_model(b16, tmp_path / "b16")
    cfg = load_policy(dataclasses.replace(base, model=str(tmp_path / "b16"))).config
    assert (cfg.block_size, cfg.steps) == (16, b16.settings.decoding.steps)
    assert cfg.kinematic_envelope is True  # on unless the parameter turns it off
    assert load_policy(dataclasses.replace(base, kinematic_envelope=False)).config.kinematic_envelope is False
    assert cfg.schedule == "linear"  # the checkpoint's own unless the parameter names one
    assert load_policy(dataclasses.replace(base, commit_schedule="cosine")).config.schedule == "cosine"
    assert cfg.forward_only is False  # the checkpoint's own (b16 does not ask for it) unless the parameter says
    assert load_policy(dataclasses.replace(base, forward_only="on")).config.forward_only is True
    fw = dataclasses.replace(b16, settings=dataclasses.replace(
        b16.settings, decoding=dataclasses.replace(b16.settings.decoding, forward_only=True)))
    save_model(fw, tmp_path / "fw")
    assert load_policy(dataclasses.replace(base, model=str(tmp_path / "fw"))).config.forward_only is True
    assert load_policy(dataclasses.replace(base, model=str(tmp_path / "fw"), forward_only="off")).config.forward_only is False
    assert cfg.text_layers == "model"  # the model's own layers unless the parameter names the static path's
    fast = load_policy(dataclasses.replace(base, model=str(tmp_path / "b16"), text_layers="fast")).config
    assert fast.text_layers == "fast"
    k8 = dataclasses.replace(b16, settings=dataclasses.replace(
        b16.settings, decoding=dataclasses.replace(b16.settings.decoding, steps=8, threshold=0.7)))
    save_model(k8, tmp_path / "k8")
    cfg = load_policy(PolicySettings(model=str(tmp_path / "k8"), denoising_steps=0)).config  # the parameters' defaults
    assert (cfg.block_size, cfg.steps, cfg.threshold, cfg.strategy) == (16, 8, 0.7, k8.settings.decoding.strategy)
    assert load_policy(PolicySettings(model=str(tmp_path / "k8"), remasking_threshold=0.5)).config.threshold == 0.5


def test_nano_model_end_to_end_image_in_trajectory_and_answer_out(ros):
    """The real policy (nano preset, untrained: its text is garbage, so the plan is invalid with a reason)."""
    pytest.importorskip("wam_diff_core.policy")
    from wam_diff_ros.planner_node import load_policy

    node = PlannerNode(namespace=ros.namespace, context=ros.context, parameter_overrides=[
        Parameter("model", value="nano"), Parameter("block_size", value=8), Parameter("denoising_steps", value=2),
        Parameter("max_new_tokens", value=16), Parameter("camera_topics", value=["camera/image_raw"]),
        Parameter("image_reliability", value="reliable"), Parameter("warmup", value=False)],
        policy_factory=load_policy)
    ros.nodes.append(node)
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert type(node.policy).__name__ == "DrivingPolicy"
    ros.executor.add_node(node)
    ros._thread = threading.Thread(target=ros.executor.spin, daemon=True)
    ros._thread.start()
    probe = ros.probe
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(77.25, value=120, h=96, w=128))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(77.25))), timeout=120, what="nano trajectory")
    traj = probe.trajectories(_ns(_stamp(77.25)))[0]
    assert (traj.block_size, traj.denoising_steps) == (8, 2) and traj.decode_time_s > 0
    if traj.valid:
        assert len(traj.points) == 8
    else:
        assert traj.error.startswith("planning:") and not traj.points
    client = probe.node.create_client(AskQuestion, "ask")
    probe.wait_for(client.service_is_ready, what="AskQuestion service")
    future = client.call_async(AskQuestion.Request(question="Is the road clear?"))
    probe.wait_for(future.done, timeout=120, what="nano answer")
    assert future.result().success, future.result().message
    assert _ns(future.result().stamp) == _ns(_stamp(77.25))
    node.trigger_deactivate()
    assert node.policy is None
