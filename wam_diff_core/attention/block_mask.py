"""Who may attend to whom, derived on the device from per-token block ids and kinds.

Every token carries a block id (non-decreasing along the sequence: prompt blocks first, then
response blocks) and a kind:
- PREFIX: prompt tokens;
- CLEAN: committed response tokens (the clean copy in training; the KV cache while decoding);
- NOISY: the partially masked copy being denoised;
- PAD: left padding of batched prompts.

Visibility (docs/architecture.md, training layout):
- prefix query in block b: prefix keys of blocks <= b;
- clean query in block j: prefix + clean blocks <= j, never a noisy key;
- noisy query in block j: prefix + clean blocks < j + noisy block j;
- pad keys are seen by pad queries only (so no row is empty), pad queries see nothing else.
With one kind per block and block size 1 this is the causal mask.
"""
from __future__ import annotations

import torch

PREFIX, CLEAN, NOISY, PAD = 0, 1, 2, 3


def visibility(q_block: torch.Tensor, q_kind: torch.Tensor, k_block: torch.Tensor, k_kind: torch.Tensor) -> torch.Tensor:
    """Boolean mask (batch, q_len, kv_len), True where the query may attend to the key.

    q_block, q_kind: (batch, q_len) int; k_block, k_kind: (batch, kv_len) int.
    """
    qb, qk = q_block[:, :, None], q_kind[:, :, None]
    kb, kk = k_block[:, None, :], k_kind[:, None, :]
    q_pad, k_pad = qk == PAD, kk == PAD
    earlier = (kb < qb) & (kk != NOISY)
    same = (kb == qb) & ((kk == qk) | (kk == PREFIX))
    return ((earlier | same) & ~q_pad & ~k_pad) | (q_pad & k_pad)


def block_ids_for_length(length: int, block_size: int, device=None) -> torch.Tensor:
    """Block id of each of `length` consecutive tokens, blocks of `block_size` starting at 0."""
    return torch.arange(length, device=device) // block_size


def prompt_layout(attention_mask: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block ids and kinds of left-padded prompts (batch, L): blocks of `block_size` counted from each
    prompt's first real token; pad tokens get kind PAD and block id -1."""
    valid = attention_mask.bool()
    index = valid.long().cumsum(-1) - 1
    blocks = torch.where(valid, index // block_size, torch.full_like(index, -1))
    kinds = torch.where(valid, torch.full_like(index, PREFIX), torch.full_like(index, PAD))
    return blocks, kinds


def training_layout(
    prefix_len: int, response_len: int, block_size: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block ids and kinds of `[prefix | clean response | noisy response]` for one sequence (1-D each).

    Prefix blocks count from the prefix start; response blocks count from the response start and are
    numbered after the last prefix block, so the clean and noisy copies share block ids. A response
    length that `block_size` does not divide ends in a shorter last block.
    """
    n_prefix_blocks = -(-prefix_len // block_size)
    prefix_blocks = block_ids_for_length(prefix_len, block_size, device)
    resp_blocks = block_ids_for_length(response_len, block_size, device) + n_prefix_blocks
    blocks = torch.cat([prefix_blocks, resp_blocks, resp_blocks])
    kinds = torch.cat(
        [
            torch.full((prefix_len,), PREFIX, device=device),
            torch.full((response_len,), CLEAN, device=device),
            torch.full((response_len,), NOISY, device=device),
        ]
    )
    return blocks, kinds
