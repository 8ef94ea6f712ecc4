"""`wam-diff-train l2-gap` (wam_diff_training.report.l2_gap_cli): paired planning L2 of several models with bootstrap
intervals of the gap to a reference."""
import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wam_diff_core.codec import format_trajectory
from wam_diff_core.eval.l2 import l2_per_horizon, l2_per_sample
from wam_diff_training.cli import main as train_main
from wam_diff_training.report import l2_gap_cli as gap
from wam_diff_training.report.l2_gap import compare, tail
from wam_diff_core.model.checkpoint import load_model, save_model


def _main(argv: list) -> int:
    """The command as `wam-diff-train l2-gap` runs it, its errors raised rather than printed."""
    parser = argparse.ArgumentParser()
    gap.add_arguments(parser)
    return gap.run(parser.parse_args(argv))


def test_per_sample_errors_average_to_the_per_horizon_errors():
    rng = np.random.default_rng(0)
    pred, gt = rng.normal(size=(5, 8, 2)), rng.normal(size=(5, 8, 2))
    per = l2_per_sample(pred, gt)
    assert per.shape == (5, 8)
    np.testing.assert_allclose(per[2, 3], np.hypot(*(pred[2, 3] - gt[2, 3])))
    np.testing.assert_allclose(per.mean(0), l2_per_horizon(pred, gt))
    assert l2_per_sample(pred[0], gt[0]).shape == (1, 8)
    with pytest.raises(ValueError, match="shape"):
        l2_per_sample(pred[:, :4], gt[:, :4])


def test_gap_intervals_and_verdicts():
    rng = np.random.default_rng(1)
    ref = rng.uniform(1.0, 3.0, size=(400, 8))
    same, worse = ref.copy(), ref * 1.2
    noisy = ref * rng.uniform(0.7, 1.4, size=(400, 1))  # +5 % on average, wide spread
    rows = compare([ref, same, worse, noisy], bound=0.05)
    assert rows[1]["gap"] == pytest.approx(0.0) and rows[1]["gap_ci"] == pytest.approx([0.0, 0.0])
    assert rows[1]["verdict"] == "within"
    assert rows[2]["gap"] == pytest.approx(0.2) and rows[2]["gap_ci"] == pytest.approx([0.2, 0.2])
    assert rows[2]["verdict"] == "outside"
    lo, hi = rows[3]["gap_ci"]
    assert lo < rows[3]["gap"] < hi and lo < 0.05 < hi and rows[3]["verdict"] == "undecided"
    assert rows[0]["l2_mean"] == pytest.approx(ref.mean())
    assert rows[0]["l2_mean_ci"][0] < ref.mean() < rows[0]["l2_mean_ci"][1]
    assert len(rows[0]["per_horizon_ci"]) == 8


def test_per_horizon_difference_is_paired_and_signed():
    rng = np.random.default_rng(2)
    ref = rng.uniform(1.0, 3.0, size=(300, 8)) * np.linspace(1.0, 4.0, 8)  # errors grow with the horizon
    # worse by 0.3 m at the first waypoints, better by 0.5 m at the last, plus per-plan noise
    shift = np.linspace(0.3, -0.5, 8)
    model = ref + shift + rng.normal(0.0, 0.05, size=ref.shape)
    row = compare([ref, model])[1]
    np.testing.assert_allclose(row["per_horizon_diff"], shift, atol=0.02)
    lo, hi = row["per_horizon_diff_ci"][-1]
    assert lo < -0.5 + 0.02 and hi > -0.5 - 0.02 and hi < 0  # better at 4 s, and the interval says so
    lo, hi = row["per_horizon_diff_ci"][0]
    assert 0 < lo < 0.3 < hi < 0.32  # paired: the interval is tight although plans differ by metres
    assert compare([ref, ref])[1]["per_horizon_diff_ci"][3] == pytest.approx([0.0, 0.0])


