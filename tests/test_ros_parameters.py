"""The planner's parameter contract over its parameter services (what `ros2 param set/get/describe` call), on
real rclpy + Fast DDS (the harness of tests/test_ros_planner_node.py).

Read-only parameters (model, device, decoding, topics, QoS) are refused at runtime naming themselves; runtime
ones (rate, tasks, input limits, frame id, periods) are checked by the on-set callback, refused with a reason
when bad and applied to the next frame when good; integers are taken where floats are declared (YAML
`rate_hz: 10`, `ros2 param set ... rate_hz 10`); a bad value at start is one error naming it; a bad choice
fails configure with one log line.
"""
from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from lifecycle_msgs.msg import State, Transition  # noqa: E402
from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from test_ros_lifecycle import Lifecycle, record_log  # noqa: E402
from test_ros_planner_node import _ns, _stamp, image_msg, ros  # noqa: E402,F401 - ros: the fixture
from wam_diff_ros.fake_policy import FakePolicy  # noqa: E402
from wam_diff_ros.planner_node import PlannerNode  # noqa: E402
from wam_diff_ros.planner_parameters import PARAMETERS, RUNTIME_PARAMETERS, ParameterError, read_config  # noqa: E402


def _value(value) -> ParameterValue:
    """A ParameterValue as `ros2 param set` builds it from the text: 10 is an integer, 10.0 a double."""
    if isinstance(value, bool):
        return ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value)
    if isinstance(value, int):
        return ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
    if isinstance(value, float):
        return ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
    if isinstance(value, list):
        return ParameterValue(type=ParameterType.PARAMETER_STRING_ARRAY, string_array_value=value)
    return ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)


class ParamClient:
    """set / get / describe through the node's parameter services."""

    def __init__(self, probe, node):
        self.probe = probe
        fqn = node.get_fully_qualified_name()
        self.clients = {srv: probe.node.create_client(srv, f"{fqn}/{name}") for srv, name in (
            (SetParameters, "set_parameters"), (GetParameters, "get_parameters"),
            (DescribeParameters, "describe_parameters"))}
        probe.wait_for(lambda: all(c.service_is_ready() for c in self.clients.values()), what="parameter services")

    def _call(self, srv, request):
        future = self.clients[srv].call_async(request)
        self.probe.wait_for(future.done, what=f"{srv.__name__}")
        return future.result()

    def set(self, name, value):
        """The SetParametersResult of setting one parameter."""
        request = SetParameters.Request(parameters=[ParameterMsg(name=name, value=_value(value))])
        return self._call(SetParameters, request).results[0]

    def get(self, name) -> ParameterValue:
        return self._call(GetParameters, GetParameters.Request(names=[name])).values[0]

    def describe(self, name):
        return self._call(DescribeParameters, DescribeParameters.Request(names=[name])).descriptors[0]


def test_rate_hz_minus_5_and_an_empty_base_frame_id_are_refused_with_reasons_and_the_old_values_stay(ros):
    node = ros.planner(FakePolicy())
    params = ParamClient(ros.probe, node)
    cases = [("rate_hz", -5.0, "out of range"), ("base_frame_id", "", "base_frame_id must be a frame name"),
             ("base_frame_id", "/map", "without a leading '/'"), ("tasks", ["planning", "qa"], "subset of"),
             ("tasks", [], "non-empty"), ("max_image_side", 0, "out of range"),
             ("route_target_max_age_s", "soon", "Wrong parameter type")]
    for name, value, reason in cases:
        result = params.set(name, value)
        assert not result.successful and reason in result.reason, (name, value, result.reason)
    assert params.get("rate_hz").double_value == 10.0 and params.get("base_frame_id").string_value == "base_link"
    assert node._cfg["base_frame_id"] == "base_link" and node._worker.min_period_s == pytest.approx(0.1)


def test_read_only_parameters_are_refused_while_active_naming_themselves(ros):
    node = ros.planner(FakePolicy())
    params = ParamClient(ros.probe, node)
    for name, value in (("model", "nano"), ("device", "cuda"), ("camera_topics", ["/other"]), ("block_size", 8),
                        ("image_reliability", "reliable"), ("command_topic", "cmd")):
        result = params.set(name, value)
        assert not result.successful and result.reason == f"Trying to set a read-only parameter: {name}.", name
    assert node.get_parameter("model").value == "nano-s-b32" and node.factory_calls[0].model == "nano-s-b32"


