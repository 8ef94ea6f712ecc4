"""Candidate answers from one prompt: one prefill, N answers denoised as one batch, row 0 greedy.

The rows of such a decode (`DecodeRows`): the prompts' own rows first, in prompt order (row p answers prompt p
exactly as a decode without candidates would), then one extra row per further candidate of the planning prompt.
The prompts are prefilled once (batch of the prompts) and their keys and values copied into the extra rows
(`BlockKVCache.share_prompts`); every denoising step then runs all rows together.

How the extra rows differ from the greedy one (`SAMPLING_METHODS`, `CandidateSampling`):
- "tokens": each position's token is drawn from the model's distribution (after the grammar and envelope masks)
  at `temperature`, by inverting its cumulative distribution at one uniform draw per position (the same
  distribution as Gumbel-max sampling, with one random number per position instead of one per vocabulary
  entry); commits ranked by the drawn tokens' probabilities;
- "order": each position's token is the argmax, as in the greedy row, but the confidences the remasking reads
  (its ranking and its threshold) are perturbed: log confidence plus temperature times Gumbel noise, so positions
  commit in another order and the later ones are predicted from other committed neighbours.
Candidate k (k >= 1) draws its noise from its own generator seeded with the decoder's seed + k, on the device
(no host synchronisation): the same prompt and seed give the same candidates. The probability each row reports
for a token (`DecodeResult.token_probs`, a candidate's log-probability) is the model's, after the grammar and
envelope masks, without the temperature or the noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..errors import WamDiffError
from .remasking import without_token

SAMPLING_METHODS = ("tokens", "order")
_TINY = torch.finfo(torch.float32).tiny  # a uniform draw of 0 would make an infinite Gumbel value


class CandidatesError(WamDiffError, ValueError):
    """A candidate count or sampling setting that does not spell what is expected."""


@dataclass(frozen=True)
class CandidateSampling:
    """How candidates 1..N-1 are drawn: `method` one of SAMPLING_METHODS, `temperature` > 0 the scale of
    its noise (the token distribution's temperature for "tokens", the Gumbel noise's on the log confidences for
    "order"); `shared_blocks` >= 0: the answer's first blocks every candidate shares with the greedy one
    (decoded once, in its row alone; the candidates branch after them); `single_step`: the candidates commit a
    whole block at its first denoising step (the greedy row takes its K steps alone)."""

    method: str = "tokens"
    temperature: float = 1.0
    shared_blocks: int = 0
    single_step: bool = False

    def __post_init__(self):
        if self.method not in SAMPLING_METHODS:
            raise CandidatesError(f"sampling method {self.method!r}: expected one of {SAMPLING_METHODS}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t < float("inf"):
            raise CandidatesError(f"sampling temperature {t!r}: expected a finite number > 0")
        k = self.shared_blocks
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise CandidatesError(f"shared blocks {k!r}: expected an integer >= 0")
        if not isinstance(self.single_step, bool):
            raise CandidatesError(f"single step {self.single_step!r}: expected true or false")


def check_candidates(candidates) -> int:
    """The candidate count as an int >= 1; a CandidatesError names the value otherwise."""
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise CandidatesError(f"candidates {candidates!r}: expected an integer >= 1")
    return candidates


def check_sampling(sampling) -> CandidateSampling:
    """A CandidateSampling, the default one for None, or a method name (its default temperature)."""
    if sampling is None:
        return CandidateSampling()
    if isinstance(sampling, str):
        return CandidateSampling(sampling)
    if not isinstance(sampling, CandidateSampling):
        raise CandidatesError(f"sampling {sampling!r}: expected a CandidateSampling or one of {SAMPLING_METHODS}")
    return sampling


@dataclass(frozen=True)
class DecodeRows:
    """The rows of a candidate decode: rows 0..own-1 the prompts' own (row p answers prompt p, greedily), then
    `extra` rows answering prompt `of`: its candidates 1, 2, ..., drawn by `sampling` with seeds `seed` + 1,
    `seed` + 2, ..."""

    own: int
    of: int
    extra: int
    sampling: CandidateSampling
    seed: int = 0

    def __post_init__(self):
        if self.own < 1 or not 0 <= self.of < self.own or self.extra < 0:
            raise ValueError(f"decode rows: {self.own} prompts, {self.extra} extra rows of prompt {self.of}: "
                             f"expected at least one prompt, the extra rows' among them")

    @classmethod
    def for_candidates(cls, tasks: Sequence[str], candidates: int, sampling: CandidateSampling,
                       seed: int = 0, task: str = "planning") -> "DecodeRows":
        """Rows for prompts answering `tasks` with `candidates` answers to the `task` prompt (its other tasks once)."""
        return cls(len(tasks), list(tasks).index(task), candidates - 1, sampling, seed)

    @property
    def prompts(self) -> tuple[int, ...]:
        """The prompt every row answers."""
        return tuple(range(self.own)) + (self.of,) * self.extra

    def tasks(self, tasks: Sequence[str]) -> list[str]:
        """The task of every row, given the prompts' tasks."""
        return [tasks[p] for p in self.prompts]

    def candidate_rows(self) -> list[int]:
        """The rows of candidates 0, 1, ..., N-1: the prompt's own row, then the extra rows."""
        return [self.of] + list(range(self.own, self.own + self.extra))

    def live(self, block: int) -> int:
        """How many rows decode answer block `block`: the prompts' own alone while the candidates share it."""
        return self.own if block < self.sampling.shared_blocks and self.extra else self.own + self.extra


