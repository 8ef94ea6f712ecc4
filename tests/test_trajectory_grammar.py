"""The fixed trajectory style and the grammar that constrains planning answers to it."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from wam_diff_training.cli import main
from wam_diff_training.data import DrivingDataset
from wam_diff_core.codec import (
    FIXED_TRAJECTORY_CHARS,
    ParseError,
    fixed_trajectory_slots,
    format_trajectory,
    parse_trajectory,
)
from wam_diff_core.constants import EOS_TOKEN
from wam_diff_core.decoding.ar import generate_ar
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.constraint import TokenConstraint, TrajectoryGrammar, planning_constraint
from wam_diff_core.model.checkpoint import LoadedModel, save_model
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.model.settings import WamDiffSettings
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.prompts import chat_prompt, detection_prompt, planning_prompt
from wam_diff_core.types import EgoState

TRAJ = np.array([[3.14159, -0.004], [6.5, 0.25], [9.99, -1.5], [13.0, 2.0],
                 [16.25, 0.0], [120.0, -3.333], [150.5, 12.345], [199.99, -199.99]])


def test_fixed_style_prints_sign_three_digits_two_decimals_and_parses_back():
    text = format_trajectory(TRAJ, "fixed")
    assert text.startswith("+003.14,+000.00,+006.50,+000.25,+009.99,-001.50,")
    assert text.endswith("+199.99,-199.99")
    assert len(text) == FIXED_TRAJECTORY_CHARS == 127
    assert all(c in allowed for c, allowed in zip(text, fixed_trajectory_slots()))
    np.testing.assert_allclose(parse_trajectory(text), parse_trajectory(format_trajectory(TRAJ)), atol=0)
    assert format_trajectory(TRAJ) .startswith("3.14,0.00,6.50,0.25,")  # the official style is unchanged


def test_fixed_style_refuses_values_at_200m_and_unknown_styles():
    with pytest.raises(ValueError, match=r"\|value\| < 200 m, got 200.00"):
        format_trajectory(np.full((8, 2), 200.0), "fixed")
    with pytest.raises(ValueError, match="style 'wide'"):
        format_trajectory(TRAJ, "wide")


@pytest.fixture(scope="module")
def grammar(nano):
    return TrajectoryGrammar(nano.processor.tokenizer, nano.settings.eos_token_id)


def test_grammar_table_allows_exactly_the_slot_characters_then_eos(nano, grammar):
    table = grammar.allowed(136, 1024)
    counts = table.sum(1).tolist()
    assert counts[:8] == [2, 2, 10, 10, 1, 10, 10, 1]  # sign, 0/1, digit, digit, ".", digit, digit, ","
    assert counts[126] == 10 and counts[127:] == [1] * 9
    assert bool(table[127:, nano.settings.eos_token_id].all())
    tok = nano.processor.tokenizer
    assert sorted(tok.decode([i]) for i in table[0].nonzero()[:, 0].tolist()) == ["+", "-"]
    text = format_trajectory(TRAJ, "fixed")
    ids = grammar.encode(text) + [nano.settings.eos_token_id]
    assert len(ids) == 128 and bool(table[torch.arange(128), ids].all())
    assert tok.decode(ids) == text + EOS_TOKEN
    with pytest.raises(ValueError, match="'x' in"):
        grammar.encode("+00x.00")


def test_constraint_masks_only_its_rows_and_checks_its_span(grammar):
    allowed = grammar.allowed(16, 1024)
    c = TokenConstraint(allowed, torch.tensor([True, False]))
    logits = torch.zeros(2, 4, 1024)
    out = c.apply(logits, 4)
    assert torch.isinf(out[0]).sum().item() == 4 * 1024 - int(allowed[4:8].sum())
    assert torch.equal(out[1], logits[1])
    with pytest.raises(ValueError, match="covers 16 answer positions, decoding needs 20"):
        c.apply(logits, 16)


def _fixed(nano) -> LoadedModel:
    return dataclasses.replace(nano, settings=dataclasses.replace(nano.settings, trajectory_format="fixed"))


@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_a_random_model_under_the_grammar_always_writes_a_trajectory_that_parses(nano, camera_image, block_size):
    policy = DrivingPolicy(_fixed(nano), DecoderConfig(block_size=block_size, steps=4), tasks=("planning", "detection"))
    for vx, command in ((5.0, "follow lane"), (22.0, "change lane left")):
        plan = policy.plan([camera_image], EgoState(vx=vx), command)
        assert plan.valid, plan.errors
        assert plan.trajectory.shape == (8, 2) and np.abs(plan.trajectory).max() < 200
        assert len(plan.raw_text["planning"]) == FIXED_TRAJECTORY_CHARS
        assert "detection" in plan.errors  # the other row of the batch decodes unconstrained
    # the same random weights without the grammar write garbage (test_policy checks it at B = 8)
    free = DrivingPolicy(nano, DecoderConfig(block_size=block_size, steps=4)).plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert not free.valid


def test_constrained_block_decoder_at_b1_matches_the_constrained_ar_decoder(nano, camera_image):
    runner = ModelRunner(nano.model, "sdpa")
    fixed = _fixed(nano)
    batch = nano.processor.encode([chat_prompt(planning_prompt(EgoState(vx=8.0), "turn left"), 1)], [[camera_image]])
    grammar = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning"], 128, runner.vocab_size, "cpu")
    eos = nano.settings.eos_token_id
    ar = generate_ar(runner, batch, 128, eos, constraint=grammar)
    block = generate(runner, batch, DecoderConfig(block_size=1, steps=1, max_new_tokens=128), nano.settings.mask_token_id,
                     eos, grammar)
    assert ar.token_ids == block.token_ids and ar.finished == [True]
    assert not isinstance(parse_trajectory(nano.processor.decode(ar.token_ids[0])), ParseError)
    assert planning_constraint(nano.processor.tokenizer, nano.settings, ["planning"], 128, runner.vocab_size, "cpu") is None


def test_settings_refuse_an_unknown_trajectory_format(nano, tmp_path):
    (tmp_path / "wam_diff.json").write_text(json.dumps({"mask_token_id": 7, "eos_token_id": 2,
                                                        "trajectory_format": "wide"}))
    with pytest.raises(ValueError, match="trajectory_format 'wide'"):
        WamDiffSettings.load(tmp_path / "wam_diff.json")


def _planning_data(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    samples = []
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(root / f"cam{i}.png")
        traj = np.stack([np.arange(1, 9) * (2.0 + i), np.linspace(0, i - 4, 8)], 1)
        samples.append({"id": f"p{i}", "datasource": "toy", "task": "planning", "image": [f"cam{i}.png"],
                        "conversations": [{"from": "human", "value": "<image>\nPlan."},
                                          {"from": "gpt", "value": format_trajectory(traj)}]})
    samples.append({"id": "garbage", "datasource": "toy", "task": "planning", "image": ["cam0.png"],
                    "conversations": [{"from": "human", "value": "<image>\nPlan."}, {"from": "gpt", "value": "1.0,2..0"}]})
    path = root / "train.json"
    path.write_text(json.dumps(samples))
    return path


def test_fixed_style_dataset_and_training_run_record_the_format(nano, tmp_path, capsys):
    data = _planning_data(tmp_path / "data")
    ds = DrivingDataset(data, nano.processor, 4096, 192, "skip", trajectory_format="fixed")
    assert len(ds) == 8 and ds.stats.skipped == {"unparsable planning answer": 1}
    x = ds[1]
    assert x.response_text == format_trajectory(np.stack([np.arange(1, 9) * 3.0, np.linspace(0, -3, 8)], 1), "fixed")
    assert len(x.response_ids) == 128 and nano.processor.decode(x.response_ids.tolist()) == x.response_text + EOS_TOKEN
    official = DrivingDataset(data, nano.processor, 4096, 192, "skip")
    assert official[1].response_text.startswith("3.00,0.00,6.00,")
    with pytest.raises(ValueError, match="trajectory_format must be one of"):
        DrivingDataset(data, nano.processor, 4096, 192, "skip", trajectory_format="wide")

    init = tmp_path / "init"
    save_model(nano, init)
    out = tmp_path / "run"
    args = ["--data", str(data), "--out", str(out), "--batch-size", "4", "--no-progress", "--set", "train.threads=1",
            "--set", "train.tensorboard=false", "--set", "eval.enabled=false"]
    assert main(["ar", "--init", str(init), "--max-steps", "2", "--set", "data.trajectory_format=fixed", *args]) == 0
    saved = json.loads((out / "ar" / "model" / "wam_diff.json").read_text())
    assert saved["trajectory_format"] == "fixed"
    # a teacher trained on the other style is refused, naming both
    assert main(["distill", "--student", str(out / "ar" / "model"), "--teacher", str(init), "--block-size", "4",
                 "--max-steps", "1", *args]) != 0
    assert "answers planning in the 'official' trajectory style, the student trains on 'fixed'" in capsys.readouterr().err
    # distillation from the AR model with number-order corruption on every trajectory block runs and learns
    assert x.chained and not official[1].chained
    assert main(["distill", "--student", str(out / "ar" / "model"), "--teacher", str(out / "ar" / "model"),
                 "--block-size", "32", "--teacher-block-size", "1", "--max-steps", "2", "--out", str(tmp_path / "chain"),
                 "--set", "data.trajectory_format=fixed", "--set", "noise.chain_share=1.0", *args[:2], *args[4:]]) == 0
    metrics = (tmp_path / "chain" / "distill" / "metrics.jsonl").read_text().splitlines()
    losses = [row["loss"] for row in map(json.loads, metrics) if "loss" in row]
    assert losses and all(math.isfinite(v) and v > 0 for v in losses)


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic"])
def test_the_static_decode_path_applies_the_grammar_with_the_same_tokens_as_the_eager_path(nano, camera_image, strategy):
    runner = ModelRunner(nano.model, "sdpa")
    prompts = [chat_prompt(planning_prompt(EgoState(vx=12.0), "follow lane"), 1),
               chat_prompt(detection_prompt(), 1)]
    batch = nano.processor.encode(prompts, [[camera_image]] * 2)
    grammar = planning_constraint(nano.processor.tokenizer, _fixed(nano).settings, ["planning", "detection"], 128,
                                  runner.vocab_size, "cpu")
    ids = nano.settings.mask_token_id, nano.settings.eos_token_id
    cfg = DecoderConfig(block_size=32, steps=4, max_new_tokens=128, strategy=strategy)
    eager = generate(runner, batch, cfg, *ids, grammar)
    static = generate(runner, batch, dataclasses.replace(cfg, cuda_graphs=True), *ids, grammar)  # CPU: no capture
    assert static.token_ids == eager.token_ids
    assert not isinstance(parse_trajectory(nano.processor.decode(eager.token_ids[0])), ParseError)
    free = generate(runner, batch, dataclasses.replace(cfg, cuda_graphs=True), *ids)  # an unconstrained bucket
    assert free.token_ids != static.token_ids


def test_chain_starts_group_each_fixed_number_and_leave_separators_and_eos_alone():
    from wam_diff_core.codec import FIXED_NUMBER_WIDTH, fixed_trajectory_chain_starts

    starts = fixed_trajectory_chain_starts(136)
    w = FIXED_NUMBER_WIDTH + 1
    assert starts[:w + 2] == [0] * FIXED_NUMBER_WIDTH + [FIXED_NUMBER_WIDTH] + [w, w]
    assert starts[FIXED_TRAJECTORY_CHARS - 1] == FIXED_TRAJECTORY_CHARS - FIXED_NUMBER_WIDTH  # last number's sign
    assert starts[FIXED_TRAJECTORY_CHARS:] == list(range(FIXED_TRAJECTORY_CHARS, 136))  # EOS and after


def _commit_history(monkeypatch, runner, batch, cfg, grammar, ids):
    """Decode, recording the planning row's masked state after every step."""
    import wam_diff_core.decoding.block_diffusion as bd

    states, real = [], bd.commit_mask

    def spy(conf, masked, *args):
        commit = real(conf, masked, *args)
        states.append((masked & ~commit)[0].clone())
        return commit

    monkeypatch.setattr(bd, "commit_mask", spy)
    generate(runner, batch, cfg, *ids, grammar)
    return states