def test_runtime_parameters_set_while_active_apply_to_the_next_frame(ros):
    policy = FakePolicy()
    node = ros.planner(policy)
    probe = ros.probe
    params = ParamClient(probe, node)
    cam = probe.publisher(Image, "camera/image_raw")
    probe.wait_connected(cam, node)
    for name, value in (("base_frame_id", "ego"), ("tasks", ["planning", "detection"]), ("rate_hz", 4),
                        ("max_image_side", 32)):
        result = params.set(name, value)
        assert result.successful, (name, result.reason)
    assert node._worker.min_period_s == 0.25 and node.get_parameter("rate_hz").value == 4.0
    cam.publish(image_msg(1.0))  # 64 x 48: over max_image_side 32 now
    probe.wait_for(lambda: node.stats.counts["frames_rejected"] == 1, what="the wide frame rejected")
    assert params.set("max_image_side", 64).successful
    cam.publish(image_msg(2.0))
    probe.wait_for(lambda: probe.trajectories(_ns(_stamp(2.0))), what="plan in the new frame")
    assert probe.trajectories(_ns(_stamp(2.0)))[0].header.frame_id == "ego"
    assert policy.plan_calls[-1]["tasks"] == ("planning", "detection")
    probe.wait_for(lambda: probe.received["detections"], what="detections once the task is on")
    assert len(policy.plan_calls) == 1


def test_an_integer_given_for_a_float_parameter_is_taken_as_that_float_at_start_from_yaml_and_at_runtime(ros, tmp_path):
    node = ros.planner(FakePolicy(), rate_hz=10, sync_slop_s=0, ask_timeout_s=5)  # Python ints: INTEGER overrides
    assert [node.get_parameter(n).type_ for n in ("rate_hz", "sync_slop_s", "ask_timeout_s")] == \
        [Parameter.Type.DOUBLE] * 3
    assert node.get_parameter("rate_hz").value == 10.0
    assert (node._cfg["sync_slop_s"], node._cfg["ask_timeout_s"]) == (0.0, 5.0)
    params = ParamClient(ros.probe, node)
    result = params.set("rate_hz", 5)  # `ros2 param set /wam_diff/wam_diff_planner rate_hz 5` sends an integer
    assert result.successful, result.reason
    value = params.get("rate_hz")
    assert (value.type, value.double_value) == (ParameterType.PARAMETER_DOUBLE, 5.0)
    assert node._worker.min_period_s == 0.2

    yaml_file = tmp_path / "planner.yaml"  # the same from a parameter file, as a launch file passes it
    yaml_file.write_text("/**/wam_diff_planner:\n  ros__parameters:\n    rate_hz: 10\n    diagnostics_period_s: 2\n")
    context = Context()
    rclpy.init(context=context, args=["--ros-args", "--params-file", str(yaml_file)], domain_id=ros.domain_id)
    try:
        other = PlannerNode(context=context)
        assert (other.get_parameter("rate_hz").value, other.get_parameter("diagnostics_period_s").value) == (10.0, 2.0)
        other.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def test_descriptors_carry_type_range_and_read_only(ros):
    node = ros.planner(FakePolicy(), autostart=False)
    params = ParamClient(ros.probe, node)
    rate = params.describe("rate_hz")
    assert (rate.type, rate.read_only) == (ParameterType.PARAMETER_DOUBLE, False)
    assert [(r.from_value, r.to_value) for r in rate.floating_point_range] == [(0.0, 1000.0)]
    side = params.describe("max_image_side")
    assert (side.type, side.read_only, [(r.from_value, r.to_value) for r in side.integer_range]) == \
        (ParameterType.PARAMETER_INTEGER, False, [(1, 16384)])
    model = params.describe("model")
    assert (model.type, model.read_only) == (ParameterType.PARAMETER_STRING, True)
    schedule = params.describe("commit_schedule")
    assert schedule.read_only and "['', 'linear', 'cosine']" in schedule.description
    assert RUNTIME_PARAMETERS == {"rate_hz", "tasks", "max_image_bytes", "max_image_side", "max_image_pixels",
                                  "route_target_max_age_s", "base_frame_id", "diagnostics_period_s", "ask_timeout_s",
                                  "candidates", "scorer", "candidate_sampling", "candidate_braking",
                                  "detection_min_score"}
    read_only = [n for n in PARAMETERS if params.describe(n).read_only]
    assert len(read_only) == len(PARAMETERS) - len(RUNTIME_PARAMETERS) == 25


