"""The planner's lifecycle driven through its services (/<node>/change_state, /<node>/get_state), as a lifecycle
manager drives it, over real rclpy + Fast DDS (the harness of tests/test_ros_planner_node.py: the planner on a
MultiThreadedExecutor of 3 threads, as `wam-diff-planner` runs it; a probe node calls the services).

Covered: the walk through every transition; get_state, parameters and /diagnostics answering while a slow model
load runs in activate; exceptions in a transition logged in one line and turned into FAILURE or ERROR; configure
after an error leaving exactly one publisher per output and one ask service; /diagnostics at a fixed rate in
every state with the device and model as hardware_id; one DELETEALL marker on deactivate; the bring-up and
shutdown nav2's lifecycle manager performs with `bond_timeout: 0.0` (docs/ros.md).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402

from test_ros_planner_node import TIMEOUT_S, _ns, _stamp, image_msg, ros  # noqa: E402,F401 - ros: the fixture
from wam_diff_ros.fake_policy import FakePolicy  # noqa: E402
from wam_diff_ros.planner_node import NODE_NAME, OUTPUTS  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ros.md"
UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = (State.PRIMARY_STATE_UNCONFIGURED, State.PRIMARY_STATE_INACTIVE,
                                              State.PRIMARY_STATE_ACTIVE, State.PRIMARY_STATE_FINALIZED)


class Lifecycle:
    """A client of one node's lifecycle services (what `ros2 lifecycle set/get` and lifecycle managers call)."""

    def __init__(self, probe, node):
        self.probe = probe
        fqn = node.get_fully_qualified_name()
        self.change = probe.node.create_client(ChangeState, f"{fqn}/change_state")
        self.get = probe.node.create_client(GetState, f"{fqn}/get_state")
        probe.wait_for(lambda: self.change.service_is_ready() and self.get.service_is_ready(),
                       what="lifecycle services")

    def request(self, transition_id: int):
        return self.change.call_async(ChangeState.Request(transition=Transition(id=transition_id)))

    def transition(self, transition_id: int, timeout: float = TIMEOUT_S) -> bool:
        future = self.request(transition_id)
        self.probe.wait_for(future.done, timeout, what=f"change_state {transition_id}")
        return future.result().success

    def state(self, timeout: float = TIMEOUT_S) -> int:
        future = self.get.call_async(GetState.Request())
        self.probe.wait_for(future.done, timeout, what="get_state")
        return future.result().current_state.id


class RecordingLogger:
    """Stands in for node.get_logger(): keeps every error line and passes everything on."""

    def __init__(self, logger):
        self._logger = logger
        self.errors: list[str] = []

    def error(self, text, **kwargs):
        self.errors.append(text)
        return self._logger.error(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self._logger, name)


def record_log(node) -> RecordingLogger:
    logger = RecordingLogger(node.get_logger())
    node.get_logger = lambda: logger
    return logger


def interface_counts(probe, node) -> dict[str, int]:
    """Publishers per output topic and servers of the ask service in the graph, as another node sees them."""
    ns = node.get_namespace()
    counts = {topic: probe.node.count_publishers(f"{ns}/{topic}") for topic, _ in OUTPUTS}
    counts["ask"] = probe.node.count_services(f"{ns}/ask")
    return counts


def test_lifecycle_services_walk_every_transition_loading_the_model_on_activate_and_freeing_it_on_deactivate(ros):
    loaded = []
    node = ros.planner(None, autostart=False, factory=lambda settings: loaded.append(FakePolicy()) or loaded[-1])
    lc = Lifecycle(ros.probe, node)
    assert lc.state() == UNCONFIGURED
    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.state() == INACTIVE
    assert loaded == [] and node.policy is None
    assert lc.transition(Transition.TRANSITION_ACTIVATE) and lc.state() == ACTIVE
    assert len(loaded) == 1 and node.policy is loaded[0] and not loaded[0].closed
    assert lc.transition(Transition.TRANSITION_DEACTIVATE) and lc.state() == INACTIVE
    assert node.policy is None and loaded[0].closed
    assert lc.transition(Transition.TRANSITION_CLEANUP) and lc.state() == UNCONFIGURED
    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.transition(Transition.TRANSITION_ACTIVATE)
    assert len(loaded) == 2 and node.policy is loaded[1] and lc.state() == ACTIVE
    assert lc.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN) and lc.state() == FINALIZED
    assert node.policy is None and loaded[1].closed
    assert interface_counts(ros.probe, node) == dict.fromkeys(interface_counts(ros.probe, node), 0)


