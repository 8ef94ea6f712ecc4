"""What can touch a plan: the agents and lane pieces that `eval.pdm.pdm_score` needs to see for it.

pdm_score tests every agent's box against the plan's box at every 0.1 s and against the plan's TTC projections,
and every corner of the plan's boxes against every lane segment, one box at a time in Python. Most agents and
most of a lane are far from any one plan; leaving them out changes no term (the tests below keep everything that
could count) and keeps a plan's score to a few milliseconds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..eval.pdm import DAC_MARGIN_M, EGO_LENGTH_M, EGO_WIDTH_M, SIM_DT_S, TTC_HORIZONS_S, Agent
from ..constants import HORIZON_S

EGO_RADIUS_M = float(np.hypot(EGO_LENGTH_M, EGO_WIDTH_M) / 2)  # centre to corner of the ego's box
_SLACK_M = 1e-3  # floating-point slack: pdm_score counts touching boxes as overlapping


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
        table_xy, table_heading = a.states_at(times)
        fields = {f.name: getattr(a, f.name) for f in dataclasses.fields(Agent)}
        out.append(TabulatedAgent(**fields, table_xy=table_xy, table_heading=table_heading))
    return out


def _ego_velocity(xy: np.ndarray, heading: np.ndarray, ego_speed: float) -> np.ndarray:
    """(T, 2) the velocity pdm_score projects the ego's box along at each 0.1 s: speed times heading."""
    speed = np.concatenate([[ego_speed], np.linalg.norm(np.diff(xy, axis=0), axis=1) / SIM_DT_S])
    return speed[:, None] * np.stack([np.cos(heading), np.sin(heading)], axis=1)


def nearby_agents(xy: np.ndarray, heading: np.ndarray, ego_speed: float,
                  agents: Sequence[TabulatedAgent]) -> list[TabulatedAgent]:
    """The agents whose box may overlap the plan's (xy, heading: `pdm.densify`'s) box at some 0.1 s or one of its
    TTC projections, at the times pdm_score compares them: the agents that no such pair separates along the ego
    box's own two axes (the separating-axis test on half of its axes, so it keeps a few that never touch)."""
    if not agents:
        return []
    n = xy.shape[0]
    steps = np.array([0] + [int(round(h / SIM_DT_S)) for h in TTC_HORIZONS_S])  # (D,) NC, then each TTC horizon
    ego = xy[None] + _ego_velocity(xy, heading, ego_speed)[None] * (steps * SIM_DT_S)[:, None, None]  # (D, n, 2)
    index = np.arange(n)[None] + steps[:, None]  # (D, n) table rows of the agents' states at those times
    rel = np.stack([a.table_xy for a in agents])[:, index] - ego[None]  # (A, D, n, 2)
    turn = np.stack([a.table_heading for a in agents])[:, index] - heading  # (A, D, n) agent heading - ego's
    along, across = np.cos(heading), np.sin(heading)
    lon = rel[..., 0] * along + rel[..., 1] * across
    lat = rel[..., 1] * along - rel[..., 0] * across
    half_l = np.array([a.length for a in agents])[:, None, None] / 2
    half_w = np.array([a.width for a in agents])[:, None, None] / 2
    c, s = np.abs(np.cos(turn)), np.abs(np.sin(turn))
    touch = ((np.abs(lon) <= EGO_LENGTH_M / 2 + half_l * c + half_w * s + _SLACK_M)
             & (np.abs(lat) <= EGO_WIDTH_M / 2 + half_l * s + half_w * c + _SLACK_M))
    return [a for a, near in zip(agents, touch.any(axis=(1, 2))) if near]


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
        keep = np.flatnonzero(dist <= EGO_RADIUS_M + width / 2 + DAC_MARGIN_M + half + _SLACK_M)
        for run in np.split(keep, np.flatnonzero(np.diff(keep) > 1) + 1) if keep.size else []:
            out.append((c[run[0]: run[-1] + 2], float(width)))
    return out
