"""What a decoder call returns, and the phase clock it is timed with."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class DecodeResult:
    """token_ids: per sample, the answer up to (not including) EOS; finished: EOS was produced;
    tokens: answer tokens produced over the batch (EOS included); forwards: model forwards (a batched
    forward counts once); timings: seconds per phase (vision, prefill, denoise, commit, total);
    token_probs: per sample, the probability each answer token had when it was committed (the softmax
    value of the chosen token, under the grammar mask and the temperature it was decoded with), aligned
    with token_ids; None from a decoder that does not report them."""

    token_ids: list[list[int]]
    finished: list[bool]
    tokens: int
    forwards: int
    timings: dict[str, float] = field(default_factory=dict)
    token_probs: Optional[list[list[float]]] = None

    @property
    def forwards_per_token(self) -> float:
        per_sample = self.tokens / max(1, len(self.token_ids))
        return self.forwards / max(1e-9, per_sample)


class PhaseClock:
    """Accumulates wall time per phase; synchronises CUDA only at phase boundaries."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.timings: dict[str, float] = {}
        self._start = self._mark = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, phase: str) -> None:
        now = self._now()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self._mark
        self._mark = now

    def total(self) -> dict[str, float]:
        self.timings["total"] = self._now() - self._start
        return dict(self.timings)


def _cut_at_eos(rows: list[list[int]], eos_id: int, ignore_eos: bool) -> tuple[list[list[int]], list[bool], int]:
    answers, finished, produced = [], [], 0
    for row in rows:
        if not ignore_eos and eos_id in row:
            cut = row.index(eos_id)
            answers.append(row[:cut])
            finished.append(True)
            produced += cut + 1
        else:
            answers.append(row)
            finished.append(False)
            produced += len(row)
    return answers, finished, produced


def trim_at_eos(out: torch.Tensor, eos_id: int, max_new_tokens: int, ignore_eos: bool) -> tuple[list[list[int]], list[bool], int]:
    """(batch, n) generated ids -> answers cut at the first EOS, finished flags, tokens produced."""
    return _cut_at_eos(out[:, :max_new_tokens].tolist(), eos_id, ignore_eos)


def decode_result(out: torch.Tensor, probs: torch.Tensor, eos_id: int, max_new_tokens: int, ignore_eos: bool,
                  forwards: int, timings: dict[str, float]) -> DecodeResult:
    """The DecodeResult of (batch, n) generated ids `out` and their (batch, n) commit probabilities `probs`:
    answers cut at the first EOS, each with its tokens' probabilities. Ids and probabilities reach the host
    in one transfer (float64 holds every token id exactly)."""
    n = min(max_new_tokens, out.shape[1])
    rows = torch.cat([out[:, :n].to(torch.float64), probs[:, :n].to(torch.float64)], dim=1).tolist()
    answers, finished, produced = _cut_at_eos([[int(v) for v in row[:n]] for row in rows], eos_id, ignore_eos)
    answer_probs = [row[n:n + len(ids)] for row, ids in zip(rows, answers)]
    return DecodeResult(answers, finished, produced, forwards, timings, answer_probs)