def test_tail_says_how_much_of_a_gap_a_few_plans_hold():
    ref = np.full(100, 2.0)
    few = ref.copy()
    few[[7, 42, 99]] += [10.0, 6.0, 4.0]  # the whole excess (20 m) in 3 plans
    out = tail(ref, few, [f"p{i}" for i in range(100)])
    assert out["tail_plans"] == 3 and out["tail_share"] == pytest.approx(1.0) and out["median_diff"] == 0.0
    assert [w["id"] for w in out["worst"][:3]] == ["p7", "p42", "p99"]
    assert out["worst"][0] == {"id": "p7", "reference": 2.0, "model": 12.0}
    spread = ref + 0.2  # the same excess in every plan: the worst 3 % hold 3 % of it
    assert tail(ref, spread)["tail_share"] == pytest.approx(0.03) and "worst" not in tail(ref, spread)
    assert tail(ref, ref - 0.1)["tail_share"] is None  # better in sum: no share of a gap
    rows = compare([np.repeat(ref[:, None], 8, 1), np.repeat(few[:, None], 8, 1)], ids=[f"p{i}" for i in range(100)])
    assert rows[1]["tail_share"] == pytest.approx(1.0) and rows[1]["worst"][0]["id"] == "p7"


def _split(root: Path, n: int = 3) -> Path:
    from wam_diff_core.prompts import planning_prompt
    from wam_diff_core.types import EgoState

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    samples = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)).save(root / f"f{i}.png")
        traj = np.stack([np.arange(1, 9) * (i + 1.0), np.zeros(8)], axis=1)
        samples.append({"id": f"p{i}", "datasource": "toy", "task": "planning", "image": [f"f{i}.png"],
                        "conversations": [{"from": "human", "value": "<image>\n" + planning_prompt(EgoState(2.0 * i), "follow lane")},
                                          {"from": "gpt", "value": format_trajectory(traj, "fixed")}]})
    path = root / "val.json"
    path.write_text(json.dumps(samples))
    return path


def _checkpoint(nano_ckpt, path: Path, block_size: int = 1, steps: int = 1) -> Path:
    """The nano checkpoint with the fixed trajectory style, its wam_diff.json saying it decodes at B and K."""
    fixed = load_model(nano_ckpt)
    settings = fixed.settings.for_block_size(block_size)
    fixed.settings = dataclasses.replace(settings, trajectory_format="fixed",
                                         decoding=dataclasses.replace(settings.decoding, steps=steps))
    save_model(fixed, path)
    return path


