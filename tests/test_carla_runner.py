"""Merging and scoring leaderboard results; the runner's shards, restarts and resume with a stand-in evaluator."""
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from wam_diff_core import cli
from wam_diff_core.eval import leaderboard
from wam_diff_ros.carla import results, runner

ROUTE = ('<route id="{id}" town="Town12"><waypoints><position x="0" y="0" z="0"/><position x="9" y="0" z="0"/>'
         '</waypoints><scenarios><scenario name="{t}_1" type="{t}"><trigger_point x="1" y="0" z="0" yaw="0"/>'
         '</scenario></scenarios><weathers><weather route_percentage="0" cloudiness="5.0"/></weathers></route>')
TYPES = {"1711": "ParkingCutIn", "1773": "ParkedObstacle", "1790": "HazardAtSideLane", "2086": "YieldToEmergencyVehicle",
         "3": "ParkedObstacle"}


def write_routes(path, ids=TYPES):
    path.write_text("<routes>" + "".join(ROUTE.format(id=i, t=t) for i, t in ids.items()) + "</routes>")
    return path


def rec(rid, status, completion, save_name="", **infractions):
    inf = {k: [] for k in results.INFRACTION_KINDS}
    inf.update(infractions)
    return {"route_id": f"RouteScenario_{rid}_rep0", "index": 0, "status": status, "scenario_name": TYPES[rid] + "_1",
            "save_name": save_name, "infractions": inf,
            "scores": {"score_route": completion}, "meta": {}}  # the merge fills in the penalty and composed score


def checkpoint(path, records, done=None):
    n = len(records) if done is None else done
    path.write_text(json.dumps({"_checkpoint": {"records": records, "progress": [n, n], "global_record": {}},
                                "entry_status": "Started"}))
    return path


def test_merged_sample_results_give_hand_computed_ds_and_sr(tmp_path):
    # 1711 perfect -> 100; 1790 40 % then blocked after a vehicle collision -> 40 x 0.6 = 24;
    # 1773 crashed in a first attempt, completed on resume with a red light and 10 % outside lanes
    #   -> 100 x 0.7 x 0.9 = 63; 2086 completed with only a min-speed infraction -> 100, a success;
    # route 3 has no record -> 0.  DS = (100 + 24 + 63 + 100 + 0) / 5 = 57.4, SR = 2 / 5 = 40 %.
    a = checkpoint(tmp_path / "a.json", [
        rec("1711", "Perfect", 100.0),
        rec("1790", "Failed - Agent got blocked", 40.0, collisions_vehicle=["Agent collided against object"],
            vehicle_blocked=["Agent got blocked"])])
    b1 = checkpoint(tmp_path / "b1.json", [rec("1773", "Failed - Simulation crashed", 10.0)])
    b2 = checkpoint(tmp_path / "b2.json", [
        rec("1773", "Completed", 100.0, red_light=["Agent ran a red light"],
            outside_route_lanes=["Agent went outside its route lanes for about 12.5 meters (10.0% of the completed route)"],
            min_speed_infractions=["Average agent speed is 80.0% of the surrounding traffic's one"]),
        rec("2086", "Completed", 100.0, min_speed_infractions=["Average agent speed is 50.0% of the surrounding traffic's one"])])
    for order in ([a, b1, b2], [b2, a, b1]):  # a finished record wins over a crashed one in any order
        merged = results.merge_checkpoints(order)
        recs = merged["_checkpoint"]["records"]
        assert [results.route_key(r["route_id"]) for r in recs] == ["1711", "1773", "1790", "2086"]
        s = results.score(recs, expected_ids=list(TYPES), route_types=TYPES)
        assert s["driving_score"] == pytest.approx(57.4)
        assert s["success_rate"] == pytest.approx(40.0)
        assert s["routes"]["1773"]["score"] == pytest.approx(63.0)
        assert s["routes"]["3"]["status"] == "missing"
        assert s["abilities"]["emergency_brake"] == 100.0 and s["abilities"]["overtaking"] == 0.0
        assert s["abilities"]["give_way"] == 100.0 and s["abilities"]["merging"] is None
        assert s["efficiency"] == pytest.approx(65.0)
        assert s["comfort"] is None  # no agent files given
        # the merged file, in the evaluator's layout out of all 5 routes, re-scores to the same DS and SR
        lb = leaderboard.score_results(results.merge_checkpoints(order, total=5))
        assert lb["driving_score"] == pytest.approx(57.4) and lb["success_rate"] == pytest.approx(40.0)
        assert lb["missing_routes"] == 1 and lb["routes"]["1773"]["stored_score"] == pytest.approx(63.0)


