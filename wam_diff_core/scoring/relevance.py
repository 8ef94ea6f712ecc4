"""What can touch a plan: the agents and lane pieces that `eval.pdm.pdm_score` needs to see for it.

pdm_score tests every agent's box against the plan's box at every 0.1 s and against the plan's TTC projections,
and every corner of the plan's boxes against every lane segment, one box at a time in Python. Most agents and
most of a lane are far from any one plan; leaving them out changes no term (the bounds below are conservative)
and keeps a score to a few milliseconds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..eval.pdm import DAC_MARGIN_M, EGO_LENGTH_M, EGO_WIDTH_M, SIM_DT_S, TTC_HORIZONS_S, Agent
from ..constants import HORIZON_S

EGO_RADIUS_M = float(np.hypot(EGO_LENGTH_M, EGO_WIDTH_M) / 2)  # centre to corner of the ego's box
_TTC_STEPS = int(round(max(TTC_HORIZONS_S) / SIM_DT_S))  # 0.1 s intervals the longest TTC projection spans
_MARGIN_M = 1.0  # slack on top of the bounds (state_at's interpolation, rounding)


@dataclass
class TabulatedAgent(Agent):
    """An agent with its states on the 0.1 s grid computed once (`tabulate`): `state_at` is pdm_score's hot call,
    once per agent per 0.1 s per TTC horizon, and replaying a logged future there is costly."""

    table_xy: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    table_heading: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def state_at(self, t: float) -> tuple[np.ndarray, float]:
        k = int(round(t / SIM_DT_S))
        if 0 <= k < self.table_heading.shape[0] and abs(k * SIM_DT_S - t) < 1e-6:
            return self.table_xy[k], float(self.table_heading[k])
        return super().state_at(t)


def tabulate(agents: Sequence[Agent]) -> list[TabulatedAgent]:
    """The agents with their centres and headings at the plan's 0.1 s times (as `pdm.densify`'s) and the TTC
    look-ahead beyond them."""
    times = np.arange(0.0, HORIZON_S + max(TTC_HORIZONS_S) + 1e-9, SIM_DT_S)
    out = []
    for a in agents:
        states = [a.state_at(float(t)) for t in times]
        fields = {f.name: getattr(a, f.name) for f in dataclasses.fields(Agent)}
        out.append(TabulatedAgent(**fields, table_xy=np.array([xy for xy, _ in states]),
                                  table_heading=np.array([h for _, h in states])))
    return out


def _ego_velocity(xy: np.ndarray, heading: np.ndarray, ego_speed: float) -> np.ndarray:
    """(T, 2) the velocity pdm_score projects the ego's box along at each 0.1 s: speed times heading."""
    speed = np.concatenate([[ego_speed], np.linalg.norm(np.diff(xy, axis=0), axis=1) / SIM_DT_S])
    return speed[:, None] * np.stack([np.cos(heading), np.sin(heading)], axis=1)


def nearby_agents(xy: np.ndarray, heading: np.ndarray, ego_speed: float,
                  agents: Sequence[TabulatedAgent]) -> list[TabulatedAgent]:
    """The agents whose box can overlap the plan's (xy, heading: `pdm.densify`'s) box or a TTC projection of it.

    At time t a projection moves the ego by v_e(t) d and the agent moves over [t, t + d], so their centres close
    in by at most d max |v_e(t) - v_a(s)|; boxes overlap only with centres within the sum of their radii."""
    if not agents:
        return []
    n = xy.shape[0]
    paths = np.stack([a.table_xy for a in agents])  # (A, T, 2)
    v_ego = _ego_velocity(xy, heading, ego_speed)  # (n, 2)
    v_agent = np.diff(paths, axis=1) / SIM_DT_S  # (A, T - 1, 2)
    closing = np.max([np.linalg.norm(v_ego[None] - v_agent[:, k:k + n], axis=2) for k in range(_TTC_STEPS)], axis=0)
    gap = np.linalg.norm(paths[:, :n] - xy[None], axis=2)  # (A, n)
    radius = np.hypot([a.length for a in agents], [a.width for a in agents]) / 2
    reach = (gap - closing * max(TTC_HORIZONS_S)).min(axis=1)
    return [a for a, r, rad in zip(agents, reach, radius) if r <= EGO_RADIUS_M + rad + _MARGIN_M]


def nearby_lanes(xy: np.ndarray, lanes) -> list[tuple[np.ndarray, float]]:
    """The runs of lane segments some corner of the plan's boxes (centres `xy`) may lie within half a lane width
    (+ pdm's margin) of, each run a polyline: the drivable-area test gives the same answer on them."""
    out = []
    for centre, width in lanes:
        c = np.asarray(centre, dtype=np.float64)
        if c.shape[0] < 2:
            continue
        mid = (c[:-1] + c[1:]) / 2
        half = np.linalg.norm(np.diff(c, axis=0), axis=1) / 2
        dist = np.linalg.norm(mid[:, None] - xy[None], axis=2).min(axis=1)
        keep = np.flatnonzero(dist <= EGO_RADIUS_M + width / 2 + DAC_MARGIN_M + half + _MARGIN_M)
        for run in np.split(keep, np.flatnonzero(np.diff(keep) > 1) + 1) if keep.size else []:
            out.append((c[run[0]: run[-1] + 2], float(width)))
    return out
