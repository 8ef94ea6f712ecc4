"""The policy the planner node loads: its settings as ROS declares them, and the loader.

The core engine is imported inside `load_policy`, lazily, so the node starts fast and tests inject a fake through
PlannerNode(policy_factory=...).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from wam_diff_core.constants import SHIPPED_MODEL


@dataclass(frozen=True)
class PolicySettings:
    """The parameters that define the loaded policy, as ROS declares them: 0 and "" mean unset (the
    checkpoint's own, its wam_diff.json; for max_new_tokens the policy's per-task budget)."""

    model: str = SHIPPED_MODEL
    device: str = "cpu"
    dtype: str = ""  # a DTYPES name; "" = the checkpoint's own on a GPU, float32 on a CPU
    attention_backend: str = "sdpa"
    cuda_graphs: bool = False
    block_size: int = 0
    denoising_steps: int = 0
    remasking_strategy: str = ""
    remasking_threshold: float = 0.0
    max_new_tokens: int = 0
    tasks: tuple[str, ...] = ("planning",)
    kinematic_envelope: bool = True
    commit_schedule: str = ""
    forward_only: str = ""  # "on", "off"
    text_layers: str = "model"
    torch_threads: int = 0  # 0 = torch's default (one per core)
    detections: str = "auto"  # DETECTION_SOURCES: the box head, the text answer, auto (the head when there is one)


def load_policy(settings: PolicySettings):
    """Create the policy for `settings`: the checkpoint's own decoding settings with the parameters that are set
    on top (0 / "" become None, unset, here and nowhere else). `model: fake` is the wiring-test FakePolicy."""
    if settings.model == "fake":
        from .fake_policy import FakePolicy

        return FakePolicy(tasks=settings.tasks)
    import torch

    from wam_diff_core.policy import DrivingPolicy

    s = settings
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)  # process-wide: the planning thread is the node's only torch user
    return DrivingPolicy.load(
        s.model, device=s.device, dtype=s.dtype or None, tasks=s.tasks, detections=s.detections, block_size=s.block_size or None, steps=s.denoising_steps or None,
        strategy=s.remasking_strategy or None, threshold=s.remasking_threshold or None,
        schedule=s.commit_schedule or None, forward_only={"on": True, "off": False}.get(s.forward_only),
        max_new_tokens=s.max_new_tokens or None, backend=s.attention_backend, cuda_graphs=s.cuda_graphs,
        kinematic_envelope=s.kinematic_envelope, text_layers=s.text_layers)


def close_policy(policy, node_name: str) -> None:
    """policy.close(), never raising: freeing must not fail a transition or a shutdown."""
    try:
        policy.close()
    except Exception as exc:  # noqa: BLE001
        print(f"{node_name}: policy.close() failed: {exc}", file=sys.stderr)
