"""The perception scorer: the PDM-style terms against the road users the robot itself detected.

Each box becomes a vehicle on the ground (`camera.TopDownCamera.to_ground`): centred where its box is, as long
and wide as the box (heading along the ego's x: the box is axis-aligned in the frame, so it encloses the vehicle
whatever its heading). With the previous frame's detections it moves at the constant velocity of its match
(`association.match`, the ego's own motion taken out); a box without a match stands still (a vehicle just come
into view, or one the detector missed before: the cautious reading). Without a previous frame at all (the
planner's first frame, or one after a gap), every vehicle moves like the ego: one frame tells where traffic is,
not how fast it goes, and it mostly drives with the ego; taken as standing, every lead looks parked and every
plan is forecast to hit it. No map: DAC is 1; the route target enters through progress.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ..eval.pdm import EGO_LENGTH_M, EGO_WIDTH_M, Agent
from ..types import Candidate, Detection
from .association import gate_m, match
from .base import ScoringContext
from .camera import TopDownCamera
from .terms import Terms, candidate_terms, scores_from_terms


def ground_boxes(detections: Sequence[Detection], camera: TopDownCamera) -> tuple[np.ndarray, np.ndarray]:
    """Detections -> (centres (N, 2) m in the ego frame, sizes (N, 2): extent along x and along y, m)."""
    if not detections:
        return np.zeros((0, 2)), np.zeros((0, 2))
    boxes = np.array([d.box_px for d in detections], dtype=np.float64)  # (N, 4) x1, y1, x2, y2
    centres = camera.to_ground(np.stack([boxes[:, 0] + boxes[:, 2], boxes[:, 1] + boxes[:, 3]], axis=1) / 2)
    sizes = np.abs(np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], axis=1)) / camera.scaling
    return centres, sizes


def _not_the_ego(centres: np.ndarray) -> np.ndarray:
    """Boxes centred on the ego's own footprint are the ego drawn in its frame, not another vehicle."""
    return ~((np.abs(centres[:, 0]) < EGO_LENGTH_M / 2) & (np.abs(centres[:, 1]) < EGO_WIDTH_M / 2))


def _into_this_frame(centres: np.ndarray, context: ScoringContext) -> np.ndarray:
    """Centres (M, 2) in the previous frame's ego frame -> in this one, by the ego's pose back then."""
    age = float(context.previous_age_s)
    ego = context.ego  # dead reckoning: the ego's velocity, acceleration and yaw rate held over the age
    back = (-ego.vx * age + ego.ax * age ** 2 / 2, -ego.vy * age + ego.ay * age ** 2 / 2, -ego.yaw_rate * age)
    x, y, yaw = context.previous_pose or back
    c, s = math.cos(yaw), math.sin(yaw)
    return centres @ np.array([[c, s], [-s, c]]) + np.array([x, y])


def perceived_agents(context: ScoringContext, min_score: float = 0.0) -> list[Agent]:
    """The vehicles the context's detections (score >= `min_score`) place on the ground, with velocities (m/s,
    ego frame, over the ground) from the previous detections where a match exists, else standing; without
    previous detections (None) every vehicle moves at the ego's velocity."""
    kept = [d for d in context.detections if d.score >= min_score]
    centres, sizes = ground_boxes(kept, context.camera)
    own = _not_the_ego(centres)
    centres, sizes = centres[own], sizes[own]
    if context.previous_detections is None:
        velocity = np.tile([float(context.ego.vx), float(context.ego.vy)], (centres.shape[0], 1))
    else:  # matched boxes at their measured velocity, the others (all, after an empty frame) standing
        velocity = np.zeros_like(centres)
        previous = [d for d in context.previous_detections if d.score >= min_score]
        seen, _ = ground_boxes(previous, context.camera)
        seen = seen[_not_the_ego(seen)]
        pairs = match(centres, seen, gate_m(float(context.previous_age_s)))
        moved = _into_this_frame(seen, context)
        has = pairs >= 0
        velocity[has] = (centres[has] - moved[pairs[has]]) / float(context.previous_age_s)
    return [Agent(xy=(float(p[0]), float(p[1])), heading=0.0, velocity=(float(v[0]), float(v[1])),
                  length=float(s[0]), width=float(s[1])) for p, s, v in zip(centres, sizes, velocity)]


class PerceptionScorer:
    """NC x DAC x EC x (5 EP + 5 TTC + 2 C) / 12 against `perceived_agents` (docs/scoring.md)."""

    name = "perception"

    def __init__(self, min_detection_score: float = 0.0):
        self.min_detection_score = float(min_detection_score)

    def terms(self, candidates: Sequence[Candidate], context: ScoringContext) -> list[Optional[Terms]]:
        """Every candidate's terms against the perceived agents (None: invalid)."""
        agents = perceived_agents(context, self.min_detection_score)
        return candidate_terms(candidates, context.ego, agents, None, context.route_target)

    def score(self, candidates: Sequence[Candidate], context: ScoringContext) -> np.ndarray:
        return scores_from_terms(self.terms(candidates, context))
