"""Preallocated KV cache for block decoding (write, then keep or discard).

A forward writes its keys/values (and the block ids / kinds the mask needs) right after the committed
length and attends over everything up to the end of what it wrote; it does not extend the cache.
`advance(n)` keeps the first n written tokens: a denoising step keeps none (the next step overwrites
them), a commit keeps the finished block. No copies, no reallocation, static storage.

Shared prompts (`share_prompts`): a cache with more rows than prompts (candidate answers of one prompt) is filled
by one prefill of the prompts alone; every row gets its prompt's keys and values (the prompts' own rows first, a
broadcast into the other rows), and the prefill attends over the prompts' own rows only.

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
        self._prompt_rows: torch.Tensor | None = None  # while sharing prompts: the prompt each row holds

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> "BlockKVCache":
        layers, kv_heads, head_dim = cache_geometry(model)
        param = next(model.parameters())
        return cls(layers, batch, kv_heads, head_dim, max_len, param.dtype, param.device)

    def share_prompts(self, rows: torch.Tensor | None) -> None:
        """From now until `share_prompts(None)`, forwards of the b prompts (batch b, into the empty cache) fill
        every row: row r gets prompt rows[r]'s keys and values. rows: (batch,) long, rows[:b] = 0..b-1."""
        if rows is not None and (self.length or rows.shape[0] != self.keys.shape[1]):
            raise ValueError(f"sharing prompts needs an empty cache and one prompt index per row ({self.keys.shape[1]}), "
                             f"got {self.length} tokens and {rows.shape[0]} indices")
        self._prompt_rows = rows

    def _write(self, store: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Write `src` (b, ..., n, ...) at the next n slots of `store` (batch, ..., max_len, ...); return the
        stored rows a forward of batch b attends over (the prompts' own when sharing prompts)."""
        end = self.length + src.shape[-2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} + {src.shape[-2]} tokens > capacity {self.max_len}")
        b = src.shape[0]
        store[:b, ..., self.length:end, :] = src
        if self._prompt_rows is not None and store.shape[0] > b:
            # one prompt: a broadcast, no temporary; several: one gathered copy
            store[b:, ..., self.length:end, :] = src if b == 1 else src.index_select(0, self._prompt_rows[b:])
        return store[:b, ..., :end, :]

    def stage(self, q_block: torch.Tensor, q_kind: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the block ids / kinds of the next forward's n tokens; return those of all its keys."""
        self._pending = q_block.shape[1]
        k_block = self._write(self.block_ids[..., None], q_block[..., None])
        k_kind = self._write(self.kinds[..., None], q_kind[..., None])
        return k_block[..., 0], k_kind[..., 0]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs=None):
        return self._write(self.keys[layer_idx], key), self._write(self.values[layer_idx], value)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def copy_row(self, src: int, dst: slice, start: int) -> None:
        """Rows `dst` take row `src`'s committed keys, values, block ids and kinds from position `start` on (a
        candidate branching off the answer it shared until now)."""
        end = self.length
        for store in (self.keys, self.values):
            store[:, dst, :, start:end] = store[:, src:src + 1, :, start:end]
        for store in (self.block_ids, self.kinds):
            store[dst, start:end] = store[src:src + 1, start:end]

    def advance(self, n: int) -> None:
        """Keep the first n tokens written by the last forward."""
        if n > self._pending:
            raise ValueError(f"cannot keep {n} tokens: the last forward wrote {self._pending}")
        self.length += n
        self._pending = 0
