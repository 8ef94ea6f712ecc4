"""What a scorer sees (`ScoringContext`), what it answers (`Scorer`), and picking the plan (`choose`)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import numpy as np

from ..eval.pdm import Agent
from ..types import Candidate, Detection, EgoState, Plan, check_command, check_route_target
from .camera import TopDownCamera

Lane = tuple[np.ndarray, float]  # centreline (N, 2) metres in the ego frame, width metres


@dataclass(frozen=True)
class ScoringContext:
    """The frame a plan's candidates are scored on; everything in the ego frame of that frame.

    ego: the ego's motion; command, route_target ((x, y) m, or None): as the planner was asked;
    detections: boxes in pixels of `camera`'s frame (the model's own, or any detector's);
    previous_detections: those of an earlier frame `previous_age_s` seconds ago, for constant-velocity forecasts;
    previous_pose: the ego's pose (x m, y m, yaw rad) at that frame, in this frame; None: dead-reckoned back from
    `ego` (its velocity, acceleration and yaw rate held over the age);
    agents, lanes: the true road users and lane centrelines (the embedded world's, `oracle.oracle_context`), None
    where unknown. The command is carried for scorers that read it; the terms of docs/scoring.md do not."""

    ego: EgoState
    command: str = "follow lane"
    route_target: Optional[tuple[float, float]] = None
    detections: tuple[Detection, ...] = ()
    camera: TopDownCamera = field(default_factory=TopDownCamera)
    previous_detections: Optional[tuple[Detection, ...]] = None
    previous_age_s: Optional[float] = None
    previous_pose: Optional[tuple[float, float, float]] = None
    agents: Optional[tuple[Agent, ...]] = None
    lanes: Optional[tuple[Lane, ...]] = None

    def __post_init__(self):
        if not isinstance(self.ego, EgoState):
            raise ValueError(f"ScoringContext.ego must be an EgoState, got {type(self.ego).__name__}")
        put = object.__setattr__
        put(self, "command", check_command(self.command))
        put(self, "route_target", check_route_target(self.route_target))
        put(self, "detections", tuple(self.detections))
        for name in ("previous_detections", "agents", "lanes"):
            if getattr(self, name) is not None:
                put(self, name, tuple(getattr(self, name)))
        if self.previous_detections is not None:
            age = self.previous_age_s
            if not isinstance(age, (int, float)) or not math.isfinite(age) or age <= 0:
                raise ValueError(f"previous_age_s {age!r}: expected the previous detections' age, seconds > 0")


class Scorer(Protocol):
    """Scores a plan's candidates: higher is better."""

    name: str

    def score(self, candidates: Sequence[Candidate], context: ScoringContext) -> np.ndarray:
        """One float per candidate (shape (len(candidates),)); -inf for an invalid candidate."""
        ...


def choose(plan: Plan, scorer: Scorer, context: ScoringContext) -> Plan:
    """The plan carrying its best valid candidate: trajectory, validity, `chosen` (the candidate's index), `score`,
    and the planning text (`raw_text["planning"]`, its error dropped). Ties go to the lowest candidate index, so
    the greedy candidate 0 keeps the plan unless another scores strictly higher. No valid candidate: the plan
    as it was. A copy; `plan` is not changed."""
    valid = [k for k, c in enumerate(plan.candidates) if c.valid]
    if not valid:
        return plan
    scores = np.asarray(scorer.score(plan.candidates, context), dtype=np.float64).reshape(-1)
    if scores.shape[0] != len(plan.candidates):
        raise ValueError(f"scorer {scorer.name!r} gave {scores.shape[0]} scores for {len(plan.candidates)} candidates")
    scores = np.where(np.isnan(scores), -np.inf, scores)
    best = max(valid, key=lambda k: (scores[k], -plan.candidates[k].index))
    winner = plan.candidates[best]
    errors = {k: v for k, v in plan.errors.items() if k != "planning"}
    raw_text = {**plan.raw_text, "planning": winner.text} if winner.text else dict(plan.raw_text)
    return dataclasses.replace(plan, trajectory=np.array(winner.trajectory, dtype=np.float64), valid=True,
                               chosen=winner.index, score=float(scores[best]), errors=errors, raw_text=raw_text)
