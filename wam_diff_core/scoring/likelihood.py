"""The likelihood scorer: the model's own mean token log-probability of each answer, nothing else seen.

The learning-free baseline: it needs no detections, map or world, and prefers the answer the model was surest
of. A decoder that reports no probabilities gives every candidate 0.0, so candidate 0 (greedy) wins the tie.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..types import Candidate
from .base import ScoringContext


class LikelihoodScorer:
    """Each valid candidate's `logprob`; -inf for an invalid one."""

    name = "likelihood"

    def score(self, candidates: Sequence[Candidate], context: ScoringContext) -> np.ndarray:
        return np.array([float(c.logprob) if c.valid else -np.inf for c in candidates], dtype=np.float64)
