"""One training forward of the block-diffusion objective, and the losses built on it.

`SelectedLogits` is the module a step runs (and DDP wraps): the vision tower, the text model under the
block-causal spec, and the LM head applied only at the rows that count (masked response tokens), so a
151k-entry vocabulary never meets the whole sequence. `diffusion_loss` / `distill_loss` compose layout,
noise, forward and loss for a batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from wam_diff_core.attention.backends import BlockSpec

from .collate import Corruption, Layout, TrainBatch, corrupt, layout, positions
from .losses import diffusion_ce, divergence, top_k_agreement


class SelectedLogits(nn.Module):
    """logits (N, V) at rows (row_b[i], row_pos[i]) of a `[prefix | clean | noisy]` forward."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, block_ids, kinds, pixel_values, image_grid_thw, row_b, row_pos):
        inner = self.model.model
        vision = None
        if pixel_values is not None:
            vision = {"image": inner.get_image_features(pixel_values, image_grid_thw, return_dict=True)}
        out = inner(input_ids=input_ids, position_ids=position_ids, mm_encoder_outputs=vision, use_cache=False,
                    block_spec=BlockSpec(block_ids, kinds, block_ids, kinds))
        hidden = out.last_hidden_state[row_b, row_pos]
        return self.model.lm_head(hidden)


@dataclass
class StepOutput:
    loss: torch.Tensor
    stats: dict  # tensors (detached scalars): ce, masked share, ...


def masked_rows(cor: Corruption) -> tuple[torch.Tensor, torch.Tensor]:
    """(sample, response index) of every masked response token (one host sync per step)."""
    return cor.masked.nonzero(as_tuple=True)


def run_logits(module, model, batch: TrainBatch, lay: Layout, input_ids, pos, row_b, row_k) -> torch.Tensor:
    return module(input_ids, pos, lay.block_ids, lay.kinds, batch.pixel_values, batch.image_grid_thw,
                  row_b, lay.target_pos[row_b, row_k])


def diffusion_loss(module, model, batch: TrainBatch, block_size: int, mask_id: int,
                   generator: Optional[torch.Generator] = None, t_min: float = 0.05, t_max: float = 1.0,
                   force_t: Optional[float] = None) -> StepOutput:
    """Masked cross-entropy weighted by 1/t, normalised by the batch's response-token count.

    module: SelectedLogits (or its DDP wrapper) over `model`."""
    lay = layout(batch, block_size)
    pos = positions(batch, model)
    cor = corrupt(batch, lay, mask_id, generator, t_min, t_max, force_t)
    row_b, row_k = masked_rows(cor)
    logits = run_logits(module, model, batch, lay, cor.input_ids, pos, row_b, row_k)
    n_tokens = lay.valid.sum().clamp(min=1)
    ce = diffusion_ce(logits, batch.targets[row_b, row_k], cor.t[row_b, row_k], n_tokens)
    with torch.no_grad():
        acc = (logits.argmax(-1) == batch.targets[row_b, row_k]).float().mean() if row_b.numel() else ce.new_zeros(())
    stats = {"ce": ce.detach(), "masked_share": (cor.masked.sum() / n_tokens).detach(), "masked_acc": acc,
             "tokens": lay.valid.sum().detach()}
    return StepOutput(ce, stats)


def distill_loss(module, model, teacher, batch: TrainBatch, block_size: int, teacher_block_size: int, mask_id: int,
                 generator: Optional[torch.Generator] = None, t_min: float = 0.05, t_max: float = 1.0,
                 ratio: float = 1.0, kind: str = "jsd", beta: float = 0.5, temperature: float = 1.0,
                 chunk_size: int = 1024, force_t: Optional[float] = None) -> StepOutput:
    """(1 - ratio) CE + ratio divergence(student, teacher) over the masked response tokens.

    Teacher and student read the same corrupted sequence; each uses its own block size for the block
    ids and for which copy predicts a token (the teacher with a smaller block sees more clean context).
    """
    lay = layout(batch, block_size)
    t_lay = layout(batch, teacher_block_size)
    pos = positions(batch, model)
    cor = corrupt(batch, lay, mask_id, generator, t_min, t_max, force_t)
    row_b, row_k = masked_rows(cor)
    logits = run_logits(module, model, batch, lay, cor.input_ids, pos, row_b, row_k)
    with torch.no_grad():
        t_pos = pos if teacher is model else positions(batch, teacher)
        t_logits = run_logits(SelectedLogits(teacher), teacher, batch, t_lay, cor.input_ids, t_pos, row_b, row_k)
    if t_logits.shape[-1] != logits.shape[-1]:
        raise ValueError(f"teacher vocabulary {t_logits.shape[-1]} differs from the student's {logits.shape[-1]}")
    n_tokens = lay.valid.sum().clamp(min=1)
    ce = diffusion_ce(logits, batch.targets[row_b, row_k], cor.t[row_b, row_k], n_tokens)
    div = divergence(logits, t_logits, kind, beta, temperature, chunk_size)
    loss = (1.0 - ratio) * ce + ratio * div if ratio < 1.0 else div + 0.0 * ce
    stats = {"ce": ce.detach(), kind: div.detach(), "top5": top_k_agreement(logits.detach(), t_logits, 5),
             "masked_share": (cor.masked.sum() / n_tokens).detach(), "tokens": lay.valid.sum().detach()}
    return StepOutput(loss, stats)
