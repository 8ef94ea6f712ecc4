"""Launch files and parameter YAML, checked structurally (`launch` is not installable here):
executables are console scripts of setup.py whose functions exist, parameter files exist in
config/, and every parameter they set is one the node declares."""
import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def _console_scripts() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entry_points = ast.literal_eval(node.value)
            return dict(re.split(r"\s*=\s*", spec, maxsplit=1) for spec in entry_points["console_scripts"])
    raise AssertionError("setup.py has no entry_points")


def _node_actions(path: Path) -> list[dict]:
    """Keyword arguments (constants only) of every Node / LifecycleNode call in a launch file."""
    tree = ast.parse(path.read_text())
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 for t in n.targets if isinstance(t, ast.Name)}  # module-level NAME = "value"
    actions = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Node", "LifecycleNode"):
            action = {}
            for kw in node.keywords:
                if isinstance(kw.value, ast.Constant):
                    action[kw.arg] = kw.value.value
                elif isinstance(kw.value, ast.Name) and kw.value.id in constants:
                    action[kw.arg] = constants[kw.value.id]
            actions.append(action)
    return actions


def _yaml_names(path: Path) -> list[str]:
    """config/*.yaml names a launch file joins with PathJoinSubstitution or mentions as strings."""
    return [n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith(".yaml")]


def test_both_launch_files_exist_and_parse():
    assert {p.name for p in LAUNCH_FILES} >= {"planner.launch.py", "demo.launch.py"}
    for path in LAUNCH_FILES:
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_executables_are_console_scripts_whose_functions_exist(path):
    scripts = _console_scripts()
    actions = [a for a in _node_actions(path) if a.get("package") == "wam_diff_ros"]
    assert actions, f"{path.name} starts no wam_diff_ros node"
    for action in actions:
        executable = action.get("executable")
        assert executable in scripts, f"{path.name}: executable {executable!r} not in setup.py console_scripts"
        module, func = scripts[executable].split(":")
        assert callable(getattr(importlib.import_module(module), func)), scripts[executable]
        assert isinstance(action.get("name"), str) and action["name"]


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_parameter_files_exist_in_config_and_are_installed(path):
    names = _yaml_names(path)
    assert names, f"{path.name} names no parameter file"
    for name in names:
        assert (ROOT / "config" / name).is_file(), f"{path.name}: config/{name} missing"
    setup = (ROOT / "setup.py").read_text()
    assert 'glob("config/*.yaml")' in setup and 'glob("launch/*.launch.py")' in setup


def _declared(module_name: str) -> set[str]:
    return set(importlib.import_module(module_name).PARAMETERS) | {"use_sim_time"}


@pytest.mark.parametrize("yaml_name", ["planner.yaml", "demo.yaml"])
def test_parameter_files_set_only_declared_parameters_of_the_right_type(yaml_name):
    pytest.importorskip("rclpy", reason="ROS 2 wheels not installed")
    nodes = {"wam_diff_planner": "wam_diff_ros.planner_node", "wam_diff_highway_bridge": "wam_diff_ros.highway_bridge_node"}
    data = yaml.safe_load((ROOT / "config" / yaml_name).read_text())
    assert data
    for key, section in data.items():
        node_name = key.rsplit("/", 1)[-1]
        assert node_name in nodes, f"{yaml_name}: unknown node {key!r}"
        params = section["ros__parameters"]
        module = importlib.import_module(nodes[node_name])
        unknown = set(params) - _declared(nodes[node_name])
        assert not unknown, f"{yaml_name}: {node_name} does not declare {sorted(unknown)}"
        for name, value in params.items():
            if name == "use_sim_time":
                continue
            default = module.PARAMETERS[name][0]
            expected = float if isinstance(default, float) else type(default)
            assert isinstance(value, expected) or (expected is float and isinstance(value, int)), \
                f"{yaml_name}: {node_name}.{name} = {value!r}, expected {expected.__name__}"


def test_planner_yaml_lists_every_declared_planner_parameter():
    pytest.importorskip("rclpy", reason="ROS 2 wheels not installed")
    from wam_diff_ros.planner_node import PARAMETERS

    params = yaml.safe_load((ROOT / "config" / "planner.yaml").read_text())["/**/wam_diff_planner"]["ros__parameters"]
    assert set(params) == set(PARAMETERS)


def _launch_default(path: Path, name: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DeclareLaunchArgument" \
                and node.args and node.args[0].value == name:
            return next(ast.literal_eval(kw.value) for kw in node.keywords if kw.arg == "default_value")
    raise AssertionError(f"{path.name} declares no launch argument {name!r}")


def test_launch_files_yaml_and_node_default_to_the_shipped_model_decoding_as_it_says():
    """Out of the box the planner runs models/nano-s-b32 with its own wam_diff.json's decoding settings, except the
    CPU setting planner.yaml gives (K = 2, threshold 0.3, dtype auto: docs/gpu.md); the node's own defaults leave all
    unset."""
    pytest.importorskip("rclpy", reason="ROS 2 wheels not installed")
    from wam_diff_core.constants import SHIPPED_MODEL
    from wam_diff_ros.planner_node import PARAMETERS, PolicySettings

    assert SHIPPED_MODEL == "nano-s-b32" and (ROOT / "models" / SHIPPED_MODEL / "wam_diff.json").is_file()
    for path in LAUNCH_FILES:
        assert _launch_default(path, "model") == SHIPPED_MODEL, path.name
    planner = yaml.safe_load((ROOT / "config" / "planner.yaml").read_text())["/**/wam_diff_planner"]["ros__parameters"]
    demo = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())["/**/wam_diff_planner"]["ros__parameters"]
    unset = {"block_size": 0, "denoising_steps": 0, "remasking_strategy": "", "remasking_threshold": 0.0,
             "commit_schedule": "", "forward_only": "", "max_new_tokens": 0, "dtype": ""}
    assert PARAMETERS["model"][0] == planner["model"] == PolicySettings().model == SHIPPED_MODEL
    cpu_setting = {"denoising_steps": 2, "remasking_threshold": 0.3, "dtype": "auto"}
    for name, value in unset.items():
        assert PARAMETERS[name][0] == value, name
        assert planner[name] == cpu_setting.get(name, value), name
        assert demo.get(name, value) == value, name  # the demo runs planner.yaml's setting


def test_planner_launch_declares_model_and_camera_topics_arguments():
    tree = ast.parse((ROOT / "launch" / "planner.launch.py").read_text())
    declared = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "DeclareLaunchArgument"}
    assert {"model", "camera_topics", "params_file", "device", "autostart"} <= declared


@pytest.mark.parametrize("text, topics", [
    ("", []), ("  ", []), ("[]", []),
    ("/camera/image_raw", ["/camera/image_raw"]),
    ("/front/image_raw, /left/image_raw/compressed", ["/front/image_raw", "/left/image_raw/compressed"]),
    ("['/a', '/b']", ["/a", "/b"]),
])
def test_camera_topics_launch_argument_parses_to_a_topic_list(text, topics):
    from wam_diff_ros.launch_args import parse_topic_list

    assert parse_topic_list(text) == topics


@pytest.mark.parametrize("text", ["/a,,/b", "/a, /my topic"])
def test_camera_topics_launch_argument_rejects_empty_or_spaced_names_in_one_line(text):
    from wam_diff_ros.launch_args import LaunchArgumentError, parse_topic_list

    with pytest.raises(LaunchArgumentError) as err:
        parse_topic_list(text)
    assert repr(text) in str(err.value) and "\n" not in str(err.value)
