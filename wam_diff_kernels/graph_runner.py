"""The capture-ready block-diffusion decoder: static shapes per bucket, fixed K steps, no host sync
inside a block, optionally one CUDA graph per (bucket, block kind) replayed for every block.

Same contract and same tokens as the eager reference (`wam_diff_core.decoding.block_diffusion.generate`,
fused commit): the prompt is prefilled by the engine, then copied (padding removed) into a
`StaticKVCache` that belongs to the bucket; per block, B mask tokens at the next positions and K
steps, each one forward of the block against the static cache plus an on-device remasking step
(`remask_ops`); the finished block is written into the cache by the next block's first step
(queries [finished block | new block], the finished one block-causal), which also yields its last
logit for the next block's first token (shifted alignment). Differences from the reference, none of
which changes a token:
- always exactly K steps per block (the dynamic strategy's early exit needs a host sync); once a
  block is full the remaining steps commit nothing;
- the kinematic envelope reads the answer so far from a static buffer (the finished blocks, then the
  block being denoised) and masks with the block's start as a device tensor
  (`KinematicEnvelope.apply_at`), so one graph serves every block and the logits are the eager
  path's, bit for bit;
- attention spans the whole static row under a per-query key limit (SDPA), or the planned FlashInfer
  kernel (`attention="flashinfer"`), instead of the cache's committed prefix;
- the only host synchronisation per block is the EOS check (none with `ignore_eos`).

A bucket is (batch, B, K, capacity, remasking settings). Its buffers live as long as the runner, so
a graph captured once keeps pointing at them: a block is run by refreshing the inputs in place
(positions, FlashInfer plans, outside the graph) and replaying.

On an H200 (results/kernels/h200/): with SDPA attention the captured decode is
token-identical to the eager reference and a block makes no host sync; with FlashInfer attention the
captured decode replays the eager one over the same (graph-mode) plans, and its bf16 steps are as close to
float32 as SDPA's (docs/gpu.md). On a CPU, or with `cuda_graphs=False`, the same block
function runs eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Optional

import torch

from wam_diff_core.decoding.block_diffusion import generate as generate_eager
from wam_diff_core.decoding.config import DecoderConfig, step_count
from wam_diff_core.decoding.constraint import TokenConstraint
from wam_diff_core.decoding.envelope import ANSWER_CHARS, KinematicEnvelope
from wam_diff_core.decoding.result import DecodeResult, PhaseClock, decode_result
from wam_diff_core.model.processor import PromptBatch
from wam_diff_core.model.runner import ModelRunner

from .fast_layers import FastTextLayers
from .remask_ops import block_logits, remask_step
from .static_cache import StaticKVCache, StaticSpec

ATTENTION = ("sdpa", "flashinfer")
CAPACITY_ROUND = 64  # bucket capacities are rounded up so requests of similar length share a graph


@dataclass(frozen=True)
class Bucket:
    """What fixes every shape and every baked-in constant of a captured block."""

    batch: int
    block_size: int
    steps: int  # steps actually taken per block (step_count(B, K))
    capacity: int  # cache slots per sample
    strategy: str
    threshold: float
    temperature: float
    constrained: bool = False  # logits masked per position (the trajectory grammar) before each commit
    ordered: bool = False  # commits follow the grammar's chains (number order)
    schedule: str = "linear"  # commits per step (remasking.masked_after)
    enveloped: bool = False  # planning rows masked to the kinematic envelope (decoding.envelope)
    forward_only: bool = False  # ... with its forward-only bound


class BlockState:
    """The static buffers of one bucket: cache, block tokens and mask, positions, the finished block
    waiting to be committed, and the logit that predicts the next block's first token."""

    def __init__(self, runner: ModelRunner, bucket: Bucket, mask_id: int):
        b, B, dev = bucket.batch, bucket.block_size, runner.device
        self.cache = StaticKVCache.for_model(runner.model, b, bucket.capacity)
        self.x = torch.full((b, B), mask_id, dtype=torch.long, device=dev)
        self.masked = torch.ones((b, B), dtype=torch.bool, device=dev)
        self.probs = torch.zeros((b, B), dtype=torch.float32, device=dev)  # each token's probability at its commit
        self.pos = torch.zeros((b, B), dtype=torch.long, device=dev)
        self.pend = torch.full((b, B), mask_id, dtype=torch.long, device=dev)
        self.pend_pos = torch.zeros((b, B), dtype=torch.long, device=dev)
        weight = runner.lm_head.weight
        self.prev_logits = torch.zeros((b, weight.shape[0]), dtype=weight.dtype, device=dev)
        self.plain_limits = torch.full((B,), B, dtype=torch.long, device=dev)
        self.fused_limits = torch.cat([torch.full((B,), B), torch.full((B,), 2 * B)]).to(dev)
        self.offsets = torch.arange(B, device=dev)
        # tokens each block position may not hold, refreshed in place before every block
        self.banned = torch.zeros((b, B, weight.shape[0]), dtype=torch.bool, device=dev) if bucket.constrained else None
        # block position where each position's chain starts, refreshed in place before every block
        self.chains = self.offsets.repeat(b, 1) if bucket.ordered else None
        self.envelope = _envelope_buffers(b, weight.shape[0], dev, bucket.forward_only) if bucket.enveloped else None
        self.start = torch.zeros((), dtype=torch.long, device=dev)  # the block's first answer position
        # the answer's first ANSWER_CHARS tokens so far (-1: not decoded yet), a last column taking what falls past
        self.answer = torch.full((b, ANSWER_CHARS + 1), -1, dtype=torch.long, device=dev) if bucket.enveloped else None

    def load_envelope(self, envelope: KinematicEnvelope) -> None:
        """Copy a request's envelope (ego velocities, active rows, token tables) into the bucket's buffers."""
        for name in ("velocity", "active", "codes", "digit_ids", "sign_ids"):
            getattr(self.envelope, name).copy_(getattr(envelope, name))
        self.answer.fill_(-1)

    def answer_with(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(batch, ANSWER_CHARS): the finished blocks' tokens with the block `x` at its positions `index`."""
        return self.answer.scatter(1, index, x)[:, :ANSWER_CHARS]


def _envelope_buffers(batch: int, vocab: int, device, forward_only: bool) -> KinematicEnvelope:
    return KinematicEnvelope(torch.zeros((batch, 2), dtype=torch.float32, device=device),
                             torch.zeros(batch, dtype=torch.bool, device=device),
                             torch.full((vocab,), -1, dtype=torch.long, device=device),
                             torch.zeros(10, dtype=torch.long, device=device),
                             torch.zeros(2, dtype=torch.long, device=device), forward_only)


def forward_static(runner: ModelRunner, tokens: torch.Tensor, rope, cache: StaticKVCache,
                   spec: StaticSpec) -> torch.Tensor:
    """The model's text layers over `tokens` (batch, n) against the static cache; final hidden states
    (batch, n, hidden). Attention goes through the model's registered backend with `spec`."""
    h = runner.text.embed_tokens(tokens)
    for layer in runner.text.layers:
        h = layer(h, position_embeddings=rope, attention_mask=None, cache=cache, block_spec=spec)
    return runner.text.norm(h)


def run_block(runner: ModelRunner, st: BlockState, bucket: Bucket, mask_id: int, fused: bool,
              plans: tuple[Any, Any] = (None, None), generator: Optional[torch.Generator] = None,
              layers: Optional[FastTextLayers] = None) -> None:
    """Denoise one block in place: K steps over the static state; with `fused`, the first step also
    commits the finished block in `st.pend` and refreshes `st.prev_logits`. Ends with the block in
    `st.x` and copied to `st.pend`. Tensor ops only: no host sync, no data-dependent Python.

    plans: the (plain step, fused step) FlashInfer plans, or None for SDPA. layers: the fast text layers
    (`wam_diff_kernels.fast_layers`), or None for the model's own.
    """
    B, K = bucket.block_size, bucket.steps
    cache = st.cache
    forward = layers.forward if layers is not None else partial(forward_static, runner)
    st.x.fill_(mask_id)
    st.masked.fill_(True)
    st.probs.zero_()
    rope = runner.rope(st.pos)
    index = (st.start + st.offsets).clamp(max=ANSWER_CHARS).expand_as(st.x)  # the block's answer positions
    for s in range(K):
        if fused and s == 0:
            tokens = torch.cat([st.pend, st.x], 1)
            q_rope = runner.rope(torch.cat([st.pend_pos, st.pos], 1))
            hidden = forward(tokens, q_rope, cache, cache.begin(st.fused_limits, plans[1]))
            cache.commit(B)
            st.prev_logits.copy_(runner.logits(hidden[:, B - 1]))
            h = hidden[:, B:]
        else:
            h = forward(st.x, rope, cache, cache.begin(st.plain_limits, plans[0]))
        logits = block_logits(st.prev_logits, runner.logits(h[:, : B - 1]))
        if st.banned is not None:
            logits = logits.masked_fill(st.banned, float("-inf"))
        if st.envelope is not None:
            logits = st.envelope.apply_at(logits, st.start, st.answer_with(st.x, index))
        x, masked, probs = remask_step(logits, st.x, st.masked, bucket.strategy, bucket.threshold, K, s,
                                       bucket.temperature, generator, st.chains, bucket.schedule, exclude=mask_id,
                                       probs=st.probs)
        st.x.copy_(x)
        st.masked.copy_(masked)
        st.probs.copy_(probs)
    st.pend.copy_(st.x)
    st.pend_pos.copy_(st.pos)
    if st.answer is not None:
        st.answer.scatter_(1, index, st.x)


class _BucketRun:
    """One bucket's state, FlashInfer planner and (when captured) its two graphs."""

    def __init__(self, owner: "GraphRunner", bucket: Bucket):
        self.owner, self.bucket = owner, bucket
        self.state = BlockState(owner.runner, bucket, owner.mask_id)
        self.planner = None
        if owner.attention == "flashinfer":
            from .flashinfer_attention import StepPlanner

            self.planner = StepPlanner(owner.runner.model, self.state.cache, bucket.block_size,
                                       use_cuda_graph=owner.cuda_graphs)
        self.graphs: dict[bool, Any] = {}

    @property
    def plans(self):
        return (self.planner.plain, self.planner.fused) if self.planner is not None else (None, None)

    def _eager(self, fused: bool, generator=None) -> None:
        run_block(self.owner.runner, self.state, self.bucket, self.owner.mask_id, fused, self.plans, generator,
                  self.owner.layers)

    def capture(self) -> None:
        """Warm up, then capture the first-block and later-block graphs (CUDA only).

        Plans are made before capture; the captured kernels read the plan buffers, which `block`
        refreshes before each replay. Warm-up runs on a side stream, as torch.cuda.graphs requires.
        """
        cache = self.state.cache
        if self.planner is not None:
            self.planner.plan([0] * self.bucket.batch, fused=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for fused in (False, True):
                cache.lens.zero_()
                self._eager(fused)
        torch.cuda.current_stream().wait_stream(side)
        cache.lens.zero_()
        pool = torch.cuda.graph_pool_handle()
        for fused in (False, True):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._eager(fused)
            self.graphs[fused] = graph
        self.owner.captures += 1

    def block(self, fused: bool, lens_host: list[int], generator=None) -> None:
        """Run one block: plan (host side, outside any graph), then replay or run eagerly."""
        if self.planner is not None:
            self.planner.plan(lens_host, fused)
        graph = self.graphs.get(fused)
        if graph is not None:
            graph.replay()
            self.owner.replays += 1
        else:
            self._eager(fused, generator)


class GraphRunner:
    """Capture-ready decoding over a ModelRunner. `attention`: "sdpa" (the model's registered SDPA
    backend reading a static mask) or "flashinfer" (switches the model's text attention to the
    FlashInfer backend; CUDA + flashinfer only). `cuda_graphs`: capture and replay per bucket (CUDA
    only; ignored on a CPU, where the same block function runs eagerly). `fast_layers`: run the text
    layers through `wam_diff_kernels.fast_layers` (merged projections, fewer kernels; same math), and with
    `compile_layers` also torch.compile their two pure parts (implies fast_layers)."""

    def __init__(self, runner: ModelRunner, mask_id: int, attention: str = "sdpa", cuda_graphs: bool = False,
                 fast_layers: bool = False, compile_layers: bool = False):
        if attention not in ATTENTION:
            raise ValueError(f"unknown attention {attention!r} for the static decoder; expected one of {ATTENTION}")
        if attention == "flashinfer":
            from .flashinfer_attention import use_flashinfer

            use_flashinfer(runner.model)  # raises naming what is missing when there is no CUDA/flashinfer
            runner.backend = "flashinfer"
        elif runner.backend != "sdpa":
            raise ValueError(f"the static decoder's SDPA attention needs a runner built with backend 'sdpa', "
                             f"got {runner.backend!r}")
        self.runner, self.mask_id, self.attention = runner, mask_id, attention
        self.cuda_graphs = bool(cuda_graphs) and runner.device.type == "cuda"
        self.layers = runner.layer_stack("compiled" if compile_layers else "fast" if fast_layers else "model")
        self.buckets: dict[Bucket, _BucketRun] = {}
        self.captures = 0  # buckets captured (each: a first-block and a later-block graph)
        self.replays = 0

    def bucket_for(self, batch: int, cfg: DecoderConfig, need: int, constrained: bool = False,
                   ordered: bool = False, enveloped: bool = False) -> _BucketRun:
        K = step_count(cfg.block_size, cfg.steps)
        forward_only = enveloped and cfg.forward_only
        want = (batch, cfg.block_size, K, cfg.strategy, cfg.threshold, cfg.temperature, constrained, ordered,
                cfg.schedule, enveloped, forward_only)
        same = [r for key, r in self.buckets.items()
                if (key.batch, key.block_size, key.steps, key.strategy, key.threshold, key.temperature,
                    key.constrained, key.ordered, key.schedule, key.enveloped, key.forward_only) == want
                and key.capacity >= need]
        if same:
            return min(same, key=lambda r: r.bucket.capacity)
        capacity = -(-need // CAPACITY_ROUND) * CAPACITY_ROUND
        bucket = Bucket(batch, cfg.block_size, K, capacity, cfg.strategy, cfg.threshold, cfg.temperature, constrained,
                        ordered, cfg.schedule, enveloped, forward_only)
        if self.cuda_graphs and cfg.temperature > 0:
            raise ValueError("captured decoding is greedy only (temperature 0); sampling runs with cuda_graphs off")
        run = _BucketRun(self, bucket)
        if self.cuda_graphs:
            run.capture()
        self.buckets[bucket] = run
        return run

    @torch.inference_mode()
    def generate(self, batch: PromptBatch, cfg: DecoderConfig, eos_id: int,
                 constraint: Optional[TokenConstraint] = None) -> DecodeResult:
        """Decode a batch of left-padded prompts; same result fields as the reference decoder. B = 1
        (autoregressive) is delegated to the reference decoder. `constraint`: the per-position token
        mask (trajectory grammar), copied into the bucket's static buffer before each block, and its
        kinematic envelope, copied into the bucket's once per request."""
        runner = self.runner
        if cfg.block_size == 1:  # plain (not fast-path) settings, so a dispatching caller cannot loop back here
            return generate_eager(runner, batch, replace(cfg, backend="sdpa", cuda_graphs=False), self.mask_id, eos_id,
                                  constraint)
        device = runner.device
        b, prompt_len = batch.input_ids.shape
        B, n_blocks = cfg.block_size, cfg.num_blocks
        pads = (prompt_len - batch.attention_mask.sum(dim=1)).tolist()  # host ints, once per request
        clock = PhaseClock(device)
        ordered = constraint is not None and cfg.number_order
        envelope = constraint.envelope if constraint is not None else None
        run = self.bucket_for(b, cfg, prompt_len + (n_blocks + 1) * B, constraint is not None, ordered,
                              envelope is not None)
        st = run.state
        if envelope is not None:
            st.load_envelope(envelope)
        clock.lap("capture")

        vision = runner.encode_images(batch)
        clock.lap("vision")
        pre = runner.new_cache(b, prompt_len)
        prev_logits, next_pos = runner.prefill(batch, pre, B, vision)
        lens_host = st.cache.load_prefill(pre.keys, pre.values, pads)
        st.prev_logits.copy_(prev_logits)
        st.pos.copy_(next_pos[:, None] + st.offsets)
        clock.lap("prefill")

        generator = torch.Generator(device=device).manual_seed(cfg.seed) if cfg.temperature > 0 else None
        out = torch.full((b, cfg.answer_positions), eos_id, dtype=torch.long, device=device)
        probs = torch.zeros((b, cfg.answer_positions), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        blocks = 0
        for j in range(n_blocks):
            if j > 0:
                st.pos.add_(B)
            st.start.fill_(j * B)
            if constraint is not None:
                st.banned.copy_(constraint.banned(j * B, B, st.banned.shape[-1]))
            if ordered:
                st.chains.copy_(constraint.chains(j * B, B))
            run.block(j > 0, lens_host, generator)
            if j > 0:
                lens_host = [n + B for n in lens_host]
            blocks += 1
            out[:, j * B:(j + 1) * B] = st.x
            probs[:, j * B:(j + 1) * B] = st.probs
            if not cfg.ignore_eos:
                done |= (st.x == eos_id).any(dim=1)
                if bool(done.all()):  # the one host sync per block
                    break
        clock.lap("denoise")
        clock.timings["commit"] = 0.0
        runner.forwards = 1 + run.bucket.steps * blocks
        return decode_result(out, probs, eos_id, cfg.max_new_tokens, cfg.ignore_eos, runner.forwards, clock.total())


_RUNNERS: dict[tuple[int, str, bool, int, str], GraphRunner] = {}


def generate_static(runner: ModelRunner, batch: PromptBatch, cfg: DecoderConfig, mask_id: int,
                    eos_id: int, constraint: Optional[TokenConstraint] = None) -> DecodeResult:
    """Drop-in for the reference `generate` honouring `cfg.backend` ("sdpa" or "flashinfer" attention;
    "flex" runs the static path with SDPA), `cfg.cuda_graphs` and `cfg.text_layers`. Keeps one GraphRunner
    (and so its buckets and graphs) per (runner, attention, graphs, mask id, text layers)."""
    attention = "flashinfer" if cfg.backend == "flashinfer" else "sdpa"
    key = (id(runner), attention, bool(cfg.cuda_graphs), mask_id, cfg.text_layers)
    graph_runner = _RUNNERS.get(key)
    if graph_runner is None or graph_runner.runner is not runner:
        graph_runner = _RUNNERS[key] = GraphRunner(runner, mask_id, attention, cfg.cuda_graphs,
                                                   fast_layers=cfg.text_layers == "fast",
                                                   compile_layers=cfg.text_layers == "compiled")
    return graph_runner.generate(batch, cfg, eos_id, constraint)
