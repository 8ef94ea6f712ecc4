import copy

import pytest
import torch

from wam_diff_core.attention.backends import BlockSpec
from wam_diff_core.attention.block_mask import CLEAN, NOISY, PREFIX
from wam_diff_core.decoding.ar import generate_ar
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.prompts import chat_prompt, planning_prompt, qa_prompt
from wam_diff_core.types import EgoState

PROMPTS = [
    (chat_prompt(planning_prompt(EgoState(vx=6.5, ax=0.3), "turn left"), 1), 1),
    (chat_prompt(qa_prompt("Is the left lane free?"), 1), 1),
    (chat_prompt(planning_prompt(EgoState(vx=20.0, vy=0.4), "change lane right"), 0), 0),
]


@pytest.fixture(scope="module")
def runner(nano):
    return ModelRunner(nano.model, "sdpa")


def _batch(nano, image, items):
    return nano.processor.encode([p for p, _ in items], [[image] * n for _, n in items])


def _decode(runner, nano, batch, **kw):
    cfg = DecoderConfig(**{"max_new_tokens": 24, **kw})
    return generate(runner, batch, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)


def test_block_size_one_reproduces_hf_greedy_generate_token_for_token(nano, runner, camera_image):
    reference = copy.deepcopy(nano.model)
    reference.set_attn_implementation("sdpa")
    for item in PROMPTS:
        batch = _batch(nano, camera_image, [item])
        kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                      mm_token_type_ids=batch.mm_token_type_ids)
        if batch.pixel_values is not None:
            kwargs.update(pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw)
        with torch.inference_mode():
            hf = reference.generate(**kwargs, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                                    suppress_tokens=[nano.settings.mask_token_id])  # ours never predicts its mask
        hf_tokens = hf[0, batch.input_ids.shape[1]:].tolist()
        ours = _decode(runner, nano, batch, block_size=1, steps=1, ignore_eos=True)
        assert ours.token_ids[0] == hf_tokens
        assert len(set(hf_tokens)) > 3  # the comparison is not between constant sequences
        assert ours.forwards == 1 + 23  # prefill + one forward per later token


def test_ar_decoder_equals_block_decoder_with_block_size_one_on_a_padded_batch(nano, runner, camera_image):
    batch = _batch(nano, camera_image, PROMPTS)
    assert not bool(batch.attention_mask.all())
    ar = generate_ar(runner, batch, 24, nano.settings.eos_token_id, ignore_eos=True,
                     mask_id=nano.settings.mask_token_id)
    block = _decode(runner, nano, batch, block_size=1, steps=1, ignore_eos=True)
    assert ar.token_ids == block.token_ids
    assert ar.forwards == block.forwards == 24


