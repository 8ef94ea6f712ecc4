"""The kinematic envelope on the capture-ready static decoder: the logits of `KinematicEnvelope.apply` at every block
start from a device tensor, no host read inside a block, and the shipped model's plans on validation frames of the
embedded world identical token for token on the eager and the static paths (on the CPU, where the static block
function runs eagerly)."""
import dataclasses
import random

import pytest
import torch

from wam_diff_core import policy as policy_mod
from wam_diff_core.codec import FIXED_TRAJECTORY_CHARS
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.constraint import TrajectoryGrammar, planning_constraint
from wam_diff_core.decoding.envelope import ANSWER_CHARS, KinematicEnvelope
from wam_diff_core.prompts import chat_prompt, detection_prompt, planning_prompt
from wam_diff_core.types import EgoState
from wam_diff_kernels import graph_runner
from wam_diff_kernels.graph_runner import GraphRunner, generate_static

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module


def _fixed(nano):
    return dataclasses.replace(nano, settings=dataclasses.replace(nano.settings, trajectory_format="fixed"))


def _random_plan(rng: random.Random) -> str:
    values = [v for k in range(8) for v in (rng.uniform(0, 30) * (k + 1) / 8, rng.uniform(-2, 2))]
    return ",".join(f"{v:+07.2f}" for v in values)[:FIXED_TRAJECTORY_CHARS]


@pytest.mark.parametrize("forward_only", [False, True])
def test_apply_at_gives_applys_logits_bit_for_bit_at_every_block_start(nano, forward_only):
    """Random partial answers (committed blocks, a block partly masked) at every block start of B = 4 .. 32."""
    fixed, rng, gen = _fixed(nano), random.Random(0), torch.Generator().manual_seed(0)
    tokenizer, mask, eos = nano.processor.tokenizer, nano.settings.mask_token_id, nano.settings.eos_token_id
    grammar = TrajectoryGrammar(tokenizer, eos)
    compared = 0
    for B in (4, 8, 16, 32):
        for start in range(0, 128, B):
            egos = [EgoState(vx=rng.uniform(0, 20), vy=rng.uniform(-1, 1)), None, EgoState(vx=rng.uniform(0, 4))]
            c = planning_constraint(tokenizer, fixed.settings, ["planning"] * 3, 128, 1024, "cpu", egos, forward_only)
            full = torch.tensor([grammar.encode(_random_plan(rng)) + [eos] * (128 - FIXED_TRAJECTORY_CHARS)
                                 for _ in range(3)])
            x = full[:, start:start + B].clone()
            x[torch.rand(x.shape, generator=gen) < rng.random()] = mask
            logits = c.apply(torch.randn(3, B, 1024, generator=gen) * 3, start)  # the grammar first, as decoders do
            want = c.envelope.apply(logits, start, torch.cat([full[:, :start], x], 1))
            answer = torch.full((3, ANSWER_CHARS + 1), -1)
            answer[:, :min(start, ANSWER_CHARS)] = full[:, :min(start, ANSWER_CHARS)]
            answer.scatter_(1, (start + torch.arange(B)).clamp(max=ANSWER_CHARS).expand(3, B), x)
            got = c.envelope.apply_at(logits, torch.tensor(start), answer[:, :ANSWER_CHARS])
            assert torch.equal(got, want), (B, start)
            compared += int(not torch.equal(want, logits))  # the envelope masked something there
    assert compared >= 20


@pytest.fixture(scope="module")
def planning_batch(nano, camera_image):
    """A planning prompt and a detection prompt (left-padded), the planning row under grammar and envelope."""
    prompts = [chat_prompt(planning_prompt(EgoState(vx=9.0, ax=-0.5), "turn left"), 1), chat_prompt(detection_prompt(), 1)]
    return nano.processor.encode(prompts, [[camera_image]] * 2)


@pytest.mark.parametrize("forward_only", [False, True])
@pytest.mark.parametrize("B", [4, 8, 32])
def test_the_static_path_decodes_the_eager_paths_tokens_under_the_envelope(nano, nano_runner, planning_batch, B,
                                                                          forward_only):
    fixed = _fixed(nano)
    cfg = DecoderConfig(block_size=B, steps=4, max_new_tokens=128, forward_only=forward_only)
    c = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning", "detection"], cfg.answer_positions,
                            nano_runner.vocab_size, "cpu", [EgoState(vx=9.0), None], forward_only)
    mask, eos = nano.settings.mask_token_id, nano.settings.eos_token_id
    ref = generate(nano_runner, planning_batch, cfg, mask, eos, c)
    ours = GraphRunner(nano_runner, mask).generate(planning_batch, cfg, eos, c)
    assert ours.token_ids == ref.token_ids
    grammar_only = dataclasses.replace(c, envelope=None)
    assert generate(nano_runner, planning_batch, cfg, mask, eos, grammar_only).token_ids[0] != ref.token_ids[0]