def test_main_decodes_each_model_and_writes_table_json_and_plot(nano_ckpt, tmp_path, capsys):
    _checkpoint(nano_ckpt, tmp_path / "fixed")  # trained and decoded at B = 1
    split, out = _split(tmp_path / "data"), tmp_path / "gap"
    args = ["--data", str(split), "--samples", "3", "--out", str(out), f"a={tmp_path / 'fixed'}", f"b={tmp_path / 'fixed'}"]
    assert _main(args) == 0
    result = json.loads((out / "l2_gap.json").read_text())
    a, b = result["models"]
    assert result["reference"] == "a" and result["plans"] == 3 and a["invalid"] == b["invalid"] == 0  # the grammar
    assert b["gap"] == pytest.approx(0.0) and b["verdict"] == "within"  # one model twice: the same plans
    assert (out / "l2_gap.png").stat().st_size > 0 and "| b | 1 | 1 |" in (out / "l2_gap.md").read_text()
    assert b["steps"] == 1 and b["tokens_per_s"] > 0  # B = 1: one step per token, the decode's own clock
    assert b["decoding"]["forward_only"] is False and result["decoding"] == {}  # the checkpoint's own, no option

    # --resume scores the predictions it finds: a hand-written plan for each id, exact errors
    rows = [json.loads(l) for l in (out / "predictions" / "b_planning.jsonl").read_text().splitlines()]
    for row in rows:
        row["text"] = format_trajectory(np.stack([np.arange(1, 9) * (int(row["id"][1:]) + 1.0), np.full(8, 3.0)], axis=1))
    (out / "predictions" / "b_planning.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _main(args + ["--resume"]) == 0
    b = json.loads((out / "l2_gap.json").read_text())["models"][1]
    assert b["per_horizon"] == pytest.approx([3.0] * 8)  # 3 m to the side at every horizon
    assert b["per_horizon_diff"] == pytest.approx((np.asarray(b["per_horizon"]) - a["per_horizon"]).tolist())
    assert "Paired difference to the reference by horizon" in (out / "l2_gap.md").read_text()
    assert b["l2_mean"] == pytest.approx(3.0)
    # @BxK decodes the checkpoint at another block size and K, recorded as such
    assert _main(["--resume"] + args + [f"c={tmp_path / 'fixed'}@4x2"]) == 0
    c = json.loads((out / "l2_gap.json").read_text())["models"][2]
    assert (c["block_size"], c["steps"], c["invalid"]) == (4, 2, 0)
    assert json.loads((out / "predictions" / "c_planning.decode.json").read_text())["block_size"] == 4
    # :cosine decodes with the cosine commit schedule, recorded as such; asking "c" for it is refused
    assert _main(["--resume"] + args + [f"c={tmp_path / 'fixed'}@4x2", f"d={tmp_path / 'fixed'}@4x2:cosine"]) == 0
    d = json.loads((out / "l2_gap.json").read_text())["models"][3]
    assert (d["block_size"], d["steps"], d["schedule"], d["invalid"]) == (4, 2, "cosine", 0)
    with pytest.raises(gap.ModelSpecError, match="schedule linear, forward only False, asked for B = 4, K = 2, schedule cosine"):
        _main(["--resume"] + args + [f"c={tmp_path / 'fixed'}@4x2:cosine"])
    # so is a file decoded without the forward-only bound, asked with it
    with pytest.raises(gap.ModelSpecError, match="schedule linear, forward only False, asked for .* forward only True"):
        _main(["--resume", "--forward-only", "on"] + args + [f"c={tmp_path / 'fixed'}@4x2"])
    # a resumed file decoded with another K is refused, not mislabelled
    (out / "predictions" / "b_planning.decode.json").write_text(json.dumps({"steps": 4}))
    with pytest.raises(gap.ModelSpecError, match="decoded with B = 1, K = 4, schedule linear, forward only False, asked for B = 1, K = 1"):
        _main(args + ["--resume"])


def test_a_checkpoint_decodes_at_its_own_steps_unless_the_spec_or_the_options_say_otherwise(nano_ckpt, tmp_path):
    ckpt = _checkpoint(nano_ckpt, tmp_path / "k8", block_size=16, steps=8)  # its wam_diff.json: B = 16, K = 8
    split, out = _split(tmp_path / "data", n=2), tmp_path / "gap"
    assert _main(["--data", str(split), "--samples", "2", "--out", str(out), f"own={ckpt}", f"k2={ckpt}@2"]) == 0
    own, k2 = json.loads((out / "l2_gap.json").read_text())["models"]
    assert (own["block_size"], own["steps"]) == (16, 8) and (k2["block_size"], k2["steps"]) == (16, 2)
    assert own["decoding"]["steps"] == 8 and k2["decoding"]["steps"] == 2
    assert json.loads((out / "predictions" / "own_planning.decode.json").read_text())["steps"] == 8
    # --steps lays K on every model; a spec's own @K still wins; B = 1 takes one step whatever K
    assert _main(["--data", str(split), "--samples", "2", "--out", str(tmp_path / "gap4"), "--steps", "4",
                  f"own={ckpt}", f"k2={ckpt}@2", f"ar={ckpt}@1x8"]) == 0
    rows = json.loads((tmp_path / "gap4" / "l2_gap.json").read_text())
    assert [(m["block_size"], m["steps"]) for m in rows["models"]] == [(16, 4), (16, 2), (1, 1)]
    assert rows["decoding"] == {"steps": 4}
    # the saved K = 8 decode is not taken for a K = 4 one
    with pytest.raises(gap.ModelSpecError, match="decoded with B = 16, K = 8, .* asked for B = 16, K = 4"):
        _main(["--data", str(split), "--samples", "2", "--out", str(out), "--resume", "--steps", "4", f"own={ckpt}"])


def test_speed_pass_decodes_each_entry_as_its_checkpoint_and_suffixes_say(nano_ckpt, tmp_path, capsys):
    from wam_diff_training.report import speed_pass

    ckpt = _checkpoint(nano_ckpt, tmp_path / "k8", block_size=16, steps=8)
    split, out = _split(tmp_path / "data", n=2), tmp_path / "speed"
    parser = argparse.ArgumentParser()
    speed_pass.add_arguments(parser)
    args = ["--data", str(split), "--samples", "2", "--out", str(out), f"own={ckpt}", f"k2={ckpt}@2:cosine:raw",
            f"fwd={ckpt}@4x2:forward"]
    assert speed_pass.run(parser.parse_args(args)) == 0
    own, k2, fwd = json.loads((out / "speed.json").read_text())["models"]
    assert (own["block_size"], own["steps"], own["schedule"], own["kinematic_envelope"], own["forward_only"]) == \
        (16, 8, "linear", True, False)
    assert (k2["block_size"], k2["steps"], k2["schedule"], k2["kinematic_envelope"]) == (16, 2, "cosine", False)
    assert (fwd["block_size"], fwd["steps"], fwd["forward_only"]) == (4, 2, True)
    assert own["x_reference"] == pytest.approx(1.0) and own["tokens"] > 0
    table = capsys.readouterr().out
    assert "| own | 16 | 8 | on |" in table and "| k2 | 16 | 2 | off |" in table
    assert "| fwd | 4 | 2 | forward |" in table
    # --forward-only on lays the bound on every entry but the one whose suffix says :envelope
    assert speed_pass.run(parser.parse_args(args[:7] + [f"env={ckpt}:envelope", "--forward-only", "on"])) == 0
    own, env = json.loads((out / "speed.json").read_text())["models"]
    assert (own["forward_only"], env["forward_only"], env["kinematic_envelope"]) == (True, False, True)
    assert speed_pass.split_envelope("a=m@2:raw") == ("a=m@2", {"kinematic_envelope": False})
    assert speed_pass.envelope_name({"kinematic_envelope": False, "forward_only": True}) == "off"


def test_bad_model_arguments_exit_naming_them(tmp_path):
    assert gap.parse_model(f"a={tmp_path}@8") == ("a", str(tmp_path), None, 8)
    assert gap.parse_model(f"a={tmp_path}@16x2") == ("a", str(tmp_path), 16, 2)
    assert gap.parse_model(f"a={tmp_path}") == ("a", str(tmp_path), None, None)  # unset: the checkpoint's own
    assert gap.split_schedule(f"a={tmp_path}@16x2:cosine") == (f"a={tmp_path}@16x2", "cosine")
    assert gap.split_schedule(f"a={tmp_path}") == (f"a={tmp_path}", None)
    for bad in ("x", "16x", "0", "1x2x3"):
        with pytest.raises(gap.ModelSpecError, match=f"expected K or BxK .* got '{bad}'"):
            gap.parse_model(f"a={tmp_path}@{bad}")
    with pytest.raises(gap.ModelSpecError, match="expected LABEL=CHECKPOINT_DIR"):
        _main(["--data", "x.json", "--out", str(tmp_path), "nolabel"])
    with pytest.raises(gap.ModelSpecError, match="not found"):
        _main(["--data", "x.json", "--out", str(tmp_path), f"a={tmp_path / 'missing'}"])


def test_the_command_prints_a_bad_model_argument_as_one_line(tmp_path, capsys):
    assert train_main(["l2-gap", "--data", "x.json", "--out", str(tmp_path), "nolabel"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["wam-diff-train l2-gap: error: 'nolabel': expected LABEL=CHECKPOINT_DIR[@K | @BxK]"]


def _predictions(path: Path, side: float, n: int = 3, broken: tuple = ()) -> Path:
    """Plans 'side' metres beside each reference trajectory of _split (ids in `broken`: garbage text)."""
    rows = [{"id": f"p{i}", "text": "not a plan" if f"p{i}" in broken else
             format_trajectory(np.stack([np.arange(1, 9) * (i + 1.0), np.full(8, side)], axis=1))} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gap_to_reference_pairs_the_plans_both_models_parse(tmp_path):
    from wam_diff_training.report.l2_gap import gap_to_reference, ground_truth

    truth = ground_truth(_split(tmp_path / "data"))
    ref = _predictions(tmp_path / "ref.jsonl", 1.0)
    worse = _predictions(tmp_path / "worse.jsonl", 1.5, broken=("p1",))
    gap = gap_to_reference(truth, ref, worse)
    assert gap["plans"] == 2 and gap["gap"] == pytest.approx(0.5) and gap["gap_ci"] == pytest.approx([0.5, 0.5])
    assert gap["verdict"] == "outside" and gap["bound"] == 0.05
    assert gap_to_reference(truth, ref, ref)["verdict"] == "within"
    none = _predictions(tmp_path / "none.jsonl", 1.0, broken=("p0", "p1", "p2"))
    assert gap_to_reference(truth, ref, none) is None


def test_report_rows_show_the_gap_to_their_ar_model(tmp_path):
    from types import SimpleNamespace

    from wam_diff_training.report import Report
    from wam_diff_training.report.table import COLUMNS, render

    split = _split(tmp_path / "data")

    def model(name, B, params, side):
        path = _predictions(tmp_path / f"{name}.jsonl", side)
        return {"name": name, "block_size": B, "parameters": params,
                "open_loop": {"planning": {"predictions": str(path), "samples": 3, "steps": 1}}}

    models = [model("big AR", 1, 20, 0.5), model("AR", 1, 7, 1.0), model("B32", 32, 7, 1.2), model("big B32", 32, 20, 1.0)]
    Report.add_l2_gaps(SimpleNamespace(spec=SimpleNamespace(data={"planning": str(split)})), models)
    assert "l2_gap" not in models[0] and "l2_gap" not in models[1]  # AR rows are the references
    assert models[2]["l2_gap"]["reference"] == "AR" and models[2]["l2_gap"]["gap"] == pytest.approx(0.2)
    assert models[3]["l2_gap"]["reference"] == "big AR" and models[3]["l2_gap"]["gap"] == pytest.approx(1.0)
    md = render({"spec": "s.yaml", "machine": "cpu", "written": "now", "decoding": {"strategy": "x", "threshold": 0.9},
                 "models": models})
    row = next(line for line in md.splitlines() if line.startswith("| B32 |")).split(" | ")
    assert row[COLUMNS.index("L2 vs AR (95 %)")] == "+20.0 % (+20.0 to +20.0)"
    ar_row = next(line for line in md.splitlines() if line.startswith("| AR |")).split(" | ")
    assert ar_row[COLUMNS.index("L2 vs AR (95 %)")] == "-"


def test_dtype_is_the_weights_not_a_decoding_setting(nano_ckpt, tmp_path):
    _checkpoint(nano_ckpt, tmp_path / "fixed")
    out = tmp_path / "gap"
    args = ["--data", str(_split(tmp_path / "data")), "--samples", "1", "--out", str(out), "--dtype", "float32",
            f"a={tmp_path / 'fixed'}"]
    assert _main(args) == 0
    result = json.loads((out / "l2_gap.json").read_text())
    assert result["decoding"] == {"dtype": "float32"} and result["models"][0]["invalid"] == 0
