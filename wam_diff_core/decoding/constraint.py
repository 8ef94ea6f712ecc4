"""Per-position token constraints on decoded answers, and the fixed-style trajectory grammar.

A fixed-style trajectory (``codec.format_trajectory(style="fixed")``) is spelled one character per
token, so answer position p may only hold the characters ``fixed_trajectory_slots()[p]`` allows and
position FIXED_TRAJECTORY_CHARS holds EOS. Under block diffusion the positions of a block are
committed in confidence order, not left to right; a mask that depends only on the position is what
parallel commits can honour. The decoders apply it to the logits before every commit decision, on
the device, to the rows that answer the planning task: every constrained answer parses.

The grammar also tells the decoder where each number's characters sit (`chain_start`): with number
order on, a digit is committed only after the more significant digits of its number, while the numbers
of a block are denoised in parallel. Committed in confidence order alone, the digits of one number are
drawn from different hypotheses (the tens of 19.8, the units of 20.3: 29.3); most significant first, a
digit is always predicted knowing the digits above it.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import torch

from ..codec import FIXED_TRAJECTORY_CHARS, fixed_trajectory_chain_starts, fixed_trajectory_slots
from ..types import EgoState
from .envelope import KinematicEnvelope, token_tables


@dataclass(frozen=True)
class TokenConstraint:
    """allowed: (length, vocab) bool, the tokens answer position p may hold; rows: (batch,) bool, the
    batch rows it applies to (the others decode unconstrained); chain_start: (length,) long or None, the
    answer position where p's chain starts (a fixed-style number: its sign), so that the decoder can
    commit a chain's positions left to right (`remasking.commit_mask`, number order); envelope: the kinematic
    envelope of the planning rows (`envelope.KinematicEnvelope`), applied when `apply` is given the answer."""

    allowed: torch.Tensor
    rows: torch.Tensor
    chain_start: Optional[torch.Tensor] = None
    envelope: Optional[KinematicEnvelope] = None

    def chains(self, start: int, n: int) -> torch.Tensor:
        """(batch, n) long: for block positions 0 .. n - 1 (answer positions start .. start + n - 1), the
        block position where each one's chain starts, clamped at 0 (a chain's earlier positions in an
        earlier block are committed already); every position its own chain in the unconstrained rows
        or without chain_start."""
        own = torch.arange(n, device=self.rows.device)
        if self.chain_start is None:
            return own.expand(self.rows.shape[0], n)
        if start + n > self.chain_start.shape[0]:
            raise ValueError(f"constraint covers {self.chain_start.shape[0]} answer positions, decoding needs {start + n}")
        local = (self.chain_start[start:start + n] - start).clamp(min=0)
        return torch.where(self.rows[:, None], local[None], own[None])

    def banned(self, start: int, n: int, vocab_size: int) -> torch.Tensor:
        """(batch, n, vocab) bool: True where answer position start + i may not hold a token."""
        if start + n > self.allowed.shape[0]:
            raise ValueError(f"constraint covers {self.allowed.shape[0]} answer positions, decoding needs {start + n}")
        if vocab_size != self.allowed.shape[1]:
            raise ValueError(f"constraint vocabulary {self.allowed.shape[1]} != logits vocabulary {vocab_size}")
        return ~self.allowed[start:start + n][None] & self.rows[:, None, None]

    def head(self, n: int) -> "TokenConstraint":
        """The constraint of the batch's first n rows."""
        envelope = None if self.envelope is None else \
            dataclasses.replace(self.envelope, velocity=self.envelope.velocity[:n], active=self.envelope.active[:n])
        return dataclasses.replace(self, rows=self.rows[:n], envelope=envelope)

    def apply(self, logits: torch.Tensor, start: int, answer: Optional[torch.Tensor] = None) -> torch.Tensor:
        """logits (batch, n, vocab) predicting answer positions start .. start + n - 1 -> the same
        logits with disallowed tokens at -inf in the constrained rows; with `answer` (batch, >= start) the
        answer's tokens so far, uncommitted ones the mask) also the digits outside the kinematic envelope."""
        logits = logits.masked_fill(self.banned(start, logits.shape[1], logits.shape[-1]), float("-inf"))
        if answer is not None and self.envelope is not None:
            logits = self.envelope.apply(logits, start, answer)
        return logits


