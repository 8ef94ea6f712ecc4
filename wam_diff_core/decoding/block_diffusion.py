"""Block-diffusion decoding (docs/architecture.md, decoding contract), the reference eager path.

Per block: B mask tokens at the next positions; up to K steps, each one forward of the block against
the cache (a step does not extend the cache) followed by an on-device commit decision; the first
token of a block is predicted by the previous block's last logit (shifted alignment), so B = 1 is
autoregressive decoding with one forward per token.

Commit saving (fuse_commit): a finished block is not written by a forward of its own. It is prepended
to the next block's first step: its queries see the cache and itself only (block-causal), so its K/V
and its last logit are exactly those a separate commit forward would give, and the step's block
queries see it like any cached block. The cache then keeps the first B of the 2B written tokens.
"""
from __future__ import annotations

import torch

from .. import extensions
from ..attention.block_mask import CLEAN, NOISY
from ..model.processor import PromptBatch
from ..model.runner import ModelRunner
from .candidates import DecodeRows, RowSampler
from .config import DecoderConfig
from .constraint import TokenConstraint
from .remasking import commit_mask, predict, step_count
from .result import DecodeResult, PhaseClock, decode_result


def _full(batch: int, n: int, value: int, device) -> torch.Tensor:
    return torch.full((batch, n), value, dtype=torch.long, device=device)


def _settled(x: torch.Tensor, masked: torch.Tensor, done: torch.Tensor, eos_id: int, offsets: torch.Tensor,
             ignore_eos: bool) -> torch.Tensor:
    """(batch,) True where the block needs no more steps: nothing masked, the answer already ended in
    an earlier block, or a committed EOS precedes every masked position (what follows EOS is cut)."""
    B = x.shape[1]
    settled = ~masked.any(dim=1)
    if ignore_eos:
        return settled
    first_masked = torch.where(masked, offsets, B).amin(dim=1)
    first_eos = torch.where(x == eos_id, offsets, B).amin(dim=1)
    return settled | done | (first_eos < first_masked)


@torch.inference_mode()
def generate(runner: ModelRunner, batch: PromptBatch, cfg: DecoderConfig, mask_id: int, eos_id: int,
             constraint: TokenConstraint | None = None, rows: DecodeRows | None = None) -> DecodeResult:
    """Decode answers for a batch of prompts (on the runner's device).

    With CUDA graphs or the FlashInfer backend the capture-ready "static" decoder an extension registers
    decodes (same tokens; it hands B = 1 back here with graphs off). `constraint` (the planning grammar)
    masks the logits of every step, on either path, and with `cfg.number_order` orders the commits of
    each number's characters; its kinematic envelope, when it has one, too (the static path masks with the
    block's start on the device, `KinematicEnvelope.apply_at`: the same logits). `cfg.text_layers` picks the
    text layers on either path.

    `rows` (candidates, `decoding.candidates`): the prompts prefilled once and N answers of one of them decoded
    as one batch, row i of the result answering prompt `rows.prompts[i]` (`constraint` then covers those rows),
    the prompts' own rows greedy and token for token what they decode without `rows`. Eager path only, greedy
    (`cfg.temperature` 0). The static decoder takes a batch of N rows as it is (its buffers and graphs are
    captured per batch size: bucket by N), not yet the shared prefix or the per-row noise."""
    static = (cfg.cuda_graphs or cfg.backend == "flashinfer") and cfg.fuse_commit and cfg.block_size > 1
    if rows is not None and (static or cfg.temperature > 0):
        raise ValueError(f"candidate rows decode on the eager path at temperature 0, got cuda_graphs="
                         f"{cfg.cuda_graphs}, backend {cfg.backend!r}, temperature {cfg.temperature}")
    if static:
        return extensions.decoder("static")(runner, batch, cfg, mask_id, eos_id, constraint)
    with runner.text_layers(cfg.text_layers):
        return _generate_eager(runner, batch, cfg, mask_id, eos_id, constraint, rows)


