"""Kinematic envelope of fixed-style plans: the bounds, the digit masks, and real decodes that stay inside."""
import dataclasses

import numpy as np
import pytest
import torch

from wam_diff_core.codec import ParseError, parse_trajectory
from wam_diff_core.constants import ENVELOPE_ACCEL_X_MPS2, ENVELOPE_LATERAL_MPS2, WAYPOINT_DT_S
from wam_diff_core.decoding.ar import generate_ar
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig, resolve_decoding
from wam_diff_core.decoding.constraint import TrajectoryGrammar, planning_constraint
from wam_diff_core.decoding.envelope import accel_bounds, forward_bounds, waypoint_bounds
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.prompts import chat_prompt, parse_planning_ego, planning_prompt
from wam_diff_core.types import EgoState

DT2 = WAYPOINT_DT_S ** 2
X_MIN, X_MAX = ENVELOPE_ACCEL_X_MPS2


def _fixed(nano):
    return dataclasses.replace(nano, settings=dataclasses.replace(nano.settings, trajectory_format="fixed"))


def test_bounds_follow_the_last_two_known_waypoints_and_widen_with_the_intervals_after_them():
    values = torch.zeros(1, 2, 8)
    known = torch.zeros(1, 2, 8, dtype=torch.bool)
    lo, hi = waypoint_bounds(values, known, torch.tensor([[10.0, 0.0]]), accel_bounds())
    # nothing known: from the ego (0) and its position one interval earlier (-v dt = -5 m)
    assert lo[0, 0, 0].item() == pytest.approx(5.0 + DT2 * X_MIN) and hi[0, 0, 0].item() == pytest.approx(5.0 + DT2 * X_MAX)
    assert lo[0, 0, 1].item() == pytest.approx(10.0 + 3 * DT2 * X_MIN) and hi[0, 0, 1].item() == pytest.approx(10.0 + 3 * DT2 * X_MAX)
    assert lo[0, 1, 0].item() == pytest.approx(-DT2 * ENVELOPE_LATERAL_MPS2)
    values[0, 0, :2] = torch.tensor([5.0, 11.0])  # x1, x2 known: 6 m per interval
    known[0, 0, :2] = True
    lo, hi = waypoint_bounds(values, known, torch.tensor([[10.0, 0.0]]), accel_bounds())
    assert lo[0, 0, 2].item() == pytest.approx(17.0 + DT2 * X_MIN) and hi[0, 0, 2].item() == pytest.approx(17.0 + DT2 * X_MAX)
    assert lo[0, 0, 3].item() == pytest.approx(23.0 + 3 * DT2 * X_MIN)
    known[0, 0, 0] = False  # a gap: x2 alone does not count, the prefix is empty again
    lo, _ = waypoint_bounds(values, known, torch.tensor([[10.0, 0.0]]), accel_bounds())
    assert lo[0, 0, 2].item() == pytest.approx(15.0 + 6 * DT2 * X_MIN)


def test_forward_bounds_hold_each_x_between_the_known_x_before_and_after_it_in_any_commit_order():
    x = torch.tensor([[5.13, 0.0, 2.38, 0.0, 9.0, 0.0, 0.0, 0.0]])
    known = torch.tensor([[True, False, True, False, True, False, False, False]])
    floor, ceiling = forward_bounds(x, known)
    inf = float("inf")
    assert floor[0].tolist() == pytest.approx([0.0, 5.13, 5.13, 5.13, 5.13, 9.0, 9.0, 9.0])
    assert ceiling[0].tolist() == pytest.approx([2.38, 2.38, 9.0, 9.0, inf, inf, inf, inf])
    floor, ceiling = forward_bounds(x, torch.zeros_like(known))  # nothing known: from the ego on, no ceiling
    assert floor[0].tolist() == [0.0] * 8 and ceiling[0].tolist() == [inf] * 8