def test_comfort_and_plan_counters_come_from_the_agent_files(tmp_path):
    agent_dir = tmp_path / "agent"
    smooth = {"dt": 0.1, "lon_accel": [0.5] * 40, "lat_accel": [0.0] * 40, "yaw_rate": [0.0] * 40}
    jerky = {"dt": 0.1, "lon_accel": [0.5, -6.0] * 20, "lat_accel": [0.0] * 40, "yaw_rate": [0.0] * 40}
    for name, comfort, invalid in (("s1", smooth, 0), ("s2", jerky, 3)):
        (agent_dir / name).mkdir(parents=True)
        (agent_dir / name / results.AGENT_FILE).write_text(json.dumps(
            {"comfort": comfort, "stats": {"ticks": 100, "plans": 10, "valid_plans": 10 - invalid,
                                           "invalid_plans": invalid, "late_plans": 0, "brake_ticks": 5 * invalid}}))
    recs = [rec("1711", "Perfect", 100.0, save_name="s1"), rec("2086", "Perfect", 100.0, save_name="s2")]
    s = results.score(recs, route_types=TYPES, agent_dir=agent_dir)
    assert s["routes"]["1711"]["comfort"] == 1.0 and s["routes"]["2086"]["comfort"] == 0.0
    assert s["comfort"] == pytest.approx(50.0)
    assert s["agent"] == {"ticks": 200, "plans": 20, "valid_plans": 17, "invalid_plans": 3, "late_plans": 0,
                          "brake_ticks": 15}


FAKE_EVALUATOR = textwrap.dedent('''\
    """Stand-in for leaderboard_evaluator.py: runs one route per call unless --resume'd; crashes once."""
    import argparse, json, os, sys, xml.etree.ElementTree as ET
    p = argparse.ArgumentParser()
    for a in ("--routes", "--checkpoint", "--agent", "--agent-config", "--port", "--traffic-manager-port",
              "--gpu-rank", "--timeout", "--repetitions", "--track", "--debug", "--debug-checkpoint", "--resume"):
        p.add_argument(a, default="")
    args = p.parse_args()
    assert os.path.isfile(args.agent) and args.agent.endswith("agent.py"), args.agent
    ids = [r.get("id") for r in ET.parse(args.routes).getroot().findall("route")]
    records = json.load(open(args.checkpoint))["_checkpoint"]["records"] if args.resume else []
    with open(os.path.join(os.path.dirname(args.checkpoint), "calls.txt"), "a") as fh:
        fh.write(f"port={args.port} tm={args.traffic_manager_port} resume={bool(args.resume)} "
                 f"save={os.environ['SAVE_PATH']}\\n")
    for rid in ids[len(records):]:
        records.append({"route_id": f"RouteScenario_{rid}_rep0", "status": "Perfect", "save_name": "",
                        "infractions": {}, "scores": {"score_route": 100.0}})
        json.dump({"_checkpoint": {"records": records, "progress": [len(records), len(ids)]}}, open(args.checkpoint, "w"))
        if not args.resume and len(ids) > 1:
            sys.exit(255)  # "Simulation crashed" after the first route
    sys.exit(0)
''')


