"""The FlashInfer backend's own code (layouts, request/page mapping, plans, prefill split) run on the
CPU against a stand-in for the flashinfer module that implements the documented semantics of the three
calls it uses with plain torch math. What this cannot check is FlashInfer itself (its kernels, JIT,
CUDA-graph mode): tests/test_kernels_gpu.py does that on a GPU.

Documented semantics the stand-in follows (flashinfer 0.7.0 API docs):
- BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout).plan(qo_indptr, kv_indptr, kv_indices,
  kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, causal=..., sm_scale=...);
  run(q (nnz_qo, H, D), (k_cache, v_cache) each (pages, H_kv, page_size, D) for HND): request r's
  queries are q[qo_indptr[r]:qo_indptr[r+1]], its keys the pages kv_indices[kv_indptr[r]:kv_indptr[r+1]],
  all full but the last, which holds kv_last_page_len[r] tokens;
- BlockSparseAttentionWrapper.plan(indptr, indices, M, N, R, C, ...): BSR over (M, N) in (R, C)
  blocks, M % R == N % C == 0; run(q (M, H, D), k/v (N, H_kv, D));
- single_prefill_with_kv_cache(q, k, v, custom_mask=bool (qo, kv), causal, kv_layout, sm_scale).
"""
import copy
import types

import pytest
import torch

from wam_diff_kernels import flashinfer_attention as fa
from wam_diff_kernels import graph_runner
from wam_diff_kernels.graph_runner import GraphRunner
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.runner import ModelRunner