def test_forward_only_raises_the_floor_of_x_alone_and_only_when_asked():
    values = torch.zeros(1, 2, 8)
    known = torch.zeros(1, 2, 8, dtype=torch.bool)
    values[0, :, 0] = torch.tensor([5.13, -0.5])  # x1 known: x2 >= 2 x1 + dt^2 (-9) = 8.01 m, above x1 already
    known[0, :, 0] = True
    v = torch.tensor([[10.3, 0.0]])
    lo, hi = waypoint_bounds(values, known, v, accel_bounds())
    lo_f, hi_f = waypoint_bounds(values, known, v, accel_bounds(), forward_only=True)
    assert lo[0, 0, 1].item() == pytest.approx(5.13 + 5.13 + DT2 * X_MIN) == lo_f[0, 0, 1].item()
    values[0, 0, 0] = 1.0  # x1 = 1 m: the acceleration bound lets x2 go back to -0.25 m
    lo, hi = waypoint_bounds(values, known, v, accel_bounds())
    lo_f, hi_f = waypoint_bounds(values, known, v, accel_bounds(), forward_only=True)
    assert lo[0, 0, 1].item() == pytest.approx(2.0 + DT2 * X_MIN) and lo_f[0, 0, 1].item() == pytest.approx(1.0)
    assert lo_f[0, 0, 5].item() == pytest.approx(1.0)  # every later x too
    assert torch.equal(lo_f[0, 1], lo[0, 1]) and torch.equal(hi_f, hi)  # y untouched; no x known after x1


@pytest.fixture(scope="module")
def grammar(nano):
    return TrajectoryGrammar(nano.processor.tokenizer, nano.settings.eos_token_id)


def _constraint(nano, vx: float, rows=("planning",), forward_only: bool = False):
    egos = [EgoState(vx=vx) if t == "planning" else None for t in rows]
    return planning_constraint(nano.processor.tokenizer, _fixed(nano).settings, list(rows), 128, 1024, "cpu", egos,
                               forward_only)


def _favouring(grammar, text: str, rows: int = 1) -> torch.Tensor:
    """(rows, len(text), 1024) logits that prefer `text` strongly, everything else a little."""
    logits = torch.randn(rows, len(text), 1024, generator=torch.Generator().manual_seed(0))
    for p, tid in enumerate(grammar.encode(text)):
        logits[:, p, tid] = 50.0
    return logits


def _spell(grammar, logits: torch.Tensor) -> str:
    inverse = {v: k for k, v in grammar.char_ids.items()}
    return "".join(inverse.get(i, "?") for i in logits.argmax(-1).tolist())


def test_digits_outside_the_envelope_are_masked_whether_a_number_is_decoded_at_once_or_char_by_char(nano, grammar):
    c = _constraint(nano, 20.0)  # x1 within 10 m + dt^2 [-9, 6]: 7.75 .. 11.5 m
    lo, hi = 10.0 + DT2 * X_MIN, 10.0 + DT2 * X_MAX
    wanted = "+150.00,"
    mask = nano.settings.mask_token_id
    # block decoding: one call for the whole number; its best characters spell a value inside
    out = c.apply(_favouring(grammar, wanted), 0, torch.full((1, 8), mask))
    value = float(_spell(grammar, out[0, :7]))
    assert lo <= value <= hi, value
    # autoregressive: one position per call, each committed before the next
    answer = torch.empty(1, 0, dtype=torch.long)
    for p in range(7):
        out = c.apply(_favouring(grammar, wanted)[:, p:p + 1], p, answer)
        answer = torch.cat([answer, out.argmax(-1)], 1)
    value = float(_spell(grammar, torch.nn.functional.one_hot(answer[0], 1024).float()))
    assert lo <= value <= hi, value
    # a plan already inside is left as it is
    inside = "+010.20,"
    out = c.apply(_favouring(grammar, inside), 0, torch.full((1, 8), mask))
    assert _spell(grammar, out[0, :7]) == inside[:7]