@pytest.mark.parametrize("block_size", [8, 32])
def test_number_order_commits_each_number_most_significant_first(nano, camera_image, monkeypatch, block_size):
    from wam_diff_core.codec import FIXED_NUMBER_WIDTH

    runner = ModelRunner(nano.model, "sdpa")
    batch = nano.processor.encode([chat_prompt(planning_prompt(EgoState(vx=12.0), "follow lane"), 1)], [[camera_image]])
    grammar = planning_constraint(nano.processor.tokenizer, _fixed(nano).settings, ["planning"], 128, runner.vocab_size, "cpu")
    ids = nano.settings.mask_token_id, nano.settings.eos_token_id
    cfg = DecoderConfig(block_size=block_size, steps=4, max_new_tokens=128, ignore_eos=True)

    def prefix_violations(states):
        bad = 0
        for masked in states:  # per block: numbers start at multiples of 8 (block sizes 8 and 32)
            for number in masked.view(-1, FIXED_NUMBER_WIDTH + 1)[:, :FIXED_NUMBER_WIDTH]:
                committed = (~number).int()
                bad += int((committed[1:] > committed[:-1]).any())  # a committed digit after a masked one
        return bad

    ordered = _commit_history(monkeypatch, runner, batch, cfg, grammar, ids)
    assert len(ordered) >= 128 // block_size  # at least one step per block (dynamic blocks may settle early)
    assert prefix_violations(ordered) == 0
    free = _commit_history(monkeypatch, runner, batch, dataclasses.replace(cfg, number_order=False), grammar, ids)
    assert prefix_violations(free) > 0  # confidence order alone commits digits behind masked ones