@pytest.mark.parametrize("block_size", [4, 8, 32])
@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static", "sequential"])
def test_fused_commit_is_token_identical_to_a_separate_commit_forward(nano, runner, camera_image, block_size, strategy):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    kw = dict(block_size=block_size, steps=4, strategy=strategy, threshold=0.5, max_new_tokens=40, ignore_eos=True)
    fused = _decode(runner, nano, batch, fuse_commit=True, **kw)
    separate = _decode(runner, nano, batch, fuse_commit=False, **kw)
    assert fused.token_ids == separate.token_ids
    n_blocks = -(-40 // block_size)
    assert separate.forwards - fused.forwards == n_blocks - 1


def test_batched_prompts_of_different_lengths_decode_as_they_do_alone(nano, runner, camera_image):
    cfg = dict(block_size=4, steps=4, strategy="low_confidence_static", ignore_eos=True)
    together = _decode(runner, nano, _batch(nano, camera_image, PROMPTS), **cfg)
    for i, item in enumerate(PROMPTS):
        alone = _decode(runner, nano, _batch(nano, camera_image, [item]), **cfg)
        assert together.token_ids[i] == alone.token_ids[0]


def test_static_schedule_uses_exactly_k_forwards_per_block(nano, runner, camera_image):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    res = _decode(runner, nano, batch, block_size=8, steps=4, strategy="low_confidence_static", max_new_tokens=32,
                  ignore_eos=True)
    assert res.forwards == 1 + 4 * 4  # prefill + K per block; commits ride along with the next block's first step
    assert len(res.token_ids[0]) == 32
    assert nano.settings.mask_token_id not in res.token_ids[0]


def test_eos_stops_decoding_and_is_cut_from_the_answer(nano, runner, camera_image):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    free = _decode(runner, nano, batch, block_size=1, steps=1, ignore_eos=True, max_new_tokens=12)
    eos = free.token_ids[0][5]  # pretend the sixth greedy token is EOS
    res = generate(runner, batch, DecoderConfig(block_size=1, steps=1, max_new_tokens=12), nano.settings.mask_token_id, eos)
    cut = free.token_ids[0].index(eos)
    assert res.token_ids[0] == free.token_ids[0][:cut]
    assert res.finished == [True]
    assert res.forwards == 1 + cut  # no forward after EOS


def test_sampling_is_reproducible_with_a_seed_and_differs_across_seeds(nano, runner, camera_image):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    kw = dict(block_size=4, steps=4, temperature=1.5, ignore_eos=True, max_new_tokens=32)
    a = _decode(runner, nano, batch, seed=1, **kw)
    b = _decode(runner, nano, batch, seed=1, **kw)
    c = _decode(runner, nano, batch, seed=2, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def _full_forward_logits(runner, nano, batch, response, block_size, kinds_response):
    """Logits of [prompt | response] in one forward under the block-causal mask (no cache)."""
    model = runner.model
    ids = torch.cat([batch.input_ids, response], 1)
    mm = torch.cat([batch.mm_token_type_ids, torch.zeros_like(response, dtype=torch.int32)], 1)
    pos, _ = model.model.get_rope_index(ids, mm, image_grid_thw=batch.image_grid_thw)
    L, R = batch.input_ids.shape[1], response.shape[1]
    n_prompt_blocks = -(-L // block_size)
    blocks = torch.cat([torch.arange(L) // block_size, n_prompt_blocks + torch.arange(R) // block_size])[None]
    kinds = torch.cat([torch.full((L,), PREFIX), kinds_response])[None]
    spec = BlockSpec(blocks, kinds, blocks, kinds)
    with torch.inference_mode():
        vision = runner.encode_images(batch)
        out = model.model(input_ids=ids, position_ids=pos, mm_encoder_outputs=vision, block_spec=spec)
        return model.lm_head(out.last_hidden_state)[0]


@pytest.mark.parametrize("block_size", [4, 32])
@pytest.mark.parametrize("fused", [False, True])
def test_cached_block_step_logits_match_a_full_block_causal_forward(nano, runner, camera_image, block_size, fused):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    gen = torch.Generator().manual_seed(3)
    response = torch.randint(10, 500, (1, 3 * block_size), generator=gen)
    response[0, 2 * block_size + 1::2] = nano.settings.mask_token_id  # a partly masked third block
    kinds = torch.cat([torch.full((2 * block_size,), CLEAN), torch.full((block_size,), NOISY)])
    full = _full_forward_logits(runner, nano, batch, response, block_size, kinds)
    L = batch.input_ids.shape[1]

    cache = runner.new_cache(1, L + 4 * block_size)
    prompt_logits, next_pos = runner.prefill(batch, cache, block_size, runner.encode_images(batch))
    first = -(-L // block_size)
    blk = lambda j: response[:, j * block_size:(j + 1) * block_size]  # noqa: E731
    pos = lambda j: next_pos[:, None] + j * block_size + torch.arange(block_size)  # noqa: E731
    ids = lambda j, kind: (torch.full((1, block_size), first + j), torch.full((1, block_size), kind))  # noqa: E731
    with torch.inference_mode():
        h0 = runner.forward_tokens(blk(0), *ids(0, CLEAN), cache, runner.rope(pos(0)), full=True)
        cache.advance(block_size)
        if fused:
            qb1, qk1 = ids(1, CLEAN)
            qb2, qk2 = ids(2, NOISY)
            h = runner.forward_tokens(torch.cat([blk(1), blk(2)], 1), torch.cat([qb1, qb2], 1), torch.cat([qk1, qk2], 1),
                                      cache, runner.rope(torch.cat([pos(1), pos(2)], 1)))
            cache.advance(block_size)
            h1, h2 = h[:, :block_size], h[:, block_size:]
        else:
            h1 = runner.forward_tokens(blk(1), *ids(1, CLEAN), cache, runner.rope(pos(1)), full=True)
            cache.advance(block_size)
            h2 = runner.forward_tokens(blk(2), *ids(2, NOISY), cache, runner.rope(pos(2)), full=True)
        cached = torch.cat([runner.logits(h) for h in (h0, h1, h2)], 1)[0]
    assert torch.allclose(prompt_logits[0], full[L - 1], atol=1e-4)
    diff = (cached - full[L:]).abs().max().item()
    assert diff <= 1e-4, diff


def test_changing_one_token_changes_only_its_own_and_later_blocks(nano, runner, camera_image):
    B = 4
    batch = _batch(nano, camera_image, PROMPTS[:1])
    response = torch.randint(10, 500, (1, 4 * B), generator=torch.Generator().manual_seed(5))
    kinds = torch.full((4 * B,), CLEAN)
    base = _full_forward_logits(runner, nano, batch, response, B, kinds)
    changed = response.clone()
    changed[0, 2 * B + 1] += 1  # a token in response block 2
    other = _full_forward_logits(runner, nano, batch, changed, B, kinds)
    L = batch.input_ids.shape[1]
    per_position = (base - other).abs().amax(dim=-1)
    assert per_position[: L + 2 * B].max().item() <= 1e-6  # prompt and blocks 0, 1: untouched
    assert per_position[L + 2 * B: L + 3 * B].min().item() > 1e-3  # every position of its own block moves
    assert per_position[L + 3 * B:].min().item() > 1e-3  # and of the later block


def test_flex_backend_decodes_the_same_tokens_as_sdpa(nano, camera_image):
    flex_model = copy.deepcopy(nano.model)
    flex_runner = ModelRunner(flex_model, "flex")
    sdpa_runner = ModelRunner(copy.deepcopy(nano.model), "sdpa")
    batch = _batch(nano, camera_image, PROMPTS)
    kw = dict(block_size=4, steps=2, strategy="low_confidence_static", ignore_eos=True, max_new_tokens=12)
    assert _decode(flex_runner, nano, batch, **kw).token_ids == _decode(sdpa_runner, nano, batch, **kw).token_ids


def test_dynamic_decoding_stops_a_block_once_a_committed_eos_precedes_every_masked_position(nano, runner, camera_image):
    batch = _batch(nano, camera_image, PROMPTS[:1])
    kw = dict(block_size=8, steps=8, strategy="low_confidence_dynamic", threshold=0.99, max_new_tokens=16)
    free = _decode(runner, nano, batch, ignore_eos=True, **kw)
    eos = free.token_ids[0][2]  # pretend the third token is EOS
    cut = free.token_ids[0].index(eos)
    res = generate(runner, batch, DecoderConfig(**kw), nano.settings.mask_token_id, eos)
    assert res.token_ids[0] == free.token_ids[0][:cut]
    assert res.finished == [True]
    assert res.forwards < free.forwards


# --- the decoder never commits its own mask token -----------------------------------------------


class _PreferMask(torch.nn.Module):
    """An LM head whose logits are the model's own plus `margin` on the mask token (exactly 0 elsewhere), so
    the mask is every position's argmax by `margin` and the other tokens keep their logits bit for bit."""

    def __init__(self, head, mask_id: int, margin: float = 1e4):
        super().__init__()
        self.head, self.weight = head, head.weight
        self.register_buffer("bias", torch.zeros(head.weight.shape[0]))
        self.bias[mask_id] = margin

    def forward(self, hidden):
        return self.head(hidden) + self.bias


@pytest.fixture(scope="module")
def mask_lover(nano):
    runner = ModelRunner(nano.model, "sdpa")
    runner.lm_head = _PreferMask(nano.model.lm_head, nano.settings.mask_token_id)
    return runner


def test_the_mask_loving_head_makes_the_mask_the_argmax_everywhere_so_the_tests_below_can_fail(nano, mask_lover,
                                                                                                 camera_image):
    batch = _batch(nano, camera_image, PROMPTS)
    plain_ar = generate_ar(mask_lover, batch, 12, nano.settings.eos_token_id, ignore_eos=True)  # no mask_id given
    assert plain_ar.token_ids == [[nano.settings.mask_token_id] * 12] * 3


@pytest.mark.parametrize("kw", [
    dict(block_size=1, steps=1),
    dict(block_size=8, steps=4, strategy="low_confidence_dynamic", threshold=0.9),
    dict(block_size=8, steps=4, strategy="low_confidence_static"),
    dict(block_size=8, steps=8, strategy="sequential", fuse_commit=False),
    dict(block_size=8, steps=4, strategy="low_confidence_dynamic", threshold=0.5, temperature=1.0, seed=3),
], ids=["ar-b1", "dynamic", "static", "sequential-unfused", "dynamic-sampled"])
def test_a_model_preferring_its_mask_token_decodes_as_if_the_mask_were_not_in_its_vocabulary(nano, runner, mask_lover,
                                                                                             camera_image, kw):
    batch = _batch(nano, camera_image, PROMPTS)
    kw = dict(kw, max_new_tokens=24, ignore_eos=True)
    loving = _decode(mask_lover, nano, batch, **kw)
    plain = _decode(runner, nano, batch, **kw)
    mask = nano.settings.mask_token_id
    assert [len(t) for t in loving.token_ids] == [24, 24, 24]
    assert all(mask not in t for t in loving.token_ids)
    assert loving.token_ids == plain.token_ids  # the other tokens' logits, so confidences and commits, are unchanged


def test_the_ar_baseline_with_the_mask_id_never_picks_it_and_equals_the_block_decoder_at_b1(nano, runner, mask_lover,
                                                                                           camera_image):
    batch = _batch(nano, camera_image, PROMPTS)
    mask = nano.settings.mask_token_id
    ar = generate_ar(mask_lover, batch, 24, nano.settings.eos_token_id, ignore_eos=True, mask_id=mask)
    assert all(len(t) == 24 and mask not in t for t in ar.token_ids)
    assert ar.token_ids == _decode(runner, nano, batch, block_size=1, steps=1, ignore_eos=True).token_ids


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static"])
def test_the_static_decoder_on_cpu_never_commits_the_mask_token_either(nano, runner, mask_lover, camera_image,
                                                                      strategy):
    from wam_diff_kernels.graph_runner import GraphRunner

    batch = _batch(nano, camera_image, PROMPTS)
    mask, eos = nano.settings.mask_token_id, nano.settings.eos_token_id
    cfg = DecoderConfig(block_size=8, steps=4, strategy=strategy, threshold=0.9, max_new_tokens=24, ignore_eos=True)
    loving = GraphRunner(mask_lover, mask).generate(batch, cfg, eos)
    assert [len(t) for t in loving.token_ids] == [24, 24, 24] and all(mask not in t for t in loving.token_ids)
    assert loving.token_ids == GraphRunner(runner, mask).generate(batch, cfg, eos).token_ids


# --- dynamic remasking finishes every block -------------------------------------------------------


@pytest.mark.parametrize("block_size, steps, schedule", [(8, 8, "linear"), (8, 3, "linear"), (16, 4, "cosine")])
def test_every_block_finished_by_dynamic_remasking_holds_no_mask_token(nano, runner, camera_image, schedule,
                                                                      block_size, steps):
    batch = _batch(nano, camera_image, PROMPTS)
    mask = nano.settings.mask_token_id
    kw = dict(block_size=block_size, steps=steps, strategy="low_confidence_dynamic", threshold=0.95,
              schedule=schedule, max_new_tokens=3 * block_size)
    free = _decode(runner, nano, batch, ignore_eos=True, **kw)
    assert [len(t) for t in free.token_ids] == [3 * block_size] * 3
    assert all(mask not in t for t in free.token_ids)
    # with an early end: a token of the first answer's second block stands in for EOS, so some blocks stop
    # before their last step once that EOS precedes every masked position
    eos = free.token_ids[0][block_size + 1]
    res = generate(runner, batch, DecoderConfig(**kw), mask, eos)
    assert all(mask not in t for t in res.token_ids)
    assert res.token_ids[0] == free.token_ids[0][: free.token_ids[0].index(eos)]
