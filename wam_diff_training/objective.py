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

from .collate import Corruption, Layout, TrainBatch, corrupt, layout, positions, without_noisy
from .losses import diffusion_ce, divergence, top_k_agreement
from .perception import occupancy_loss


class SelectedLogits(nn.Module):
    """logits (N, V) at rows (row_b[i], row_pos[i]) of a `[prefix | clean | noisy]` forward; with an
    `occupancy_head` (wam_diff_training/perception.py) also its logits over every visual token of the batch."""

    def __init__(self, model, occupancy_head: Optional[nn.Module] = None):
        super().__init__()
        self.model = model
        self.occupancy_head = occupancy_head

    def forward(self, input_ids, position_ids, block_ids, kinds, pixel_values, image_grid_thw, row_b, row_pos):
        inner = self.model.model
        vision = None
        if pixel_values is not None:
            vision = {"image": inner.get_image_features(pixel_values, image_grid_thw, return_dict=True)}
        out = inner(input_ids=input_ids, position_ids=position_ids, mm_encoder_outputs=vision, use_cache=False,
                    block_spec=BlockSpec(block_ids, kinds, block_ids, kinds))
        logits = self.model.lm_head(out.last_hidden_state[row_b, row_pos])
        if self.occupancy_head is None:
            return logits
        occ = self.occupancy_head(torch.cat(vision["image"].pooler_output)) if vision is not None else None
        return logits, occ


@dataclass
class StepOutput:
    loss: torch.Tensor
    stats: dict  # tensors (detached scalars): ce, masked share, ...


def masked_rows(cor: Corruption) -> tuple[torch.Tensor, torch.Tensor]:
    """(sample, response index) of every masked response token (one host sync per step)."""
    return cor.masked.nonzero(as_tuple=True)


def run_logits(module, model, batch: TrainBatch, lay: Layout, input_ids, pos, row_b, row_k) -> torch.Tensor:
    """The selected logits (N, V); a module with an occupancy head gives (logits, occupancy logits)."""
    return module(input_ids, pos, lay.block_ids, lay.kinds, batch.pixel_values, batch.image_grid_thw,
                  row_b, lay.target_pos[row_b, row_k])


def _split(out) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    return out if isinstance(out, tuple) else (out, None)


def with_occupancy(loss: torch.Tensor, stats: dict, occ_logits: Optional[torch.Tensor], batch: TrainBatch,
                   weight: float) -> torch.Tensor:
    """loss + weight x the perception BCE (its statistics into `stats`); a batch without targets adds a
    zero that still touches the head (so data-parallel gradient reduction sees every parameter)."""
    if occ_logits is None:
        return loss
    if batch.occupancy is None:
        return loss + 0.0 * occ_logits.sum()
    bce, occ_stats = occupancy_loss(occ_logits, batch.occupancy)
    stats.update(occ_stats)
    return loss + weight * bce


def diffusion_loss(module, model, batch: TrainBatch, block_size: int, mask_id: int,
                   generator: Optional[torch.Generator] = None, t_min: float = 0.05, t_max: float = 1.0,
                   force_t: Optional[float] = None, occupancy_weight: float = 0.0, chain_share: float = 0.0) -> StepOutput:
    """Masked cross-entropy weighted by 1/t, normalised by the batch's response-token count (+ the
    perception loss times `occupancy_weight` when the module has an occupancy head); `chain_share`: see
    `collate.corrupt`.

    module: SelectedLogits (or its DDP wrapper) over `model`."""
    lay = layout(batch, block_size)
    pos = positions(batch, model)
    cor = corrupt(batch, lay, mask_id, generator, t_min, t_max, force_t, chain_share)
    row_b, row_k = masked_rows(cor)
    logits, occ = _split(run_logits(module, model, batch, lay, cor.input_ids, pos, row_b, row_k))
    n_tokens = lay.valid.sum().clamp(min=1)
    ce = diffusion_ce(logits, batch.targets[row_b, row_k], cor.t[row_b, row_k], n_tokens)
    with torch.no_grad():
        acc = (logits.argmax(-1) == batch.targets[row_b, row_k]).float().mean() if row_b.numel() else ce.new_zeros(())
    stats = {"ce": ce.detach(), "masked_share": (cor.masked.sum() / n_tokens).detach(), "masked_acc": acc,
             "tokens": lay.valid.sum().detach()}
    return StepOutput(with_occupancy(ce, stats, occ, batch, occupancy_weight), stats)


def distill_loss(module, model, teacher, batch: TrainBatch, block_size: int, teacher_block_size: int, mask_id: int,
                 generator: Optional[torch.Generator] = None, t_min: float = 0.05, t_max: float = 1.0,
                 ratio: float = 1.0, kind: str = "jsd", beta: float = 0.5, temperature: float = 1.0,
                 chunk_size: int = 1024, force_t: Optional[float] = None, occupancy_weight: float = 0.0,
                 chain_share: float = 0.0, teacher_clean_only: bool = False) -> StepOutput:
    """(1 - ratio) CE + ratio divergence(student, teacher) over the masked response tokens.

    Teacher and student read the same corrupted sequence; each uses its own block size for the block
    ids and for which copy predicts a token (the teacher with a smaller block sees more clean context).
    `teacher_clean_only`: a B = 1 teacher reads `[prefix | clean]` alone (`collate.without_noisy`).
    """
    lay = layout(batch, block_size)
    pos = positions(batch, model)
    cor = corrupt(batch, lay, mask_id, generator, t_min, t_max, force_t, chain_share)
    row_b, row_k = masked_rows(cor)
    logits, occ = _split(run_logits(module, model, batch, lay, cor.input_ids, pos, row_b, row_k))
    with torch.no_grad():
        if teacher_clean_only and teacher_block_size == 1:  # its logits come from the clean copy alone
            t_batch, t_ids = without_noisy(batch, cor.input_ids)
            t_pos = positions(t_batch, teacher)
        else:
            t_batch, t_ids = batch, cor.input_ids
            t_pos = pos if teacher is model else positions(batch, teacher)
        t_lay = layout(t_batch, teacher_block_size)
        t_logits = run_logits(SelectedLogits(teacher), teacher, t_batch, t_lay, t_ids, t_pos, row_b, row_k)
    if t_logits.shape[-1] != logits.shape[-1]:
        raise ValueError(f"teacher vocabulary {t_logits.shape[-1]} differs from the student's {logits.shape[-1]}")
    n_tokens = lay.valid.sum().clamp(min=1)
    ce = diffusion_ce(logits, batch.targets[row_b, row_k], cor.t[row_b, row_k], n_tokens)
    div = divergence(logits, t_logits, kind, beta, temperature, chunk_size)
    loss = (1.0 - ratio) * ce + ratio * div if ratio < 1.0 else div + 0.0 * ce
    stats = {"ce": ce.detach(), kind: div.detach(), "top5": top_k_agreement(logits.detach(), t_logits, 5),
             "masked_share": (cor.masked.sum() / n_tokens).detach(), "tokens": lay.valid.sum().detach()}
    return StepOutput(with_occupancy(loss, stats, occ, batch, occupancy_weight), stats)
