"""NAVSIM-PDM-style terms of candidate trajectories against road users and lanes, and their product.

    score = NC x DAC x EC x (5 EP + 5 TTC + 2 C) / 12

NC, DAC, TTC and C are `eval.pdm.pdm_score`'s (NAVSIM v1's definitions on a 0.1 s interpolation of the plan);
EC, the kinematic envelope, is 1 when the plan's implied accelerations stay inside the decoder's envelope
(`decoding.envelope.accel_bounds`) and it never steps back (the world's ego does not reverse), else 0; DAC is 1
where no lanes are known. EP is progress in metres, toward the route target when there is one (how much nearer
the plan's closest approach comes than the ego is now), else along x, divided by the most progress of a candidate
that passes NC, DAC and EC, as NAVSIM divides by its best safe proposal's; 1 when that is under 5 m.
docs/scoring.md compares the weights with NAVSIM's PDMS.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from ..constants import TRAJECTORY_DECIMALS, WAYPOINT_DT_S
from ..decoding.envelope import accel_bounds
from ..eval.pdm import EP_MIN_REFERENCE_M, Agent, PdmResult, PdmScene, densify, pdm_score
from ..types import Candidate, EgoState
from .relevance import TabulatedAgent, nearby_agents, nearby_lanes, tabulate

# a decoded plan's numbers are rounded to hundredths: a second difference may carry 4 half-hundredths of error
ENVELOPE_TOLERANCE_MPS2 = 4 * 0.5 * 10 ** -TRAJECTORY_DECIMALS / WAYPOINT_DT_S ** 2
REVERSE_TOLERANCE_M = 0.05  # a stopping plan's x may wobble by rounding; more than this is driving backwards


@dataclass(frozen=True)
class Terms:
    """One trajectory's terms: nc (0, 0.5 or 1), dac, envelope, ttc, comfort (0 or 1), progress_m (metres)."""

    nc: float
    dac: float
    envelope: float
    ttc: float
    comfort: float
    progress_m: float


@lru_cache(maxsize=1)
def _accel_bounds() -> np.ndarray:
    return accel_bounds().numpy().astype(np.float64)


def inside_envelope(trajectory: np.ndarray, ego: EgoState) -> bool:
    """Whether the (NUM_WAYPOINTS, 2) plan's per-axis accelerations (second differences, the ego one interval
    back at -v dt) stay inside the decoder's kinematic envelope and its x never steps back."""
    traj = np.asarray(trajectory, dtype=np.float64)
    dt = WAYPOINT_DT_S
    series = np.vstack([[-ego.vx * dt, -ego.vy * dt], [0.0, 0.0], traj])
    accel = np.diff(series, n=2, axis=0) / dt ** 2  # (NUM_WAYPOINTS, 2)
    bounds = _accel_bounds()
    inside = (accel >= bounds[:, 0] - ENVELOPE_TOLERANCE_MPS2) & (accel <= bounds[:, 1] + ENVELOPE_TOLERANCE_MPS2)
    x = np.concatenate([[0.0], traj[:, 0]])
    forward = (x - np.maximum.accumulate(x) >= -REVERSE_TOLERANCE_M).all()
    return bool(inside.all() and forward)


def progress_m(trajectory: np.ndarray, route_target: Optional[tuple[float, float]]) -> float:
    """Metres of progress: toward `route_target` (its distance now minus the plan's closest approach, on the
    0.1 s path), else the last waypoint's x; never below 0."""
    if route_target is None:
        return max(float(np.asarray(trajectory)[-1, 0]), 0.0)
    _, xy, _ = densify(trajectory)
    target = np.asarray(route_target, dtype=np.float64)
    closest = float(np.linalg.norm(xy - target, axis=1).min())
    return max(float(np.linalg.norm(target)) - closest, 0.0)


def trajectory_terms(trajectory: np.ndarray, ego: EgoState, agents: Sequence[Agent], lanes,
                     route_target: Optional[tuple[float, float]]) -> Terms:
    """The terms of one (NUM_WAYPOINTS, 2) ego-frame plan; lanes None: no map, DAC 1. Agents already
    `relevance.tabulate`d are used as they are (a caller scoring several plans against the same agents)."""
    if not all(isinstance(a, TabulatedAgent) for a in agents):
        agents = tabulate(agents)
    _, xy, heading = densify(trajectory)
    scene = PdmScene(ego_speed=ego.speed, agents=nearby_agents(xy, heading, ego.speed, agents),
                     lanes=nearby_lanes(xy, lanes or []))
    pdm = pdm_score(trajectory, scene)
    return Terms(nc=pdm.nc, dac=pdm.dac if lanes is not None else 1.0,
                 envelope=1.0 if inside_envelope(trajectory, ego) else 0.0, ttc=pdm.ttc, comfort=pdm.c,
                 progress_m=progress_m(trajectory, route_target))


def combine(terms: Sequence[Terms]) -> np.ndarray:
    """Scores (len(terms),) in [0, 1]: NC x DAC x EC x (5 EP + 5 TTC + 2 C) / 12, EP relative to the best
    progress among the candidates that pass NC, DAC and EC."""
    if not terms:
        return np.zeros(0)
    passing = [t.progress_m for t in terms if t.nc * t.dac * t.envelope > 0]
    reference = max(passing, default=0.0)
    out = []
    for t in terms:
        ep = 1.0 if reference < EP_MIN_REFERENCE_M else float(np.clip(t.progress_m / reference, 0.0, 1.0))
        out.append(PdmResult(nc=t.nc, dac=t.dac * t.envelope, ttc=t.ttc, ep=ep, c=t.comfort).score)
    return np.asarray(out, dtype=np.float64)


def candidate_terms(candidates: Sequence[Candidate], ego: EgoState, agents: Sequence[Agent], lanes,
                    route_target: Optional[tuple[float, float]]) -> list[Optional[Terms]]:
    """Every candidate's terms; None for an invalid one."""
    agents = tabulate(agents)
    return [trajectory_terms(c.trajectory, ego, agents, lanes, route_target) if c.valid else None
            for c in candidates]


def scores_from_terms(terms: Sequence[Optional[Terms]]) -> np.ndarray:
    """`combine` of the valid candidates' terms (progress relative among them); -inf where the terms are None."""
    valid = [k for k, t in enumerate(terms) if t is not None]
    out = np.full(len(terms), -np.inf)
    out[valid] = combine([terms[k] for k in valid])
    return out
