"""Preallocated KV cache for block decoding (write, then keep or discard).

A forward writes its keys/values (and the block ids / kinds the mask needs) right after the committed
length and attends over everything up to the end of what it wrote; it does not extend the cache.
`advance(n)` keeps the first n written tokens: a denoising step keeps none (the next step overwrites
them), a commit keeps the finished block. No copies, no reallocation, static storage.

Duck-types the part of transformers' Cache API the Qwen3-VL text layers use (`update`,
`get_seq_length`).
"""
from __future__ import annotations

import torch


def cache_geometry(model) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a Qwen3-VL model's text KV cache."""
    cfg = model.config.text_config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim


class BlockKVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, batch, kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.block_ids = torch.zeros((batch, max_len), dtype=torch.long, device=device)
        self.kinds = torch.zeros((batch, max_len), dtype=torch.long, device=device)
        self.max_len = max_len
        self.length = 0  # committed tokens (a host integer: the schedule is known, never read from the device)
        self._pending = 0

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> "BlockKVCache":
        layers, kv_heads, head_dim = cache_geometry(model)
        param = next(model.parameters())
        return cls(layers, batch, kv_heads, head_dim, max_len, param.dtype, param.device)

    def stage(self, q_block: torch.Tensor, q_kind: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the block ids / kinds of the next forward's n tokens; return those of all its keys."""
        n = q_block.shape[1]
        end = self.length + n
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} + {n} tokens > capacity {self.max_len}")
        self.block_ids[:, self.length:end] = q_block
        self.kinds[:, self.length:end] = q_kind
        self._pending = n
        return self.block_ids[:, :end], self.kinds[:, :end]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs=None):
        n = key.shape[2]
        end = self.length + n
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} + {n} tokens > capacity {self.max_len}")
        self.keys[layer_idx, :, :, self.length:end] = key
        self.values[layer_idx, :, :, self.length:end] = value
        return self.keys[layer_idx, :, :, :end], self.values[layer_idx, :, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def advance(self, n: int) -> None:
        """Keep the first n tokens written by the last forward."""
        if n > self._pending:
            raise ValueError(f"cannot keep {n} tokens: the last forward wrote {self._pending}")
        self.length += n
        self._pending = 0