def test_an_enveloped_block_traces_as_one_graph_and_reads_nothing_on_the_host(nano, nano_runner, planning_batch,
                                                                             monkeypatch):
    """fullgraph tracing of a block with the envelope (no data-dependent Python, the property CUDA-graph capture
    needs), the same tokens, and no tensor read by the host inside a block."""
    fixed = _fixed(nano)
    cfg = DecoderConfig(block_size=8, steps=2, max_new_tokens=24, forward_only=True, ignore_eos=True)
    c = planning_constraint(nano.processor.tokenizer, fixed.settings, ["planning", "detection"], cfg.answer_positions,
                            nano_runner.vocab_size, "cpu", [EgoState(vx=9.0), None], True)
    static = GraphRunner(nano_runner, nano.settings.mask_token_id)
    ref = static.generate(planning_batch, cfg, nano.settings.eos_token_id, c)
    reads, blocks = [], []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _n=name, _o=original, **k: reads.append(_n) or _o(t, *a, **k))
    run_block = graph_runner.run_block

    def counted(*a, **k):
        before = len(reads)
        run_block(*a, **k)
        blocks.append(len(reads) - before)

    monkeypatch.setattr(graph_runner, "run_block", counted)
    assert static.generate(planning_batch, cfg, nano.settings.eos_token_id, c).token_ids == ref.token_ids
    assert blocks == [0, 0, 0]
    monkeypatch.setattr(graph_runner, "run_block", torch.compile(run_block, backend="eager", fullgraph=True))
    try:
        assert static.generate(planning_batch, cfg, nano.settings.eos_token_id, c).token_ids == ref.token_ids
    finally:
        torch._dynamo.reset()


def _validation_frames(per_route: int, every: int):
    """Frames of the embedded world's validation routes (held out by `assign_splits`), the expert driving:
    (frame, ego state, command, route target) at every `every`-th tick of four scenario types."""
    pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")
    from wam_diff_core.sim.datagen import assign_splits
    from wam_diff_core.sim.highway import HighwayWorld
    from wam_diff_core.sim.routes import load_routes

    routes = load_routes()
    splits = assign_splits(routes, 0.2)
    picked = {}
    for route in routes:
        if splits[route.route_id] == "val" and route.scenario in ("highway_dense", "intersection", "merge", "roundabout"):
            picked.setdefault(route.scenario, route)
    frames = []
    for route in picked.values():
        world = HighwayWorld(route, frame_size=(256, 128), driver="expert", route_target_scenarios=("roundabout",))
        world.reset()
        for k in range(1, per_route * every + 1):
            tick = world.step(frame=k % every == 0)
            if k % every == 0:
                frames.append((tick.frame, tick.ego, tick.command, tick.route_target))
        world.close()
    return frames


def _plans(policy, frames, static: bool) -> list[str]:
    decode = (lambda runner, batch, cfg, m, e, c=None: generate_static(runner, batch, cfg, m, e, c)) if static \
        else generate
    original, policy_mod.generate = policy_mod.generate, decode
    try:
        return [policy.plan([f], ego, cmd, target=t).raw_text["planning"] for f, ego, cmd, t in frames]
    finally:
        policy_mod.generate = original


def test_the_shipped_model_publishes_the_same_plans_on_the_eager_and_static_paths(monkeypatch):
    frames = _validation_frames(per_route=3, every=9)
    policy = policy_mod.DrivingPolicy.load("nano-s-b32")
    assert policy.config.kinematic_envelope and policy.config.forward_only and policy.config.block_size == 32
    eager = _plans(policy, frames, static=False)
    assert len(eager) == 12 and len(set(eager)) >= 10  # twelve frames, (nearly) as many different plans
    assert _plans(policy, frames, static=True) == eager
    # the envelope is what makes them equal: the static path without it publishes other plans
    monkeypatch.setattr(KinematicEnvelope, "apply_at", lambda self, logits, start, answer: logits)
    without = _plans(policy, frames, static=True)
    assert sum(a != b for a, b in zip(without, eager)) >= 3