def test_get_state_parameters_and_diagnostics_answer_while_activate_loads_a_model_and_a_second_change_is_refused(ros):
    release = threading.Event()
    load_started = threading.Event()

    def slow_load(settings):  # a model load that lasts until the test has asked everything it wants
        load_started.set()
        assert release.wait(30.0)
        return FakePolicy()

    node = ros.planner(None, autostart=False, factory=slow_load, model="fake")
    probe = ros.probe
    lc = Lifecycle(probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    activation = lc.request(Transition.TRANSITION_ACTIVATE)
    probe.wait_for(load_started.is_set, what="the model load to start")
    started = time.monotonic()
    answers_s = []
    for _ in range(5):
        t0 = time.monotonic()
        assert lc.state(timeout=2.0) == State.TRANSITION_STATE_ACTIVATING
        answers_s.append(time.monotonic() - t0)
        time.sleep(0.2)
    refused = lc.request(Transition.TRANSITION_DEACTIVATE)
    probe.wait_for(refused.done, 2.0, what="the answer to a change_state during activation")
    setter = probe.node.create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")
    probe.wait_for(setter.service_is_ready, what="set_parameters")
    rate = ParameterMsg(name="rate_hz", value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=4.0))
    set_future = setter.call_async(SetParameters.Request(parameters=[rate]))
    probe.wait_for(set_future.done, 2.0, what="set_parameters during activation")
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(s.message.startswith("activating") for s in probe.diagnostics(name)), 2.0,
                   what="an 'activating' diagnostic")
    loading_s = time.monotonic() - started
    assert not activation.done() and loading_s > 1.0  # all of the above happened during the load
    release.set()
    probe.wait_for(activation.done, what="activate to finish")
    assert activation.result().success and lc.state() == ACTIVE
    assert max(answers_s) < 0.5, answers_s
    assert refused.result().success is False
    assert set_future.result().results[0].successful and node._worker.min_period_s == 0.25


def test_an_exception_in_activate_is_one_log_line_and_error_then_configure_leaves_one_of_each_interface(ros):
    class BrokenPolicy(FakePolicy):
        @property
        def trained_frame_size(self):
            raise RuntimeError("boom")

    policies = [BrokenPolicy(), FakePolicy()]
    node = ros.planner(None, autostart=False, factory=lambda settings: policies.pop(0))
    probe = ros.probe
    log = record_log(node)
    lc = Lifecycle(probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    probe.wait_for(lambda: interface_counts(probe, node) == dict.fromkeys(interface_counts(probe, node), 1),
                   what="one publisher per output and one ask service")
    assert lc.transition(Transition.TRANSITION_ACTIVATE) is False
    assert lc.state() == UNCONFIGURED  # ERROR -> on_error freed everything
    assert log.errors == ["activate failed: RuntimeError: boom"]
    assert node.policy is None and node._pubs == {} and node._service is None
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: any(s.level == DiagnosticStatus.ERROR and s.message == "activate failed: RuntimeError: boom"
                               for s in probe.diagnostics(name)), what="the failure as an ERROR diagnostic")

    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.transition(Transition.TRANSITION_ACTIVATE)
    assert lc.state() == ACTIVE
    time.sleep(0.3)  # a second publisher or service would show up in the graph by now
    probe.executor.spin_once(timeout_sec=0.1)
    assert interface_counts(probe, node) == {"trajectory": 1, "path": 1, "detections": 1, "markers": 1, "answer": 1,
                                             "ask": 1}
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    cam.publish(image_msg(3.0))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(3.0))), what="a plan after the recovery")
    assert len(probe.trajectories()) == 1 and len(log.errors) == 1


def test_a_model_that_fails_to_load_fails_activate_and_the_node_stays_inactive_until_a_later_activate(ros):
    attempts = []

    def factory(settings):
        attempts.append(settings.model)
        if len(attempts) == 1:
            raise FileNotFoundError("no checkpoint at /nowhere")
        return FakePolicy()

    node = ros.planner(None, autostart=False, factory=factory, model="/nowhere")
    log = record_log(node)
    lc = Lifecycle(ros.probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE)
    assert lc.transition(Transition.TRANSITION_ACTIVATE) is False and lc.state() == INACTIVE  # FAILURE
    assert log.errors == ["activate failed: loading model '/nowhere' failed: FileNotFoundError: no checkpoint at "
                          "/nowhere"]
    assert lc.transition(Transition.TRANSITION_ACTIVATE) and lc.state() == ACTIVE
    assert attempts == ["/nowhere", "/nowhere"] and len(log.errors) == 1
    assert interface_counts(ros.probe, node)["trajectory"] == 1


