"""The training layout `[prefix | clean response | noisy response]` (docs/architecture.md, training layout).

`collate` packs Examples into a right-padded `TrainBatch` (token ids only, per-sample lengths; no
masks). Everything that depends on the block size B or on the noise is derived later on the device,
vectorised over the batch:
- `layout(batch, B)`: block ids and kinds per token (the attention mask is derived from them inside
  the attention, once per forward), and for each response token k the position of the logit that
  predicts it (shifted alignment: offset 0 of a block from the clean copy's position k - 1, or the last
  prompt position for k = 0; later offsets from the noisy copy's position k - 1);
- `positions(batch, model)`: M-RoPE positions; the noisy copy reuses the clean copy's positions;
- `corrupt(...)`: a stratified noise level t per response block, each noisy token masked with
  probability t; or, for a share of the blocks of fixed-style trajectories (`chain_share`), the states
  number-order decoding meets: each number of the block masked from a random digit on (a committed
  most-significant prefix, the rest masked), separators and EOS visible.
A batch built with `with_noisy=False` is `[prefix | response]`: the B = 1 layout, plain AR training.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from wam_diff_core.attention.backends import BlockSpec
from wam_diff_core.attention.block_mask import CLEAN, NOISY, PAD, PREFIX
from wam_diff_core.codec import fixed_trajectory_chain_starts

from .data import BadSample, Example
from .perception import batch_occupancy


@dataclass
class TrainBatch:
    """input_ids / mm_token_type_ids: (b, L) right-padded `[prefix | clean | noisy]` (noisy = an
    uncorrupted copy until `corrupt`); prefix_ids / prefix_mm / prefix_mask: (b, P_max) the prompts alone
    (for M-RoPE); prefix_len / response_len: (b,); targets: (b, R_max) response ids (0 past the end)."""

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    prefix_ids: torch.Tensor
    prefix_mm: torch.Tensor
    prefix_mask: torch.Tensor
    prefix_len: torch.Tensor
    response_len: torch.Tensor
    targets: torch.Tensor
    pixel_values: Optional[torch.Tensor]
    image_grid_thw: Optional[torch.Tensor]
    with_noisy: bool
    sample_ids: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)
    skipped: list[BadSample] = field(default_factory=list)
    occupancy: Optional[torch.Tensor] = None  # (visual tokens, cells^2) perception targets, NaN rows: none
    chain_start: Optional[torch.Tensor] = None  # (b, R_max) response index where token k's chain starts

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]

    def to(self, device) -> "TrainBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return TrainBatch(
            *(move(t) for t in (self.input_ids, self.mm_token_type_ids, self.prefix_ids, self.prefix_mm,
                                self.prefix_mask, self.prefix_len, self.response_len, self.targets,
                                self.pixel_values, self.image_grid_thw)),
            self.with_noisy, self.sample_ids, self.tasks, self.examples, self.skipped, move(self.occupancy),
            move(self.chain_start),
        )


def _right_pad(rows: Sequence[torch.Tensor], value: int, dtype=torch.long) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def collate(items: Sequence[Union[Example, BadSample]], pad_id: int, with_noisy: bool = True) -> Optional[TrainBatch]:
    """Examples -> TrainBatch (CPU). BadSamples are dropped and listed in `skipped`; None if none is left."""
    good = [x for x in items if isinstance(x, Example)]
    bad = [x for x in items if isinstance(x, BadSample)]
    if not good:
        return TrainBatch(*(None,) * 10, with_noisy, skipped=bad) if bad else None
    copies = 2 if with_noisy else 1
    seqs = [torch.cat([x.prompt_ids] + [x.response_ids] * copies) for x in good]
    mms = [torch.cat([x.mm_token_type_ids.long(), torch.zeros(copies * len(x.response_ids), dtype=torch.long)]) for x in good]
    prefix = [x.prompt_ids for x in good]
    pix = [x.pixel_values for x in good if x.pixel_values is not None]
    grids = [x.image_grid_thw for x in good if x.image_grid_thw is not None]
    return TrainBatch(
        input_ids=_right_pad(seqs, pad_id),
        mm_token_type_ids=_right_pad(mms, 0, torch.int32),
        prefix_ids=_right_pad(prefix, pad_id),
        prefix_mm=_right_pad([x.mm_token_type_ids for x in good], 0, torch.int32),
        prefix_mask=_right_pad([torch.ones(len(p), dtype=torch.long) for p in prefix], 0),
        prefix_len=torch.tensor([len(p) for p in prefix]),
        response_len=torch.tensor([len(x.response_ids) for x in good]),
        targets=_right_pad([x.response_ids for x in good], 0),
        pixel_values=torch.cat(pix) if pix else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        with_noisy=with_noisy,
        sample_ids=[x.sample_id for x in good],
        tasks=[x.task for x in good],
        examples=good,
        skipped=bad,
        occupancy=batch_occupancy(good),
        chain_start=chain_starts(good),
    )


def without_noisy(batch: TrainBatch, input_ids: torch.Tensor) -> tuple[TrainBatch, torch.Tensor]:
    """The `[prefix | clean]` view of a `[prefix | clean | noisy]` batch and of its (corrupted) `input_ids`: what a
    B = 1 reader needs (its logits come from the clean copy, which never attends to the noisy one). Each row is
    cut at the longest prefix + response; a shorter row's noisy tokens past its end fall into padding (kind PAD)."""
    if not batch.with_noisy:
        return batch, input_ids
    width = int((batch.prefix_len + batch.response_len).max())
    view = dataclasses.replace(batch, input_ids=batch.input_ids[:, :width],
                               mm_token_type_ids=batch.mm_token_type_ids[:, :width], with_noisy=False)
    return view, input_ids[:, :width]


