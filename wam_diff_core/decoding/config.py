"""Decoder settings (one frozen object, validated at construction)."""
from __future__ import annotations

from dataclasses import dataclass

from ..attention.backends import BACKENDS
from ..model.settings import SCHEDULES, STRATEGIES, TEXT_LAYERS


@dataclass(frozen=True)
class DecoderConfig:
    """block_size B (1 = autoregressive); steps K per block (at most); remasking strategy and its
    confidence threshold; token budget; temperature (0 = greedy); fuse_commit: write a finished block
    into the cache inside the next block's first step instead of a forward of its own; ignore_eos:
    always spend the whole budget (benchmarks on random weights); number_order: under a constraint that
    knows its chains (the trajectory grammar), commit each number's characters most significant first;
    schedule: how many positions each step commits (`SCHEDULES`, `remasking.masked_after`); forward_only: the
    kinematic envelope also keeps plans from stepping back along the ego's heading (`envelope.forward_bounds`);
    text_layers: `TEXT_LAYERS`, the text layers of either decode path: the model's own, or
    kernels.fast_layers' (merged projections; "compiled": their pure parts torch.compiled)."""

    block_size: int = 32
    steps: int = 4
    strategy: str = "low_confidence_dynamic"
    threshold: float = 0.9
    max_new_tokens: int = 64
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
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.backend not in BACKENDS + ("flashinfer",):
            raise ValueError(f"backend {self.backend!r} not in {BACKENDS + ('flashinfer',)}")
        if self.text_layers not in TEXT_LAYERS:
            raise ValueError(f"text_layers {self.text_layers!r} not in {TEXT_LAYERS}")

    @property
    def num_blocks(self) -> int:
        return -(-self.max_new_tokens // self.block_size)

    @property
    def answer_positions(self) -> int:
        """Answer positions a decode can fill: whole blocks covering max_new_tokens."""
        return self.num_blocks * self.block_size
