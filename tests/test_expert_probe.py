"""`wam-diff expert-probe` (wam_diff_core.sim.expert_probe): policies' plans beside the expert's while the expert
drives a route."""
import json

import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.cli import main as wam_diff_main  # noqa: E402
from wam_diff_core.errors import WamDiffError  # noqa: E402
from wam_diff_core.sim import expert_probe as probe  # noqa: E402


def _main(argv: list) -> int:
    """The command as `wam-diff expert-probe` runs it, its errors raised rather than printed."""
    import argparse

    parser = argparse.ArgumentParser()
    probe.add_arguments(parser)
    return probe.run(parser.parse_args(argv))

LEFT = {"route_id": "t_left", "scenario": "intersection", "seed": 9, "density": 1.0, "target_distance_m": 90.0,
        "time_limit_s": 25.0, "options": {"destination": "o1"}}


def test_probe_records_each_policy_beside_the_expert_at_every_replan(tmp_path, capsys):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"routes": [LEFT]}))
    out = tmp_path / "probe"
    assert wam_diff_main(["expert-probe", "--route", "t_left", "--routes", str(suite), "--out", str(out),
                          "--frame-size", "64x32", "cv=constant-velocity", "twin=expert-plan"]) == 0
    result = json.loads((out / "t_left.json").read_text())
    assert result["status"] == "Completed" and result["horizons_s"] == [1.0, 2.0, 4.0]
    rows = result["rows"]
    assert len(rows) >= 10 and [r["t"] for r in rows[:3]] == [0.0, 0.4, 0.8]  # every 4 ticks of 0.1 s
    assert all(r["cv"] == [0.0, 0.0, 0.0] for r in rows)  # constant velocity never turns
    assert max(r["expert"][2] for r in rows) > 5.0  # the expert's left turn: 4 s waypoint well to the left
    # a second expert planner, bound to the same world, plans what the driving expert plans
    assert all(r["twin"] == r["expert"] for r in rows)
    assert "t_left: expert Completed" in capsys.readouterr().out


def test_probe_refuses_a_model_without_a_label_a_bad_frame_size_and_an_unknown_route(tmp_path):
    with pytest.raises(probe.ProbeError, match="LABEL=PATH"):
        _main(["--route", "t_left", "--out", str(tmp_path), "constant-velocity"])
    with pytest.raises((SystemExit, WamDiffError), match="expected WxH"):  # the frame size is the world's to check
        _main(["--route", "roundabout_01", "--out", str(tmp_path), "--frame-size", "12", "cv=constant-velocity"])
    with pytest.raises(probe.ProbeError, match="not in suite"):
        _main(["--route", "no_such_route", "--out", str(tmp_path), "cv=constant-velocity"])
