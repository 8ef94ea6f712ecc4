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
    """Adapter around wam_diff_core.policy.DrivingPolicy (frames in, trajectory out)."""

    needs_images = True
    drives_itself = False

    def __init__(self, path: str, device: str = "cpu", decoding: Optional[dict] = None):
        from ..policy import DrivingPolicy  # heavy: torch + transformers

        self.inner = DrivingPolicy.load(path, device=device, **(decoding or {}))
        only = self.inner.loaded.settings.route_targets_only_on
        if only is not None:  # the route types it learned targets on: the world states them there alone (run_route)
            self.route_target_scenarios = only

    def plan(self, images, ego: EgoState, command: str, target=None) -> Plan:
        return self.inner.plan(images, ego, command, target=target)


def load_policy(spec: str, device: str = "cpu", decoding: Optional[dict] = None):
    """'expert', 'expert-plan', 'constant-velocity', or a checkpoint path / preset name for DrivingPolicy (decoding
    as its `wam_diff.json` says, with `decoding`, DecoderConfig fields, on top: `resolve_decoding`)."""
    if spec == "expert":
        return ExpertPolicy()
    if spec == "expert-plan":
        return ExpertPlanPolicy()
    if spec == "constant-velocity":
        return ConstantVelocityPolicy()
    return LearnedPolicy(spec, device=device, decoding=decoding)


_CACHED: dict = {}


def cached_policy(spec: str, device: str = "cpu", decoding: Optional[dict] = None):
    """`load_policy` once per process for the same (spec, device, decoding): a pool worker loads its model
    for its first route and keeps it for the rest. Its `name` is the spec."""
    key = (spec, device, json.dumps(decoding or None, sort_keys=True))
    if key not in _CACHED:
        _CACHED.clear()  # one model per worker process
        policy = load_policy(spec, device=device, decoding=decoding)
        policy.name = spec
        _CACHED[key] = policy
    return _CACHED[key]


def safe_plan(policy, images, ego: EgoState, command: str, target=None) -> Plan:
    """Call policy.plan (with `target` when there is one) and turn any exception or malformed trajectory into an
    invalid Plan."""
    try:
        plan = policy.plan(images, ego, command) if target is None else policy.plan(images, ego, command, target=target)
    except Exception as exc:  # a closed loop never crashes on the policy
        return Plan(trajectory=None, valid=False, errors={"planning": f"{type(exc).__name__}: {exc}"})
    traj: Optional[np.ndarray] = getattr(plan, "trajectory", None)
    if not getattr(plan, "valid", False) or traj is None:
        return plan if isinstance(plan, Plan) else Plan(trajectory=None, valid=False, errors={"planning": "no plan"})
    traj = np.asarray(traj, dtype=np.float64)
    if traj.shape != (NUM_WAYPOINTS, 2) or not np.isfinite(traj).all():
        return Plan(trajectory=None, valid=False, errors={"planning": f"bad trajectory shape {traj.shape}"})
    return plan
