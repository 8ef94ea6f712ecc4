"""One remasking step on the device: confidence and argmax per position, then the commit decision.

The decision itself is the reference's (`wam_diff_core.decoding.remasking`: threshold commit with
the at-least-one rule for `low_confidence_dynamic`, a fixed quota for the static strategies), so the
capture-ready decoder commits exactly what the eager decoder commits. Everything here is tensor ops
with shapes fixed by (batch, B) and the step index fixed on the host: no `.item()`, no data-dependent
Python, so a CUDA graph can hold it.
"""
from __future__ import annotations

from typing import Optional

import torch

from wam_diff_core.decoding.remasking import commit_mask, predict


def block_logits(prev_logits: torch.Tensor, block_logits_: Optional[torch.Tensor]) -> torch.Tensor:
    """Logits predicting the B block tokens under the shifted alignment.

    prev_logits: (batch, vocab), the last logit before the block; block_logits_: (batch, B - 1, vocab)
    from the block's own first B - 1 positions (None for B = 1). Returns (batch, B, vocab).
    """
    if block_logits_ is None:
        return prev_logits[:, None]
    return torch.cat([prev_logits[:, None], block_logits_], 1)


def remask_step(logits: torch.Tensor, x: torch.Tensor, masked: torch.Tensor, strategy: str, threshold: float,
                steps: int, step: int, temperature: float = 0.0,
                generator: Optional[torch.Generator] = None,
                chain_start: Optional[torch.Tensor] = None, schedule: str = "linear",
                exclude: Optional[int] = None,
                probs: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Commit some masked positions of a block.

    logits: (batch, B, vocab); x: (batch, B) current tokens (mask id where masked); masked: (batch, B)
    bool; chain_start: (batch, B) long or None (number order); schedule: `SCHEDULES`; exclude: a token id
    never predicted (the mask id, as in the eager decoder); probs: (batch, B) float32, the probability each
    committed token had at its commit (zeros if None). Returns the new (x, masked, probs). Positions
    already committed never change.
    """
    pred, conf = predict(logits, temperature, generator, exclude)
    commit = commit_mask(conf, masked, strategy, threshold, steps, step, chain_start, schedule)
    probs = torch.zeros_like(conf) if probs is None else probs
    return torch.where(commit, pred, x), masked & ~commit, torch.where(commit, conf, probs)
