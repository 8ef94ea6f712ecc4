"""The oracle scorer (embedded world only): the PDM-style terms against the world's true road users and lanes.

What the perception scorer would reach with perfect detection, tracking and a map: the ceiling of scoring.
A live world has no logged future: each vehicle follows its lane or route at its current speed
(`HighwayWorld.vehicle_futures`), or moves at its constant velocity where that cannot be predicted.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..eval.pdm import Agent
from ..types import Candidate
from .base import ScoringContext
from .camera import TopDownCamera
from .terms import Terms, candidate_terms, scores_from_terms


def agents_from_vehicles(vehicles, futures: Optional[dict] = None) -> list[Agent]:
    """The world's `VehicleGT`s (a tick's `vehicles`, ego frame) -> PDM agents; `futures` (vid -> (NUM_WAYPOINTS, 3)
    x, y, heading at 0.5 s steps) where known, else moving at their velocity."""
    futures = futures or {}
    return [Agent(xy=tuple(v.xy), heading=float(v.heading), velocity=tuple(v.velocity), length=float(v.length),
                  width=float(v.width), future=futures.get(v.vid)) for v in vehicles]


def lanes_from_world(lanes_gt: list[dict]) -> list[tuple[np.ndarray, float]]:
    """`HighwayWorld.lanes_gt()` -> [(centreline (N, 2) m, width m)], as the PDM scene holds them."""
    return [(np.asarray(lane["centre"], dtype=np.float64), float(lane["width"])) for lane in lanes_gt]


def oracle_context(world, tick, camera: Optional[TopDownCamera] = None) -> ScoringContext:
    """The scoring context of a live embedded world at `tick` (its latest): ego, command, route target, the
    world's own boxes as detections, the true vehicles with their forecasts (`world.vehicle_futures()`) and the
    lanes near the ego (`world.lanes_gt()`)."""
    return ScoringContext(ego=tick.ego, command=tick.command, route_target=tick.route_target,
                          detections=tuple(tick.detections), camera=camera or world.camera,
                          agents=tuple(agents_from_vehicles(tick.vehicles, world.vehicle_futures())),
                          lanes=tuple(lanes_from_world(world.lanes_gt())))


class OracleScorer:
    """NC x DAC x EC x (5 EP + 5 TTC + 2 C) / 12 against the context's true agents and lanes (docs/scoring.md)."""

    name = "oracle"

    def terms(self, candidates: Sequence[Candidate], context: ScoringContext) -> list[Optional[Terms]]:
        """Every candidate's terms against the true agents and lanes (None: invalid)."""
        if context.agents is None:
            raise ValueError("the oracle scorer needs the true agents and lanes: a context from "
                             "scoring.oracle.oracle_context (embedded world only)")
        return candidate_terms(candidates, context.ego, context.agents, context.lanes, context.route_target)

    def score(self, candidates: Sequence[Candidate], context: ScoringContext) -> np.ndarray:
        return scores_from_terms(self.terms(candidates, context))
