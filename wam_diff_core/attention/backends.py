"""Block-causal attention registered through transformers' AttentionInterface.

The model's text layers call the registered function with the keyword argument `block_spec`
(a BlockSpec: block ids and kinds of queries and keys). Each backend turns the spec into its own
mask form once per forward (cached on the spec, shared by all layers):
- `wam_sdpa`: a dense boolean mask for torch SDPA (the reference; CPU and GPU);
- `wam_flex`: a flex-attention BlockMask (sparse over blocks).
Other backends (FlashInfer, on a GPU) come from extensions (`wam_diff_core.extensions`).
A spec with `full=True` means every key is visible (a block step against the cache): no mask at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from .. import extensions
from .block_mask import visibility

BACKENDS = ("sdpa", "flex")  # built in, CPU and GPU; others (GPU) are registered by extensions
_REGISTERED_NAME = {"sdpa": "wam_sdpa", "flex": "wam_flex"}


@dataclass
class BlockSpec:
    """Block ids / kinds of the queries (batch, q_len) and keys (batch, kv_len) of one forward."""

    q_block: Optional[torch.Tensor] = None
    q_kind: Optional[torch.Tensor] = None
    k_block: Optional[torch.Tensor] = None
    k_kind: Optional[torch.Tensor] = None
    full: bool = False
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def dense(self) -> Optional[torch.Tensor]:
        """(batch, 1, q_len, kv_len) bool mask, or None when every key is visible."""
        if self.full:
            return None
        if "dense" not in self._cache:
            self._cache["dense"] = visibility(self.q_block, self.q_kind, self.k_block, self.k_kind)[:, None]
        return self._cache["dense"]

    def flex(self):
        if self.full:
            return None
        if "flex" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            qb, qk, kb, kk = self.q_block, self.q_kind, self.k_block, self.k_kind

            def mask_mod(b, h, q_idx, kv_idx):
                return visibility(
                    qb[b, q_idx][None, None], qk[b, q_idx][None, None], kb[b, kv_idx][None, None], kk[b, kv_idx][None, None]
                )[0, 0, 0]

            self._cache["flex"] = create_block_mask(
                mask_mod, qb.shape[0], None, qb.shape[1], kb.shape[1], device=qb.device
            )
        return self._cache["flex"]


def _sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, block_spec=None, **kwargs):
    mask = block_spec.dense() if block_spec is not None else attention_mask
    if mask is None and block_spec is None:
        raise ValueError("wam_sdpa attention needs a block_spec (or an explicit 4-D attention_mask)")
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def _flex(module, query, key, value, attention_mask, scaling=None, dropout=0.0, block_spec=None, **kwargs):
    from torch.nn.attention.flex_attention import flex_attention

    if block_spec is None:
        raise ValueError("wam_flex attention needs a block_spec")
    out = flex_attention(
        query, key, value, block_mask=block_spec.flex(), scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(_REGISTERED_NAME["sdpa"], _sdpa)
AttentionInterface.register(_REGISTERED_NAME["flex"], _flex)


def use_backend(model, backend: str) -> None:
    """Route the text layers of a Qwen3-VL model through a block-causal backend: one of `BACKENDS`, or one
    an extension registered (the vision tower keeps stock SDPA)."""
    if backend in _REGISTERED_NAME:
        model.set_attn_implementation({"text_config": _REGISTERED_NAME[backend], "vision_config": "sdpa"})
    else:
        extensions.attention_backend(backend).install(model)
