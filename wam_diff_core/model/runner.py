"""ModelRunner: the forwards the decoders need, over a Qwen3-VL model and a BlockKVCache.

- `encode_images`: the vision tower (timed apart from prefill); its output stays in `last_vision` for heads
  that read it after a decode (the box head);
- `prefill`: the prompt under the block-causal mask, writing the cache, returning the last logits;
- `forward_tokens`: text tokens at given positions against the cache (a denoising step, a commit,
  or both fused), returning final hidden states; `logits` applies the LM head only where asked.

Text-only forwards run the model's own decoder layers (so attention goes through the registered
block-causal backend) without the outer wrapper's per-call mask and rotary set-up; the rotary
tables of a block can be computed once and reused over its K steps. Inside `text_layers("fast")` or
`text_layers("compiled")` they run the layer stack an extension registered for that kind instead (the
same math with merged projections; built once per kind and kept, with copies of the merged weights).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch

from .. import extensions
from ..attention.backends import BlockSpec, use_backend
from ..attention.block_mask import PREFIX, prompt_layout
from ..constants import TEXT_LAYERS
from .kv_cache import BlockKVCache
from .processor import PromptBatch


class ModelRunner:
    def __init__(self, model, backend: str = "sdpa"):
        self.model = model.eval()
        self.backend = backend
        use_backend(model, backend)
        self.text = model.model.language_model
        self.lm_head = model.lm_head
        self.forwards = 0  # model forwards since the last reset (a batched forward counts once)
        self.layers = None  # another text layer stack for forward_tokens (forward(tokens, rope, cache, spec))
        self._stacks: dict[str, object] = {}
        self.last_vision: Optional[tuple] = None  # (encoder output, image_grid_thw) of the last encode_images

    def layer_stack(self, kind: str):
        """The text layer stack of `kind` (`TEXT_LAYERS`): None for the model's own, else the one an extension
        registered for `kind`, built on first use and kept (the eager and static decoders share it)."""
        if kind not in TEXT_LAYERS:
            raise ValueError(f"text layers {kind!r} not in {TEXT_LAYERS}")
        if kind != "model" and kind not in self._stacks:
            self._stacks[kind] = extensions.text_layers(kind)(self.model)
        return self._stacks.get(kind)

    @contextlib.contextmanager
    def text_layers(self, kind: str) -> Iterator[None]:
        """Run forward_tokens through `layer_stack(kind)` inside the block; the stack in use before is restored
        after it."""
        previous, self.layers = self.layers, self.layer_stack(kind)
        try:
            yield
        finally:
            self.layers = previous

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self, batch: int, max_len: int) -> BlockKVCache:
        return BlockKVCache.for_model(self.model, batch, max_len)

    @torch.inference_mode()
    def encode_images(self, batch: PromptBatch) -> Optional[dict]:
        if batch.pixel_values is None:
            return None
        vision = self.model.model.get_image_features(batch.pixel_values, batch.image_grid_thw, return_dict=True)
        self.last_vision = (vision, batch.image_grid_thw)
        return {"image": vision}

    @torch.inference_mode()
    def prefill(self, batch: PromptBatch, cache: BlockKVCache, block_size: int,
                vision: Optional[dict] = None, rows: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill left-padded prompts with blocks of `block_size`. Returns (last-position logits
        (batch, vocab), next text position per sample (batch,)).

        `rows`: the prompt each cache row answers (the prompts' own rows 0..b-1 first, then extra rows, e.g.
        candidates of one prompt): the prompts run once, batch b, and every row of the cache gets its prompt's
        keys and values (`BlockKVCache.share_prompts`); logits and positions are returned per row."""
        index = None if rows is None else torch.tensor(list(rows), dtype=torch.long, device=self.device)
        positions, _ = self.model.model.get_rope_index(
            batch.input_ids, batch.mm_token_type_ids, image_grid_thw=batch.image_grid_thw,
            attention_mask=batch.attention_mask.long(),
        )
        q_block, q_kind = prompt_layout(batch.attention_mask, block_size)
        cache.share_prompts(index)
        try:
            k_block, k_kind = cache.stage(q_block, q_kind)
            spec = BlockSpec(q_block, q_kind, k_block, k_kind)
            out = self.model.model(
                input_ids=batch.input_ids, position_ids=positions, cache=cache, mm_encoder_outputs=vision,
                use_cache=True, block_spec=spec,
            )
        finally:
            cache.share_prompts(None)
        cache.advance(batch.input_ids.shape[1])
        self.forwards += 1
        next_pos = positions.amax(dim=(0, 2)) + 1
        logits = self.lm_head(out.last_hidden_state[:, -1])
        if index is None:
            return logits, next_pos
        return logits.index_select(0, index), next_pos.index_select(0, index)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary (cos, sin) for text positions (batch, n): equal t/h/w positions."""
        pos3 = positions[None].expand(3, -1, -1)
        dummy = torch.empty(0, dtype=self.lm_head.weight.dtype, device=self.device)
        return self.text.rotary_emb(dummy, pos3)

    @torch.inference_mode()
    def forward_tokens(self, tokens: torch.Tensor, q_block: torch.Tensor, q_kind: torch.Tensor,
                       cache: BlockKVCache, rope: tuple[torch.Tensor, torch.Tensor], full: bool = False) -> torch.Tensor:
        """Run text tokens (batch, n) against the cache; returns final hidden states (batch, n, hidden).

        `full=True` declares that every cached key and every query-block key is visible (one block
        against a cache with no padding), so the attention needs no mask.
        """
        k_block, k_kind = cache.stage(q_block, q_kind)
        spec = BlockSpec(full=True) if full else BlockSpec(q_block, q_kind, k_block, k_kind)
        self.forwards += 1
        if self.layers is not None:
            return self.layers.forward(tokens, rope, cache, spec)
        h = self.text.embed_tokens(tokens)
        for layer in self.text.layers:
            h = layer(h, position_embeddings=rope, attention_mask=None, cache=cache, block_spec=spec)
        return self.text.norm(h)

    @property
    def vocab_size(self) -> int:
        """Width of the logits (the output embedding's rows; may exceed the tokenizer's length)."""
        return int(self.lm_head.weight.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


__all__ = ["ModelRunner", "PREFIX"]
