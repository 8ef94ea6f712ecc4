"""Decoding settings: one frozen object from a checkpoint's `wam_diff.json` to the decoder.

A checkpoint states how it decodes in the "decoding" section of its `wam_diff.json` (`CHECKPOINT_KEYS`);
every entry point (policy loader, `wam-diff decode` / `demo` / `drive` / `dagger` / `sensitivity`, the ROS
planner, the CARLA agent, the report) takes those values and lays the user's on top with `resolve_decoding`,
where a user value of None means "unset: the checkpoint's own".
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

from ..constants import ATTENTION_BACKENDS, SCHEDULES, STRATEGIES, TEXT_LAYERS

# The keys of wam_diff.json's "decoding" section, in the order they are written.
CHECKPOINT_KEYS = ("block_size", "steps", "strategy", "threshold", "number_order", "schedule", "forward_only")
_BOOLS = ("fuse_commit", "ignore_eos", "cuda_graphs", "number_order", "kinematic_envelope", "forward_only")


def step_count(block_size: int, steps: int) -> int:
    """Denoising steps a block takes: B = 1 decodes one token per forward (one step); a larger block takes
    K steps, never more than its B positions, and at least one."""
    return max(1, min(int(steps), int(block_size)))


@dataclass(frozen=True)
class DecoderConfig:
    """block_size B (1 = autoregressive); steps K per block (at most, `step_count`); remasking strategy
    (`STRATEGIES`) and its confidence threshold; max_new_tokens: the token budget (None: the caller's, e.g.
    the policy's per-task budget); temperature (0 = greedy); fuse_commit: write a finished block into the
    cache inside the next block's first step instead of a forward of its own; ignore_eos: always spend the
    whole budget (benchmarks on random weights); number_order: under a constraint that knows its chains (the
    trajectory grammar), commit each number's characters most significant first; schedule: how many
    positions each step commits (`SCHEDULES`, `remasking.masked_after`); kinematic_envelope: planning answers
    stay inside the kinematic envelope of the ego state (`envelope`); forward_only: the envelope also keeps
    plans from stepping back along the ego's heading (`envelope.forward_bounds`); backend: attention
    (`ATTENTION_BACKENDS`); cuda_graphs: the graph-captured static decode path; text_layers: `TEXT_LAYERS`,
    the text layers of either decode path: the model's own, or wam_diff_kernels.fast_layers' (merged projections;
    "compiled": their pure parts torch.compiled)."""

    block_size: int = 32
    steps: int = 4
    strategy: str = "low_confidence_dynamic"
    threshold: float = 0.9
    max_new_tokens: Optional[int] = None
    temperature: float = 0.0
    fuse_commit: bool = True
    ignore_eos: bool = False
    backend: str = "sdpa"
    cuda_graphs: bool = False
    seed: int = 0
    number_order: bool = True
    kinematic_envelope: bool = True
    schedule: str = "linear"
    forward_only: bool = False
    text_layers: str = "model"

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {self.block_size!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r} not in {STRATEGIES}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} not in {SCHEDULES}")
        if not isinstance(self.threshold, (int, float)) or not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if self.max_new_tokens is not None and (not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1 or None, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.backend not in ATTENTION_BACKENDS:
            raise ValueError(f"backend {self.backend!r} not in {ATTENTION_BACKENDS}")
        if self.text_layers not in TEXT_LAYERS:
            raise ValueError(f"text_layers {self.text_layers!r} not in {TEXT_LAYERS}")
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r}: expected true or false")

    @property
    def num_blocks(self) -> int:
        if self.max_new_tokens is None:
            raise ValueError("max_new_tokens is unset: give the decoder a token budget")
        return -(-self.max_new_tokens // self.block_size)

    @property
    def answer_positions(self) -> int:
        """Answer positions a decode can fill: whole blocks covering max_new_tokens."""
        return self.num_blocks * self.block_size

    def to_checkpoint(self) -> dict[str, Any]:
        """The "decoding" section of wam_diff.json: the `CHECKPOINT_KEYS` values."""
        return {k: getattr(self, k) for k in CHECKPOINT_KEYS}

    @classmethod
    def from_checkpoint(cls, section: Mapping[str, Any]) -> "DecoderConfig":
        """The config a wam_diff.json "decoding" section states (missing keys: the defaults); a ValueError
        names unknown keys and bad values."""
        if not isinstance(section, Mapping):
            raise ValueError(f"decoding: expected a mapping of {list(CHECKPOINT_KEYS)}, got {section!r}")
        unknown = sorted(set(section) - set(CHECKPOINT_KEYS))
        if unknown:
            raise ValueError(f"decoding: unknown keys {unknown}; expected some of {list(CHECKPOINT_KEYS)}")
        try:
            return cls(**section)
        except ValueError as exc:  # the message starts with the field's name
            raise ValueError(f"decoding.{exc}") from None


FIELDS = tuple(f.name for f in fields(DecoderConfig))


def resolve_decoding(checkpoint: DecoderConfig, **user: Any) -> DecoderConfig:
    """The decoding settings an entry point runs with: `checkpoint` (the model's own, from its wam_diff.json)
    with every user value that is not None on top, its steps as decoded (`step_count`: B = 1 takes one step,
    a larger block at most B). Unknown names raise a ValueError naming them; bad values the DecoderConfig one."""
    unknown = sorted(set(user) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown decoding settings {unknown}; expected some of {list(FIELDS)}")
    cfg = replace(checkpoint, **{k: v for k, v in user.items() if v is not None})
    return replace(cfg, steps=step_count(cfg.block_size, cfg.steps))