def chain_starts(examples: Sequence[Example]) -> torch.Tensor:
    """(b, R_max) long: the response index where token k's chain starts: the first character of its
    number in a fixed-style trajectory (`Example.chained`), k itself everywhere else."""
    width = max(len(x.response_ids) for x in examples)
    out = torch.arange(width).repeat(len(examples), 1)
    fixed = torch.tensor(fixed_trajectory_chain_starts(width))
    for i, x in enumerate(examples):
        if x.chained:
            out[i] = fixed
    return out


@dataclass
class Layout:
    """Block ids / kinds per token (b, L); per response token k (b, R_max): the logit position that
    predicts it, the position of its noisy copy, its response block index, and whether it exists."""

    block_ids: torch.Tensor
    kinds: torch.Tensor
    target_pos: torch.Tensor
    noisy_pos: torch.Tensor
    response_block: torch.Tensor
    valid: torch.Tensor
    block_size: int

    def spec(self) -> BlockSpec:
        return BlockSpec(self.block_ids, self.kinds, self.block_ids, self.kinds)


def layout(batch: TrainBatch, block_size: int) -> Layout:
    """Block ids, kinds and shifted target positions of a batch for block size B (on the batch's device)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not batch.with_noisy and block_size != 1:
        raise ValueError(f"a batch without the noisy copy is the B = 1 (AR) layout; got block_size {block_size}")
    device = batch.input_ids.device
    B = block_size
    P, R = batch.prefix_len[:, None], batch.response_len[:, None]
    s = torch.arange(batch.seq_len, device=device)[None]
    in_prefix = s < P
    in_clean = (s >= P) & (s < P + R)
    in_noisy = (s >= P + R) & (s < P + 2 * R) if batch.with_noisy else torch.zeros_like(in_prefix)
    k = torch.where(in_clean, s - P, s - P - R)  # response index of a clean / noisy token
    n_prefix_blocks = (P + B - 1) // B
    block_ids = torch.where(in_prefix, s // B, n_prefix_blocks + torch.div(k, B, rounding_mode="floor"))
    block_ids = torch.where(in_prefix | in_clean | in_noisy, block_ids, torch.full_like(block_ids, -1))
    kinds = torch.full_like(block_ids, PAD)
    kinds = torch.where(in_prefix, torch.full_like(kinds, PREFIX), kinds)
    kinds = torch.where(in_clean, torch.full_like(kinds, CLEAN), kinds)
    kinds = torch.where(in_noisy, torch.full_like(kinds, NOISY), kinds)

    kr = torch.arange(batch.targets.shape[1], device=device)[None]
    first_in_block = kr % B == 0
    from_clean = torch.where(kr == 0, P - 1, P + kr - 1)  # clean copy position k - 1 (or last prompt token)
    from_noisy = P + R + kr - 1  # noisy copy position k - 1
    target_pos = torch.where(first_in_block, from_clean, from_noisy)
    valid = kr < R
    target_pos = torch.where(valid, target_pos, torch.zeros_like(target_pos))
    noisy_pos = torch.where(valid, P + R + kr, torch.zeros_like(target_pos))
    return Layout(block_ids, kinds, target_pos, noisy_pos, kr.expand_as(target_pos) // B, valid, B)


def positions(batch: TrainBatch, model) -> torch.Tensor:
    """M-RoPE positions (3, b, L): the prompt's from the model's rope index; response token k at
    (last prompt position + 1 + k) in both copies; padding at 0."""
    pre, _ = model.model.get_rope_index(batch.prefix_ids, batch.prefix_mm, image_grid_thw=batch.image_grid_thw,
                                        attention_mask=batch.prefix_mask)
    P, R = batch.prefix_len[:, None], batch.response_len[:, None]
    s = torch.arange(batch.seq_len, device=pre.device)[None]
    base = torch.where(batch.prefix_mask.bool()[None], pre, torch.zeros_like(pre)).amax(dim=(0, 2))[:, None] + 1
    k = torch.where(s < P + R, s - P, s - P - R)
    copies = 2 if batch.with_noisy else 1
    response = torch.where(s < P + copies * R, base + k, torch.zeros_like(k))
    idx = s.clamp(max=pre.shape[2] - 1).expand(pre.shape[1], -1)
    prompt = pre.gather(2, idx[None].expand(3, -1, -1))
    return torch.where((s < P)[None], prompt, response[None].expand(3, -1, -1))


@dataclass
class Corruption:
    """input_ids with masked noisy tokens; masked / t: (b, R_max) per response token."""

    input_ids: torch.Tensor
    masked: torch.Tensor
    t: torch.Tensor


def stratified_t(num_blocks: torch.Tensor, max_blocks: int, generator: Optional[torch.Generator],
                 t_min: float, t_max: float) -> torch.Tensor:
    """Noise level per (sample, response block) (b, max_blocks): sample i's J_i blocks take one draw
    from each of J_i equal strata of [0, 1) in random order, mapped onto [t_min, t_max]."""
    b = num_blocks.shape[0]
    device = num_blocks.device
    keys = torch.rand(b, max_blocks, generator=generator, device=device)
    j = torch.arange(max_blocks, device=device)[None]
    keys = torch.where(j < num_blocks[:, None], keys, torch.full_like(keys, 2.0))
    rank = keys.argsort(dim=1).argsort(dim=1)
    u = torch.rand(b, max_blocks, generator=generator, device=device)
    strat = (rank + u) / num_blocks.clamp(min=1)[:, None]
    return t_min + (t_max - t_min) * strat.clamp(0.0, 1.0)


def chain_masks(batch: TrainBatch, lay: Layout, generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """The number-order corruption of every response block: (masked (b, R_max) bool, t (b, R_max)).

    Each chain of two or more tokens inside a block (a number; a chain crossing a block boundary starts
    at the block's first position, its earlier part being clean context) is masked from a random offset
    c in 0 .. length on; single-token chains (separators, EOS, untrained rows) stay visible. t is the
    block's masked share of its tokens (at least 1 / B), the noise level the 1/t weighting of the loss reads."""
    b, R_max = batch.targets.shape
    device = batch.targets.device
    B = lay.block_size
    k = torch.arange(R_max, device=device)[None]
    start = torch.maximum(batch.chain_start, (k // B) * B)
    valid = lay.valid
    length = torch.zeros(b, R_max, device=device).scatter_add_(1, start, valid.float()).gather(1, start)
    u = torch.rand(b, R_max, generator=generator, device=device).gather(1, start)  # one draw per chain
    cut = torch.floor(u * (length + 1))
    masked = ((k - start) >= cut) & valid & (length > 1)
    blocks = -(-R_max // B)
    count = torch.zeros(b, blocks, device=device).scatter_add_(1, lay.response_block, masked.float())
    size = torch.zeros(b, blocks, device=device).scatter_add_(1, lay.response_block, valid.float())
    t = (count / size.clamp(min=1)).clamp(min=1.0 / B).gather(1, lay.response_block)
    return masked, t


def corrupt(batch: TrainBatch, lay: Layout, mask_id: int, generator: Optional[torch.Generator] = None,
            t_min: float = 0.05, t_max: float = 1.0, force_t: Optional[float] = None,
            chain_share: float = 0.0) -> Corruption:
    """Mask the noisy copy: a stratified t per response block, each token masked with probability t.
    `force_t` fixes t everywhere (1.0 masks every response token). With `chain_share` > 0 that share of
    the response blocks of chained samples (fixed-style trajectories) is corrupted by `chain_masks`
    instead. Without a noisy copy (AR) nothing is masked in the input and every response token counts,
    with t = 1."""
    b, R_max = batch.targets.shape
    device = batch.targets.device
    if not batch.with_noisy:
        return Corruption(batch.input_ids, lay.valid.clone(), torch.ones(b, R_max, device=device))
    B = lay.block_size
    max_blocks = max(1, -(-R_max // B))
    if force_t is not None:
        t_block = torch.full((b, max_blocks), float(force_t), device=device)
    else:
        n_blocks = (batch.response_len + B - 1) // B
        t_block = stratified_t(n_blocks, max_blocks, generator, t_min, t_max)
    t = t_block.gather(1, lay.response_block)
    draw = torch.rand(b, R_max, generator=generator, device=device)
    masked = (draw < t) & lay.valid
    if chain_share > 0 and force_t is None and batch.chain_start is not None:
        c_masked, c_t = chain_masks(batch, lay, generator)
        chained = (batch.chain_start != torch.arange(R_max, device=device)[None]).any(dim=1)
        pick = (torch.rand(b, max_blocks, generator=generator, device=device) < chain_share) & chained[:, None]
        pick = pick.gather(1, lay.response_block)
        masked, t = torch.where(pick, c_masked, masked), torch.where(pick, c_t, t)
    ids = batch.input_ids.clone()
    current = ids.gather(1, lay.noisy_pos)
    ids.scatter_(1, lay.noisy_pos, torch.where(masked, torch.full_like(current, mask_id), current))
    return Corruption(ids, masked, t)