def test_runner_parallel_shards_restart_after_crash_resume_and_score(tmp_path, capsys):
    routes = write_routes(tmp_path / "routes.xml")
    fake = tmp_path / "fake_evaluator.py"
    fake.write_text(FAKE_EVALUATOR)
    out = tmp_path / "run"
    argv = ["run", "--routes", str(routes), "--bench2drive-root", str(tmp_path), "--carla-root", str(tmp_path),
            "--out", str(out), "--ports", "2000,2100", "--evaluator", str(fake), "--poll-s", "0.05", "--compat", "never"]
    assert runner.main(argv) == 0
    calls0 = (out / "shard_0" / "calls.txt").read_text().splitlines()
    calls1 = (out / "shard_1" / "calls.txt").read_text().splitlines()
    # shard 0 holds routes 1711, 1790, 3: crashed after one route, restarted with --resume
    assert calls0 == [f"port=2000 tm=8000 resume=False save={out.resolve() / 'agent'}",
                      f"port=2000 tm=8000 resume=True save={out.resolve() / 'agent'}"]
    assert calls1[0].startswith("port=2100 tm=8100 resume=False")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_routes"] == 5 and summary["driving_score"] == 100.0 and summary["success_rate"] == 100.0
    assert "driving score 100.00" in capsys.readouterr().out
    # a second run in the same directory needs --resume; with it, finished shards are not rerun
    assert runner.main(argv) == 2
    assert "--resume" in capsys.readouterr().err
    assert runner.main(argv + ["--resume"]) == 0
    assert len((out / "shard_0" / "calls.txt").read_text().splitlines()) == 2
    # resuming with another number of ports is refused
    assert runner.main(argv[:-8] + ["--ports", "2000", "--evaluator", str(fake), "--resume", "--compat", "never"]) == 2
    assert "2 shard(s)" in capsys.readouterr().err
    # the score sub-command re-merges from the run directory alone
    assert runner.main(["score", "--out", str(out)]) == 0
    # merged.json is a result file in the evaluator's layout that `wam-diff score --leaderboard` reads back
    merged = json.loads((out / "merged.json").read_text())
    assert merged["_checkpoint"]["progress"] == [5, 5] and merged["entry_status"] == "Finished"
    assert merged["_checkpoint"]["global_record"]["scores_mean"]["score_composed"] == 100.0
    assert [r["index"] for r in merged["_checkpoint"]["records"]] == [0, 1, 2, 3, 4]
    assert all(r["scores"] == {"score_route": 100.0, "score_penalty": 1.0, "score_composed": 100.0}
               and list(r["infractions"]) == list(leaderboard.OFFICIAL_KINDS) for r in merged["_checkpoint"]["records"])
    capsys.readouterr()
    assert cli.main(["score", "--leaderboard", str(out / "merged.json"), "--out", str(tmp_path / "lb.json")]) == 0
    assert "driving score 100.00 (score_composed in the file: 100.00)   success rate 100.00 %   routes 5" \
        in capsys.readouterr().out
    read_back = json.loads((tmp_path / "lb.json").read_text())
    assert read_back["driving_score"] == summary["driving_score"] == 100.0
    assert sorted(read_back["routes"]) == sorted(TYPES) and read_back["mismatches"] == []


def test_runner_merge_scores_partial_runs_as_the_leaderboard_does_and_flags_disagreeing_scores(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "shard_0").mkdir(parents=True)
    (out / "shard_1").mkdir(parents=True)
    routes = write_routes(tmp_path / "routes.xml")
    (out / runner.MANIFEST).write_text(json.dumps({"routes": str(routes)}))
    bad = rec("1773", "Completed", 100.0, red_light=["Agent ran a red light"])
    bad["scores"].update(score_penalty=1.0, score_composed=100.0)  # the file says 100, its red light says 70
    checkpoint(out / "shard_0" / "checkpoint.json", [rec("1711", "Perfect", 100.0), bad])
    checkpoint(out / "shard_1" / "checkpoint.json", [rec("1790", "Failed - Agent got blocked", 50.0,
                                                         collisions_vehicle=["Agent collided against object"],
                                                         vehicle_blocked=["Agent got blocked"])])
    assert runner.main(["score", "--out", str(out)]) == 0
    assert "route 1773: the evaluator's score_composed 100.0000 differs from its infractions' 70.0000" \
        in capsys.readouterr().out
    merged = json.loads((out / "merged.json").read_text())
    # 3 of the 5 routes have a record: DS = (100 + 70 + 50 x 0.6) / 5 = 40, SR = 1 / 5 = 20 %
    assert merged["_checkpoint"]["progress"] == [3, 5] and merged["entry_status"] == "Started"
    assert merged["_checkpoint"]["records"][1]["scores"]["score_composed"] == 100.0  # kept as the evaluator wrote it
    summary = json.loads((out / "summary.json").read_text())
    lb = leaderboard.score_results(merged)
    assert summary["driving_score"] == pytest.approx(40.0) and lb["driving_score"] == pytest.approx(40.0)
    assert summary["success_rate"] == pytest.approx(20.0) and lb["success_rate"] == pytest.approx(20.0)
    assert [m["route_id"] for m in summary["score_composed_mismatches"]] == ["1773"]


