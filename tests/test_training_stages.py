"""Training stages end to end on the nano model and tiny datasets written here (CPU, seconds each)."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import Qwen3VLForConditionalGeneration

from wam_diff_training.cli import main
from wam_diff_training.config import ConfigError, load_config
from wam_diff_training.data import MixSampler
from wam_diff_core.model.checkpoint import LoadedModel, load_model, save_model

ANSWERS = ["left lane free", "stop now", "go slow", "truck ahead", "red light", "turn right", "keep lane", "car left"]


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def write_dataset(root: Path, n: int = 8, bad: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(root / f"cam{i}.png")
        samples.append({"id": f"s{i}", "datasource": "toy", "task": "qa", "image": [f"cam{i}.png"],
                        "conversations": [{"from": "human", "value": f"<image>Case {i}?"},
                                          {"from": "gpt", "value": ANSWERS[i % len(ANSWERS)]}]})
    if bad:
        samples.append({"id": "no-image", "datasource": "toy", "task": "qa", "image": ["gone.png"],
                        "conversations": [{"from": "human", "value": "<image>?"}, {"from": "gpt", "value": "x"}]})
        samples.append({"id": "empty", "datasource": "toy", "task": "qa", "image": [], "conversations": []})
    path = root / "train.json"
    path.write_text(json.dumps(samples))
    return path


FAST = ["--no-progress", "--set", "train.threads=1", "--set", "train.tensorboard=false"]


def _metrics(stage_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_overfit_loss_falls_10x_and_greedy_decoding_reproduces_targets_at_b1_and_after_adapt_to_b4(nano_ckpt, tmp_path):
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "run"
    common = ["--data", str(data), "--val", str(data), "--out", str(out), "--batch-size", "8", "--lr", "3e-3",
              "--set", "optim.vision_lr=3e-3", "--set", "optim.weight_decay=0", "--set", "optim.warmup_steps=3",
              "--set", "eval.max_new_tokens=12", *FAST]
    assert main(["ar", "--init", str(nano_ckpt), "--max-steps", "30", *common]) == 0
    assert main(["adapt", "--init", str(out / "ar" / "model"), "--block-sizes", "4", "--max-steps", "90",
                 "--set", "noise.t_min=0.2", *common]) == 0
    for stage, B in (("ar", 1), ("block4", 4)):
        losses = [r["loss"] for r in _metrics(out / stage)]
        assert losses[0] / np.mean(losses[-5:]) >= 10, (stage, losses[0], losses[-5:])
        ev = json.loads((out / stage / "eval.json").read_text())
        assert ev["block_size"] == B and ev["samples"] == 8
        assert ev["exact_match"] == 1.0, (stage, ev)
        assert json.loads((out / stage / "model" / "wam_diff.json").read_text())["trained_block_size"] == B
    assert load_model(out / "block4" / "model").settings.trained_block_size == 4
    # dynamic remasking finishes the adapted model's confident blocks in fewer forwards than K per block
    fpt = {}
    for strategy in ("low_confidence_static", "low_confidence_dynamic"):
        path = tmp_path / f"{strategy}.json"
        assert main(["eval", "--model", str(out / "block4" / "model"), "--data", str(data), "--steps", "4",
                     "--strategy", strategy, "--max-new-tokens", "12", "--json", str(path)]) == 0
        ev = json.loads(path.read_text())
        assert ev["exact_match"] == 1.0, ev
        fpt[strategy] = ev["forwards_per_token"]
    assert fpt["low_confidence_dynamic"] < 0.9 * fpt["low_confidence_static"], fpt


def test_interrupted_run_resumed_gives_parameters_identical_to_an_uninterrupted_run(nano_ckpt, tmp_path):
    data = write_dataset(tmp_path / "data", n=8)
    args = ["adapt", "--init", str(nano_ckpt), "--block-sizes", "4", "--data", str(data), "--max-steps", "6",
            "--batch-size", "4", "--lr", "1e-3", "--set", "train.save_every=1", "--set", "eval.enabled=false", *FAST]
    assert main([*args, "--out", str(tmp_path / "straight")]) == 0
    straight = load_file(tmp_path / "straight" / "block4" / "model" / "model.safetensors")
    straight_losses = [r["loss"] for r in _metrics(tmp_path / "straight" / "block4")]
    init = load_file(nano_ckpt / "model.safetensors")
    assert any(not torch.equal(straight[k], init[k]) for k in straight)  # training moved the weights

    # a real SIGTERM in the middle of a run (the --stop-after path saves the same way), then --resume
    killed = tmp_path / "killed" / "block4"
    proc = subprocess.Popen([sys.executable, "-m", "wam_diff_training.cli", *args, "--out", str(tmp_path / "killed")],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (killed / "metrics.jsonl").is_file() and (killed / "metrics.jsonl").read_text().strip():
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    for run in ("killed",):
        stage = tmp_path / run / "block4"
        assert not (stage / "model").exists() and (stage / "resume" / "trainer_state.pt").is_file(), run
        assert 1 <= len(_metrics(stage)) < 6
        assert main([*args, "--out", str(tmp_path / run), "--resume"]) == 0
        resumed = load_file(stage / "model" / "model.safetensors")
        assert resumed.keys() == straight.keys()
        assert all(torch.equal(straight[k], resumed[k]) for k in straight), run
        assert [r["step"] for r in _metrics(stage)] == [1, 2, 3, 4, 5, 6]
        assert [r["loss"] for r in _metrics(stage)] == straight_losses


def _torchrun(nano_ckpt, data, out, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "wam_diff_training.cli",
           "adapt", "--init", str(nano_ckpt), "--block-sizes", "4", "--data", str(data), "--out", str(out),
           "--max-steps", "3", "--batch-size", "2", "--lr", "1e-3", "--set", "eval.enabled=false", *FAST, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "block4"


@pytest.fixture(scope="module")
def ddp_run(nano_ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    data = write_dataset(root / "data", n=8)
    return data, _torchrun(nano_ckpt, data, root / "out")


def test_two_process_torchrun_run_completes_and_both_ranks_hold_identical_parameters(ddp_run):
    _, stage = ddp_run
    d0 = (stage / "param_digest.rank0.txt").read_text()
    d1 = (stage / "param_digest.rank1.txt").read_text()
    assert d0 == d1
    assert json.loads((stage / "run_config.json").read_text())["world"] == 2
    assert len(_metrics(stage)) == 3
    assert (stage / "model" / "model.safetensors").is_file()


def test_fsdp2_two_process_run_saves_a_full_checkpoint_matching_the_ddp_run(nano_ckpt, ddp_run, tmp_path):
    data, ddp_stage = ddp_run
    stage = _torchrun(nano_ckpt, data, tmp_path / "fsdp", "--set", "train.parallel=fsdp2")
    sharded = load_file(stage / "model" / "model.safetensors")
    replicated = load_file(ddp_stage / "model" / "model.safetensors")
    init = load_file(nano_ckpt / "model.safetensors")
    assert sharded.keys() == replicated.keys()
    # the same data, noise and updates: equal up to the order of floating-point reductions
    worst = max((sharded[k] - replicated[k]).abs().max().item() for k in sharded)
    moved = max((replicated[k] - init[k]).abs().max().item() for k in sharded)
    assert worst < 1e-4 < moved, (worst, moved)
    assert load_model(stage / "model").settings.trained_block_size == 4


def test_distillation_honours_the_teacher_block_size_and_logs_jsd_and_top5(nano_ckpt, tmp_path):
    data = write_dataset(tmp_path / "data", n=4)
    out = tmp_path / "kd"
    assert main(["distill", "--teacher", str(nano_ckpt), "--teacher-block-size", "2", "--student", str(nano_ckpt),
                 "--block-size", "4", "--ratio", "0.5", "--on-policy-every", "2", "--data", str(data), "--out", str(out),
                 "--max-steps", "2", "--batch-size", "2", "--set", "eval.enabled=false",
                 "--set", "data.max_response_tokens=12", *FAST]) == 0
    rows = _metrics(out / "distill")
    assert [r["on_policy"] for r in rows] == [True, False]
    assert all(0.0 <= r["top5"] <= 1.0 and 0.0 <= r["jsd"] <= np.log(2) for r in rows)
    # same weights at another block size: the teacher sees more clean context, so they disagree somewhat
    assert rows[1]["jsd"] > 0
    stage = json.loads((out / "distill" / "run_config.json").read_text())["stage"]
    assert stage["teacher_block_size"] == 2 and stage["block_size"] == 4


def test_bad_training_data_is_skipped_and_counted_or_stops_naming_the_sample(nano_ckpt, tmp_path, capsys):
    data = write_dataset(tmp_path / "data", n=4, bad=True)
    args = ["ar", "--init", str(nano_ckpt), "--data", str(data), "--max-steps", "1", "--batch-size", "4",
            "--set", "eval.enabled=false", *FAST]
    assert main([*args, "--out", str(tmp_path / "skip")]) == 0
    summary = json.loads((tmp_path / "skip" / "ar" / "summary.json").read_text())
    assert summary["skipped_scan"] == {"missing image": 1, "bad conversation": 1}
    assert _metrics(tmp_path / "skip" / "ar")[0]["skipped_scan"] == 2
    assert main([*args, "--out", str(tmp_path / "error"), "--set", "data.on_bad_sample=error"]) == 2
    assert "no-image" in capsys.readouterr().err


def test_mix_sampler_draws_datasets_by_weight_is_reproducible_and_shards_ranks_disjointly():
    s = MixSampler([10, 30], [3.0, 1.0], batch_size=4, seed=1, epoch_size=40)
    flat = [i for b in s.epoch_batches(0) for i in b]
    assert sum(i < 10 for i in flat) == 30 and sum(i >= 10 for i in flat) == 10
    assert s.epoch_batches(0) == MixSampler([10, 30], [3.0, 1.0], 4, seed=1, epoch_size=40).epoch_batches(0)
    assert s.epoch_batches(0) != s.epoch_batches(1)
    r0 = MixSampler([10, 30], [1.0, 1.0], 4, seed=1, rank=0, world=2).epoch_batches(0)
    r1 = MixSampler([10, 30], [1.0, 1.0], 4, seed=1, rank=1, world=2).epoch_batches(0)
    assert len(r0) == len(r1) == 5
    assert not set(map(tuple, r0)) & set(map(tuple, r1))
    stream = MixSampler([10, 30], [1.0, 1.0], 4, seed=1).stream(start=12)
    assert next(stream) == (1, MixSampler([10, 30], [1.0, 1.0], 4, seed=1).epoch_batches(1)[2])


def test_config_file_overrides_and_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 2e-4\ntrain:\n  batch_size: 3\nblock_sizes: [4, 8]\n")
    cfg = load_config(path, ["optim.lr=1e-3", "noise.t_min=0.1"])
    assert cfg.optim.lr == 1e-3 and cfg.train.batch_size == 3 and cfg.block_sizes == [4, 8] and cfg.noise.t_min == 0.1
    with pytest.raises(ConfigError, match="optim.lrr"):
        load_config(path, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="batch_size"):
        load_config(None, ["train.batch_size=many"])


def test_config_base_applies_the_parent_first_and_names_missing_files_and_cycles(tmp_path):
    (tmp_path / "parent.yaml").write_text("optim:\n  lr: 2e-4\n  weight_decay: 0.3\ntrain:\n  batch_size: 3\n"
                                         "out: runs/parent\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "child.yaml").write_text("base: ../parent.yaml\noptim:\n  lr: 5e-4\nout: runs/child\n")
    cfg = load_config(sub / "child.yaml", ["train.batch_size=4"])
    # sections merge key by key: the child's lr, the parent's weight decay, the override's batch size
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.train.batch_size, cfg.out) == (5e-4, 0.3, 4, "runs/child")
    (tmp_path / "orphan.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml.*the base of"):
        load_config(tmp_path / "orphan.yaml")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "bad.yaml").write_text("base: [1]\n")
    with pytest.raises(ConfigError, match="base must be a config file path"):
        load_config(tmp_path / "bad.yaml")


def test_optimizer_groups_give_the_vision_tower_its_own_lr_and_norms_no_decay(nano):
    from wam_diff_training.trainer import param_groups, warmup_cosine

    groups = {g["name"]: g for g in param_groups(nano.model, 1e-3, 1e-5, 0.05)}
    assert set(groups) == {"text", "text_no_decay", "vision", "vision_no_decay"}
    assert groups["vision"]["lr"] == 1e-5 and groups["text"]["lr"] == 1e-3
    assert groups["text_no_decay"]["weight_decay"] == 0.0 and groups["text"]["weight_decay"] == 0.05
    n_vision = sum(p.numel() for p in nano.model.model.visual.parameters())
    assert sum(p.numel() for g in ("vision", "vision_no_decay") for p in groups[g]["params"]) == n_vision
    f = warmup_cosine(total_steps=110, warmup_steps=10, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)


def test_model_wise_distillation_from_a_larger_teacher_trains_the_student(nano, nano_ckpt, tmp_path):
    from wam_diff_core.model.presets import build_config, get_preset

    c = nano.model.config
    ids = {"pad_token_id": c.text_config.pad_token_id, "eos_token_id": c.text_config.eos_token_id,
           "vision_start_token_id": c.vision_start_token_id, "vision_end_token_id": c.vision_end_token_id,
           "image_token_id": c.image_token_id, "video_token_id": c.video_token_id}
    torch.manual_seed(1)
    big = Qwen3VLForConditionalGeneration._from_config(build_config(get_preset("nano-l"), ids))
    teacher = tmp_path / "teacher"
    save_model(LoadedModel(big.eval(), nano.processor, nano.settings, "nano-l"), teacher)
    data = write_dataset(tmp_path / "data", n=4)
    out = tmp_path / "kd"
    assert main(["distill", "--teacher", str(teacher), "--student", str(nano_ckpt), "--block-size", "4",
                 "--data", str(data), "--out", str(out), "--max-steps", "2", "--batch-size", "2", "--lr", "1e-3",
                 "--set", "eval.enabled=false", *FAST]) == 0
    rows = _metrics(out / "distill")
    assert all(r["jsd"] > 1e-3 and 0.0 <= r["top5"] <= 1.0 for r in rows)  # two different networks
    stage = json.loads((out / "distill" / "run_config.json").read_text())["stage"]
    assert stage["teacher_block_size"] == 1  # not given: the teacher's own trained_block_size
    student = load_file(out / "distill" / "model" / "model.safetensors")
    init = load_file(nano_ckpt / "model.safetensors")
    assert any(not torch.equal(student[k], init[k]) for k in student)
    assert sum(p.numel() for p in big.parameters()) > 3 * sum(v.numel() for v in init.values())


def test_export_to_bfloat16_halves_the_weights_and_loads_back_as_float32(nano_ckpt, tmp_path):
    out = tmp_path / "bf16"
    assert main(["export", str(nano_ckpt), str(out), "--dtype", "bfloat16"]) == 0
    src = load_file(nano_ckpt / "model.safetensors")
    dst = load_file(out / "model.safetensors")
    assert set(src) == set(dst) and all(v.dtype == torch.bfloat16 for v in dst.values())
    assert (out / "model.safetensors").stat().st_size < 0.55 * (nano_ckpt / "model.safetensors").stat().st_size
    back = load_model(out)
    w = dict(back.model.named_parameters())
    name = next(k for k in src if k.endswith("q_proj.weight"))
    got = w[name]
    assert got.dtype == torch.float32
    assert torch.equal(got, src[name].to(torch.bfloat16).float())
    assert (out / "wam_diff.json").read_text() == (nano_ckpt / "wam_diff.json").read_text()
    with pytest.raises(ValueError, match="dtype 'int4'"):
        from wam_diff_training.export import export
        export(nano_ckpt, tmp_path / "x", "int4")


def test_export_steps_sets_the_default_operating_point_and_refuses_it_for_ar(nano_ckpt, tmp_path):
    b32 = tmp_path / "b32"
    loaded = load_model(nano_ckpt)
    loaded.settings = loaded.settings.for_block_size(32)
    save_model(loaded, b32)
    assert main(["export", str(b32), str(tmp_path / "k4"), "--dtype", "float32", "--steps", "4"]) == 0
    got = load_model(tmp_path / "k4").settings
    assert (got.decoding.steps, got.decoding.block_size, got.trained_block_size) == (4, 32, 32)
    assert got.decoding.strategy == loaded.settings.decoding.strategy
    assert got.decoding.schedule == "linear"
    assert main(["export", str(tmp_path / "k4"), str(tmp_path / "cos"), "--dtype", "float32", "--schedule", "cosine"]) == 0
    got = load_model(tmp_path / "cos").settings
    assert (got.decoding.schedule, got.decoding.steps) == ("cosine", 4)
    assert got.decoding.forward_only is False
    assert main(["export", str(tmp_path / "cos"), str(tmp_path / "fw"), "--dtype", "float32", "--forward-only", "on"]) == 0
    got = load_model(tmp_path / "fw").settings
    assert (got.decoding.forward_only, got.decoding.schedule, got.decoding.steps) == (True, "cosine", 4)
    assert (got.name, got.version) == (None, None)
    assert main(["export", str(tmp_path / "fw"), str(tmp_path / "named"), "--dtype", "float32",
                 "--name", "my-model", "--version", "2.1.0"]) == 0
    named = (tmp_path / "named" / "wam_diff.json").read_text()
    assert named.startswith('{\n  "name": "my-model",\n  "version": "2.1.0",')
    assert load_model(tmp_path / "named").settings.decoding == got.decoding
    from wam_diff_training.export import export

    ar = tmp_path / "ar"
    loaded.settings = loaded.settings.for_block_size(1)
    save_model(loaded, ar)
    with pytest.raises(ValueError, match="block size 1"):
        export(ar, tmp_path / "y", "float32", steps=4)
    with pytest.raises(ValueError, match="schedule 'zigzag'"):
        export(b32, tmp_path / "z", "float32", schedule="zigzag")
    with pytest.raises(ValueError, match="steps 0"):
        export(b32, tmp_path / "z", "float32", steps=0)


def write_planning_dataset(root: Path, size: tuple[int, int], n: int = 4, target=None, scenarios=None) -> Path:
    """n planning samples whose frames are `size` (W, H) pixels (prompts with the route target `target` when given;
    sample i of scenario scenarios[i % len(scenarios)] in its meta when given)."""
    from wam_diff_core.codec import format_trajectory
    from wam_diff_core.prompts import planning_prompt
    from wam_diff_core.types import EgoState

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    samples = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(root / f"f{i}.png")
        traj = np.stack([np.arange(1, 9) * (i + 1.0), np.zeros(8)], axis=1)
        samples.append({"id": f"p{i}", "datasource": "toy", "task": "planning", "image": [f"f{i}.png"],
                        "conversations": [{"from": "human", "value": "<image>\n" + planning_prompt(EgoState(2.0 * i), "follow lane", target)},
                                          {"from": "gpt", "value": format_trajectory(traj)}]})
        if scenarios:
            samples[-1]["meta"] = {"scenario": scenarios[i % len(scenarios)]}
    path = root / "train.json"
    path.write_text(json.dumps(samples))
    return path


def test_a_trained_checkpoint_records_the_frame_size_of_its_planning_frames(nano_ckpt, tmp_path, capsys):
    from wam_diff_training.data import build_datasets
    from wam_diff_core.model.checkpoint import load

    wide, narrow = write_planning_dataset(tmp_path / "wide", (96, 48)), write_planning_dataset(tmp_path / "narrow", (64, 32))
    qa = write_dataset(tmp_path / "qa", n=4)  # 64x64 QA frames do not count: only planning frames do
    processor = load(nano_ckpt).processor
    mixed = build_datasets([{"path": str(wide)}, {"path": str(narrow), "weight": 1.0}], processor, 4096, 512, "skip")
    assert mixed.planning_frame_size() is None and mixed.planning_frame_sizes() == {"64x32": 4, "96x48": 4}
    unweighted = build_datasets([{"path": str(wide)}, {"path": str(narrow), "weight": 0.0}, {"path": str(qa)}],
                                processor, 4096, 512, "skip")
    assert unweighted.planning_frame_size() == (96, 48)

    args = ["ar", "--init", str(nano_ckpt), "--max-steps", "1", "--batch-size", "4", "--set", "eval.enabled=false", *FAST]
    assert main([*args, "--data", str(wide), "--out", str(tmp_path / "one")]) == 0
    assert json.loads((tmp_path / "one" / "ar" / "model" / "wam_diff.json").read_text())["frame_size"] == [96, 48]
    assert load_model(tmp_path / "one" / "ar" / "model").settings.frame_size == (96, 48)
    assert json.loads((tmp_path / "one" / "ar" / "summary.json").read_text())["planning_frame_sizes"] == {"96x48": 4}
    # a model trained on it keeps the size through a stage with no planning data
    assert main([*args, "--data", str(qa), "--out", str(tmp_path / "qa_run"), "--init", str(tmp_path / "one" / "ar" / "model")]) == 0
    assert load_model(tmp_path / "qa_run" / "ar" / "model").settings.frame_size == (96, 48)


def test_a_checkpoint_trained_on_route_target_prompts_records_it_and_old_checkpoints_are_asked_without(nano_ckpt, tmp_path,
                                                                                                      capsys):
    from wam_diff_training.data import DrivingDataset, build_datasets
    from wam_diff_core.model.checkpoint import load
    from wam_diff_core.prompts import parse_route_target

    plain = write_planning_dataset(tmp_path / "plain", (64, 32))
    routed = write_planning_dataset(tmp_path / "routed", (64, 32), n=5, target=(25.0, -4.5))
    processor = load(nano_ckpt).processor
    assert build_datasets([{"path": str(plain)}, {"path": str(routed)}], processor, 4096, 512, "skip").planning_route_targets() == 5
    assert build_datasets([{"path": str(plain)}, {"path": str(routed), "weight": 0.0}], processor, 4096, 512,
                          "skip").planning_route_targets() == 0
    # an evaluation for a checkpoint that never learned targets asks the prompt it learned
    kept = DrivingDataset(routed, processor, 4096, 512, "skip")
    stripped = DrivingDataset(routed, processor, 4096, 512, "skip", route_targets=False)
    assert parse_route_target(kept.samples[0][2]) == (25.0, -4.5) and parse_route_target(stripped.samples[0][2]) is None
    assert len(stripped.encode(0).prompt_ids) < len(kept.encode(0).prompt_ids)

    args = ["ar", "--init", str(nano_ckpt), "--max-steps", "1", "--batch-size", "4", "--set", "eval.enabled=false", *FAST]
    assert main([*args, "--data", str(plain), "--out", str(tmp_path / "plain_run")]) == 0
    assert load_model(tmp_path / "plain_run" / "ar" / "model").settings.route_target is False
    assert main([*args, "--data", str(routed), "--out", str(tmp_path / "routed_run")]) == 0
    assert json.loads((tmp_path / "routed_run" / "ar" / "model" / "wam_diff.json").read_text())["route_target"] is True
    assert json.loads((tmp_path / "routed_run" / "ar" / "summary.json").read_text())["planning_route_targets"] == 5
    # data.route_targets false: the same data trained without the sentence, and the checkpoint asked without it
    routed_model = str(tmp_path / "routed_run" / "ar" / "model")
    assert main([*args, "--data", str(routed), "--out", str(tmp_path / "stripped_run"), "--init", routed_model,
                 "--set", "data.route_targets=false"]) == 0
    assert load_model(tmp_path / "stripped_run" / "ar" / "model").settings.route_target is False
    assert json.loads((tmp_path / "stripped_run" / "ar" / "summary.json").read_text())["planning_route_targets"] == 0
    assert main([*args, "--data", str(routed), "--out", str(tmp_path / "bad"), "--set", "data.route_targets='no'"]) != 0
    assert "data.route_targets: expected true/false or a list, got 'no'" in capsys.readouterr().err


def test_route_targets_on_some_route_types_keep_the_sentence_there_alone_and_the_checkpoint_records_them(nano_ckpt,
                                                                                                         tmp_path):
    from wam_diff_training.data import DrivingDataset
    from wam_diff_core.model.checkpoint import load
    from wam_diff_core.prompts import parse_route_target

    data = write_planning_dataset(tmp_path / "junctions", (64, 32), n=6, target=(25.0, -4.5),
                                  scenarios=["roundabout", "intersection", "roundabout"])
    ds = DrivingDataset(data, load(nano_ckpt).processor, 4096, 512, "skip", route_targets=["roundabout"])
    assert [parse_route_target(x[2]) is not None for x in ds.samples] == [True, False, True, True, False, True]
    assert ds.planning_route_targets == 4

    args = ["ar", "--init", str(nano_ckpt), "--max-steps", "1", "--batch-size", "4", "--set", "eval.enabled=false", *FAST]
    assert main([*args, "--data", str(data), "--out", str(tmp_path / "run"), "--set", "data.route_targets=[roundabout]"]) == 0
    settings = load_model(tmp_path / "run" / "ar" / "model").settings
    assert settings.route_target is True and settings.route_target_scenarios == ("roundabout",)
    assert settings.prompt_route_targets == ("roundabout",)
    assert json.loads((tmp_path / "run" / "ar" / "model" / "wam_diff.json").read_text())["route_target_scenarios"] == ["roundabout"]
    assert json.loads((tmp_path / "run" / "ar" / "summary.json").read_text())["planning_route_targets"] == 4
    # true keeps every target and records no restriction
    assert main([*args, "--data", str(data), "--out", str(tmp_path / "all")]) == 0
    every = load_model(tmp_path / "all" / "ar" / "model").settings
    assert every.route_target_scenarios is None and every.prompt_route_targets is True
    assert main([*args, "--data", str(data), "--out", str(tmp_path / "bad"), "--set", "data.route_targets=[highway]"]) != 0


def test_export_route_target_switches_what_the_policy_is_told(nano_ckpt, tmp_path):
    src = tmp_path / "rt"
    loaded = load_model(nano_ckpt)
    loaded.settings = dataclasses.replace(loaded.settings, route_target=True)
    save_model(loaded, src)
    assert main(["export", str(src), str(tmp_path / "off"), "--dtype", "float32", "--route-target", "off"]) == 0
    assert main(["export", str(src), str(tmp_path / "kept"), "--dtype", "float32"]) == 0
    assert load_model(tmp_path / "off").settings.route_target is False
    assert load_model(tmp_path / "kept").settings.route_target is True
    with pytest.raises(SystemExit):
        main(["export", str(src), str(tmp_path / "bad"), "--route-target", "maybe"])
