"""Typed values exchanged between the policy and its callers (ROS node, CARLA agent, closed loop)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .constants import NAV_COMMANDS


@dataclass(frozen=True)
class EgoState:
    """Ego motion in the ego frame (x forward, y left): velocity m/s, acceleration m/s^2, yaw rate rad/s."""

    vx: float
    vy: float = 0.0
    ax: float = 0.0
    ay: float = 0.0
    yaw_rate: float = 0.0

    def __post_init__(self):
        for name in ("vx", "vy", "ax", "ay", "yaw_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(float(value)):
                raise ValueError(f"EgoState.{name} must be a finite number, got {value!r}")

    @property
    def speed(self) -> float:
        return math.hypot(self.vx, self.vy)


def check_command(command: str) -> str:
    """Normalise a navigation command; raise ValueError naming it if unknown."""
    if not isinstance(command, str) or command.strip().lower() not in NAV_COMMANDS:
        raise ValueError(f"unknown navigation command {command!r}; expected one of {NAV_COMMANDS}")
    return command.strip().lower()


def check_route_target(target) -> Optional[tuple[float, float]]:
    """A route target point (x, y) in metres in the ego frame, or None; a ValueError names a bad value."""
    if target is None:
        return None
    try:
        x, y = (float(v) for v in target)
        ok = math.isfinite(x) and math.isfinite(y)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"route target {target!r}: expected (x, y) in metres in the ego frame, two finite numbers")
    return x, y


@dataclass(frozen=True)
class Detection:
    """A 2D box: label, corners in pixels (x1, y1, x2, y2) and on the 0..1000 scale, score in 0..1: how sure
    the model was of it (the geometric mean of its label and coordinate tokens' probabilities,
    `text_confidence`), 1.0 for a box no model scored (ground truth, or a decoder reporting no probabilities)."""

    label: str
    box_px: tuple[float, float, float, float]
    box_norm: tuple[float, float, float, float]
    score: float = 1.0


@dataclass
class DecodeStats:
    """What one decoder call cost: tokens produced, forwards used, seconds per phase."""

    tokens: int = 0
    forwards: int = 0
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Candidate:
    """One of the trajectories a plan drew from one prompt (`DrivingPolicy.plan(..., candidates=N)`): index 0 is the
    greedy answer (the plan without candidates), the others sampled; trajectory (8, 2) metres in the ego frame, None
    when the answer did not parse (`error` says why); logprob: the mean log-probability the model gave the answer's
    tokens (0.0 when the decoder reported none); source: "model" for an answer the model decoded, "braking" for
    a plan a scorer added by braking along the greedy candidate's path (`scoring.braking`)."""

    index: int
    trajectory: Optional[np.ndarray]
    text: str = ""
    logprob: float = 0.0
    error: Optional[str] = None
    source: str = "model"

    @property
    def valid(self) -> bool:
        return self.trajectory is not None


@dataclass
class Plan:
    """Output of DrivingPolicy.plan(): trajectory (8, 2) metres in the ego frame, or invalid with an error.
    With candidates: every candidate drawn, the one whose trajectory the plan carries (`chosen`) and its score."""

    trajectory: Optional[np.ndarray]
    valid: bool
    detections: Optional[list[Detection]] = None
    answer: Optional[str] = None
    raw_text: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, DecodeStats] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    chosen: int = 0
    score: Optional[float] = None


@dataclass
class Answer:
    """Output of DrivingPolicy.ask()."""

    question: str
    text: str
    raw_text: str
    timings: dict[str, float] = field(default_factory=dict)
