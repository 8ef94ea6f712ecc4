"""Scorers by name: what `--scorer NAME` and a node's `scorer` parameter spell."""
from __future__ import annotations

from ..errors import WamDiffError
from .base import Scorer
from .likelihood import LikelihoodScorer
from .oracle import OracleScorer
from .perception import PerceptionScorer

SCORERS = ("perception", "oracle", "likelihood")
_CLASSES = {"perception": PerceptionScorer, "oracle": OracleScorer, "likelihood": LikelihoodScorer}


class ScorerError(WamDiffError, ValueError):
    """A scorer name that is not one of SCORERS."""


def check_scorer(name) -> str:
    """The scorer name, normalised; a ScorerError names a bad one."""
    if not isinstance(name, str) or name.strip().lower() not in SCORERS:
        raise ScorerError(f"unknown scorer {name!r}; expected one of {', '.join(SCORERS)}")
    return name.strip().lower()


def make_scorer(name: str) -> Scorer:
    """A new scorer of `name` (one of SCORERS) with its default settings."""
    return _CLASSES[check_scorer(name)]()
