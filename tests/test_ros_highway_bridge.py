"""`wam-diff-demo` (planner + highway bridge over rclpy + Fast DDS) on one short route, as a subprocess."""
import json
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")
pytest.importorskip("highway_env", reason="embedded world dependencies not installed")

SHORT_ROUTE = {"route_id": "short_highway", "scenario": "highway", "seed": 7, "density": 0.5,
               "target_distance_m": 60.0, "time_limit_s": 8.0,
               "options": {"lanes": 3, "vehicles": 2, "ego_speed": 20.0}}


def test_demo_drives_a_route_through_the_planner_node_and_writes_scores_and_video(tmp_path):
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
