"""The oracle scorer (embedded world only): the PDM-style terms against the world's true road users and lanes.

What the perception scorer would reach with perfect detection, tracking and a map: the ceiling of scoring.
The agents move at their true velocity (constant over the horizon: a live world has no logged future).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..eval.pdm import Agent
from ..types import Candidate
from .base import ScoringContext
from .camera import TopDownCamera
from .terms import score_candidates


def agents_from_vehicles(vehicles) -> list[Agent]:
    """The world's `VehicleGT`s (a tick's `vehicles`, ego frame) -> PDM agents moving at their velocity."""
    return [Agent(xy=tuple(v.xy), heading=float(v.heading), velocity=tuple(v.velocity), length=float(v.length),
                  width=float(v.width)) for v in vehicles]


def lanes_from_world(lanes_gt: list[dict]) -> list[tuple[np.ndarray, float]]:
    """`HighwayWorld.lanes_gt()` -> [(centreline (N, 2) m, width m)], as the PDM scene holds them."""
    return [(np.asarray(lane["centre"], dtype=np.float64), float(lane["width"])) for lane in lanes_gt]


def oracle_context(world, tick, camera: Optional[TopDownCamera] = None) -> ScoringContext:
    """The scoring context of a live embedded world at `tick` (its latest): ego, command, route target, the
    world's own boxes as detections, the true vehicles and the lanes near the ego (`world.lanes_gt()`)."""
    return ScoringContext(ego=tick.ego, command=tick.command, route_target=tick.route_target,
                          detections=tuple(tick.detections), camera=camera or world.camera,
                          agents=tuple(agents_from_vehicles(tick.vehicles)),
                          lanes=tuple(lanes_from_world(world.lanes_gt())))


class OracleScorer:
    """NC x DAC x EC x (5 EP + 5 TTC + 2 C) / 12 against the context's true agents and lanes (docs/scoring.md)."""

    name = "oracle"

    def score(self, candidates: Sequence[Candidate], context: ScoringContext) -> np.ndarray:
        if context.agents is None:
            raise ValueError("the oracle scorer needs the true agents and lanes: a context from "
                             "scoring.oracle.oracle_context (embedded world only)")
        return score_candidates(candidates, context.ego, context.agents, context.lanes, context.route_target)