class RowSampler:
    """The per-step prediction of a candidate decode, on the device: greedy rows as `remasking.predict` at
    temperature 0 (the same values), the extra rows drawn as their `CandidateSampling` says."""

    def __init__(self, rows: DecodeRows, device):
        self.rows = rows
        self.method, self.temperature = rows.sampling.method, float(rows.sampling.temperature)
        self.index = torch.arange(rows.own, rows.own + rows.extra, device=device)
        self.generators = [torch.Generator(device=device).manual_seed(rows.seed + k) for k in range(1, rows.extra + 1)]
        self._noise: Optional[torch.Tensor] = None

    def _uniform(self, shape: tuple[int, ...], device) -> torch.Tensor:
        """(extra rows, *shape) uniform [0, 1) draws, each row from its own generator (one buffer, refilled)."""
        full = (len(self.generators), *shape)
        if self._noise is None or self._noise.shape != full:
            self._noise = torch.empty(full, dtype=torch.float32, device=device)
        for row, generator in zip(self._noise, self.generators):
            row.uniform_(generator=generator)
        return self._noise

    def _draw(self, logits: torch.Tensor) -> torch.Tensor:
        """(extra rows, n) tokens drawn from the extra rows' logits (rows, n, vocab) at the temperature: the first
        token whose cumulative probability exceeds a uniform draw (never a token of probability 0)."""
        cdf = torch.softmax(logits.index_select(0, self.index) / self.temperature, dim=-1).cumsum(dim=-1)
        u = self._uniform(cdf.shape[1:-1], cdf.device) * cdf[..., -1]  # below the total, whatever its rounding
        return torch.searchsorted(cdf, u[..., None], right=True)[..., 0].clamp_(max=cdf.shape[-1] - 1)

    def __call__(self, logits: torch.Tensor, exclude: Optional[int] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits (rows, n, vocab) -> (token (rows, n), the model's probability of it (rows, n), the confidence
        the remasking ranks and thresholds (rows, n))."""
        logits = logits.float() if exclude is None else without_token(logits, exclude)
        top, pred = logits.max(dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
        conf = torch.exp(top - lse)
        if not self.generators:
            return pred, conf, conf
        if self.method == "tokens":
            pred = pred.index_copy(0, self.index, self._draw(logits))
            conf = torch.exp(logits.gather(-1, pred[..., None])[..., 0] - lse)
            return pred, conf, conf
        gumbel = -torch.log(-torch.log(self._uniform(conf.shape[1:], conf.device).clamp(min=_TINY)))
        noisy = conf.index_select(0, self.index) * torch.exp(self.temperature * gumbel)
        return pred, conf, conf.index_copy(0, self.index, noisy)


__all__ = ["SAMPLING_METHODS", "CandidateSampling", "CandidatesError", "DecodeRows", "RowSampler", "check_candidates",
           "check_sampling"]
