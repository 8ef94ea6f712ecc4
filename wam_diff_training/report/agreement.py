"""Top-5 agreement of a student with its teacher: on the same corrupted validation sequences (the
distillation layout, each model at its own block size), the share of the student's top-5 tokens at
masked positions that are also in the teacher's top-5. The JSD between them is reported alongside."""
from __future__ import annotations

from typing import Sequence

import torch

from wam_diff_core.model.checkpoint import LoadedModel

from ..collate import collate
from ..data import Example
from ..objective import SelectedLogits, distill_loss

AGREEMENT_SEED = 1234
AGREEMENT_BATCH = 8


@torch.no_grad()
def top5_agreement(student: LoadedModel, student_block_size: int, teacher: LoadedModel, teacher_block_size: int,
                   examples: Sequence[Example], seed: int = AGREEMENT_SEED, batch_size: int = AGREEMENT_BATCH) -> dict:
    """Mean top-5 agreement and JSD over masked response tokens (noise drawn with a fixed seed, so
    every student of a report sees the same corruption)."""
    if student.settings.mask_token_id != teacher.settings.mask_token_id:
        raise ValueError(f"student mask id {student.settings.mask_token_id} != teacher's "
                         f"{teacher.settings.mask_token_id}: the models do not share a tokenizer")
    gen = torch.Generator().manual_seed(seed)
    pad_id = student.settings.eos_token_id
    module = SelectedLogits(student.model)
    weighted_top5 = weighted_jsd = 0.0
    rows = 0
    for start in range(0, len(examples), batch_size):
        batch = collate(list(examples[start:start + batch_size]), pad_id, with_noisy=True)
        if batch is None:
            continue
        out = distill_loss(module, student.model, teacher.model, batch, student_block_size, teacher_block_size,
                           student.settings.mask_token_id, generator=gen, ratio=1.0)
        n = float(out.stats["masked_share"] * out.stats["tokens"])
        weighted_top5 += float(out.stats["top5"]) * n
        weighted_jsd += float(out.stats["jsd"]) * n
        rows += n
    if rows == 0:
        raise ValueError("no masked response tokens in the agreement samples")
    return {"top5": weighted_top5 / rows, "jsd": weighted_jsd / rows, "masked_tokens": int(round(rows)),
            "samples": len(examples), "student_block_size": student_block_size,
            "teacher_block_size": teacher_block_size}