def _attend(q, k, v, mask, scale):
    """q (n, H, D), k/v (m, H_kv, D), mask (n, m) bool or None -> (n, H, D)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=None if mask is None else mask[None, None], scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


class _Paged:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, backend="auto", **buffers):
        assert kv_layout == "HND" and backend in ("fa2", "fa3", "auto")
        self.calls = 0

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, sm_scale=None, q_data_type=None, kv_data_type=None, o_data_type=None):
        assert not causal and int(last_page_len.min()) >= 1 and int(last_page_len.max()) <= page_size
        self.p = [t.tolist() for t in (qo_indptr, kv_indptr, kv_indices, last_page_len)] + [page_size, sm_scale]

    def run(self, q, kv):
        (qo, kvp, idx, last, page, scale), (kc, vc) = self.p, kv
        assert kc.shape[2] == page and q.shape[0] == qo[-1]
        out = torch.empty_like(q)
        for r in range(len(qo) - 1):
            pages = idx[kvp[r]:kvp[r + 1]]
            k = torch.cat([kc[p] for p in pages], 1)[:, : (len(pages) - 1) * page + last[r]].transpose(0, 1)
            v = torch.cat([vc[p] for p in pages], 1)[:, : (len(pages) - 1) * page + last[r]].transpose(0, 1)
            out[qo[r]:qo[r + 1]] = _attend(q[qo[r]:qo[r + 1]], k, v, None, scale)
        self.calls += 1
        return out


class _BlockSparse:
    def __init__(self, workspace, backend="auto"):
        pass

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, causal=False, sm_scale=None,
             q_data_type=None, kv_data_type=None, o_data_type="float16"):
        assert M % R == 0 and N % C == 0, "FlashInfer's BSR takes whole blocks"
        assert o_data_type == q_data_type
        mask = torch.zeros(M, N, dtype=torch.bool)
        for row in range(len(indptr) - 1):
            for col in indices[indptr[row]:indptr[row + 1]].tolist():
                mask[row * R:(row + 1) * R, col * C:(col + 1) * C] = True
        self.mask, self.scale = mask, sm_scale

    def run(self, q, k, v):
        return _attend(q, k, v, self.mask, self.scale)


def _single_prefill(q, k, v, custom_mask=None, causal=False, kv_layout="NHD", sm_scale=None, backend="auto"):
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    mask = custom_mask
    if causal:  # bottom-right aligned
        n, m = q.shape[0], k.shape[0]
        mask = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
    return _attend(q, k, v, mask, sm_scale)


FAKE = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_Paged, BlockSparseAttentionWrapper=_BlockSparse,
                             single_prefill_with_kv_cache=_single_prefill)


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(fa, "require_flashinfer", lambda: FAKE)
    monkeypatch.setattr(fa, "_check_tensor", lambda t: None)  # CPU float32 instead of CUDA bf16
    fa._BSR.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    fa._BSR.clear()


@pytest.fixture(scope="module")
def batch(two_prompts, encode_prompts):
    return encode_prompts(two_prompts)


@pytest.mark.parametrize("mode", ["block_sparse", "custom_mask"])
@pytest.mark.parametrize("B", [4, 32])
def test_flashinfer_glue_prefill_and_block_steps_decode_the_reference_tokens(nano, batch, monkeypatch, mode, B):
    monkeypatch.setenv("WAM_FLASHINFER_PREFILL", mode)
    ids = nano.settings
    cfg = DecoderConfig(block_size=B, steps=2, strategy="low_confidence_static", max_new_tokens=B + 4, ignore_eos=True)
    ref = generate(ModelRunner(nano.model, "sdpa"), batch, cfg, ids.mask_token_id, ids.eos_token_id)
    runner = ModelRunner(copy.deepcopy(nano.model), "sdpa")
    static = GraphRunner(runner, ids.mask_token_id, attention="flashinfer")
    assert runner.model.config.text_config._attn_implementation == fa.REGISTERED_NAME
    ours = static.generate(batch, cfg, ids.eos_token_id)
    assert ours.token_ids == ref.token_ids
    planner = next(iter(static.buckets.values())).planner
    K, blocks = 2, cfg.num_blocks
    assert planner.fused.wrapper.calls == 4 * (blocks - 1)  # one fused step per later block, in each of 4 layers
    assert planner.plain.wrapper.calls == 4 * (K * blocks - (blocks - 1))
    if mode == "block_sparse":
        assert fa._BSR  # the prompts went through the block-sparse kernel


def test_flashinfer_glue_serves_the_fast_layers_too(nano, batch):
    """wam_diff_kernels.fast_layers hands the step's spec (and so its FlashInfer plan) to the registered backend."""
    ids = nano.settings
    cfg = DecoderConfig(block_size=8, steps=2, strategy="low_confidence_static", max_new_tokens=20, ignore_eos=True)
    ref = generate(ModelRunner(nano.model, "sdpa"), batch, cfg, ids.mask_token_id, ids.eos_token_id)
    static = GraphRunner(ModelRunner(copy.deepcopy(nano.model), "sdpa"), ids.mask_token_id, attention="flashinfer",
                         fast_layers=True)
    assert static.generate(batch, cfg, ids.eos_token_id).token_ids == ref.token_ids
    planner = next(iter(static.buckets.values())).planner
    assert planner.plain.wrapper.calls > 0 and planner.fused.wrapper.calls > 0


def test_flashinfer_glue_serves_the_eager_reference_decoder_too(nano, batch):
    """The reference decoder on this backend: masked fused steps (custom mask per sample, pads cut)
    and unmasked steps (a single-sample batch has no padding)."""
    ids = nano.settings
    runner = ModelRunner(copy.deepcopy(nano.model), "sdpa")
    fa.use_flashinfer(runner.model)
    cfg = DecoderConfig(block_size=4, steps=2, strategy="low_confidence_static", max_new_tokens=12, ignore_eos=True)
    sdpa = ModelRunner(nano.model, "sdpa")
    for b in (batch, type(batch)(*(None if t is None else t[:1] for t in (
            batch.input_ids, batch.attention_mask, batch.mm_token_type_ids)), batch.pixel_values, batch.image_grid_thw)):
        want = generate(sdpa, b, cfg, ids.mask_token_id, ids.eos_token_id).token_ids
        assert generate(runner, b, cfg, ids.mask_token_id, ids.eos_token_id).token_ids == want


