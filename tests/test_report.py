"""`wam-diff-train report` on the nano model and a tiny three-task dataset written here."""
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from wam_diff_training.cli import main as train_main
from wam_diff_training.data import spaced_indices
from wam_diff_training.report import Report
from wam_diff_training.report.spec import SpecError, load_spec, parse_spec
from wam_diff_training.report.table import COLUMNS
from wam_diff_core.model.checkpoint import save_model

EGO_VX = 3.0  # m/s; TRAJ drives 2 m/s, so constant velocity is 0.5 m off per waypoint (4 m at 4 s)
TRAJ = "1.00,0.00,2.00,0.00,3.00,0.00,4.00,0.00,5.00,0.00,6.00,0.00,7.00,0.00,8.00,0.00"


def _dataset(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    samples = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)).save(root / f"f{i}.png")
        samples += [
            {"id": f"p{i}", "datasource": "toy", "task": "planning", "image": [f"f{i}.png"],
             "conversations": [{"from": "human", "value": "<image>\nPlan the next 4 s."}, {"from": "gpt", "value": TRAJ}],
             "meta": {"ego": [EGO_VX, 0.0, 0.0, 0.0, 0.0]}},
            {"id": f"d{i}", "datasource": "toy", "task": "detection", "image": [f"f{i}.png"],
             "conversations": [{"from": "human", "value": "<image>\nDetect every vehicle."},
                               {"from": "gpt", "value": '[{"bbox_2d":[10,20,30,40],"label":"car"}]'}]},
            {"id": f"q{i}", "datasource": "toy", "task": "qa", "image": [f"f{i}.png"],
             "conversations": [{"from": "human", "value": "<image>\nHow many cars?"}, {"from": "gpt", "value": str(i)}]},
        ]
    path = root / "val.json"
    path.write_text(json.dumps(samples))
    return path


