"""A KV cache of static shape whose committed length lives on the device (capture-ready).

Layout: keys/values (layers, batch, kv_heads, max_len, head_dim), one row per sample, prompts stored
left-aligned with their padding removed (`load_prefill`), so sample b's committed tokens are the slots
[0, lens[b]). `lens` is a device tensor: nothing in a denoising step reads it on the host.

A forward of n query tokens (`begin`) writes its K/V at slots lens[b] + 0..n-1 (a scatter with a device
index) and attends over the whole static row with a per-query key limit: query q sees slot s iff
s < lens[b] + limit[q]. A plain block step has limit B for every query (the cache and the whole block);
the fused commit step [finished block | new block] has limit B for the finished block's queries (the
cache and itself, block-causal) and 2B for the new block's. `commit(B)` keeps the first B written
tokens (lens += B, on the device). Every shape is fixed per (batch, max_len, n): one CUDA graph fits.

Each row is also exactly a FlashInfer page in the HND layout (num_pages = batch, page_size = max_len),
so the same buffers serve the FlashInfer backend without a copy.

Duck-types the part of transformers' Cache API the Qwen3-VL text layers call (`update`, `get_seq_length`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from wam_diff_core.attention.backends import BlockSpec
from wam_diff_core.model.kv_cache import cache_geometry


@dataclass
class StaticSpec(BlockSpec):
    """The attention spec of one static-shape forward: a (batch, 1, n, max_len) boolean mask for SDPA
    (`dense()`), and, for the FlashInfer backend, the planned wrapper of this step kind (`plan`)."""

    mask: Optional[torch.Tensor] = None
    plan: Any = None

    def dense(self) -> Optional[torch.Tensor]:
        return self.mask


class StaticKVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, batch, kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)  # committed tokens per sample
        self.slots = torch.arange(max_len, device=device)
        self.batch, self.kv_heads, self.head_dim, self.max_len = batch, kv_heads, head_dim, max_len
        self._index: Optional[torch.Tensor] = None  # scatter index of the forward in flight

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> "StaticKVCache":
        layers, kv_heads, head_dim = cache_geometry(model)
        param = next(model.parameters())
        return cls(layers, batch, kv_heads, head_dim, max_len, param.dtype, param.device)

    def load_prefill(self, keys: torch.Tensor, values: torch.Tensor, pads: list[int]) -> list[int]:
        """Copy a prefilled left-padded cache (layers, batch, kv_heads, L, head_dim) in, padding removed.

        `pads`: left-pad count per sample (host ints, known when the batch is built). Returns the
        committed length per sample (host ints), also written to `lens`. Runs once per request,
        outside any capture.
        """
        L = keys.shape[3]
        if keys.shape[1] != self.batch or L > self.max_len:
            raise ValueError(f"prefill cache {tuple(keys.shape)} does not fit batch {self.batch}, max_len {self.max_len}")
        lens = [L - p for p in pads]
        for b, p in enumerate(pads):
            self.keys[:, b, :, : L - p] = keys[:, b, :, p:]
            self.values[:, b, :, : L - p] = values[:, b, :, p:]
        self.lens.copy_(torch.tensor(lens, dtype=torch.long))
        return lens

    def begin(self, limits: torch.Tensor, plan: Any = None) -> StaticSpec:
        """Prepare a forward of n = len(limits) query tokens: their write slots and visibility.

        limits: (n,) long on the device, per query the number of slots past `lens` it may see.
        Device ops only (no host sync); returns the spec the attention backend reads.
        """
        n = limits.shape[0]
        write = self.lens[:, None] + self.slots[:n]  # (batch, n)
        self._index = write[:, None, :, None].expand(self.batch, self.kv_heads, n, self.head_dim)
        visible = self.slots[None, None, :] < (self.lens[:, None, None] + limits[None, :, None])
        return StaticSpec(full=False, mask=visible[:, None], plan=plan)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs=None):
        """Write this forward's K/V (batch, kv_heads, n, head_dim); return the whole static rows."""
        if self._index is None or self._index.shape[2] != key.shape[2]:
            raise RuntimeError("StaticKVCache.update without a matching begin(); call begin(limits) before a forward")
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.scatter_(2, self._index, key.to(k.dtype))
        v.scatter_(2, self._index, value.to(v.dtype))
        return k, v

    def commit(self, n: int) -> None:
        """Keep the first n tokens written by the last forward (device op)."""
        self.lens.add_(n)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise RuntimeError("StaticKVCache keeps its length on the device; positions are passed explicitly")