class TrajectoryGrammar:
    """The fixed trajectory style in a tokenizer's ids: each character one token, EOS after the last.

    Raises ValueError when the tokenizer cannot spell a character of the style as one token (the
    style then does not apply to that checkpoint)."""

    def __init__(self, tokenizer, eos_id: int):
        self.eos_id = int(eos_id)
        self.char_ids: dict[str, int] = {}
        for char in sorted(set("".join(fixed_trajectory_slots()))):
            ids = tokenizer(char, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(f"the tokenizer spells {char!r} as {len(ids)} tokens {ids}; the fixed trajectory "
                                 "style needs one token per character")
            self.char_ids[char] = int(ids[0])

    def encode(self, text: str) -> list[int]:
        """A fixed-style trajectory -> its token ids (one per character, no EOS)."""
        try:
            return [self.char_ids[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} in {text[:40]!r} is not a fixed-style trajectory character") from None

    def allowed(self, length: int, vocab_size: int, device=None) -> torch.Tensor:
        """(length, vocab_size) bool: the slot characters, EOS at FIXED_TRAJECTORY_CHARS and after."""
        if vocab_size <= max(max(self.char_ids.values()), self.eos_id):
            raise ValueError(f"vocab_size {vocab_size} does not hold the grammar's token ids")
        table = torch.zeros(length, vocab_size, dtype=torch.bool)
        for p, chars in enumerate(fixed_trajectory_slots()[:length]):
            table[p, [self.char_ids[c] for c in chars]] = True
        table[FIXED_TRAJECTORY_CHARS:, self.eos_id] = True
        return table.to(device)


@lru_cache(maxsize=8)
def _grammar(tokenizer, eos_id: int) -> TrajectoryGrammar:
    return TrajectoryGrammar(tokenizer, eos_id)


@lru_cache(maxsize=8)
def _grammar_table(tokenizer, eos_id: int, length: int, vocab_size: int, device: str) -> torch.Tensor:
    return _grammar(tokenizer, eos_id).allowed(length, vocab_size, device)


@lru_cache(maxsize=8)
def _envelope_tables(tokenizer, eos_id: int, vocab_size: int, device: str) -> tuple[torch.Tensor, ...]:
    return token_tables(_grammar(tokenizer, eos_id).char_ids, vocab_size, device)


def _envelope(tokenizer, settings, rows: torch.Tensor, egos: Sequence[Optional[EgoState]], vocab_size: int,
              device, forward_only: bool) -> KinematicEnvelope:
    if len(egos) != rows.shape[0]:
        raise ValueError(f"egos: {len(egos)} entries for a batch of {rows.shape[0]} rows")
    for i, ego in enumerate(egos):
        if ego is not None and not isinstance(ego, EgoState):
            raise ValueError(f"egos[{i}] must be an EgoState or None, got {type(ego).__name__}")
    velocity = torch.tensor([[e.vx, e.vy] if e is not None else [0.0, 0.0] for e in egos], dtype=torch.float32,
                            device=device)
    has_ego = torch.tensor([e is not None for e in egos], dtype=torch.bool, device=device)
    codes, digit_ids, sign_ids = _envelope_tables(tokenizer, int(settings.eos_token_id), vocab_size, str(device))
    return KinematicEnvelope(velocity, rows & has_ego, codes, digit_ids, sign_ids, bool(forward_only))


@lru_cache(maxsize=8)
def _chain_table(length: int, device: str) -> torch.Tensor:
    return torch.tensor(fixed_trajectory_chain_starts(length), dtype=torch.long, device=device)


def planning_constraint(tokenizer, settings, tasks: Sequence[str], length: int, vocab_size: int,
                        device, egos: Optional[Sequence[Optional[EgoState]]] = None,
                        forward_only: bool = False) -> Optional[TokenConstraint]:
    """The trajectory grammar for the planning rows of a batch whose row i answers `tasks[i]`, when the
    checkpoint's `settings.trajectory_format` is "fixed"; None otherwise (nothing to constrain). With `egos`
    (row i's ego state, or None) also the kinematic envelope of the planning rows that have one (forward_only:
    with its forward-only bound, `envelope.KinematicEnvelope.forward_only`)."""
    if settings.trajectory_format != "fixed" or "planning" not in tasks:
        return None
    allowed = _grammar_table(tokenizer, int(settings.eos_token_id), length, vocab_size, str(device))
    rows = torch.tensor([t == "planning" for t in tasks], dtype=torch.bool, device=device)
    envelope = None if egos is None else _envelope(tokenizer, settings, rows, egos, vocab_size, device, forward_only)
    return TokenConstraint(allowed, rows, _chain_table(length, str(device)), envelope)