def test_rows_without_an_ego_or_another_task_are_left_alone(nano, grammar):
    c = _constraint(nano, 20.0, rows=("planning", "detection"))
    logits = _favouring(grammar, "+150.00,", rows=2)
    out = c.apply(logits, 0, torch.full((2, 8), nano.settings.mask_token_id))
    assert torch.equal(out[1], logits[1])
    no_ego = planning_constraint(nano.processor.tokenizer, _fixed(nano).settings, ["planning"], 128, 1024, "cpu", [None])
    banned_only = no_ego.apply(logits[:1], 0)
    assert torch.equal(no_ego.apply(logits[:1], 0, torch.full((1, 8), nano.settings.mask_token_id)), banned_only)
    assert _spell(grammar, banned_only[0, :7]) == "+150.00"
    with pytest.raises(ValueError, match="egos: 2 entries for a batch of 1 rows"):
        planning_constraint(nano.processor.tokenizer, _fixed(nano).settings, ["planning"], 128, 1024, "cpu",
                            [None, None])


def test_a_committed_prefix_outside_the_bound_keeps_the_nearest_digit_allowed(nano, grammar):
    c = _constraint(nano, 20.0)  # bound 7.75 .. 11.5 m; "+09" already committed: 90 .. 99.99 m
    answer = torch.tensor([grammar.encode("+09")])
    out = c.apply(torch.zeros(1, 1, 1024), 3, answer)
    allowed = [d for d in "0123456789" if torch.isfinite(out[0, 0, grammar.char_ids[d]])]
    assert allowed == ["0"]


def test_forward_only_keeps_a_digit_mask_from_stepping_back_in_x(nano, grammar):
    """x1 = +001.00 committed at 8 m/s (hard braking); the logits want x2 = +000.20. The plain envelope lets x2
    fall back to 0.2 m, forward only holds it at 1 m or more."""
    mask = nano.settings.mask_token_id
    answer = torch.tensor([grammar.encode("+001.00,-000.10,") + [mask] * 8])
    for forward, check in ((False, lambda v: v == pytest.approx(0.2)), (True, lambda v: v >= 1.0)):
        c = _constraint(nano, 8.0, forward_only=forward)
        out = c.apply(_favouring(grammar, "+000.20,"), 16, answer)
        value = float(_spell(grammar, out[0, :7]))
        assert check(value), (forward, value)


def _second_differences(plan: np.ndarray, vx: float) -> np.ndarray:
    x = np.concatenate([[-vx * WAYPOINT_DT_S, 0.0], plan[:, 0]])
    y = np.concatenate([[0.0, 0.0], plan[:, 1]])
    return np.stack([np.diff(x, 2), np.diff(y, 2)], 1) / DT2


@pytest.mark.parametrize("block_size", [1, 8])
def test_a_random_model_decodes_plans_inside_the_envelope(nano, camera_image, block_size):
    """At B = 1 and B = 8 (one number per block) every waypoint is bounded from two known ones: every
    second difference of the plan lies in the acceleration range (rounding: 0.01 m over dt^2)."""
    fixed = _fixed(nano)
    runner = ModelRunner(nano.model, "sdpa")
    eos, tol = nano.settings.eos_token_id, 0.02 / DT2
    for vx in (3.0, 25.0):
        batch = nano.processor.encode([chat_prompt(planning_prompt(EgoState(vx=vx), "follow lane"), 1)], [[camera_image]])
        raw = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning"], 128, runner.vocab_size, "cpu")
        env = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning"], 128, runner.vocab_size, "cpu",
                                  [EgoState(vx=vx)])
        plans = {}
        for name, c in (("raw", raw), ("env", env)):
            if block_size == 1:
                ids = generate_ar(runner, batch, 128, eos, constraint=c).token_ids[0]
            else:
                cfg = DecoderConfig(block_size=block_size, steps=4, max_new_tokens=128)
                ids = generate(runner, batch, cfg, nano.settings.mask_token_id, eos, c).token_ids[0]
            plans[name] = parse_trajectory(nano.processor.decode(ids))
            assert not isinstance(plans[name], ParseError)
        acc = _second_differences(plans["env"], vx)
        assert acc[:, 0].min() >= X_MIN - tol and acc[:, 0].max() <= X_MAX + tol, acc
        assert np.abs(acc[:, 1]).max() <= ENVELOPE_LATERAL_MPS2 + tol, acc
        raw_acc = _second_differences(plans["raw"], vx)
        assert np.abs(raw_acc).max() > ENVELOPE_LATERAL_MPS2  # random weights: the envelope did the work


