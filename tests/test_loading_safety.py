"""Loading stays safe, one test (or more) per rule:

1. YAML is read with yaml.safe_load only: a `!!python/...` tag is refused with one line by every loader, never run.
2. Checkpoints are safetensors only: a pickle file is refused and never unpickled, wherever it sits.
3. No remote code: trust_remote_code is never set, a checkpoint whose JSON names code (`auto_map`) is refused.
4. Paths never come from messages: the planner's inputs (an AskQuestion text) are prompt text, and the model
   parameter opens nothing but a checkpoint directory's own files.

Payloads are live: each test first shows that its YAML / pickle creates a marker file when loaded unsafely, then
that the project's loader leaves the marker absent.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors import safe_open

from wam_diff_core.console import one_line
from wam_diff_core.model.checkpoint import CheckpointError, load, load_model

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("wam_diff_core", "wam_diff_ros", "wam_diff_training", "wam_diff_kernels", "launch", "scripts")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def yaml_payload(marker: Path) -> str:
    """YAML that creates `marker` when loaded with yaml.unsafe_load (it calls open(marker, "w"))."""
    return f"x: !!python/object/apply:builtins.open [{json.dumps(str(marker))}, w]\n"


class _Touch:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # unpickling calls open(marker, "w")
        return open, (str(self.marker), "w")


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(_Touch(marker))


# ------------------------------------------------------------------ files opened (audit hook)

_opened: list[str] | None = None
_hook_lock = threading.Lock()
_hook_installed = False


def _audit(event: str, args) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


@contextmanager
def files_opened():
    """The paths Python opens inside the block (sys.addaudithook's "open" events; a hook cannot be removed, so it
    is installed once and records only inside this block)."""
    global _opened, _hook_installed
    with _hook_lock:
        if not _hook_installed:
            sys.addaudithook(_audit)
            _hook_installed = True
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


# ------------------------------------------------------------------ 1. YAML: safe_load only

UNSAFE_YAML = re.compile(r"yaml\.(load|load_all|unsafe_load|unsafe_load_all|full_load|full_load_all)\s*\("
                         r"|yaml\.(C?Loader|C?FullLoader|C?UnsafeLoader)\b")


def test_no_module_loads_yaml_with_a_loader_that_builds_python_objects():
    sources = _sources()
    offending = [f"{p.relative_to(ROOT)}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1)
                 if UNSAFE_YAML.search(line)]
    safe = sum(p.read_text().count("yaml.safe_load(") for p in sources)
    assert len(sources) > 100 and safe >= 6, (len(sources), safe)  # the scan sees the code that reads YAML
    assert offending == []


def test_the_yaml_payload_runs_code_when_loaded_unsafely(tmp_path):
    marker = tmp_path / "ran"
    yaml.unsafe_load(yaml_payload(marker))
    assert marker.exists()


def _one_line_refusal(text: str, path: Path) -> None:
    assert "\n" not in text, text
    assert str(path) in text and "tag !!python/object/apply:builtins.open on line 1 is refused" in text, text


def test_training_config_refuses_a_python_tag_in_one_line(tmp_path, capsys):
    from wam_diff_training.cli import main as train_main
    from wam_diff_training.config import ConfigError, load_config

    marker, path = tmp_path / "ran", tmp_path / "cfg.yaml"
    path.write_text(yaml_payload(marker))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _one_line_refusal(str(info.value), path)
    with pytest.raises(ConfigError, match=r"override 'optim.lr=!!python/name:os.system': tag !!python/name:os.system"):
        load_config(None, ["optim.lr=!!python/name:os.system"])
    assert train_main(["ar", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wam-diff-train ar: error: {path}: tag !!python/") and err.count("\n") == 1, err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_report_spec_refuses_a_python_tag_in_one_line(tmp_path):
    from wam_diff_training.report.spec import SpecError, load_spec

    marker, path = tmp_path / "ran", tmp_path / "spec.yaml"
    path.write_text(yaml_payload(marker))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    _one_line_refusal(str(info.value), path)
    assert not marker.exists()


def test_recipe_refuses_a_python_tag_and_its_command_line_is_one_line(tmp_path, capsys):
    from wam_diff_training.cli import main as train_main
    from wam_diff_training.config import ConfigError
    from wam_diff_training.recipe import load_recipe

    marker, path = tmp_path / "ran", tmp_path / "recipe.yaml"
    path.write_text(yaml_payload(marker))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert str(path) in str(info.value) and "python/object/apply:builtins.open" in str(info.value)
    assert train_main(["recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wam-diff-train recipe: error: recipe {path}") and err.count("\n") == 1, err
    assert not marker.exists()


def test_carla_agent_config_refuses_a_python_tag_in_one_line(tmp_path):
    from wam_diff_ros.carla.agent_config import AgentConfig, AgentConfigError

    marker, path = tmp_path / "ran", tmp_path / "agent.yaml"
    path.write_text(yaml_payload(marker))
    with pytest.raises(AgentConfigError) as info:
        AgentConfig.load(path)
    _one_line_refusal(str(info.value), path)
    assert not marker.exists()


def test_carla_bridge_config_refuses_a_python_tag_in_one_line_without_running_it(tmp_path, capsys):
    pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
    from wam_diff_ros.carla_bridge_node import BridgeConfig, main

    marker, path = tmp_path / "ran", tmp_path / "bridge.yaml"
    path.write_text(yaml_payload(marker))
    with pytest.raises(ValueError, match=r"tag !!python/object/apply:builtins.open on line 1 is refused"):
        BridgeConfig.load(path)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wam-diff-carla-bridge: error: bridge config {path}: tag !!python") and err.count("\n") == 1
    assert not marker.exists()


# ------------------------------------------------------------------ 2. checkpoints: safetensors only


def _checkpoint_copy(src: Path, dst: Path) -> Path:
    """The saved nano checkpoint, its files hard-linked (nothing here writes into them)."""
    shutil.copytree(src, dst, copy_function=os.link)
    return dst


def test_the_pickle_payload_runs_code_when_unpickled(tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(pickle_payload(marker))
    assert marker.exists()


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt"])
def test_a_pickle_only_checkpoint_is_refused_and_never_unpickled(nano_ckpt, tmp_path, name):
    path = _checkpoint_copy(nano_ckpt, tmp_path / "ckpt")
    (path / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    (path / name).write_bytes(pickle_payload(marker))
    with pytest.raises(CheckpointError) as info:
        load(str(path))
    assert str(info.value) == (f"{path / name}: pickle checkpoints are refused (never unpickled); "
                               f"convert to model.safetensors")
    assert not marker.exists()


def test_a_pickle_beside_the_safetensors_weights_is_never_unpickled(nano_ckpt, tmp_path):
    path = _checkpoint_copy(nano_ckpt, tmp_path / "ckpt")
    marker = tmp_path / "ran"
    (path / "pytorch_model.bin").write_bytes(pickle_payload(marker))
    (path / "training_args.bin").write_bytes(pickle_payload(marker))
    loaded = load_model(path)
    assert loaded.num_params > 5e6
    assert not marker.exists()


@pytest.mark.parametrize("shard", ["pytorch_model.bin", "../outside.safetensors", "ABSOLUTE", "sub/model.safetensors"])
def test_a_weight_map_naming_a_pickle_or_a_file_elsewhere_is_refused_before_opening_it(nano_ckpt, tmp_path, shard,
                                                                                    monkeypatch):
    from wam_diff_core.model import checkpoint

    opened = []  # safetensors reads in Rust, out of the audit hook's sight: record its calls instead
    monkeypatch.setattr(checkpoint, "safe_open", lambda f, **kw: (opened.append(f), safe_open(f, **kw))[1])
    path = _checkpoint_copy(nano_ckpt, tmp_path / "ckpt")
    marker = tmp_path / "ran"
    outside = tmp_path / "outside.safetensors"
    shutil.copy(path / "model.safetensors", outside)  # a valid file: only the rule stops it being read
    (path / "pytorch_model.bin").write_bytes(pickle_payload(marker))
    shard = str(outside) if shard == "ABSOLUTE" else shard
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    assert str(info.value) == (f"{path / 'model.safetensors.index.json'}: weight_map names {shard!r}; expected the "
                               f"file name of a .safetensors shard in the same directory")
    assert not marker.exists() and opened == []


def test_a_resume_state_holding_a_pickled_object_is_refused_and_never_run(tmp_path):
    import torch

    from wam_diff_training.state import STATE_FILE, ResumeStateError, load_resume

    marker = tmp_path / "ran"
    torch.save({"step": 3, "extra": _Touch(marker)}, tmp_path / STATE_FILE)
    with pytest.raises(ResumeStateError) as info:
        load_resume(tmp_path)
    assert str(info.value).startswith(f"resume state {tmp_path / STATE_FILE} holds objects other than tensors")
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_a_resume_state_round_trips_the_rng_states_as_tensors_and_plain_values(tmp_path):
    import random

    import torch

    from wam_diff_training.state import STATE_FILE, load_resume, rng_state, set_rng_state

    torch.save({"step": 7, "rng": rng_state()}, tmp_path / STATE_FILE)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(load_resume(tmp_path)["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


# ------------------------------------------------------------------ 3. no remote code

EVIL_MODULE = """
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PreTrainedTokenizerFast as EvilTokenizer, Qwen3VLConfig as EvilConfig
from transformers import Qwen3VLForConditionalGeneration as EvilModel
"""


def test_trust_remote_code_is_never_set_true():
    values = [(str(p.relative_to(ROOT)), value) for p in _sources()
              for value in re.findall(r"trust_remote_code\s*=\s*([^,)\s]+)", p.read_text())]
    assert ("wam_diff_core/model/checkpoint.py", "False") in values  # the loader says so explicitly
    assert [v for v in values if v[1] != "False"] == []


@pytest.mark.parametrize("json_file, auto_map", [
    ("config.json", {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}),
    ("tokenizer_config.json", {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}),
    ("preprocessor_config.json", {"AutoImageProcessor": "evil.EvilTokenizer"}),
])
def test_a_checkpoint_whose_json_names_code_to_import_is_refused_and_the_code_never_runs(nano_ckpt, tmp_path,
                                                                                        json_file, auto_map):
    path = _checkpoint_copy(nano_ckpt, tmp_path / "ckpt")
    marker = tmp_path / "ran"
    (path / "evil.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    data = json.loads((path / json_file).read_text())
    (path / json_file).unlink()  # a hard link: write a new file, leave the shared one alone
    (path / json_file).write_text(json.dumps({**data, "auto_map": auto_map}))
    with pytest.raises(CheckpointError) as info:
        load(str(path))
    assert str(info.value).startswith(f"{path / json_file}: 'auto_map' names code to import (")
    assert str(info.value).endswith("checkpoints never run their own code here: remove the key")
    assert not marker.exists() and "evil" not in sys.modules


# ------------------------------------------------------------------ 4. paths: never from messages


@pytest.fixture(scope="module")
def nano_policy():
    from wam_diff_core.policy import DrivingPolicy

    policy = DrivingPolicy.load("nano", device="cpu", tasks=("planning",), max_new_tokens=8)
    image = [np.full((96, 128, 3), 100, np.uint8)]
    policy.ask(image, "warm up")  # lazy first-call work (thread pools, caches) is not what is measured
    return policy, image


def test_a_question_naming_files_is_prompt_text_and_opens_nothing(nano_policy, tmp_path):
    from wam_diff_core.types import EgoState

    policy, image = nano_policy
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    questions = [str(secret), f"file://{secret}", f"../../{secret.name}", "@" + str(secret), "{{ open('x') }}"]
    with files_opened() as opened:
        answers = [policy.ask(image, q) for q in questions]
        plan = policy.plan(image, EgoState(3.0), "follow lane")
    assert [a.question for a in answers] == questions and plan is not None
    assert opened == []


def test_the_model_parameter_opens_only_a_checkpoint_directorys_own_files(nano_ckpt, tmp_path):
    """What the planner's `model` parameter reaches (DrivingPolicy.load): a file path is refused unopened; a
    directory is read only for its checkpoint files."""
    from wam_diff_core.policy import DrivingPolicy

    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    with files_opened() as opened:
        with pytest.raises(CheckpointError) as info:
            DrivingPolicy.load(str(secret), device="cpu")
    assert one_line(info.value) == str(info.value) and str(info.value).startswith(f"not a directory: {secret}")
    assert opened == []
    path = _checkpoint_copy(nano_ckpt, tmp_path / "ckpt").resolve()
    with files_opened() as opened:
        DrivingPolicy.load(str(path), device="cpu")
    read = {Path(f).resolve() for f in opened}
    assert {path / "config.json", path / "tokenizer_config.json"} <= read  # the hook sees the checkpoint's reads
    assert [p for p in read if tmp_path.resolve() in p.parents and path not in p.parents] == []