@pytest.mark.parametrize("name, value, message", [
    ("rate_hz", -5.0, "^Parameter rate_hz out of range Min: 0.0, Max: 1000.0, value: -5.0$"),
    ("block_size", -1, "^Parameter block_size out of range"),
    ("rate_hz", "fast", "^Trying to set parameter 'rate_hz' to 'fast' of type 'STRING', expecting type 'DOUBLE'$"),
], ids=["rate_hz_negative", "block_size_negative", "rate_hz_string"])
def test_a_bad_value_at_start_is_one_error_naming_the_parameter(ros, name, value, message):
    with pytest.raises(ParameterError, match=message):
        PlannerNode(namespace=ros.namespace, context=ros.context, parameter_overrides=[Parameter(name, value=value)])


@pytest.mark.parametrize("name, value, message", [
    ("commit_schedule", "zigzag", "commit_schedule must be one of ['', 'linear', 'cosine'], got 'zigzag'"),
    ("forward_only", "yes", "forward_only must be one of ['', 'on', 'off'], got 'yes'"),
    ("text_layers", "fused", "text_layers must be one of ['model', 'fast', 'compiled'], got 'fused'"),
    ("attention_backend", "xformers",
     "attention_backend must be one of ['sdpa', 'flex', 'flashinfer'], got 'xformers'"),
    ("camera_topics", ["/a b"], "camera_topics must be a topic name, got '/a b'"),
    ("default_command", "fly", "default_command: unknown navigation command 'fly'"),
], ids=["commit_schedule", "forward_only", "text_layers", "attention_backend", "camera_topics", "default_command"])
def test_a_bad_choice_fails_configure_through_the_service_with_one_log_line_naming_it(ros, name, value, message):
    values = {n: spec.default for n, spec in PARAMETERS.items()}
    with pytest.raises(ParameterError) as caught:
        read_config({**values, name: value})
    assert str(caught.value).startswith(message)
    node = ros.planner(None, autostart=False, **{name: value})
    log = record_log(node)
    lc = Lifecycle(ros.probe, node)
    assert lc.transition(Transition.TRANSITION_CONFIGURE) is False and lc.state() == State.PRIMARY_STATE_UNCONFIGURED
    assert log.errors == [f"configure failed: {caught.value}"] and node._pubs == {}


def test_the_parameter_table_of_docs_ros_md_states_each_parameters_type_range_and_whether_it_changes_at_runtime():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "ros.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`") and cells[0].strip("`") in PARAMETERS:
            rows[cells[0].strip("`")] = cells[1:5]
    assert set(rows) == set(PARAMETERS)
    types = {bool: "bool", int: "integer", float: "double", str: "string", list: "string[]"}
    for name, spec in PARAMETERS.items():
        kind, _, bounds, changes = rows[name]
        low_high = "-" if spec.bounds is None else " .. ".join(f"{v:g}" if isinstance(v, float) else str(v)
                                                               for v in spec.bounds)
        assert (kind, bounds, changes) == (types[type(spec.default)], low_high,
                                           "runtime" if spec.runtime else "read-only"), name


def test_torch_threads_parameter_sets_the_planning_threads_before_the_model_loads(monkeypatch):
    import torch

    from wam_diff_core.policy import DrivingPolicy
    from wam_diff_ros.policy_loading import PolicySettings, load_policy

    seen = []
    monkeypatch.setattr(DrivingPolicy, "load", classmethod(lambda cls, *a, **k: seen.append(torch.get_num_threads())))
    before = torch.get_num_threads()
    try:
        load_policy(PolicySettings(torch_threads=1))
        assert seen == [1] and torch.get_num_threads() == 1
        torch.set_num_threads(before)
        load_policy(PolicySettings())  # 0: left as it is
        assert seen == [1, before]
    finally:
        torch.set_num_threads(before)
    assert read_config({**{n: s.default for n, s in PARAMETERS.items()}, "torch_threads": 1})["policy"].torch_threads == 1
