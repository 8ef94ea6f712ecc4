"""FlashInfer attention backend for the Qwen3-VL text layers (GPU only; flashinfer imported lazily).

Written against FlashInfer's Python API (flashinfer-python 0.7.0: BatchPrefillWithPagedKVCacheWrapper,
BlockSparseAttentionWrapper, single_prefill_with_kv_cache). Checked on an H200 (tests/test_kernels_gpu.py
and `wam_diff_kernels.teacher_forced`; logs and tables in results/kernels/h200/): a block step equals SDPA over the
static mask (2B and nano shapes), the prefill writes SDPA's K/V and gives its last logits, a block makes no
host sync, teacher-forced along a float32 decode every bf16 step is as close to float32 as bf16 SDPA's, and
the captured decode replays the eager one. (Greedy tokens of a random model differ from SDPA's after a few steps, as
those of torch.compiled layers do: near-tied logits, not a wrong kernel.)

Registered with transformers' AttentionInterface as "wam_flashinfer" (registration needs no
flashinfer; a call does, and raises naming what is missing). What it computes depends on the spec:
- block denoising steps of the capture-ready decoder (`StaticSpec` with a `PagedStep` plan): one
  batched paged-prefill call with NO mask. Each cache row of the `StaticKVCache` is one page in the
  HND layout (page_size = the row's capacity), so the cache is used in place. A plain step is one
  request per sample (the B block queries over kv_len = committed + B); the fused commit step is two
  requests per sample on the same page, the finished block over committed + B and the new block over
  committed + 2B, which is exactly the block-causal visibility with no mask. Plans are made on the
  host before the block runs (before capture, before each replay); with `use_cuda_graph` the wrapper
  keeps its index buffers static, as FlashInfer's CUDA-graph mode requires.
- block-causal prompt prefill (a `BlockSpec` over PREFIX/PAD tokens): per sample, over its real
  tokens, either a block-sparse BSR pattern with R = C = B (lower-triangular in blocks; exact for a
  block-causal mask; FlashInfer's BSR takes whole blocks only, so a partial last block, which sees
  every key, is one unmasked call) or a boolean custom mask. `WAM_FLASHINFER_PREFILL=block_sparse|custom_mask`
  chooses (the ladder measures both; a packed custom mask is reported ~2x slower than plain causal).
- any other masked forward (the eager reference decoder run on this backend): a custom mask per
  sample; `full` specs: no mask. These are for correctness checks, not speed.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Optional

import torch
from transformers import AttentionInterface

from wam_diff_core.attention.block_mask import PAD, PREFIX

from .availability import require_flashinfer
from .static_cache import StaticKVCache, StaticSpec

REGISTERED_NAME = "wam_flashinfer"
PREFILL_MODES = ("block_sparse", "custom_mask")
WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's documented default float workspace
_BSR_CACHE_SIZE = 8


def kernel_backend() -> str:
    """FlashInfer kernel family: "fa2" by default (one JIT build per head size serves every call here;
    "auto" picks FA3 on Hopper where it can, at the cost of more kernels to JIT-compile)."""
    return os.environ.get("WAM_FLASHINFER_BACKEND", "fa2")


def prefill_mode() -> str:
    mode = os.environ.get("WAM_FLASHINFER_PREFILL", "block_sparse")
    if mode not in PREFILL_MODES:
        raise ValueError(f"WAM_FLASHINFER_PREFILL={mode!r}; expected one of {PREFILL_MODES}")
    return mode


def _check_tensor(t: torch.Tensor) -> None:
    """FlashInfer's kernels take CUDA tensors in bfloat16 or float16."""
    if t.device.type != "cuda":
        raise RuntimeError(f"the FlashInfer backend needs CUDA tensors, got one on {t.device}")
    if t.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"the FlashInfer backend runs in bfloat16 or float16, got {t.dtype} (use --dtype bfloat16)")