def _rate(probe, name, seconds: float) -> tuple[int, set]:
    """/diagnostics statuses of `name` received during the next `seconds`, and their messages."""
    settle = time.monotonic() + 0.1  # a status published before the transition may still be on its way
    while time.monotonic() < settle:
        probe.executor.spin_once(timeout_sec=0.02)
    before = len(probe.diagnostics(name))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        probe.executor.spin_once(timeout_sec=0.02)
    statuses = probe.diagnostics(name)[before:]
    return len(statuses), {(s.message, s.hardware_id) for s in statuses}


def test_diagnostics_come_every_period_in_unconfigured_inactive_and_active_states_naming_device_and_model(ros):
    node = ros.planner(None, autostart=False, factory=lambda settings: FakePolicy(), model="fake",
                       diagnostics_period_s=0.25)
    probe = ros.probe
    lc = Lifecycle(probe, node)
    name = node.get_fully_qualified_name()
    probe.wait_for(lambda: probe.diagnostics(name), what="a first diagnostic")
    seen = {}
    for state, transition_id in (("unconfigured", None), ("inactive", Transition.TRANSITION_CONFIGURE),
                                 ("active", Transition.TRANSITION_ACTIVATE)):
        if transition_id is not None:
            assert lc.transition(transition_id)
        seen[state] = _rate(probe, name, 1.0)
    messages = {"unconfigured": "unconfigured: configure and activate to plan", "inactive": "inactive: no model loaded",
                "active": "waiting for camera frames"}
    for state, (count, statuses) in seen.items():
        assert 3 <= count <= 5, (state, count)  # 1 s at 0.25 s
        assert statuses == {(messages[state], "cpu/fake")}, (state, statuses)


def test_deactivate_publishes_one_deleteall_marker_and_the_markers_publisher_is_then_silent(ros):
    node = ros.planner(FakePolicy(), autostart=False, base_frame_id="ego")
    probe = ros.probe
    lc = Lifecycle(probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE) and lc.transition(Transition.TRANSITION_ACTIVATE)
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    probe.wait_for(lambda: any(s.get_publisher_count() >= 1 for s in probe.node.subscriptions
                               if s.topic_name.endswith("markers")), what="markers matched")
    cam.publish(image_msg(2.0))
    probe.wait_for(lambda: probe.received["markers"], what="the plan's markers")
    assert lc.transition(Transition.TRANSITION_DEACTIVATE)
    probe.wait_for(lambda: len(probe.received["markers"]) == 2, what="the DELETEALL marker")
    clear = probe.received["markers"][1].markers
    assert [(m.action, m.header.frame_id) for m in clear] == [(Marker.DELETEALL, "ego")]
    node._pubs["markers"].publish(MarkerArray(markers=[Marker(action=Marker.ADD)]))  # a lifecycle publisher: dropped
    probe.executor.spin_once(timeout_sec=0.3)
    assert len(probe.received["markers"]) == 2


def _nav2_params_in_docs() -> dict:
    """The nav2_lifecycle_manager parameter snippet of docs/ros.md."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    found = [yaml.safe_load(b) for b in blocks if "lifecycle_manager" in b]
    assert len(found) == 1, "docs/ros.md has no single nav2 lifecycle manager snippet"
    (params,) = (section["ros__parameters"] for section in found[0].values())
    return params


def test_nav2_lifecycle_manager_with_bond_timeout_0_brings_the_planner_up_and_down_and_the_docs_say_so(ros):
    """nav2_lifecycle_manager (bond_timeout <= 0: no bond) calls change_state and checks get_state for each node:
    configure -> inactive, activate -> active; on shutdown deactivate, cleanup, shutdown. The planner has no bond
    (the `bond` messages are not on PyPI), so the documented recipe sets bond_timeout to 0.0."""
    params = _nav2_params_in_docs()
    assert params["bond_timeout"] == 0.0 and params["autostart"] is True and NODE_NAME in params["node_names"]
    node = ros.planner(FakePolicy(), autostart=False)
    lc = Lifecycle(ros.probe, node)
    for transition_id, expected in ((Transition.TRANSITION_CONFIGURE, INACTIVE),
                                    (Transition.TRANSITION_ACTIVATE, ACTIVE),
                                    (Transition.TRANSITION_DEACTIVATE, INACTIVE),
                                    (Transition.TRANSITION_CLEANUP, UNCONFIGURED),
                                    (Transition.TRANSITION_UNCONFIGURED_SHUTDOWN, FINALIZED)):
        assert lc.transition(transition_id) and lc.state() == expected, transition_id
    topics = [t for t, _ in ros.probe.node.get_publisher_names_and_types_by_node(node.get_name(), node.get_namespace())]
    assert not [t for t in topics if t.endswith("/bond")]  # hence bond_timeout: 0.0
