"""Policies the closed loop can drive with: the Protocol every one of them meets, and the baselines
of the embedded world (the expert driving itself, the expert's rollouts as tracked plans, constant
velocity). The learned DrivingPolicy (wam_diff_core.policy) meets the same Protocol and is imported
lazily by `load_policy`; `cached_policy` keeps one per worker process.
"""
from __future__ import annotations

import json
from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from ..constants import HORIZON_S, NUM_WAYPOINTS, WAYPOINT_DT_S
from ..types import EgoState, Plan

BASELINES = ("expert", "expert-plan", "constant-velocity")


@runtime_checkable
class Policy(Protocol):
    """A planner the closed loops drive with. The world's route target point, where it has one, comes as the
    keyword `target` (x, y) m in the ego frame; `safe_plan` passes it only then, so a policy that never uses
    one may take the three positional arguments alone."""

    def plan(self, images: Sequence[np.ndarray], ego: EgoState, command: str, target=None) -> Plan: ...


class ConstantVelocityPolicy:
    """Keeps the current velocity vector for 4 s: a straight line at the current speed."""

    needs_images = False
    drives_itself = False

    def plan(self, images, ego: EgoState, command: str, target=None) -> Plan:
        t = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
        traj = np.stack([ego.vx * t, ego.vy * t], axis=1)
        return Plan(trajectory=traj, valid=True)


class ExpertPolicy:
    """The rule-based expert (sim.expert.ExpertVehicle) drives the ego itself inside the world; its
    plan is what it intends: its route ahead at its current speed (drawn in videos, never tracked)."""

    needs_images = False
    drives_itself = True

    def __init__(self):
        self.world = None

    def bind(self, world) -> None:
        self.world = world

    def plan(self, images, ego: EgoState, command: str, target=None) -> Plan:
        if self.world is None:
            return Plan(trajectory=None, valid=False, errors={"planning": "expert not bound to a world"})
        return Plan(trajectory=self.world.expert_intent(), valid=True)


def expert_plan(world) -> tuple[np.ndarray, bool]:
    """The expert's plan from the world's current state in the planning format: the ego positions of
    `world.expert_rollout(HORIZON_S)` at the waypoint times, (NUM_WAYPOINTS, 2) in the ego frame, and
    whether the expert collided within the horizon."""
    path, crashed = world.expert_rollout(HORIZON_S)
    step = int(round(WAYPOINT_DT_S / world.dt))
    return path[step - 1::step][:NUM_WAYPOINTS], crashed


class ExpertPlanPolicy(ExpertPolicy):
    """The expert as a planner: every plan is the expert's rollout from the current state (`expert_plan`),
    tracked by the same controller, cadence and plan format as a learned policy. Its score is the ceiling
    of the plan-and-track interface: what a model that predicted the expert's plans exactly would drive."""

    drives_itself = False

    def plan(self, images, ego: EgoState, command: str, target=None) -> Plan:
        if self.world is None:
            return Plan(trajectory=None, valid=False, errors={"planning": "expert-plan not bound to a world"})
        return Plan(trajectory=expert_plan(self.world)[0], valid=True)


