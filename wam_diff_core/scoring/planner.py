"""Planning with candidates and a scorer: what `wam-diff drive|decode`, the ROS node and the CARLA agent call in
place of `policy.plan`.

`CandidatePlanner(policy, candidates=N, scorer=NAME, sampling=METHOD).plan(images, ego, command, ...)`:
- N = 1 without a scorer, or with one that forecasts nothing (likelihood): the policy's own call, unchanged (the
  same tokens; no scorer runs, no detection is added);
- N = 1 with perception or oracle (and braking on): the policy's plan, scored, and braked along its path when it
  is forecast to collide (`braking`): a safety check at the cost of the detections and one scoring;
- N > 1: `policy.plan(..., candidates=N, sampling=...)` (one prefill, N answers as one batch), then the scorer picks
  the best valid candidate (`base.choose`, with braking plans when all collide: `braking.choose_or_brake`);
  without a scorer the plan keeps candidate 0, the greedy one.
The `perception` scorer needs the model's detections, so the detection task joins the plan's tasks; this frame's
detections are kept with their time for the next frame's constant-velocity forecasts (`previous_detections`).
The `oracle` scorer needs the embedded world's truth, which only a caller holding the world can give (`truth`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np

from ..decoding.candidates import CandidateSampling, check_candidates, check_sampling
from ..types import Detection, EgoState, Plan
from .base import ScoringContext, choose
from .braking import BRAKING_SOURCE, choose_or_brake
from .camera import TopDownCamera
from .registry import ScorerError, check_scorer, make_scorer

# Detections older than this are not matched to the newer ones: a vehicle may have turned or left the frame since,
# and the planner may have paused (a lifecycle node deactivated, a route restarted)
MAX_PREVIOUS_AGE_S = 1.0
WORLD_SCORERS = ("oracle",)  # scorers that read the embedded world's true vehicles and lanes
BOX_SOURCES = ("model", "world")  # the boxes perception reads in the embedded world: the model's, or the true ones

Truth = Union[ScoringContext, Callable[[], ScoringContext]]


def check_scorer_setting(name: Optional[str], has_world: bool, where: str = "here") -> Optional[str]:
    """The scorer name normalised, None for None or "" (no scorer); a ScorerError (one line) for an unknown name,
    or for the oracle where no embedded world is (`has_world` False; `where` names the place)."""
    if name is None or (isinstance(name, str) and not name.strip()):
        return None
    name = check_scorer(name)
    if name in WORLD_SCORERS and not has_world:
        raise ScorerError(f"scorer {name!r} reads the embedded world's true vehicles and lanes; {where} has no world: "
                          f"use perception or likelihood")
    return name


class _Recorded:
    """A scorer that keeps the scores of its last call (`last`)."""

    def __init__(self, scorer):
        self.inner, self.name, self.last = scorer, scorer.name, None

    def score(self, candidates, context) -> np.ndarray:
        self.last = np.asarray(self.inner.score(candidates, context), dtype=np.float64)
        return self.last


@dataclass
class CandidateStats:
    """What planning with candidates did: plans made, plans whose candidates a scorer ranked, plans won by a
    candidate other than 0 (greedy), plans where braking plans were added (every model candidate was forecast to
    collide) and plans a braking one won (`scoring.braking`), model candidates drawn and the invalid ones dropped
    (their answers did not parse), seconds in whole plans and in scoring alone (context + scorer)."""

    plans: int = 0
    scored: int = 0
    non_greedy_wins: int = 0
    braking_plans: int = 0
    braking_wins: int = 0
    candidates_drawn: int = 0
    invalid_candidates: int = 0
    plan_s: float = 0.0
    score_s: float = 0.0

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class CandidatePlanner:
    """Plans with `policy` (DrivingPolicy's plan interface), `candidates` N >= 1 per frame drawn by `sampling` (a
    CandidateSampling or a method name), the winner picked by `scorer` (a SCORERS name; None or "": candidate 0).
    `has_world`: the caller can give the oracle the embedded world's truth (else the oracle is refused, naming
    `where`); `camera`: the top-down camera the perception scorer reads boxes in (default: the embedded world's at the
    frame's size); `shared_blocks`: the answer blocks the candidates share with the greedy one before they branch
    (`CandidateSampling.shared_blocks`; 0: none); `single_step`: the candidates commit each block at its first
    denoising step (`CandidateSampling.single_step`); `braking`: with a scorer that forecasts collisions
    (perception, oracle), brake along the greedy candidate's path when every candidate collides
    (`scoring.braking`)."""

    def __init__(self, policy, candidates: int = 1, scorer: Optional[str] = None,
                 sampling: CandidateSampling | str | None = None, *, has_world: bool = False, where: str = "here",
                 camera: Optional[TopDownCamera] = None, braking: bool = True, shared_blocks: int = 0,
                 single_step: bool = False):
        self.policy = policy
        self.braking = bool(braking)
        self.candidates = check_candidates(candidates)
        self.scorer_name = check_scorer_setting(scorer, has_world, where)
        self.sampling = check_sampling(sampling)
        if shared_blocks or single_step:
            self.sampling = CandidateSampling(self.sampling.method, self.sampling.temperature, shared_blocks,
                                              bool(single_step))
        config = getattr(policy, "config", None)
        if self.candidates > 1 and config is not None:
            from ..policy import check_candidate_settings  # heavy (torch): only with a policy that decodes

            check_candidate_settings(self.candidates, config)
        self.scorer = _Recorded(make_scorer(self.scorer_name)) if self.scorer_name else None
        self.camera = camera
        self.stats = CandidateStats()
        self._previous: Optional[tuple[tuple[Detection, ...], float]] = None  # (detections, time s)

    @property
    def perceives(self) -> bool:
        """Whether plans ask for detections for the scorer (perception with N > 1, or braking at N = 1)."""
        return self.scorer_name == "perception" and (self.candidates > 1 or self.brakes)

    def settings(self) -> dict:
        """N, the scorer's name (None: none), the sampling and whether it brakes, as records and summaries state
        them."""
        return {"candidates": self.candidates, "scorer": self.scorer_name, "sampling": self.sampling.method,
                "temperature": self.sampling.temperature, "shared_blocks": self.sampling.shared_blocks,
                "single_step": self.sampling.single_step, "braking": self.brakes}

    @property
    def brakes(self) -> bool:
        """Whether plans whose candidates all collide get braking plans (`braking` on and a scorer that forecasts)."""
        return self.braking and self.scorer is not None and hasattr(self.scorer.inner, "terms")

    def reset(self) -> None:
        """Forget the previous frame's detections and the counts (a new route, a restarted node)."""
        self._previous = None
        self.stats = CandidateStats()
        if self.scorer is not None:
            self.scorer.last = None

    @property
    def last_scores(self) -> Optional[np.ndarray]:
        """The score of every candidate of the last plan a scorer ranked (-inf: invalid); None before any."""
        return None if self.scorer is None else self.scorer.last

    def plan(self, images, ego: EgoState, command: str, target: Optional[tuple[float, float]] = None,
             tasks: Optional[Sequence[str]] = None, *, route_target: Optional[tuple[float, float]] = None,
             time_s: Optional[float] = None, truth: Optional[Truth] = None,
             detections: Optional[Sequence[Detection]] = None) -> Plan:
        """Plan from camera images, ego state, command and the route target the model is asked with (`target`);
        `tasks` (None: the policy's own) as policy.plan takes them. `route_target`: the one the scorer measures
        progress toward (None: `target`; a caller may know the route where the model is not asked with it);
        `time_s`: the frame's time in seconds (stamp or simulated time; default: this machine's monotonic clock),
        for the age of the previous detections; `truth`: the oracle's context (true agents and lanes) or a function
        making it; `detections`: boxes of another detector in pixels of the first image, which the perception
        scorer then reads in place of the model's (no detection task is added). The plan carries the winner
        (`chosen`, `score`); N = 1 without braking is the policy's own call."""
        t0 = time.perf_counter()
        kwargs = {"target": target} if tasks is None else {"target": target, "tasks": tasks}
        if self.candidates == 1 and not self.brakes:
            plan = self.policy.plan(images, ego, command, **kwargs)
            self._count(plan, time.perf_counter() - t0)
            return plan
        if self.perceives and detections is None:
            asked = tuple(tasks or getattr(self.policy, "tasks", ("planning",)))
            kwargs["tasks"] = asked if "detection" in asked else asked + ("detection",)
        plan = self.policy.plan(images, ego, command, candidates=self.candidates, sampling=self.sampling, **kwargs)
        t_score = time.perf_counter()
        boxes = tuple(plan.detections or ()) if detections is None else tuple(detections)
        if self.scorer is not None:
            self.scorer.last = None
            goal = target if route_target is None else route_target
            context = self._context(boxes, images, ego, command, goal, time_s, truth)
            if self.brakes:
                plan, self.scorer.last = choose_or_brake(plan, self.scorer.inner, context)
            else:
                plan = choose(plan, self.scorer, context)
            self.stats.scored += 1
        if self.perceives:
            self._previous = (boxes, self._now(time_s))
        plan.timings["score"] = time.perf_counter() - t_score
        self.stats.score_s += plan.timings["score"]
        self._count(plan, time.perf_counter() - t0)
        return plan

    def _count(self, plan: Plan, seconds: float) -> None:
        s = self.stats
        s.plans += 1
        s.plan_s += seconds
        drawn = [c for c in plan.candidates if c.source != BRAKING_SOURCE]
        s.candidates_drawn += len(drawn)
        s.invalid_candidates += sum(not c.valid for c in drawn)
        s.non_greedy_wins += int(plan.chosen != 0)
        s.braking_plans += int(len(drawn) < len(plan.candidates))
        s.braking_wins += int(plan.chosen >= len(drawn) > 0)

    @staticmethod
    def _now(time_s: Optional[float]) -> float:
        return float(time_s) if time_s is not None else time.monotonic()

    def _context(self, boxes: tuple[Detection, ...], images, ego: EgoState, command: str, route_target,
                 time_s: Optional[float], truth: Optional[Truth]) -> ScoringContext:
        """What the scorer sees: the oracle's truth, or the ego, command and route target, with this frame's boxes
        and (when recent) the previous frame's for perception."""
        if self.scorer_name in WORLD_SCORERS:
            if truth is None:
                raise ScorerError(f"scorer {self.scorer_name!r} needs the embedded world's truth for every plan")
            return truth() if callable(truth) else truth
        if not self.perceives:
            return ScoringContext(ego=ego, command=command, route_target=route_target)
        image = images[0] if isinstance(images, (list, tuple)) else images
        camera = self.camera or TopDownCamera(int(image.shape[1]), int(image.shape[0]))
        previous, age = None, None
        if self._previous is not None:
            age = self._now(time_s) - self._previous[1]
            if 0.0 < age <= MAX_PREVIOUS_AGE_S:
                previous = self._previous[0]
        return ScoringContext(ego=ego, command=command, route_target=route_target,
                              detections=boxes, camera=camera, previous_detections=previous,
                              previous_age_s=age if previous is not None else None)


def add_candidate_arguments(parser, world: bool = False) -> None:
    """--candidates N, --scorer NAME, --sampling METHOD (`wam-diff drive`, `wam-diff decode`); with a `world`
    (`wam-diff drive`) also --perception-boxes model|world."""
    from ..decoding.candidates import SAMPLING_METHODS
    from .registry import SCORERS

    g = parser.add_argument_group("candidates", "N plans from one prefill, the best one by a scorer (docs/scoring.md)")
    g.add_argument("--candidates", type=int, default=1, metavar="N",
                   help="candidate trajectories per plan, drawn as one batch (default 1: the greedy plan alone)")
    g.add_argument("--scorer", choices=SCORERS, default=None,
                   help="picks the candidate the plan carries (default: none, candidate 0, the greedy plan)")
    g.add_argument("--sampling", choices=SAMPLING_METHODS, default="tokens",
                   help="how candidates 1..N-1 are drawn: tokens sampled at temperature 1, or the greedy tokens "
                        "committed in a noisy order (default: tokens)")
    g.add_argument("--shared-blocks", type=int, default=0, metavar="S",
                   help="the answer's first S blocks are the greedy candidate's for every candidate, decoded once; "
                        "the candidates branch after them (default 0: from the first token; docs/scoring.md)")
    g.add_argument("--single-step", action="store_true",
                   help="candidates 1..N-1 commit each answer block at its first denoising step; the greedy "
                        "candidate takes its steps alone (docs/scoring.md)")
    g.add_argument("--no-braking", dest="braking", action="store_false",
                   help="with perception or oracle: do not add braking plans along the greedy path when no "
                        "candidate is forecast safe (default: add them; docs/scoring.md)")
    if world:
        g.add_argument("--perception-boxes", choices=BOX_SOURCES, default="model",
                       help="the boxes the perception scorer reads: the model's own detections (default; the "
                            "detection task joins each plan), or the world's true boxes, what a perfect detector "
                            "would give (no detection task)")


def candidate_arguments(args, has_world: bool, where: str, decoding: Optional[dict] = None) -> dict:
    """The CandidatePlanner settings the command line gave ({} for the greedy plan alone: N = 1, no scorer);
    a one-line error (CandidatesError, ScorerError, PolicySettingsError) for a bad N, a scorer `where` cannot run,
    or `decoding` options (DrivingPolicy.load keywords) that cannot draw N candidates, before any model loads."""
    n = check_candidates(args.candidates)
    scorer = check_scorer_setting(args.scorer, has_world, where)
    boxes = getattr(args, "perception_boxes", "model")
    if boxes != "model" and scorer != "perception":
        raise ScorerError(f"--perception-boxes {boxes}: only the perception scorer reads boxes, the scorer is {scorer}")
    if n == 1 and scorer is None:
        return {}
    if n > 1:
        from ..decoding.config import DecoderConfig, resolve_decoding
        from ..policy import check_candidate_settings

        fields = {k: v for k, v in (decoding or {}).items() if k != "dtype"}
        check_candidate_settings(n, resolve_decoding(DecoderConfig(), **fields))
    out = {"candidates": n, "scorer": scorer, "sampling": check_sampling(args.sampling).method}
    if not getattr(args, "braking", True):
        out["braking"] = False
    if getattr(args, "single_step", False):
        out["single_step"] = True
    shared = getattr(args, "shared_blocks", 0)
    if shared:
        CandidateSampling(out["sampling"], shared_blocks=shared)  # a one-line CandidatesError for a bad count
        out["shared_blocks"] = shared
    return {**out, "boxes": boxes} if boxes != "model" else out


__all__ = ["BOX_SOURCES", "CandidatePlanner", "CandidateStats", "MAX_PREVIOUS_AGE_S", "WORLD_SCORERS", "add_candidate_arguments",
           "candidate_arguments", "check_scorer_setting"]