def test_the_policy_plans_inside_the_envelope_unless_told_not_to(nano, camera_image):
    vx = 12.0
    on = DrivingPolicy(_fixed(nano), DecoderConfig(block_size=8, steps=4)).plan([camera_image], EgoState(vx=vx), "follow lane")
    off = DrivingPolicy(_fixed(nano), DecoderConfig(block_size=8, steps=4, kinematic_envelope=False)).plan(
        [camera_image], EgoState(vx=vx), "follow lane")
    assert on.valid and off.valid
    assert np.abs(_second_differences(on.trajectory, vx)[:, 1]).max() <= ENVELOPE_LATERAL_MPS2 + 0.1
    assert not np.allclose(on.trajectory, off.trajectory)


def test_numbers_one_step_commits_together_do_not_step_back_with_forward_only(nano, grammar):
    """A whole block in one step, nothing committed, the logits wanting x1 = 5.13 and x2 = 2.38 at 9 m/s: both lie
    inside the acceleration bound (x2 >= 2.25 m); forward only spells x2 at 5.13 m or more."""
    mask = nano.settings.mask_token_id
    wanted = "+005.13,-000.11,+002.38,-000.11,"
    for forward in (False, True):
        out = _constraint(nano, 9.0, forward_only=forward).apply(_favouring(grammar, wanted), 0,
                                                                 torch.full((1, 32), mask))
        text = _spell(grammar, out[0])
        x1, x2 = float(text[0:7]), float(text[16:23])
        assert x1 == pytest.approx(5.13)
        assert (x2 >= x1) if forward else x2 == pytest.approx(2.38), (forward, text)


@pytest.mark.parametrize("block_size", [8, 32])
def test_a_random_model_never_plans_backwards_with_forward_only(nano, camera_image, block_size):
    fixed = _fixed(nano)
    runner = ModelRunner(nano.model, "sdpa")
    cfg = DecoderConfig(block_size=block_size, steps=4, max_new_tokens=128)
    for vx in (0.0, 4.0, 20.0):
        batch = nano.processor.encode([chat_prompt(planning_prompt(EgoState(vx=vx), "follow lane"), 1)], [[camera_image]])
        c = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning"], 128, runner.vocab_size, "cpu",
                                [EgoState(vx=vx)], True)
        ids = generate(runner, batch, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id, c).token_ids[0]
        plan = parse_trajectory(nano.processor.decode(ids))
        assert not isinstance(plan, ParseError)
        assert np.diff(np.concatenate([[0.0], plan[:, 0]])).min() >= 0.0, (vx, plan[:, 0])


def test_a_checkpoint_can_ask_for_forward_only_and_a_caller_can_override_it(nano):
    settings = dataclasses.replace(nano.settings, decoding=dataclasses.replace(nano.settings.decoding, forward_only=True))
    assert resolve_decoding(settings.decoding).forward_only is True
    assert resolve_decoding(settings.decoding, forward_only=None).forward_only is True
    assert resolve_decoding(settings.decoding, forward_only=False).forward_only is False
    assert resolve_decoding(nano.settings.decoding).forward_only is False


def test_the_planning_prompt_gives_back_its_ego_state():
    ego = EgoState(vx=12.345, vy=-0.5, ax=-1.0, ay=0.01)
    got = parse_planning_ego(chat_prompt(planning_prompt(ego, "turn left"), 1))
    assert (got.vx, got.vy, got.ax, got.ay) == (12.35, -0.5, -1.0, 0.01)
    assert parse_planning_ego("Detect every vehicle in view.") is None
    with pytest.raises(ValueError, match="text must be a string"):
        parse_planning_ego(None)