class LearnedPolicy:
    """Adapter around wam_diff_core.policy.DrivingPolicy (frames in, trajectory out). `candidates`: the
    `scoring.planner.CandidatePlanner` settings {"candidates": N, "scorer": NAME or None, "sampling": METHOD}, and
    "boxes": "world" for a perception scorer reading the world's true boxes instead of the model's; unset or N = 1:
    the policy's own plan.

    With a scorer, the world states the route target on every junction route (`route_target_scenarios` left unset)
    for the scorer's progress term, and the model is asked with it only on the route types its checkpoint learned
    targets on, as without candidates; the oracle reads the world bound to it (`bind`) at the tick it plans on."""

    needs_images = True
    drives_itself = False
    reads_tick = True  # safe_plan hands it the world's tick

    def __init__(self, path: str, device: str = "cpu", decoding: Optional[dict] = None,
                 candidates: Optional[dict] = None):
        from ..policy import DrivingPolicy  # heavy: torch + transformers
        from ..scoring.planner import CandidatePlanner

        self.inner = DrivingPolicy.load(path, device=device, **(decoding or {}))
        settings = dict(candidates or {})
        self.world_boxes = settings.pop("boxes", "model") == "world"
        self.planner = CandidatePlanner(self.inner, has_world=True, where="the embedded world", **settings)
        self.world = None
        self.model_target_on = self.inner.loaded.settings.route_targets_only_on  # None: every route type
        if self.model_target_on is not None and self.planner.scorer is None:
            self.route_target_scenarios = self.model_target_on  # the world states them there alone (run_route)

    def bind(self, world) -> None:
        """A new route: its world (the oracle's truth), and no detections carried over from the last route."""
        self.world = world
        self.planner.reset()

    def plan(self, images, ego: EgoState, command: str, target=None, tick=None) -> Plan:
        model_target = target
        scenario = getattr(getattr(self.world, "route", None), "scenario", None)
        if self.planner.scorer is not None and self.model_target_on is not None and scenario not in self.model_target_on:
            model_target = None
        truth = None
        if self.planner.scorer_name == "oracle" and self.world is not None and tick is not None:
            from ..scoring.oracle import oracle_context

            world = self.world
            truth = lambda: oracle_context(world, tick)  # noqa: E731 - built only when the scorer runs
        if tick is None:
            return self.planner.plan(images, ego, command, target=model_target, route_target=target, truth=truth)
        return self.planner.plan(images, ego, command, target=model_target, route_target=target, time_s=tick.t,
                                 truth=truth, detections=tick.detections if self.world_boxes else None)


def load_policy(spec: str, device: str = "cpu", decoding: Optional[dict] = None, candidates: Optional[dict] = None):
    """'expert', 'expert-plan', 'constant-velocity', or a checkpoint path / preset name for DrivingPolicy (decoding
    as its `wam_diff.json` says, with `decoding`, DecoderConfig fields, on top: `resolve_decoding`; `candidates`:
    LearnedPolicy's candidate settings)."""
    if spec == "expert":
        return ExpertPolicy()
    if spec == "expert-plan":
        return ExpertPlanPolicy()
    if spec == "constant-velocity":
        return ConstantVelocityPolicy()
    return LearnedPolicy(spec, device=device, decoding=decoding, candidates=candidates)


_CACHED: dict = {}


def cached_policy(spec: str, device: str = "cpu", decoding: Optional[dict] = None,
                  candidates: Optional[dict] = None):
    """`load_policy` once per process for the same (spec, device, decoding, candidates): a pool worker loads its
    model for its first route and keeps it for the rest. Its `name` is the spec."""
    key = (spec, device, json.dumps(decoding or None, sort_keys=True), json.dumps(candidates or None, sort_keys=True))
    if key not in _CACHED:
        _CACHED.clear()  # one model per worker process
        policy = load_policy(spec, device=device, decoding=decoding, candidates=candidates)
        policy.name = spec
        _CACHED[key] = policy
    return _CACHED[key]


def safe_plan(policy, images, ego: EgoState, command: str, target=None, tick=None) -> Plan:
    """Call policy.plan (with `target` when there is one, and the world's `tick` when the policy `reads_tick`) and
    turn any exception or malformed trajectory into an invalid Plan."""
    kwargs = {} if target is None else {"target": target}
    if tick is not None and getattr(policy, "reads_tick", False):
        kwargs["tick"] = tick
    try:
        plan = policy.plan(images, ego, command, **kwargs)
    except Exception as exc:  # a closed loop never crashes on the policy
        return Plan(trajectory=None, valid=False, errors={"planning": f"{type(exc).__name__}: {exc}"})
    traj: Optional[np.ndarray] = getattr(plan, "trajectory", None)
    if not getattr(plan, "valid", False) or traj is None:
        return plan if isinstance(plan, Plan) else Plan(trajectory=None, valid=False, errors={"planning": "no plan"})
    traj = np.asarray(traj, dtype=np.float64)
    if traj.shape != (NUM_WAYPOINTS, 2) or not np.isfinite(traj).all():
        return Plan(trajectory=None, valid=False, errors={"planning": f"bad trajectory shape {traj.shape}"})
    return plan