def test_block_sparse_prefill_splits_a_partial_last_block_off():
    torch.manual_seed(0)
    n, block = 10, 4
    q, k, v = torch.randn(n, 4, 8), torch.randn(n, 2, 8), torch.randn(n, 2, 8)
    out = fa._block_sparse_prefill(FAKE, q, k, v, block, 8 ** -0.5)
    blocks = torch.arange(n) // block
    want = _attend(q, k, v, blocks[None, :] <= blocks[:, None], 8 ** -0.5)
    assert torch.allclose(out, want, atol=1e-5)
    assert graph_runner.ATTENTION == ("sdpa", "flashinfer")


def test_jit_warmup_makes_the_backends_own_calls_for_both_module_kinds(monkeypatch):
    """The warm-up builds modules by calling the backend's code (so it builds what the backend loads):
    the paged block step in both graph modes, the block-sparse prefill, and a single prefill."""
    from wam_diff_kernels import jit_warmup

    calls = []
    fake = types.SimpleNamespace(
        BatchPrefillWithPagedKVCacheWrapper=lambda *a, **kw: calls.append(("paged", kw.get("use_cuda_graph", False)))
        or _Paged(*a, **kw),
        BlockSparseAttentionWrapper=lambda *a, **kw: calls.append(("bsr",)) or _BlockSparse(*a, **kw),
        single_prefill_with_kv_cache=lambda *a, **kw: calls.append(("single", kw.get("causal"))) or _single_prefill(*a, **kw))
    monkeypatch.setattr(fa, "require_flashinfer", lambda: fake)
    jit_warmup.build("batch_prefill", 16, torch.float32, "cpu")
    assert calls == [("paged", False), ("paged", True), ("bsr",)]
    calls.clear()
    jit_warmup.build("single_prefill", 16, torch.float32, "cpu")
    assert calls == [("single", True)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert jit_warmup.main(["--head-dims", "64"]) == 2  # no CUDA: says so and builds nothing


def _dropping_keys(n_drop):
    """A broken paged wrapper: every request misses its last n_drop keys (what a wrong kv length does)."""
    class Broken(_Paged):
        def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, *args, **kwargs):
            super().plan(qo_indptr, kv_indptr, kv_indices, (last_page_len - n_drop).clamp(min=1), *args, **kwargs)

    return Broken


@pytest.mark.parametrize("broken", [False, True])
def test_teacher_forcing_tells_a_wrong_attention_kernel_from_a_right_one(nano, batch, monkeypatch, broken):
    """wam_diff_kernels.teacher_forced on float32 with the stand-in: a right kernel follows the reference exactly
    (every masked position's argmax, logits within float32 rounding); one that drops 8 keys per request
    flips decisive positions, and its logits are far off."""
    from wam_diff_kernels.teacher_forced import compare, decode_logged

    if broken:
        monkeypatch.setattr(FAKE, "BatchPrefillWithPagedKVCacheWrapper", _dropping_keys(8))
    ids = nano.settings
    cfg = DecoderConfig(block_size=8, steps=4, strategy="low_confidence_static", max_new_tokens=24, ignore_eos=True)
    ref, ref_tokens = decode_logged(ModelRunner(nano.model, "sdpa"), ids.mask_token_id, ids.eos_token_id, "sdpa",
                                    batch, cfg)
    runner = ModelRunner(copy.deepcopy(nano.model), "sdpa")
    var, var_tokens = decode_logged(runner, ids.mask_token_id, ids.eos_token_id, "flashinfer", batch, cfg, replay=ref)
    stats = compare(ref, var)
    assert stats["steps"] == len(ref.logits) == 4 * 3 and stats["positions"] == 2 * 3 * (8 + 6 + 4 + 2)  # masked before each step
    assert var_tokens == ref_tokens  # forced: the variant's blocks are the reference's
    if broken:
        assert stats["top1_agreement"] < 0.9 and stats["max_margin_at_flip"] > stats["median_reference_margin"]
        assert stats["max_relative_logit_error"] > 0.1
    else:
        assert stats["top1_agreement"] == 1.0 and stats["flips"] == 0 and stats["max_margin_at_flip"] == 0.0
        assert stats["max_relative_logit_error"] < 1e-4
