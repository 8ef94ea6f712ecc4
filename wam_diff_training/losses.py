"""Losses over selected response positions: masked diffusion cross-entropy and divergences.

All functions take logits of the positions that count, flattened: (N, vocab). Divergences run over
the full vocabulary in chunks of rows, each chunk under activation checkpointing when gradients are
needed, so their (chunk, vocab) float32 temporaries never exist for all N rows at once.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DIVERGENCES = ("jsd", "forward_kl", "reverse_kl")


def diffusion_ce(logits: torch.Tensor, targets: torch.Tensor, t: torch.Tensor, normalizer: float | torch.Tensor) -> torch.Tensor:
    """sum_i CE(logits_i, target_i) / t_i, divided by `normalizer` (the batch's response-token count).

    logits (N, V); targets (N,); t (N,) the noise level of each masked token. With t = 1 everywhere and
    N = normalizer this is the mean next-token cross-entropy.
    """
    ce = F.cross_entropy(logits.float(), targets, reduction="none")
    return (ce / t).sum() / normalizer


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return F.log_softmax(logits.float() / temperature, dim=-1)


def _jsd_rows(student: torch.Tensor, teacher: torch.Tensor, beta: float, temperature: float) -> torch.Tensor:
    log_p = _log_probs(student, temperature)
    log_q = _log_probs(teacher, temperature)
    # log of the mixture beta P + (1 - beta) Q, computed stably in log space
    log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1 - beta)]), dim=0)
    kl_p = (log_p.exp() * (log_p - log_m)).sum(-1)
    kl_q = (log_q.exp() * (log_q - log_m)).sum(-1)
    return beta * kl_p + (1 - beta) * kl_q


def _forward_kl_rows(student, teacher, beta, temperature):
    log_p, log_q = _log_probs(student, temperature), _log_probs(teacher, temperature)
    return (log_q.exp() * (log_q - log_p)).sum(-1)  # KL(teacher || student)


def _reverse_kl_rows(student, teacher, beta, temperature):
    log_p, log_q = _log_probs(student, temperature), _log_probs(teacher, temperature)
    return (log_p.exp() * (log_p - log_q)).sum(-1)  # KL(student || teacher)


_ROWS: dict[str, Callable] = {"jsd": _jsd_rows, "forward_kl": _forward_kl_rows, "reverse_kl": _reverse_kl_rows}


def divergence(student: torch.Tensor, teacher: torch.Tensor, kind: str = "jsd", beta: float = 0.5,
               temperature: float = 1.0, chunk_size: int = 1024, reduction: str = "mean") -> torch.Tensor:
    """Per-row divergence between student and teacher distributions softmax(logits / temperature).

    student, teacher: (N, V) logits (the teacher is detached). kind: `jsd` = beta KL(P||M) +
    (1 - beta) KL(Q||M) with M = beta P + (1 - beta) Q (symmetric at beta 0.5, at most ln 2 there);
    `forward_kl` = KL(teacher||student); `reverse_kl` = KL(student||teacher). Returns the mean over rows
    (reduction "mean"), their sum ("sum") or the rows (N,) ("none").
    """
    if kind not in _ROWS:
        raise ValueError(f"unknown divergence {kind!r}; expected one of {DIVERGENCES}")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student.shape != teacher.shape:
        raise ValueError(f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} differ")
    teacher = teacher.detach()
    fn = _ROWS[kind]
    rows = []
    for start in range(0, student.shape[0], chunk_size):
        s, q = student[start:start + chunk_size], teacher[start:start + chunk_size]
        if torch.is_grad_enabled() and s.requires_grad:
            rows.append(checkpoint(fn, s, q, beta, temperature, use_reentrant=False))
        else:
            rows.append(fn(s, q, beta, temperature))
    out = torch.cat(rows) if rows else student.new_zeros(0, dtype=torch.float32)
    if reduction == "none":
        return out
    if reduction == "sum":
        return out.sum()
    return out.mean() if out.numel() else out.sum()


def jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float = 0.5, temperature: float = 1.0,
        chunk_size: int = 1024, reduction: str = "mean") -> torch.Tensor:
    return divergence(student, teacher, "jsd", beta, temperature, chunk_size, reduction)


@torch.no_grad()
def top_k_agreement(student: torch.Tensor, teacher: torch.Tensor, k: int = 5) -> torch.Tensor:
    """Share of the student's top-k tokens that are among the teacher's top-k, averaged over rows (N, V)."""
    if student.shape[0] == 0:
        return student.new_zeros((), dtype=torch.float32)
    s = student.topk(k, dim=-1).indices
    q = teacher.topk(k, dim=-1).indices
    hits = (s[:, :, None] == q[:, None, :]).any(-1).float()
    return hits.mean()
