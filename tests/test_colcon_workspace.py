"""The repository as a colcon workspace source: with it under src/, `colcon build --base-paths src
src/wam_diff_ros/msg` (the flags docs/ros.md gives) builds wam_diff_msgs, then wam_diff_ros, against the venv's ROS
wheels as the underlay, and the install space runs the planner node and imports the interfaces. The package.xml
files are read with catkin_pkg, the parser colcon-ros uses.

The build test needs colcon, which `make install` puts into .venv (requirements-ros.txt): run from .venv it fails
without it; from another environment it is skipped."""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PACKAGE = "wam_diff_ros"
MSGS = "wam_diff_msgs"
OWN_PACKAGES = {"wam_diff_core", "wam_diff_kernels", "wam_diff_training", "wam_diff_ros"}
# top-level folders the build does not need (result files) and would only copy slowly
NOT_COPIED = ("results/",)
# Python modules the nodes import -> their rosdep keys
ROSDEP_KEYS = {"numpy": "python3-numpy", "PIL": "python3-pil", "yaml": "python3-yaml", "tqdm": "python3-tqdm"}


def _parse(path: Path):
    from catkin_pkg.package import parse_package

    package = parse_package(str(path))
    package.validate()  # what colcon-ros and bloom refuse: bad names, versions, maintainer e-mails
    return package


def _names(depends) -> set[str]:
    return {d.name for d in depends}


def _imported_modules(paths) -> set[str]:
    """Top-level names of every import in the given Python files (lazy imports inside functions included)."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _is_ros_package(name: str) -> bool:
    return name.endswith(("_msgs", "_srvs", "_interfaces")) or name in {"rclpy", "launch", "launch_ros",
                                                                          "ament_index_python"}


def test_package_xml_declares_every_ros_package_and_keyed_library_the_nodes_and_launch_files_import():
    package = _parse(ROOT / "package.xml")
    assert (package.name, package.get_build_type()) == (PACKAGE, "ament_python")
    exec_depends = _names(package.exec_depends)
    imported = _imported_modules([*(ROOT / PACKAGE).rglob("*.py"), *(ROOT / "launch").glob("*.launch.py")])
    ros_imports = {name for name in imported if _is_ros_package(name) and name != PACKAGE}
    assert {"rclpy", "launch", "launch_ros", MSGS, "tf2_msgs"} <= ros_imports  # the scan sees them
    assert sorted(ros_imports - exec_depends) == []
    keyed = {ROSDEP_KEYS[name] for name in imported if name in ROSDEP_KEYS}
    assert keyed == set(ROSDEP_KEYS.values())
    assert sorted(keyed - exec_depends) == []
    assert {"python3-pytest", "python3-hypothesis"} <= _names(package.test_depends)


def test_ament_index_marker_setup_cfg_and_setup_py_agree_on_the_package_name_and_script_dir():
    assert (ROOT / "resource" / PACKAGE).is_file()
    assert re.search(rf'^PACKAGE = "{PACKAGE}"$', (ROOT / "setup.py").read_text(), re.M)
    setup_cfg = (ROOT / "setup.cfg").read_text()
    # where colcon / `ros2 run` look for an ament_python package's executables
    assert re.search(rf"^\[develop\]\nscript_dir=\$base/lib/{PACKAGE}$", setup_cfg, re.M)
    assert re.search(rf"^\[install\]\ninstall_scripts=\$base/lib/{PACKAGE}$", setup_cfg, re.M)


def _cmake_find_packages(cmake_lists: str) -> set[str]:
    return set(re.findall(r"find_package\((\w+) REQUIRED\)", cmake_lists))


def _cmake_interfaces(cmake_lists: str) -> list[tuple[str, str]]:
    """(kind, name) of every interface rosidl_generate_interfaces lists: ("msg", "Trajectory"), ("srv", ...)."""
    return re.findall(r'"(msg|srv|action)/(\w+)\.\1"', cmake_lists)


def test_msgs_package_xml_depends_on_exactly_what_its_cmake_lists_finds():
    package = _parse(ROOT / "msg" / "package.xml")
    assert (package.name, package.get_build_type()) == (MSGS, "ament_cmake")
    assert {"ament_cmake", "rosidl_default_generators"} <= _names(package.buildtool_depends)
    assert "rosidl_default_runtime" in _names(package.exec_depends)
    assert [g.name for g in package.member_of_groups] == ["rosidl_interface_packages"]
    cmake_lists = (ROOT / "msg" / "CMakeLists.txt").read_text()
    found = _cmake_find_packages(cmake_lists) - {"ament_cmake", "rosidl_default_generators"}
    assert _names(package.build_depends) == found
    assert found <= _names(package.exec_depends)  # <depend> = build + exec
    assert len(_cmake_interfaces(cmake_lists)) >= 6


# ---------------------------------------------------------------------------------------------------------------
# the workspace build


def _colcon() -> Path:
    colcon = Path(sys.executable).parent / "colcon"
    if colcon.exists():
        return colcon
    if VENV.exists() and Path(sys.prefix).resolve() == VENV.resolve():
        pytest.fail("colcon is not in .venv: `make install` installs it (requirements-ros.txt)")
    pytest.skip("colcon is not installed in this Python environment (`make test` runs this test from .venv)")


def _repository_files() -> list[str]:
    """What a clone holds (tracked files and new ones git does not ignore), without NOT_COPIED."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [f for f in out.split("\0") if f and not f.startswith(NOT_COPIED) and (ROOT / f).is_file()]