class PagedStep:
    """One planned kind of block step: `requests` ragged query groups of `q_per_request` tokens, request
    r reading page `pages[r]` of the static cache (one page = one sample's row). `plan(kv_lens)` runs on
    the host; `run` is what a captured graph replays."""

    def __init__(self, fi, cache: StaticKVCache, num_heads: int, q_per_request: int, pages: list[int],
                 use_cuda_graph: bool):
        n_req, dev = len(pages), cache.keys.device
        self.cache, self.num_heads, self.q_per_request = cache, num_heads, q_per_request
        self.qo_indptr = torch.arange(n_req + 1, dtype=torch.int32) * q_per_request
        self.kv_indptr = torch.arange(n_req + 1, dtype=torch.int32)
        self.kv_indices = torch.tensor(pages, dtype=torch.int32)
        buffers = {}
        if use_cuda_graph:
            int32 = dict(dtype=torch.int32, device=dev)
            buffers = dict(use_cuda_graph=True, qo_indptr_buf=torch.empty(n_req + 1, **int32),
                           paged_kv_indptr_buf=torch.empty(n_req + 1, **int32),
                           paged_kv_indices_buf=torch.empty(n_req, **int32),
                           paged_kv_last_page_len_buf=torch.empty(n_req, **int32))
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self.wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND", backend=kernel_backend(), **buffers)
        self.kv_lens: Optional[list[int]] = None
        self._staged: Optional[torch.cuda.Event] = None  # marks the last plan's copy to the device

    def plan(self, kv_lens: list[int]) -> None:
        """kv_lens: keys each request sees (host ints, 1..capacity). Host work, and at most one wait.

        FlashInfer writes a plan into a pinned host buffer and copies it to the device asynchronously,
        in stream order, while the host may run ahead of the device (no sync inside a block; a graph
        replay returns at once). A new plan must not overwrite that buffer before the last plan's copy
        has run, or the earlier block would read the later block's plan. FlashInfer's own copies of the
        index arrays from pageable memory already wait for the stream; the event recorded after each
        plan makes the guarantee explicit instead of leaning on that: a plan waits until the device has
        begun the block planned before it, which leaves the host one block ahead.
        """
        cache = self.cache
        if max(kv_lens) > cache.max_len or min(kv_lens) < 1:
            raise ValueError(f"kv lengths {kv_lens} outside 1..{cache.max_len}")
        if self._staged is not None:
            self._staged.synchronize()
        self.wrapper.plan(
            self.qo_indptr, self.kv_indptr, self.kv_indices, torch.tensor(kv_lens, dtype=torch.int32),
            self.num_heads, cache.kv_heads, cache.head_dim, cache.max_len,
            causal=False, sm_scale=cache.head_dim ** -0.5, q_data_type=cache.keys.dtype, kv_data_type=cache.keys.dtype,
            o_data_type=cache.keys.dtype,
        )
        if cache.keys.device.type == "cuda":
            self._staged = torch.cuda.Event()
            self._staged.record()
        self.kv_lens = list(kv_lens)

    def run(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query (batch, heads, n, head_dim); key/value: the layer's static rows (batch, kv_heads,
        capacity, head_dim) = pages in HND. Returns (batch, n, heads, head_dim)."""
        b, h, n, d = query.shape
        q = query.transpose(1, 2).reshape(b * n, h, d)  # sample-major; each sample splits into its requests
        out = self.wrapper.run(q, (key, value))
        return out.view(b, n, h, d)


class StepPlanner:
    """The two step kinds of one bucket of the capture-ready decoder, planned per block on the host."""

    def __init__(self, model, cache: StaticKVCache, block_size: int, use_cuda_graph: bool):
        fi = require_flashinfer()
        _check_tensor(cache.keys)
        heads = model.config.text_config.num_attention_heads
        b = cache.batch
        self.block_size = block_size
        self.plain = PagedStep(fi, cache, heads, block_size, list(range(b)), use_cuda_graph)
        self.fused = PagedStep(fi, cache, heads, block_size, [p for p in range(b) for _ in (0, 1)], use_cuda_graph)

    def plan(self, lens: list[int], fused: bool) -> None:
        """lens: committed tokens per sample before the block (host ints, from the known schedule)."""
        fused_lens, plain_lens = step_kv_lens(lens, self.block_size, fused)
        if fused_lens is not None:
            self.fused.plan(fused_lens)
        self.plain.plan(plain_lens)


def step_kv_lens(lens: list[int], block: int, fused: bool) -> tuple[Optional[list[int]], list[int]]:
    """Keys seen per request in a block's steps, from the committed length per sample before the block.

    Fused first step (when `fused`): two requests per sample, the finished block (committed + B) and
    the new block (committed + 2B); it commits B tokens. Plain steps: one request per sample
    (committed + B). The same numbers as the static SDPA mask's per-query limits.
    """
    fused_lens = None
    if fused:
        fused_lens = [n + block * (1 + r) for n in lens for r in (0, 1)]
        lens = [n + block for n in lens]
    return fused_lens, [n + block for n in lens]


def block_causal_bsr(n_real: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BSR (indptr, indices) of a block-causal pattern over n_real tokens in blocks of `block` (the last
    block may be partial): block row i holds block columns 0..i. int32, on the CPU."""
    rows = -(-n_real // block)
    indptr = torch.tensor([i * (i + 1) // 2 for i in range(rows + 1)], dtype=torch.int32)
    indices = torch.cat([torch.arange(i + 1, dtype=torch.int32) for i in range(rows)]) if rows else indptr[:0]
    return indptr, indices


_BSR: "OrderedDict[tuple, object]" = OrderedDict()


def _bsr_wrapper(fi, device, n_real: int, block: int, heads: int, kv_heads: int, head_dim: int, dtype):
    """A BlockSparseAttentionWrapper planned for a block-causal pattern over n_real tokens (cached:
    every layer, and every prompt of the same length and block size, reuses the plan)."""
    key = (str(device), n_real, block, heads, kv_heads, head_dim, dtype)
    if key in _BSR:
        _BSR.move_to_end(key)
        return _BSR[key]
    indptr, indices = (t.to(device) for t in block_causal_bsr(n_real, block))
    wrapper = fi.BlockSparseAttentionWrapper(torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device),
                                             backend=kernel_backend())
    wrapper.plan(indptr, indices, n_real, n_real, block, block, heads, kv_heads, head_dim,
                 causal=False, sm_scale=head_dim ** -0.5, q_data_type=dtype, kv_data_type=dtype, o_data_type=dtype)
    _BSR[key] = wrapper
    if len(_BSR) > _BSR_CACHE_SIZE:
        _BSR.popitem(last=False)
    return wrapper


def _host_layout(spec) -> dict:
    """Per-sample pad counts and block size of a generic BlockSpec (one host read per forward)."""
    if "fi_host" not in spec._cache:
        q_pads = (spec.q_kind == PAD).sum(1).tolist()
        k_pads = (spec.k_kind == PAD).sum(1).tolist()
        q_kinds = set(spec.q_kind.unique().tolist()) - {PAD}
        prompt = q_kinds <= {PREFIX} and spec.q_kind.shape[1] == spec.k_kind.shape[1]
        block = None
        if prompt:
            b0 = int(q_pads[0])
            first = spec.q_block[0, b0:]
            block = int((first == first[0]).sum()) if first.numel() else 1
        spec._cache["fi_host"] = dict(q_pads=q_pads, k_pads=k_pads, prompt=prompt, block=block)
    return spec._cache["fi_host"]


def _block_sparse_prefill(fi, q, k, v, block: int, scaling) -> torch.Tensor:
    """Block-causal attention of one prompt's real tokens q/k/v (n, heads, d) NHD.

    FlashInfer's BSR needs whole blocks (M % R == N % C == 0), so the whole blocks go through the
    block-sparse kernel and a partial last block, whose queries see every key, through one
    unmasked prefill call."""
    n = q.shape[0]
    head = (n // block) * block
    if head == n:
        return _bsr_wrapper(fi, q.device, n, block, q.shape[1], k.shape[1], q.shape[2], q.dtype).run(q, k, v)
    out = torch.empty_like(q)
    if head:
        wrapper = _bsr_wrapper(fi, q.device, head, block, q.shape[1], k.shape[1], q.shape[2], q.dtype)
        out[:head] = wrapper.run(q[:head], k[:head], v[:head])
    out[head:] = fi.single_prefill_with_kv_cache(q[head:], k, v, causal=False, sm_scale=scaling,
                                                    backend=kernel_backend())
    return out


def _masked(fi, spec, query, key, value, scaling) -> torch.Tensor:
    """Generic masked forward, per sample over its real queries and keys."""
    b, h, n, d = query.shape
    host = _host_layout(spec)
    out = query.new_zeros(b, n, h, d)  # pad queries: zeros (no real query ever sees them)
    mode = prefill_mode()
    for i in range(b):
        qp, kp = host["q_pads"][i], host["k_pads"][i]
        q = query[i, :, qp:].transpose(0, 1).contiguous()  # (n_q, heads, d)
        k = key[i, :, kp:].transpose(0, 1).contiguous()  # (n_k, kv_heads, d), NHD
        v = value[i, :, kp:].transpose(0, 1).contiguous()
        if host["prompt"] and mode == "block_sparse" and host["block"] > 1:
            o = _block_sparse_prefill(fi, q, k, v, host["block"], scaling)
        elif host["prompt"] and host["block"] == 1:
            o = fi.single_prefill_with_kv_cache(q, k, v, causal=True, sm_scale=scaling, backend=kernel_backend())
        else:
            mask = spec.dense()[i, 0, qp:, kp:].contiguous()
            o = fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, sm_scale=scaling, backend=kernel_backend())
        out[i, qp:] = o
    return out


def _full(fi, query, key, value, scaling) -> torch.Tensor:
    b, h, n, d = query.shape
    outs = [fi.single_prefill_with_kv_cache(query[i].transpose(0, 1).contiguous(), key[i], value[i], kv_layout="HND",
                                            causal=False, sm_scale=scaling, backend=kernel_backend()) for i in range(b)]
    return torch.stack(outs)


def flashinfer_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, block_spec=None,
                         **kwargs):
    """AttentionInterface function: query (batch, heads, n, d), key/value (batch, kv_heads, kv_len, d);
    returns ((batch, n, heads, d), None)."""
    fi = require_flashinfer()
    _check_tensor(query)
    if block_spec is None:
        raise ValueError(f"{REGISTERED_NAME} attention needs a block_spec")
    if isinstance(block_spec, StaticSpec):
        if block_spec.plan is None:
            raise ValueError("a static forward on the FlashInfer backend needs a planned PagedStep (StepPlanner)")
        return block_spec.plan.run(query, key, value), None
    if block_spec.full:
        return _full(fi, query, key.contiguous(), value.contiguous(), scaling), None
    return _masked(fi, block_spec, query, key, value, scaling), None


AttentionInterface.register(REGISTERED_NAME, flashinfer_attention)


def use_flashinfer(model) -> None:
    """Route the text layers of a Qwen3-VL model through FlashInfer (vision keeps SDPA). Raises
    RuntimeError naming what is missing when CUDA or flashinfer is absent."""
    require_flashinfer()
    _check_tensor(next(model.parameters()))
    model.set_attn_implementation({"text_config": REGISTERED_NAME, "vision_config": "sdpa"})