@pytest.fixture(scope="module")
def setup(nano, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    ckpt = root / "nano"
    save_model(nano, ckpt)
    val = _dataset(root / "data")
    spec = {
        "data": {"planning": str(val), "detection": str(val), "qa": str(val)},
        "samples": {"planning": 4, "detection": 2, "qa": 3},
        "max_new_tokens": {"planning": 12, "detection": 8, "qa": 8},
        "decoding": {"steps": 2, "strategy": "low_confidence_dynamic", "threshold": 0.9},
        "closed_loop": {"ids": ["highway_00"], "frame_size": "128x64", "replan_every": 5},
        "models": [
            {"name": "AR", "path": str(ckpt), "block_size": 1, "closed_loop": False},
            {"name": "teacher B4", "path": str(ckpt), "block_size": 4, "closed_loop": False},
            {"name": "student B4", "path": str(ckpt), "block_size": 4, "teacher": "teacher B4", "closed_loop": False},
            {"name": "student B4 vs AR", "path": str(ckpt), "block_size": 4, "teacher": "AR", "closed_loop": False},
        ],
        "sweeps": {"steps": {"model": "teacher B4", "values": [1, 4]},
                   "block_size": {"model": "teacher B4", "values": [1, 2, 4]}},
        "baselines": ["constant-velocity"],
    }
    # the traffic-response probe of one closed-loop model (random weights: plan pairs or invalid ones)
    spec_cl = {**spec, "models": [{"name": "B4 driven", "path": str(ckpt), "block_size": 4}], "sweeps": {},
               "data": {"planning": str(val)}, "baselines": [],
               "sensitivity": {"ids": ["highway_00"], "max_seconds": 1, "every": 10}}
    (root / "spec_cl.yaml").write_text(yaml.safe_dump(spec_cl))
    spec_path = root / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    return root, spec_path, spec


def test_spaced_indices_cover_the_whole_split():
    assert spaced_indices(100, 5) == [0, 25, 50, 74, 99]
    assert spaced_indices(3, 10) == [0, 1, 2]


def test_report_writes_table_json_plots_and_agreement_numbers(setup):
    root, spec_path, _ = setup
    out = root / "out"
    assert train_main(["report", "--spec", str(spec_path), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    by_name = {m["name"]: m for m in report["models"]}
    ar, b4 = by_name["AR"], by_name["teacher B4"]
    assert (ar["block_size"], ar["open_loop"]["planning"]["steps"]) == (1, 1)
    assert (b4["block_size"], b4["open_loop"]["planning"]["steps"]) == (4, 2)
    for task, n in (("planning", 4), ("detection", 2), ("qa", 3)):
        res = ar["open_loop"][task]
        assert res["samples"] == n and res["tokens"] > 0 and res["tokens_per_s"] > 0
        lines = Path(res["predictions"]).read_text().splitlines()
        assert len(lines) == n
    # B = 1: exactly one forward per produced token (EOS included)
    assert ar["open_loop"]["planning"]["forwards_per_token"] == pytest.approx(1.0)
    assert b4["open_loop"]["planning"]["forwards_per_token"] < 1.0
    # the same weights at the same block size agree with themselves exactly; with the AR reading they do not
    same = by_name["student B4"]["agreement"]
    assert same["top5"] == pytest.approx(1.0) and same["jsd"] == pytest.approx(0.0, abs=1e-6)
    vs_ar = by_name["student B4 vs AR"]["agreement"]
    assert vs_ar["teacher_block_size"] == 1 and vs_ar["top5"] < 1.0 and vs_ar["jsd"] > 1e-4
    assert same["masked_tokens"] == vs_ar["masked_tokens"] > 0  # same seeded corruption for both students
    # the speed pass: every model over the same planning samples in one run; the table's x AR uses it
    speed = report["speed"]
    assert speed["samples"] == 4 and set(speed["models"]) == set(by_name)
    assert speed["models"]["AR"]["forwards_per_token"] == pytest.approx(1.0)
    assert speed["models"]["teacher B4"]["forwards_per_token"] < 1.0
    # closed loop: the baseline drove its one route
    cv = report["baselines"]["constant-velocity"]
    assert cv["num_routes"] == 1 and 0.0 <= cv["driving_score"] <= 100.0
    # open loop: the baseline's plans on the models' planning samples, 0.5 m more per waypoint
    cv_l2 = cv["open_loop"]["planning"]["scores"]
    assert cv_l2["samples"] == 4
    assert (cv_l2["l2_1.0s"], cv_l2["l2_4.0s"], cv_l2["l2_mean"]) == pytest.approx((1.0, 4.0, 2.25))
    # sweeps and plots
    assert [p["steps"] for p in report["sweeps"]["steps"]["points"]] == [1, 4]
    bs = report["sweeps"]["block_size"]["points"]
    assert [p["block_size"] for p in bs] == [1, 2, 4] and bs[0]["forwards_per_token"] == pytest.approx(1.0)
    for rel in report["plots"].values():
        assert (out / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in md
    assert md.count("\n| AR | 1 | 1 |") == 1
    cv_row = next(line for line in md.splitlines() if line.startswith("| constant-velocity |")).split(" | ")
    assert (cv_row[COLUMNS.index("L2 4s")], cv_row[COLUMNS.index("L2 mean")], cv_row[COLUMNS.index("unparsable")]) == \
        ("4.00", "2.25", "0/4")
    ar_row = next(line for line in md.splitlines() if line.startswith("| AR |")).split(" | ")
    assert ar_row[COLUMNS.index("x AR")] == "1.00"


def test_resume_reuses_cached_model_results(setup):
    root, _, spec = setup
    small = {**spec, "models": spec["models"][:1], "sweeps": {}, "data": {"qa": spec["data"]["qa"]}}
    spec_path = root / "small.yaml"
    spec_path.write_text(yaml.safe_dump(small))
    out = root / "out_resume"
    assert train_main(["report", "--spec", str(spec_path), "--out", str(out), "--no-progress",
                       "--no-closed-loop"]) == 0
    cached = out / "models" / "ar.json"
    doc = json.loads(cached.read_text())
    doc["open_loop"]["qa"]["tokens_per_s"] = 12345.0  # marker: resume must not recompute
    cached.write_text(json.dumps(doc))
    assert train_main(["report", "--spec", str(spec_path), "--out", str(out), "--no-progress",
                       "--no-closed-loop", "--resume"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["models"][0]["open_loop"]["qa"]["tokens_per_s"] == 12345.0
    # the spec later names a teacher for the cached model: resume adds the agreement, keeps the rest
    taught = {**small, "models": [{**spec["models"][0], "teacher": "teacher B4"}, spec["models"][1]]}
    spec_path.write_text(yaml.safe_dump(taught))
    assert train_main(["report", "--spec", str(spec_path), "--out", str(out), "--no-progress",
                       "--no-closed-loop", "--resume"]) == 0
    doc = json.loads(cached.read_text())
    assert doc["open_loop"]["qa"]["tokens_per_s"] == 12345.0
    assert doc["agreement"]["teacher"] == "teacher B4" and 0.0 <= doc["agreement"]["top5"] <= 1.0


def test_bad_specs_name_the_key(setup, tmp_path, capsys):
    _, _, spec = setup
    cases = [
        ({**spec, "models": []}, "models"),
        ({**spec, "decoding": {"strategy": "random"}}, "decoding.strategy"),
        ({**spec, "models": [{"name": "x", "path": "p", "teacher": "nobody"}]}, "teacher 'nobody'"),
        ({**spec, "sweeps": {"steps": {"model": "AR", "values": [0]}}}, "sweeps.steps.values"),
        ({**spec, "closed_loop": {"frame_size": "big"}}, "closed_loop.frame_size"),
        ({**spec, "samples": {"planing": 3}}, "samples"),
        ({**spec, "baselines": ["human"]}, "baselines"),
        ({**spec, "sensitivity": {"ids": []}}, "sensitivity.ids"),
        ({**spec, "sensitivity": {"ids": ["highway_00"], "max_seconds": 0}}, "sensitivity.max_seconds"),
        ({**spec, "models": [{"name": "x", "path": "p", "grammar": False}]}, r"models\[0\]: grammar: false is an open-loop"),
        ({**spec, "decoding": {"number_order": "yes"}}, "decoding.number_order: expected true or false"),
        ({**spec, "models": [{"name": "x", "path": "p", "number_order": 1}]}, r"models\[0\].number_order"),
    ]
    for raw, fragment in cases:
        with pytest.raises(SpecError, match=fragment):
            parse_spec(raw)
    ok = parse_spec({**{k: v for k, v in spec.items() if k != "sweeps"},
                     "models": [{"name": "x", "path": "p", "number_order": False}, {"name": "y", "path": "p"}]})
    assert ok.decoding.number_order is True and [m.number_order for m in ok.models] == [False, None]
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(broken)
    assert train_main(["report", "--spec", str(broken), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"wam-diff-train report: error: {broken}: not valid YAML") and "\n" not in err


def test_report_probes_the_traffic_response_of_closed_loop_models(setup):
    root, _, _ = setup
    out = root / "out_cl"
    spec_cl = str(root / "spec_cl.yaml")
    assert train_main(["report", "--spec", spec_cl, "--out", str(out), "--no-progress", "--no-closed-loop"]) == 0
    cached = out / "models" / "b4_driven.json"
    doc = json.loads(cached.read_text())
    assert "sensitivity" not in doc  # --no-closed-loop: no probe either
    # a closed loop already on record (a whole route with random weights takes minutes): only the probe runs
    doc["closed_loop"] = {"driving_score": 12.5, "success_rate": 0.0, "held_out_driving_score": None}
    cached.write_text(json.dumps(doc))
    assert train_main(["report", "--spec", spec_cl, "--out", str(out), "--no-progress", "--resume"]) == 0
    model = json.loads((out / "report.json").read_text())["models"][0]
    sens = model["sensitivity"]
    assert sens["route_ids"] == ["highway_00"] and sens["routes"] == 1
    assert sens["all"]["probes"] + sens["invalid"] == 2  # t = 0 s and 1 s
    assert (out / "sensitivity" / "b4_driven" / "sensitivity.json").is_file()
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| B4 driven |")).split(" | ")
    expected = "-" if sens["all"].get("response") is None else f"{sens['all']['response']:.2f}"
    assert row[COLUMNS.index("traffic response")] == expected and row[COLUMNS.index("DS")] == "12.5"
    assert "Traffic response" in md


def test_report_counts_its_work_on_one_progress_bar_on_stderr(setup, capsys):
    """Open loop (4 planning samples) + the speed pass (1 model x 4 samples) = 8 items; closed loop off."""
    root, _, _ = setup
    out = root / "out_bar"
    assert train_main(["report", "--spec", str(root / "spec_cl.yaml"), "--out", str(out), "--no-closed-loop"]) == 0
    captured = capsys.readouterr()
    final = [line for line in captured.err.replace("\r", "\n").splitlines() if line.startswith("report: 100%")]
    assert final and "| 8/8 [" in final[-1] and "item/s]" in final[-1]  # elapsed<remaining, rate
    assert "report:" not in captured.out
    # resumed: the cached work leaves the total, the bar counts what this run does
    assert train_main(["report", "--spec", str(root / "spec_cl.yaml"), "--out", str(out), "--no-closed-loop",
                       "--resume"]) == 0
    final = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("report:")]
    assert final and final[-1].startswith("report: 0item [")


def test_held_out_score_averages_the_validation_split_routes_only():
    from wam_diff_training.report import held_out_score
    from wam_diff_core.sim.datagen import VAL_FRACTION, assign_splits
    from wam_diff_core.sim.routes import load_routes

    routes = load_routes()
    held = sorted(r for r, s in assign_splits(routes, VAL_FRACTION).items() if s == "val")
    assert 0 < len(held) < len(routes)
    # held-out routes score 80 except one missing record (0); every other route 10
    per_route = {r.route_id: {"score": 80.0 if r.route_id in held else 10.0} for r in routes}
    del per_route[held[0]]
    out = held_out_score(routes, {"routes": per_route})
    assert out["held_out_routes"] == held
    assert out["held_out_driving_score"] == pytest.approx(80.0 * (len(held) - 1) / len(held))


def test_scenario_scores_and_table_average_per_scenario_and_count_collisions():
    from wam_diff_training.report import scenario_scores
    from wam_diff_training.report.table import scenario_table

    summary = {"routes": {
        "a": {"scenario": "merge", "score": 100.0, "infractions": []},
        "b": {"scenario": "merge", "score": 46.0, "infractions": ["route_deviation"]},
        "c": {"scenario": "cut_in", "score": 60.0, "infractions": ["collision_vehicle"]},
        "d": {"scenario": "cut_in", "score": 30.0, "infractions": ["collision_vehicle", "agent_blocked"]},
    }}
    got = scenario_scores(summary)
    assert got == {"per_scenario": {"cut_in": 45.0, "merge": 73.0}, "collisions": 2}
    md = scenario_table([{"name": "m", "closed_loop": {"driving_score": 59.0, **got}}, {"name": "no loop"}],
                        {"expert": {"driving_score": 95.0, "per_scenario": {"merge": 90.0}, "collisions": 0}})
    lines = md.splitlines()
    assert lines[0] == "| model | cut_in | merge | all | collisions |"
    assert lines[2] == "| m | 45.0 | 73.0 | 59.0 | 2 |" and lines[3] == "| expert | - | 90.0 | 95.0 | 0 |"
    assert len(lines) == 4 and scenario_table([{"name": "x"}], {}) == ""


def test_a_spec_continues_its_base_spec(tmp_path):
    """`base:`: the base's keys first; mappings merge, models merge by name, a cycle and a missing base are named."""
    base = {"data": {"planning": "val.json", "qa": "qa.json"}, "samples": {"planning": 8, "qa": 4},
            "decoding": {"steps": 4, "threshold": 0.9},
            "models": [{"name": "AR", "path": "ar"}, {"name": "B32", "path": "b32", "teacher": "AR"}],
            "baselines": ["expert"]}
    (tmp_path / "specs").mkdir()
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "specs" / "more.yaml").write_text(yaml.safe_dump({
        "base": "../base.yaml", "samples": {"planning": 16}, "baselines": ["constant-velocity"],
        "models": [{"name": "B32", "path": "b32_v2", "teacher": "AR"}, {"name": "new", "path": "n", "teacher": "AR"}]}))
    spec = load_spec(tmp_path / "specs" / "more.yaml")
    assert [(m.name, m.path) for m in spec.models] == [("AR", "ar"), ("B32", "b32_v2"), ("new", "n")]
    assert (spec.samples["planning"], spec.samples["qa"]) == (16, 4)
    assert spec.data == {"planning": "val.json", "qa": "qa.json"} and spec.baselines == ("constant-velocity",)
    assert spec.decoding.steps == 4 and spec.decoding.threshold == 0.9
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump({"base": "loop.yaml", "models": []}))
    with pytest.raises(SpecError, match="base cycle"):
        load_spec(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text(yaml.safe_dump({"base": "nope.yaml"}))
    with pytest.raises(SpecError, match=r"nope.yaml \(the base of .*orphan.yaml\)"):
        load_spec(tmp_path / "orphan.yaml")
    (tmp_path / "badbase.yaml").write_text(yaml.safe_dump({"base": 3}))
    with pytest.raises(SpecError, match="base: expected a report spec path, got 3"):
        load_spec(tmp_path / "badbase.yaml")


def test_the_shipped_report_specs_load():
    specs = sorted((Path(__file__).resolve().parents[1] / "wam_diff_training/configs").glob("report*.yaml"))
    assert {p.name for p in specs} >= {"report.yaml", "report_all.yaml"}
    for path in specs:
        assert load_spec(path).models, path