def test_runner_score_refuses_a_misspelt_infraction_list_naming_route_and_key(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "shard_0").mkdir(parents=True)
    r = rec("1711", "Completed", 100.0)
    r["infractions"]["collision_vehicles"] = ["Agent collided against object"]
    checkpoint(out / "shard_0" / "checkpoint.json", [r])
    assert runner.main(["score", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "route 1711: infractions.collision_vehicles is not a leaderboard infraction" in err
    assert not (out / "summary.json").exists()


def make_checkout(root):
    """A directory shaped like a Bench2Drive checkout and a CARLA install: every file the runner checks, at its
    real path, with stub contents (only the paths matter here). Returns (checkout, carla_root)."""
    b2d, carla_root = root / "Bench2Drive", root / "CARLA_0.9.15"
    for rel in runner.CHECKOUT_FILES:
        (b2d / rel).parent.mkdir(parents=True, exist_ok=True)
        (b2d / rel).write_text("")
    write_routes(b2d / runner.DEFAULT_ROUTES)
    for rel in runner.CARLA_FILES:
        (carla_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (carla_root / rel).write_text("")
    return b2d, carla_root


@pytest.mark.parametrize("missing", runner.CHECKOUT_FILES + runner.CARLA_FILES)
def test_an_incomplete_checkout_or_carla_install_is_one_line_naming_the_missing_file(tmp_path, capsys, missing):
    b2d, carla_root = make_checkout(tmp_path)
    gone = (b2d if missing in runner.CHECKOUT_FILES else carla_root) / missing
    gone.unlink()
    assert runner.main(["--bench2drive", str(b2d), "--carla-root", str(carla_root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"wam-diff-bench2drive: error: {gone} not found")
    assert not (tmp_path / "o").exists()


def test_a_missing_evaluator_module_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    b2d, carla_root = make_checkout(tmp_path)
    monkeypatch.setattr(runner, "EVALUATOR_MODULES", runner.EVALUATOR_MODULES + ("no_such_module_for_b2d",))
    assert runner.main(["--bench2drive", str(b2d), "--carla-root", str(carla_root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "['no_such_module_for_b2d']" in err and "requirements-carla.txt" in err


def test_this_python_has_every_module_the_evaluator_and_scenario_runner_import():
    pytest.importorskip("carla")
    assert runner.missing_modules() == []


def test_dry_run_builds_the_evaluator_command_for_a_checkout_with_its_default_routes(tmp_path, capsys):
    from wam_diff_ros.carla import agent as agent_module
    from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG

    b2d, carla_root = make_checkout(tmp_path)
    out = tmp_path / "o"
    assert runner.main(["--bench2drive", str(b2d), "--carla-root", str(carla_root), "--out", str(out),
                        "--ports", "2000,2100", "--gpus", "3", "--compat", "never", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2  # five routes, two ports: two shards
    cmd = lines[0].split(" ")
    assert cmd[:2] == [sys.executable, str((b2d / runner.EVALUATOR).resolve())]
    assert cmd[2:] == [f"--routes={out / 'routes' / 'shard_0.xml'}", "--repetitions=1", "--track=SENSORS",
                       f"--checkpoint={out / 'shard_0' / 'checkpoint.json'}",
                       f"--debug-checkpoint={out / 'shard_0' / 'live_results.txt'}",
                       f"--agent={Path(agent_module.__file__).resolve()}", f"--agent-config={DEFAULT_CONFIG.resolve()}",
                       "--debug=0", "--port=2000", "--traffic-manager-port=8000", "--gpu-rank=3", "--timeout=600.0"]
    assert "--port=2100" in lines[1] and "--traffic-manager-port=8100" in lines[1]
    assert json.loads((out / "run.json").read_text())["routes"] == str((b2d / runner.DEFAULT_ROUTES).resolve())


def test_evaluator_env_puts_leaderboard_scenario_runner_and_the_carla_pythonapi_on_pythonpath(tmp_path, monkeypatch):
    from types import SimpleNamespace

    b2d, carla_root = make_checkout(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/earlier")
    args = SimpleNamespace(bench2drive_root=str(b2d), carla_root=str(carla_root), out=str(tmp_path / "o"))
    shard = runner.Shard(index=0, port=2000, tm_port=8000, gpu=1, routes=tmp_path, dir=tmp_path, route_ids=[])
    env = runner.evaluator_env(args, shard, tmp_path / "compat")
    c, b = carla_root.resolve(), b2d.resolve()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "compat"), str(c / "PythonAPI"), str(c / "PythonAPI" / "carla"),
                                                   str(b / "leaderboard"), str(b / "scenario_runner"), "/earlier"]
    assert (env["CARLA_ROOT"], env["LEADERBOARD_ROOT"], env["SCENARIO_RUNNER_ROOT"]) == (str(c), str(b / "leaderboard"),
                                                                                       str(b / "scenario_runner"))
    assert env["SAVE_PATH"] == str((tmp_path / "o").resolve() / "agent") and env["CUDA_VISIBLE_DEVICES"] == "1"


def test_compat_shim_reports_the_carla_client_version(tmp_path):
    pytest.importorskip("carla")
    runner.write_compat(tmp_path)
    import subprocess

    code = "import pkg_resources; print(pkg_resources.get_distribution('carla').version)"
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0.9.15"


def test_runner_rejects_overlapping_ports(tmp_path, capsys):
    b2d, carla_root = make_checkout(tmp_path)
    assert runner.main(["run", "--bench2drive", str(b2d), "--carla-root", str(carla_root), "--compat", "never",
                        "--out", str(tmp_path / "o1"), "--ports", "2000,2001"]) == 2
    assert "at least 3 apart" in capsys.readouterr().err


def run_fake(tmp_path, script, *extra):
    routes = write_routes(tmp_path / "routes.xml", {"1711": "ParkingCutIn"})
    fake = tmp_path / "fake_evaluator.py"
    fake.write_text(textwrap.dedent(script))
    return runner.main(["run", "--routes", str(routes), "--bench2drive-root", str(tmp_path), "--carla-root", str(tmp_path),
                        "--out", str(tmp_path / "o"), "--evaluator", str(fake), "--poll-s", "0.05", "--grace-s", "5",
                        "--compat", "never", *extra])


def test_runner_restarts_a_failing_evaluator_then_gives_up_showing_its_log(tmp_path, capsys):
    rc = run_fake(tmp_path, "import sys\nprint('Simulation crashed')\nsys.exit(1)\n", "--max-restarts", "1")
    assert rc == 2
    captured = capsys.readouterr()
    assert "gave up after 1 restarts (exit codes [1, 1])" in captured.out and "Simulation crashed" in captured.out
    assert "evaluator.log" in captured.err


def test_an_evaluator_missing_a_module_is_not_restarted_and_the_module_is_named(tmp_path, capsys):
    rc = run_fake(tmp_path, "import sys\nprint(\"ModuleNotFoundError: No module named 'py_trees'\")\nsys.exit(1)\n")
    assert rc == 2
    out = capsys.readouterr().out
    assert "gave up at once: the evaluator cannot import 'py_trees': install it for" in out
    assert "restart" not in out.replace("gave up", "")


def test_an_unreachable_carla_server_stops_the_evaluator_after_three_failed_connections(tmp_path, capsys):
    script = """\
        import time
        for attempt in range(3):
            print(f"load_world failed , attempts={attempt}", flush=True)
            print("time-out of 600000ms while waiting for the simulator", flush=True)
        time.sleep(60)  # the real evaluator would go on trying for long
        """
    start = time.monotonic()
    assert run_fake(tmp_path, script) == 2
    assert time.monotonic() - start < 30
    out = capsys.readouterr().out
    assert "gave up at once: the CARLA server on port 2000 is not reachable" in out
