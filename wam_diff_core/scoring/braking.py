"""Braking along the model's path when every one of its candidates is forecast to collide (a PDM-Closed-style
fallback).

The model's candidates all keep roughly its own speed: where a vehicle cuts in or a dense lane slows down, every
one of them can be forecast to collide, and picking the best of eight colliding plans still collides. PDM-Closed
(NAVSIM's rule-based planner) always has slower proposals to fall back on. Here the fallback keeps the model's
path and changes only the timing: when no candidate the model drew passes NC and TTC (`collision_free`), the
greedy candidate's path is driven at each of `BRAKING_DECELERATIONS_MPS2` from the ego's speed (never faster than
the plan itself, stopping at most), those plans are scored with the model's candidates (progress relative to the
best safe one, as always) and the best of all is published; where every plan, braking
ones included, scores 0, the hardest braking is published (it sheds the most speed before the contact). With a
collision-free model candidate nothing is added and the choice is `base.choose`'s.

A braking plan is a `Candidate` with `source` "braking" and an index after the model's; its text is the
trajectory in the codec's official format, so what the plan publishes as its planning text parses to what it
drives.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from ..codec import format_trajectory
from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from ..types import Candidate, Plan
from .base import ScoringContext, choose
from .terms import Terms, scores_from_terms

# from gentle (nuPlan's comfortable -4.05 m/s^2 bound in reach) to emergency braking (the envelope allows -9)
BRAKING_DECELERATIONS_MPS2 = (1.5, 3.0, 5.0, 8.0)
BRAKING_SOURCE = "braking"


def collision_free(terms: Optional[Terms]) -> bool:
    """A valid candidate forecast to hit nothing (NC) and to keep its time to collision (TTC). Drivability (DAC,
    the envelope) is not asked: a model whose candidates all leave the envelope on a tight curve keeps its
    choice as without braking, rather than crawling along."""
    return terms is not None and terms.nc >= 1.0 and terms.ttc >= 1.0


def brake_along(trajectory: np.ndarray, speed_mps: float, deceleration_mps2: float) -> np.ndarray:
    """The (NUM_WAYPOINTS, 2) plan that follows `trajectory`'s path (from the ego at the origin) at `speed_mps`
    braking at `deceleration_mps2` until it stands, and never further along the path than `trajectory` is at the
    same time."""
    traj = np.asarray(trajectory, dtype=np.float64).reshape(NUM_WAYPOINTS, 2)
    knots = np.vstack([[0.0, 0.0], traj])
    along = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(knots, axis=0), axis=1))])
    t = np.arange(1, NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    speed = max(float(speed_mps), 0.0)
    moving = np.minimum(t, speed / deceleration_mps2)  # until it stands
    braking = speed * moving - deceleration_mps2 * moving ** 2 / 2
    s = np.minimum(braking, along[1:])
    s = np.maximum.accumulate(s)  # the plan's own path length never shrinks; a braking one neither
    return np.stack([np.interp(s, along, knots[:, 0]), np.interp(s, along, knots[:, 1])], axis=1)


def braking_candidates(base: Candidate, speed_mps: float, first_index: int,
                       decelerations: Sequence[float] = BRAKING_DECELERATIONS_MPS2) -> list[Candidate]:
    """`base`'s path braked at each deceleration, as candidates `first_index`, `first_index` + 1, ...; a ValueError
    names a deceleration that is not a finite number > 0."""
    bad = [d for d in decelerations if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d < np.inf]
    if bad:
        raise ValueError(f"braking decelerations {list(decelerations)!r}: expected finite numbers > 0 m/s^2, "
                         f"got {bad[0]!r}")
    out = []
    for k, decel in enumerate(decelerations):
        traj = np.round(brake_along(base.trajectory, speed_mps, float(decel)), 2)
        out.append(Candidate(first_index + k, traj, format_trajectory(traj), 0.0, None, BRAKING_SOURCE))
    return out


def choose_or_brake(plan: Plan, scorer, context: ScoringContext,
                    decelerations: Sequence[float] = BRAKING_DECELERATIONS_MPS2) -> tuple[Plan, np.ndarray]:
    """The plan carrying its best candidate, braking plans of the greedy (first valid) candidate's path added when
    no model candidate is `collision_free` (`scorer` must offer `terms(candidates, context)`, as the perception
    and oracle scorers do); also every candidate's score (the braking ones after the model's)."""
    terms = scorer.terms(plan.candidates, context)
    valid = [c for c in plan.candidates if c.valid]
    if not valid or any(collision_free(t) for t in terms) or not decelerations:
        scores = scores_from_terms(terms)
        return choose(plan, _Fixed(scorer.name, scores), context), scores
    extra = braking_candidates(valid[0], context.ego.speed, len(plan.candidates), decelerations)
    terms = list(terms) + list(scorer.terms(extra, context))
    scores = scores_from_terms(terms)
    widened = dataclasses.replace(plan, candidates=list(plan.candidates) + extra)
    if float(np.max(scores)) > 0.0:
        return choose(widened, _Fixed(scorer.name, scores), context), scores
    # even braking is forecast to collide: the hardest braking sheds the most speed before the contact
    rank = np.where(np.isfinite(scores), 0.0, -np.inf)
    rank[-1] = 1.0
    return dataclasses.replace(choose(widened, _Fixed(scorer.name, rank), context), score=float(scores[-1])), scores


class _Fixed:
    """A scorer that answers scores already computed (so `choose` does not score twice)."""

    def __init__(self, name: str, scores: np.ndarray):
        self.name, self._scores = name, scores

    def score(self, candidates, context) -> np.ndarray:
        return self._scores


__all__ = ["BRAKING_DECELERATIONS_MPS2", "BRAKING_SOURCE", "brake_along", "braking_candidates", "choose_or_brake",
           "collision_free"]
