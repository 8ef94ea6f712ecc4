"""Which masked positions of a block to commit after a denoising step, decided on the device.

Strategies (docs/architecture.md, decoding contract):
- `low_confidence_dynamic`: every masked position whose confidence >= threshold, and at least as many
  of the most confident as the schedule asks of this step (at least one);
- `low_confidence_static`: a fixed count per step (the schedule's share of the block), most
  confident first;
- `sequential`: the same count per step, leftmost first.
Schedules (`SCHEDULES`): the fraction of the block still masked after step s of K is 1 - (s + 1) / K
("linear": the block spread evenly over the K steps) or cos(pi / 2 (s + 1) / K) ("cosine", MaskGIT's: few
commits in the first steps, so the first decisions condition more of the later ones). The dynamic
strategy applies the fraction to what is still masked (positions committed early by the threshold
shorten the later quotas).
With chains (number order, `chain_start` from the trajectory grammar), a position is a candidate only
once the positions before it in its chain are committed (the chain's frontier); a confident position
commits beyond the frontier only when every position before it in its chain is committed or commits
now with it. Quotas are filled from the frontier; the last step commits whatever is left.
No host synchronisation: counts are tensors; the step schedule is known on the host.
"""
from __future__ import annotations

import math

import torch

from ..constants import SCHEDULES, STRATEGIES
from .config import step_count


def check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")


def masked_after(schedule: str, steps: int, step: int) -> float:
    """Fraction of the block the schedule leaves masked after `step` (0-based) of `steps`: 1 before the
    first step, 0 after the last."""
    check_schedule(schedule)
    t = (step + 1) / steps
    if t >= 1:
        return 0.0
    return 1.0 - t if schedule == "linear" else math.cos(math.pi / 2 * t)


def done_after(block_size: int, steps: int, step: int, schedule: str = "linear") -> int:
    """Positions of a block committed after `step` (0-based): linear floor(B (s+1) / K); cosine
    B - floor(B cos(pi / 2 (s+1) / K)); B after the last step."""
    k = step_count(block_size, steps)
    check_schedule(schedule)
    if step < 0:
        return 0
    if schedule == "linear" or step >= k - 1:
        return min(block_size, (block_size * (step + 1)) // k)
    return block_size - math.floor(block_size * masked_after(schedule, k, step))


def static_quota(block_size: int, steps: int, step: int, schedule: str = "linear") -> int:
    """Positions committed at `step` (0-based) by the static strategies."""
    return done_after(block_size, steps, step, schedule) - done_after(block_size, steps, step - 1, schedule)


def dynamic_need(remaining: torch.Tensor, steps: int, step: int, schedule: str = "linear") -> torch.Tensor:
    """(batch,) long: positions the dynamic strategy commits at least at `step`, of `remaining` masked:
    linear ceil(remaining / steps left); otherwise what the schedule's ratio masked_after(s) /
    masked_after(s - 1) leaves masked is kept. At least one while any remain."""
    check_schedule(schedule)
    steps_left = steps - step
    if schedule == "linear" or steps_left <= 1:
        return torch.div(remaining + steps_left - 1, steps_left, rounding_mode="floor")
    before = 1.0 if step == 0 else masked_after(schedule, steps, step - 1)
    keep = torch.floor(remaining.float() * (masked_after(schedule, steps, step) / before)).long()
    return torch.minimum(remaining, torch.clamp(remaining - keep, min=1))


def without_token(logits: torch.Tensor, token: int) -> torch.Tensor:
    """float32 copy of `logits` (..., vocab) in which `token` has logit -inf (probability 0): one copy and a
    fill of one column, no host sync, capturable in a CUDA graph."""
    out = logits.to(torch.float32, copy=True)
    out.select(-1, token).fill_(float("-inf"))
    return out


def predict(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
            exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and its probability per position. logits (..., vocab) -> (pred, confidence), both (...).

    Greedy at temperature 0; otherwise sampling without a host sync: argmax(p / Exponential(1)).
    `exclude`: a token never predicted, the decoder's own mask token (a committed mask would be read as
    "still masked" by the model and ends up as literal mask text); probabilities are over the other tokens.
    """
    logits = logits.float() if exclude is None else without_token(logits, exclude)
    if temperature <= 0:
        # max softmax probability = exp(max - logsumexp): no full probability tensor is written
        top, pred = logits.max(dim=-1)
        return pred, torch.exp(top - torch.logsumexp(logits, dim=-1))
    probs = torch.softmax(logits / temperature, dim=-1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    pred = (probs / noise).argmax(dim=-1)
    return pred, probs.gather(-1, pred[..., None])[..., 0]


def chain_frontier(masked: torch.Tensor, chain_start: torch.Tensor) -> torch.Tensor:
    """(batch, B) bool: the masked positions whose chain predecessors are all committed. Chains are runs
    of consecutive positions committed as prefixes, so that is: p starts its chain or p - 1 is committed."""
    offsets = torch.arange(masked.shape[1], device=masked.device)
    before_done = torch.cat([torch.ones_like(masked[:, :1]), ~masked[:, :-1]], dim=1)
    return masked & ((chain_start == offsets) | before_done)


def chain_prefix_ok(ok: torch.Tensor, chain_start: torch.Tensor) -> torch.Tensor:
    """(batch, B) bool: every position q with chain_start[p] <= q < p satisfies `ok`."""
    bad = (~ok).to(torch.int32).cumsum(dim=1)
    before = torch.cat([torch.zeros_like(bad[:, :1]), bad[:, :-1]], dim=1)  # bad count over [0, p)
    return before == before.gather(1, chain_start)


def commit_mask(confidence: torch.Tensor, masked: torch.Tensor, strategy: str, threshold: float,
                steps: int, step: int, chain_start: torch.Tensor | None = None,
                schedule: str = "linear") -> torch.Tensor:
    """Boolean (batch, B): the masked positions to commit at `step` of `steps`.

    confidence: (batch, B) float; masked: (batch, B) bool (True = still masked); chain_start: (batch, B)
    long or None, the block position where each position's chain starts (`TokenConstraint.chains`);
    schedule: one of `SCHEDULES`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown remasking strategy {strategy!r}; expected one of {STRATEGIES}")
    batch, block = masked.shape
    k = step_count(block, steps)
    if chain_start is not None and step >= k - 1:
        return masked.clone()
    candidates = masked if chain_start is None else chain_frontier(masked, chain_start)
    if strategy == "low_confidence_dynamic":
        need = dynamic_need(masked.sum(dim=1), k, step, schedule)
    else:
        need = torch.full((batch,), static_quota(block, steps, step, schedule), device=masked.device,
                          dtype=torch.long)
        need = torch.minimum(need, masked.sum(dim=1))
    if strategy == "sequential":
        score = -torch.arange(block, device=masked.device, dtype=torch.float32).expand(batch, block)
    else:
        score = confidence.float()
    score = score.masked_fill(~candidates, float("-inf"))
    ranked = score.sort(dim=1, descending=True).values
    kth = ranked.gather(1, (need - 1).clamp(min=0)[:, None])
    commit = candidates & (score >= kth) & (need > 0)[:, None]
    if strategy == "low_confidence_dynamic":
        sure = masked & (confidence >= threshold)
        if chain_start is not None:
            sure = sure & chain_prefix_ok(~masked | sure, chain_start)
        commit = commit | sure
    return commit