def _prefill(runner: ModelRunner, batch: PromptBatch, cfg: DecoderConfig, rows: DecodeRows | None,
             clock: PhaseClock):
    """Vision and prefill into a new cache of one row per answer: (cache, last logits (rows, vocab), next
    positions (rows,))."""
    b, prompt_len = batch.input_ids.shape
    n_rows = b if rows is None else len(rows.prompts)
    cache = runner.new_cache(n_rows, prompt_len + (cfg.num_blocks + 1) * cfg.block_size)
    vision = runner.encode_images(batch)
    clock.lap("vision")
    prev_logits, next_pos = runner.prefill(batch, cache, cfg.block_size, vision, None if rows is None else rows.prompts)
    clock.lap("prefill")
    return cache, prev_logits, next_pos


def _commit_fused(runner: ModelRunner, cache, pending, x: torch.Tensor, pos: torch.Tensor, block_id: int):
    """The first step of a block with the finished block `pending` (tokens, positions) prepended: writes it into
    the cache; returns (its last logit (rows, vocab), the new block's hidden states (rows, B, hidden) or None
    for B = 1)."""
    b, B = x.shape
    device = x.device
    p_tokens, p_pos = pending
    tokens, q_pos = (torch.cat([p_tokens, x], 1), torch.cat([p_pos, pos], 1)) if B > 1 else (p_tokens, p_pos)
    q_block = torch.cat([_full(b, B, block_id - 1, device), _full(b, B, block_id, device)], 1)[:, : tokens.shape[1]]
    q_kind = torch.cat([_full(b, B, CLEAN, device), _full(b, B, NOISY, device)], 1)[:, : tokens.shape[1]]
    hidden = runner.forward_tokens(tokens, q_block, q_kind, cache, runner.rope(q_pos))
    cache.advance(B)
    return runner.logits(hidden[:, B - 1]), (hidden[:, B:] if B > 1 else None)


def _commit(runner: ModelRunner, cache, x: torch.Tensor, pos: torch.Tensor, block_id: int,
            padded: bool) -> torch.Tensor:
    """Write the finished block x (rows, B) at positions pos into the cache by a forward of its own; its rows'
    last logits (rows, vocab)."""
    b, B = x.shape
    hidden = runner.forward_tokens(x, _full(b, B, block_id, x.device), _full(b, B, CLEAN, x.device), cache,
                                   runner.rope(pos), full=not padded)
    cache.advance(B)
    return runner.logits(hidden[:, -1])


def _share(rows: DecodeRows, *tensors: torch.Tensor) -> None:
    """The extra rows of each tensor take the greedy row's values (the answer blocks they shared)."""
    for t in tensors:
        t[rows.own:] = t[rows.of]


