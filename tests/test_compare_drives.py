"""`wam-diff compare-drives` (wam_diff_core.eval.compare_drives): closed-loop runs side by side (table, JSON, plot)
from drive summaries."""
import argparse
import json

import pytest

from wam_diff_core.cli import main as wam_diff_main
from wam_diff_core.eval import compare_drives as compare


def _main(argv: list) -> int:
    """The command as `wam-diff compare-drives` runs it, its errors raised rather than printed."""
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    return compare.run(parser.parse_args(argv))


def test_compare_reads_drive_summaries_and_writes_the_table_json_and_plot(tmp_path, capsys):
    pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")
    from wam_diff_core.sim.closed_loop import drive_suite
    from wam_diff_core.sim.routes import Route

    short = [Route("t_highway", "highway", 11, 1.0, 60.0, 10.0, {"lanes": 3, "vehicles": 8, "ego_speed": 20.0}),
             Route("t_left", "intersection", 9, 1.0, 90.0, 25.0, {"destination": "o1"})]
    a = drive_suite(short, "expert-plan", tmp_path / "a", frame_size=(64, 32), replan_every=4, progress=False)
    b = drive_suite(short, "constant-velocity", tmp_path / "b", frame_size=(64, 32), replan_every=4, progress=False,
                    realtime=True)
    out = tmp_path / "cmp"
    assert wam_diff_main(["compare-drives", "--out", str(out), f"expert plans={tmp_path / 'a'}",
                          f"cv={tmp_path / 'b' / 'summary.json'}"]) == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in rows] == ["expert plans", "cv"]
    assert rows[0]["driving_score"] == pytest.approx(a["driving_score"])
    assert rows[1]["driving_score"] == pytest.approx(b["driving_score"])
    # realtime: a plan is used from the first tick after it is ready, so even an instant policy lags (up to) one tick
    assert rows[1]["realtime"] is True and rows[1]["latency_ticks_mean"] == b["latency_ticks_mean"] <= 1.0
    assert rows[0]["per_scenario"]["intersection"] == pytest.approx(a["routes"]["t_left"]["score"])
    assert rows[0]["plans"] == a["plans"] > 0 and rows[0]["frame_size"] == [64, 32]
    table = (out / "compare.md").read_text()
    assert table.splitlines()[2].startswith(f"| expert plans | {a['driving_score']:.1f} |")
    assert (out / "compare.png").stat().st_size > 1000 and table in capsys.readouterr().out


def test_compare_names_a_malformed_or_unreadable_run(tmp_path, capsys):
    with pytest.raises(compare.DriveSummaryError, match="LABEL=PATH"):
        _main(["--out", str(tmp_path), "no-label"])
    with pytest.raises(compare.DriveSummaryError, match="cannot read"):
        _main(["--out", str(tmp_path), f"x={tmp_path / 'missing'}"])
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(compare.DriveSummaryError, match="not a wam-diff drive summary"):
        _main(["--out", str(tmp_path), f"x={tmp_path / 'other.json'}"])
    assert wam_diff_main(["compare-drives", "--out", str(tmp_path), "no-label"]) == 2
    assert capsys.readouterr().err.startswith("wam-diff compare-drives: error: 'no-label': expected LABEL=PATH")


def test_runs_pool_and_select_by_traffic_offset(tmp_path):
    """'+' pools runs, '#offsets' keeps routes by traffic seed offset; DS and SR are recomputed over what is kept."""
    def summary(scores: dict) -> dict:
        return {"driving_score": -1.0, "success_rate": -1.0, "plans": 99, "frame_size": [64, 32],
                "routes": {rid: {"score": s, "success": s == 100.0, "scenario": "highway", "infractions": []}
                           for rid, s in scores.items()}}

    (tmp_path / "a.json").write_text(json.dumps(summary({"h_00": 100.0, "h_00_s50000": 40.0, "h_00_s60000": 70.0})))
    (tmp_path / "b.json").write_text(json.dumps(summary({"h_01": 20.0})))
    assert compare.traffic_offset("h_00") == 0 and compare.traffic_offset("cut_in_03_s60000") == 60000
    _, new = compare.load_run(f"x={tmp_path / 'a.json'}#50000,60000")
    assert (new["num_routes"], new["driving_score"], new["success_rate"]) == (2, 55.0, 0.0) and "plans" not in new
    _, suite = compare.load_run(f"x={tmp_path / 'a.json'}#0+{tmp_path / 'b.json'}")
    assert sorted(suite["routes"]) == ["h_00", "h_01"] and suite["driving_score"] == 60.0 and suite["success_rate"] == 50.0
    assert suite["frame_size"] == [64, 32]
    with pytest.raises(compare.DriveSummaryError, match="more than one pooled run"):
        compare.load_run(f"x={tmp_path / 'a.json'}+{tmp_path / 'a.json'}")
    with pytest.raises(compare.DriveSummaryError, match="keeps no route"):
        compare.load_run(f"x={tmp_path / 'b.json'}#70000")
    with pytest.raises(compare.DriveSummaryError, match="seed offsets, got 'new'"):
        compare.load_run(f"x={tmp_path / 'b.json'}#new")
