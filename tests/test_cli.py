import json

import pytest

from wam_diff_core.cli import main


def test_bench_writes_rows_with_exact_forward_counts(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", "nano", "--block-sizes", "1,4", "--steps", "2", "--new-tokens", "8",
               "--repeats", "1", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["model"] == "nano" and result["params"] > 5e6
    ar, block = result["rows"]
    for row in (ar, block):
        assert set(row) >= {"block_size", "steps", "batch_size", "tokens_per_s", "ms_per_token", "forwards_per_token",
                            "speedup_vs_ar", "peak_mem_mb"}
    assert (ar["block_size"], ar["speedup_vs_ar"]) == (1, 1.0)
    assert ar["forwards_per_token"] == pytest.approx(7 / 8)  # the first token comes from the prefill
    assert block["forwards_per_token"] == pytest.approx(4 / 8)  # 2 blocks x K = 2, commits fused
    assert block["forwards_per_token_unfused"] == pytest.approx(5 / 8)  # + 1 separate commit forward
    assert "speedup" in capsys.readouterr().out


def test_decode_prints_a_plan_as_json(capsys):
    rc = main(["decode", "--model", "nano", "--block-size", "8", "--steps", "2", "--max-new-tokens", "16"])
    assert rc == 0
    out = capsys.readouterr().out
    plan = json.loads(out[out.index("{"):])
    assert plan["valid"] is False  # random weights
    assert plan["tokens"] == 16 and plan["forwards"] == 1 + 2 * 2
    assert set(plan["timings_ms"]) >= {"vision", "prefill", "denoise", "total"}


def test_unknown_command_exits_with_usage_error():
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2


def test_bad_block_size_list_is_named(tmp_path):
    with pytest.raises(ValueError, match="x,y"):
        main(["bench", "--block-sizes", "x,y", "--out", str(tmp_path / "b.json")])


@pytest.mark.parametrize("bad", ["25", "25,x", "nan,1"])
def test_decode_target_must_be_two_finite_numbers(bad, capsys):
    assert main(["decode", "--model", "nano", "--target", bad]) == 2
    assert capsys.readouterr().err.startswith(f"wam-diff decode: error: --target {bad!r}")


def _checkpoint_with_steps(nano, path, steps: int):
    import dataclasses

    from wam_diff_core.model.checkpoint import save_model

    settings = nano.settings.for_block_size(16)
    settings = dataclasses.replace(settings, decoding=dataclasses.replace(settings.decoding, steps=steps))
    return save_model(dataclasses.replace(nano, settings=settings), path)


def test_decode_takes_the_checkpoints_own_steps_unless_given(nano, tmp_path, monkeypatch, capsys):
    from wam_diff_core import policy as policy_mod

    ckpt = _checkpoint_with_steps(nano, tmp_path / "k8", 8)
    used, real = [], policy_mod.generate
    monkeypatch.setattr(policy_mod, "generate", lambda runner, batch, cfg, *a: used.append(cfg) or real(runner, batch, cfg, *a))
    assert main(["decode", "--model", str(ckpt), "--max-new-tokens", "16"]) == 0
    assert main(["decode", "--model", str(ckpt), "--max-new-tokens", "16", "--steps", "2"]) == 0
    assert main(["decode", "--model", str(ckpt), "--max-new-tokens", "16", "--block-size", "1"]) == 0
    assert [(c.block_size, c.steps) for c in used] == [(16, 8), (16, 2), (1, 1)]
    capsys.readouterr()


def test_demo_runs_the_shipped_model_with_its_own_settings_by_default(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo.json"), "--max-new-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "models/nano-s-b32" in out.splitlines()[0]
    results = json.loads((tmp_path / "demo.json").read_text())
    assert list(results) == ["AR (B=1)", "block diffusion (B=32, K=4)"]  # K: its wam_diff.json's


def test_report_moved_to_the_training_command():
    from wam_diff_training.cli import COMMANDS as TRAINING_COMMANDS
    from wam_diff_core.cli import COMMANDS

    assert "report" not in COMMANDS and TRAINING_COMMANDS["report"][0] == "wam_diff_training.report.report"
    with pytest.raises(SystemExit) as exc:
        main(["report", "--spec", "wam_diff_training/configs/report.yaml", "--out", "runs/report"])
    assert exc.value.code == 2