def _generate_eager(runner: ModelRunner, batch: PromptBatch, cfg: DecoderConfig, mask_id: int, eos_id: int,
                    constraint: TokenConstraint | None, rows: DecodeRows | None = None) -> DecodeResult:
    device = runner.device
    B, n_blocks = cfg.block_size, cfg.num_blocks
    padded = not bool(batch.attention_mask.all())
    generator = torch.Generator(device=device).manual_seed(cfg.seed) if cfg.temperature > 0 else None
    sampler = RowSampler(rows, device) if rows is not None else None
    K = step_count(B, cfg.steps)
    dynamic = cfg.strategy == "low_confidence_dynamic"
    runner.forwards = 0
    clock = PhaseClock(device)
    cache, prev_logits, next_pos = _prefill(runner, batch, cfg, rows, clock)
    b = prev_logits.shape[0]
    answer_start, live = cache.length, b

    first_block = -(-batch.input_ids.shape[1] // B)  # response block ids follow every prompt block
    offsets = torch.arange(B, device=device)
    out = _full(b, cfg.answer_positions, eos_id, device)
    probs = torch.zeros((b, cfg.answer_positions), dtype=torch.float32, device=device)  # each token's, at its commit
    done = torch.zeros(b, dtype=torch.bool, device=device)
    pending = None  # (tokens, positions) of a finished block not yet in the cache
    for j in range(n_blocks):
        block_id = first_block + j
        if rows is not None and rows.live(j) > live:  # the candidates branch off the blocks they shared
            _share(rows, out, probs, done, prev_logits)
            cache.copy_row(rows.of, slice(rows.own, b), answer_start)
            if pending is not None:  # the last shared block: committed in every row by this block's first step
                pending = tuple(torch.cat([t, t[rows.of:rows.of + 1].expand(b - live, -1)]) for t in pending)
        live = b if rows is None else rows.live(j)
        pos = (next_pos[:, None] + j * B + offsets)[:live]
        x, x_probs = _block(runner, cache, cfg, (j, block_id, K), pending, pos, prev_logits[:live], out[:live],
                            constraint if constraint is None or live == b else constraint.head(live),
                            sampler if live == b else None, generator, mask_id, eos_id, dynamic, padded, done[:live])
        x_probs, committed = x_probs
        if committed is not None:  # the block before was committed: the rows' new last logits
            prev_logits = committed if live == b else torch.cat([committed, prev_logits[live:]])
        pending = None
        out[:live, j * B:(j + 1) * B] = x
        probs[:live, j * B:(j + 1) * B] = x_probs
        clock.lap("denoise")
        if not cfg.ignore_eos:
            done[:live] |= (x == eos_id).any(dim=1)
            if bool(done[:live].all()):
                break
        if j == n_blocks - 1:
            break
        if cfg.fuse_commit:
            pending = (x, pos)
        else:
            prev_logits = torch.cat([_commit(runner, cache, x, pos, block_id, padded), prev_logits[live:]])
            clock.lap("commit")
    if live < b:
        _share(rows, out, probs)

    clock.timings.setdefault("commit", 0.0)
    return decode_result(out, probs, eos_id, cfg.max_new_tokens, cfg.ignore_eos, runner.forwards, clock.total())


def _block(runner: ModelRunner, cache, cfg: DecoderConfig, where: tuple, pending, pos: torch.Tensor,
           prev_logits: torch.Tensor, out: torch.Tensor, constraint: TokenConstraint | None,
           sampler: RowSampler | None, generator, mask_id: int, eos_id: int, dynamic: bool, padded: bool,
           done: torch.Tensor):
    """Denoise answer block j of the rows given (up to K steps, the finished block `pending` committed by the
    first; with a single-step sampler the candidate rows commit the whole block at the first step and the later
    steps run the prompts' own rows alone): (its tokens (rows, B), (their commit probabilities (rows, B), the new
    last logits of the rows' cache or None when no block was committed))."""
    j, block_id, K = where
    b, B, device = pos.shape[0], cfg.block_size, pos.device
    keep = sampler.rows.own if sampler is not None and sampler.rows.sampling.single_step else b
    offsets = torch.arange(B, device=device)
    x = _full(b, B, mask_id, device)
    masked = torch.ones(b, B, dtype=torch.bool, device=device)
    x_probs = torch.zeros(b, B, dtype=torch.float32, device=device)
    rope = runner.rope(pos) if B > 1 else None
    chains = constraint.chains(j * B, B) if constraint is not None and cfg.number_order and B > 1 else None
    committed = None
    for s in range(K):
        n, h = (b if s == 0 else keep), None
        if pending is not None:
            prev_logits, h = _commit_fused(runner, cache, pending, x, pos, block_id)
            committed, pending = prev_logits, None
        elif B > 1:
            h = runner.forward_tokens(x[:n], _full(n, B, block_id, device), _full(n, B, NOISY, device), cache,
                                      tuple(r[:n] for r in rope), full=not padded)
        # token 0 of the block is predicted by the previous block's last logit, token i > 0 by
        # block position i - 1; one predict call keeps the sampling noise in block order
        logits = prev_logits[:n, None] if h is None else \
            torch.cat([prev_logits[:n, None], runner.logits(h[:, : B - 1])], 1)
        if constraint is not None:
            rows_constraint = constraint if n == b else constraint.head(n)
            answer = torch.cat([out[:n, : j * B], x[:n]], 1) if constraint.envelope is not None else None
            logits = rows_constraint.apply(logits, j * B, answer)
        if sampler is None or n < b:
            pred, conf = predict(logits, cfg.temperature, generator, exclude=mask_id)
            rank = conf
        else:
            pred, conf, rank = sampler(logits, exclude=mask_id)
        commit = commit_mask(rank, masked[:n], cfg.strategy, cfg.threshold, cfg.steps, s,
                             None if chains is None else chains[:n], cfg.schedule)
        if n > keep:
            commit[keep:] = masked[keep:n]  # the candidate rows: the whole block at once
        x[:n] = torch.where(commit, pred, x[:n])
        x_probs[:n] = torch.where(commit, conf, x_probs[:n])
        masked[:n] &= ~commit
        if dynamic and s < K - 1 and bool(_settled(x, masked, done, eos_id, offsets, cfg.ignore_eos).all()):
            break
    return x, (x_probs, committed)