def _clean_env(underlay: Path) -> dict[str, str]:
    """A shell with nothing sourced but the underlay on the prefix paths (no bootstrap marker of this process's ROS
    wheels, no PYTHONPATH): what a user's terminal has."""
    env = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR", "TERM") if k in os.environ}
    env.update(PATH=f"{underlay / 'bin'}:/usr/local/bin:/usr/bin:/bin", AMENT_PREFIX_PATH=str(underlay),
               CMAKE_PREFIX_PATH=str(underlay), PYTHONUNBUFFERED="1")
    return env


def _sourced_env(workspace: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment after `source install/setup.bash` (colcon's generated setup script)."""
    out = subprocess.run(["bash", "-c", "source install/setup.bash && env -0"], cwd=workspace, env=env,
                         capture_output=True, check=True).stdout.decode()
    return dict(line.split("=", 1) for line in out.split("\0") if "=" in line)


# Run with the sourced install space's environment: imports every interface msg/CMakeLists.txt generates,
# serializes one of each (the C type support libraries load), then waits for the planner's Trajectory publisher.
PROBE = r"""
import importlib, json, sys, time
import rclpy
from rclpy.serialization import serialize_message
import wam_diff_msgs, wam_diff_ros
from wam_diff_core.model.shipped import resolve_model
interfaces, topic = json.loads(sys.argv[1]), sys.argv[2]
for kind, name in interfaces:
    cls = getattr(importlib.import_module(f"wam_diff_msgs.{kind}"), name)
    if kind == "msg":
        serialize_message(cls())
rclpy.init()
node = rclpy.create_node("colcon_probe")
deadline, info = time.monotonic() + 60.0, []
# an endpoint can be seen before its node's name ("_NODE_NAME_UNKNOWN_"): wait for both
while not (info and "_NODE_NAME_UNKNOWN_" not in {i.node_name for i in info}) and time.monotonic() < deadline:
    rclpy.spin_once(node, timeout_sec=0.2)
    info = node.get_publishers_info_by_topic(topic)
print(json.dumps({"msgs": wam_diff_msgs.__file__, "ros": wam_diff_ros.__file__, "interfaces": len(interfaces),
                  "shipped_model": resolve_model("nano-s-b32"),
                  "publishers": [(i.node_name, i.topic_type) for i in info]}))
"""


def _copy_repository(src: Path) -> None:
    for name in _repository_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)


def _console_scripts() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    (entry_points,) = [ast.literal_eval(k.value) for k in ast.walk(tree)
                       if isinstance(k, ast.keyword) and k.arg == "entry_points"]
    return sorted(spec.split("=")[0].strip() for spec in entry_points["console_scripts"])


def _check_install_space(install: Path) -> Path:
    """The install space holds the project's four Python packages and nothing else in site-packages, every launch
    file and parameter file under share/wam_diff_ros, every console script in lib/wam_diff_ros; returns
    site-packages."""
    (site,) = (install / PACKAGE / "lib").glob("python3*/site-packages")
    assert {p.name for p in site.iterdir() if not p.name.endswith((".egg-info", ".dist-info"))} == OWN_PACKAGES
    share = install / PACKAGE / "share" / PACKAGE
    for folder, pattern in (("launch", "*.launch.py"), ("config", "*.yaml")):
        installed = sorted(p.name for p in (share / folder).iterdir())
        assert installed == sorted(p.name for p in (ROOT / folder).glob(pattern)), folder
    assert sorted(p.name for p in (install / PACKAGE / "lib" / PACKAGE).iterdir()) == _console_scripts()
    for model in (ROOT / "models").iterdir():  # the shipped checkpoints, file for file
        assert sorted(p.name for p in (share / "models" / model.name).iterdir()) == sorted(
            p.name for p in model.iterdir()), model.name
    return site


def _run_planner_and_probe(workspace: Path, ws_env: dict[str, str], interfaces, log: Path):
    """Start the installed wam-diff-planner (model fake, autostart), run PROBE beside it, stop it with SIGINT:
    (probe result, planner exit status, planner output)."""
    ws_env = dict(ws_env, ROS_DOMAIN_ID=str(151 + os.getpid() % 60), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    namespace = f"/colcon_{os.getpid()}"
    with log.open("w") as out:
        planner = subprocess.Popen(
            [str(workspace / "install" / PACKAGE / "lib" / PACKAGE / "wam-diff-planner"), "--ros-args",
             "-r", f"__ns:={namespace}", "-p", "model:=fake", "-p", "autostart:=true"],
            cwd=workspace, env=ws_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE, json.dumps(interfaces), f"{namespace}/trajectory"],
                               cwd=workspace, env=ws_env, capture_output=True, text=True, timeout=120)
        planner.send_signal(signal.SIGINT)
        rc = planner.wait(timeout=10)
    finally:
        if planner.poll() is None:
            planner.kill()
            planner.wait()
    return probe, rc, log.read_text()


def test_colcon_builds_msgs_then_ros_and_the_install_space_runs_the_planner(tmp_path):
    colcon = _colcon()
    underlay = Path(sys.prefix)
    subprocess.run(["bash", str(ROOT / "scripts" / "install_ros.sh"), "--underlay", str(underlay)], check=True,
                   capture_output=True)
    workspace = tmp_path / "ws"
    src = workspace / "src" / PACKAGE
    _copy_repository(src)
    env = _clean_env(underlay)

    start = time.monotonic()
    build = subprocess.run([str(colcon), "build", "--base-paths", "src", f"src/{PACKAGE}/msg"], cwd=workspace,
                           env=env, capture_output=True, text=True, timeout=600)
    build_s = time.monotonic() - start
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    assert re.findall(r"^Starting >>> (\w+)", output, re.M) == [MSGS, PACKAGE], output
    assert re.search(r"^Summary: 2 packages finished \[", output, re.M), output
    print(f"colcon build: {build_s:.1f} s; " + " ".join(re.findall(r"^Finished <<< .*$", output, re.M)))
    install = workspace / "install"
    site = _check_install_space(install)

    interfaces = _cmake_interfaces((src / "msg" / "CMakeLists.txt").read_text())
    probe, rc, log = _run_planner_and_probe(workspace, _sourced_env(workspace, env), interfaces,
                                            tmp_path / "planner.log")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(seen["msgs"]).is_relative_to(install / MSGS), seen
    assert Path(seen["ros"]).is_relative_to(site), seen
    assert Path(seen["shipped_model"]) == install / PACKAGE / "share" / PACKAGE / "models" / "nano-s-b32", seen
    assert seen["interfaces"] == len(interfaces) >= 6
    assert seen["publishers"] == [["wam_diff_planner", "wam_diff_msgs/msg/Trajectory"]], (seen, log)
    assert rc == 0, log
    assert "Traceback" not in log, log
