"""A user's mistake at a console script is one line `<command>: error: <message>` on stderr and exit status 2.

The bad inputs are the ones a user meets first: a model directory that is not there, a truncated weights
file, a mistyped preset, a mistyped config key, a dataset file that is not there. Each must fail before any
model is built or decoded.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wam_diff_core.cli import main as wam_diff
from wam_diff_core.console import DEBUG_ENV, console_main, strip_debug_flag
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.checkpoint import CheckpointError
from wam_diff_training.cli import main as wam_diff_train

ROOT = Path(__file__).resolve().parents[1]
SMALL_CONFIG = "model: nano\ntrain:\n  max_steps: 1\n  batch_size: 1\neval:\n  enabled: false\n"


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    """Errors print as one line unless a test asks for the traceback; `--debug` sets the variable for child
    processes, so it is set here to be restored (to unset) after each test."""
    monkeypatch.setenv(DEBUG_ENV, "0")


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_a_missing_model_directory_is_one_line_naming_it(capsys, tmp_path):
    missing = tmp_path / "nonexistent"
    assert wam_diff(["decode", "--model", str(missing)]) == 2
    line = one_error_line(capsys, "wam-diff decode")
    assert f"checkpoint directory not found: {missing}" in line and "nano" in line  # the presets it could have been


def test_a_truncated_safetensors_file_is_one_line_naming_it(capsys, tmp_path, nano_ckpt):
    model = shutil.copytree(nano_ckpt, tmp_path / "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert wam_diff(["decode", "--model", str(model)]) == 2
    line = one_error_line(capsys, "wam-diff decode")
    assert f"corrupt checkpoint file {weights}:" in line


def test_an_unknown_preset_is_one_line_listing_the_presets(capsys):
    assert wam_diff(["decode", "--model", "nano2"]) == 2
    line = one_error_line(capsys, "wam-diff decode")
    assert "'nano2' is neither a checkpoint directory nor a preset" in line
    assert "nano, nano-l, qwen3-vl-2b, qwen3-vl-8b" in line


def test_an_unknown_training_config_key_is_one_line_naming_file_key_and_the_likely_one(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("model: nano\ntrain:\n  max_step: 1\n")
    assert wam_diff_train(["ar", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys, "wam-diff-train ar")
    assert f"{config}: unknown config key 'train.max_step'; did you mean 'train.max_steps'?" in line
    assert not (tmp_path / "run").exists()


def test_an_unknown_report_spec_key_is_one_line_naming_file_and_key(capsys, tmp_path):
    import wam_diff_training.cli

    if "report" not in getattr(wam_diff_training.cli, "COMMANDS", {}):
        pytest.skip("this installation has no wam-diff-train report")
    spec = tmp_path / "spec.yaml"
    spec.write_text("data: {planning: val.json}\nmodelz: []\n")
    assert wam_diff_train(["report", "--spec", str(spec), "--out", str(tmp_path / "report")]) == 2
    line = one_error_line(capsys, "wam-diff-train report")
    assert f"{spec}:" in line and "unknown keys ['modelz']" in line
    assert not (tmp_path / "report").exists()


def test_a_missing_dataset_file_is_one_line_before_any_model_is_built(capsys, tmp_path, monkeypatch):
    import wam_diff_training.trainer

    def no_training(*args, **kwargs):
        raise AssertionError("the stage started although its dataset file is missing")

    monkeypatch.setattr(wam_diff_training.trainer, "run_stage", no_training)
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_CONFIG)
    missing = tmp_path / "nonexistent.json"
    assert wam_diff_train(["ar", "--config", str(config), "--data", str(missing), "--out", str(tmp_path / "run")]) == 2
    assert f"dataset file not found: {missing}" in one_error_line(capsys, "wam-diff-train ar")


def test_eval_names_a_missing_dataset_file_before_loading_the_model(capsys, tmp_path):
    missing = tmp_path / "val.json"
    assert wam_diff_train(["eval", "--model", str(tmp_path / "no-model"), "--data", str(missing)]) == 2
    assert f"dataset file not found: {missing}" in one_error_line(capsys, "wam-diff-train eval")


def test_debug_flag_lets_the_error_through_and_is_not_seen_by_the_parser(monkeypatch):
    with pytest.raises(CheckpointError, match="nano2"):
        wam_diff(["decode", "--debug", "--model", "nano2"])
    assert os.environ[DEBUG_ENV] == "1"  # inherited by the processes a command starts


def test_the_installed_script_prints_one_line_and_its_traceback_under_wam_diff_debug(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("optim:\n  learning_rate: 1e-4\n")
    script = Path(sys.executable).parent / "wam-diff-train"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "wam_diff_training.cli"]
    cmd += ["ar", "--config", str(config), "--out", str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1, plain.stderr
    assert plain.stderr.startswith(f"wam-diff-train ar: error: {config}: unknown config key 'optim.learning_rate'")
    debug = subprocess.run(cmd, capture_output=True, text=True, env={**env, DEBUG_ENV: "1"}, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1].startswith("wam_diff_training.config.ConfigError: ")


@console_main("tool", subcommands=True)
def _tool(argv=None, raise_=None):
    if raise_ is not None:
        raise raise_
    return len(argv)


def test_the_wrapper_collapses_a_message_to_one_line_and_names_the_sub_command(capsys):
    assert _tool(["run", "-x"], raise_=WamDiffError("first line\n  second   line\n")) == 2
    assert capsys.readouterr().err == "tool run: error: first line second line\n"
    assert _tool(["-x"], raise_=WamDiffError("bad")) == 2
    assert capsys.readouterr().err == "tool: error: bad\n"


def test_the_wrapper_exits_130_quietly_on_ctrl_c_and_lets_a_bug_keep_its_traceback(capsys):
    assert _tool(["run"], raise_=KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == ""
    with pytest.raises(ZeroDivisionError):
        _tool(["run"], raise_=ZeroDivisionError("a bug"))
    assert _tool(["run", "--debug", "a", "--", "--debug"]) == 4  # removed before `--` only


def test_strip_debug_flag_reports_whether_it_was_given():
    assert strip_debug_flag(["a", "--debug", "b"]) == (["a", "b"], True)
    assert strip_debug_flag(["a", "b"]) == (["a", "b"], False)


def test_every_console_script_reports_errors_as_its_own_command_name():
    pytest.importorskip("rclpy")
    import importlib

    listed = re.search(r'"console_scripts":\s*\[(.*?)\]', (ROOT / "setup.py").read_text(), re.DOTALL).group(1)
    scripts = re.findall(r'"([\w-]+) = ([\w.]+):(\w+)"', listed)
    assert len(scripts) >= 8
    for name, module, func in scripts:
        entry = getattr(importlib.import_module(module), func)
        assert getattr(entry, "console_prog", None) == name, f"{name} = {module}:{func} does not use console_main"
