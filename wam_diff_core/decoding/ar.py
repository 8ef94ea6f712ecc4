"""Autoregressive greedy decoding with a KV cache: the baseline the block decoder is measured against.

One forward per token; causal prefill (block size 1). The block decoder with B = 1 does the same
work and must produce the same tokens.
"""
from __future__ import annotations

import torch

from ..attention.block_mask import CLEAN
from ..model.processor import PromptBatch
from ..model.runner import ModelRunner
from .constraint import TokenConstraint
from .remasking import predict
from .result import DecodeResult, PhaseClock, decode_result


@torch.inference_mode()
def generate_ar(runner: ModelRunner, batch: PromptBatch, max_new_tokens: int, eos_id: int,
                ignore_eos: bool = False, constraint: TokenConstraint | None = None,
                mask_id: int | None = None) -> DecodeResult:
    """Greedy tokens for a batch of prompts, with each token's probability (`DecodeResult.token_probs`);
    `mask_id`, the checkpoint's diffusion mask token, is never chosen (as in the block decoder, which with
    B = 1 gives the same tokens and probabilities)."""
    device = runner.device
    b, prompt_len = batch.input_ids.shape
    padded = not bool(batch.attention_mask.all())
    runner.forwards = 0
    clock = PhaseClock(device)
    cache = runner.new_cache(b, prompt_len + max_new_tokens)
    vision = runner.encode_images(batch)
    clock.lap("vision")
    logits, next_pos = runner.prefill(batch, cache, 1, vision)
    clock.lap("prefill")
    out = torch.full((b, max_new_tokens), eos_id, dtype=torch.long, device=device)
    probs = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    kind = torch.full((b, 1), CLEAN, dtype=torch.long, device=device)
    for t in range(max_new_tokens):
        if constraint is not None:
            logits = constraint.apply(logits[:, None], t, out[:, :t] if constraint.envelope is not None else None)[:, 0]
        token, probs[:, t] = predict(logits, 0.0, exclude=mask_id)
        out[:, t] = token
        if not ignore_eos:
            done |= token == eos_id
            if bool(done.all()):
                break
        if t == max_new_tokens - 1:
            break
        block = torch.full((b, 1), prompt_len + t, dtype=torch.long, device=device)
        hidden = runner.forward_tokens(token[:, None], block, kind, cache, runner.rope(next_pos[:, None] + t),
                                       full=not padded)
        cache.advance(1)
        logits = runner.logits(hidden[:, -1])
    clock.lap("denoise")
    clock.timings["commit"] = 0.0
    return decode_result(out, probs, eos_id, max_new_tokens, ignore_eos, runner.forwards, clock.total())
