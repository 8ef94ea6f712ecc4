import torch

from wam_diff_core.attention.backends import BlockSpec, _flex, _sdpa
from wam_diff_core.attention.block_mask import CLEAN, NOISY, PAD, PREFIX, prompt_layout, training_layout, visibility


def _mask(blocks, kinds):
    return visibility(blocks[None], kinds[None], blocks[None], kinds[None])[0].int()


def test_block_size_one_prompt_mask_is_the_causal_mask():
    valid = torch.ones(1, 9, dtype=torch.bool)
    blocks, kinds = prompt_layout(valid, 1)
    assert torch.equal(_mask(blocks[0], kinds[0]), torch.tril(torch.ones(9, 9, dtype=torch.int)))


def test_block_causal_prompt_mask_is_bidirectional_inside_blocks_of_b():
    blocks, kinds = prompt_layout(torch.ones(1, 5, dtype=torch.bool), 2)
    expected = torch.tensor(
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.int
    )
    assert torch.equal(_mask(blocks[0], kinds[0]), expected)


def test_training_layout_visibility_matches_architecture_by_hand_with_uneven_last_block():
    # prefix 2 tokens, response 3 tokens, B = 2: the response ends in a 1-token block.
    blocks, kinds = training_layout(prefix_len=2, response_len=3, block_size=2)
    assert blocks.tolist() == [0, 0, 1, 1, 2, 1, 1, 2]
    assert kinds.tolist() == [PREFIX, PREFIX, CLEAN, CLEAN, CLEAN, NOISY, NOISY, NOISY]
    #            P0 P1 C0 C1 C2 N0 N1 N2
    expected = [[1, 1, 0, 0, 0, 0, 0, 0],  # P0
                [1, 1, 0, 0, 0, 0, 0, 0],  # P1
                [1, 1, 1, 1, 0, 0, 0, 0],  # C0: prefix + clean blocks <= 1
                [1, 1, 1, 1, 0, 0, 0, 0],  # C1
                [1, 1, 1, 1, 1, 0, 0, 0],  # C2: never a noisy key
                [1, 1, 0, 0, 0, 1, 1, 0],  # N0: prefix + clean < 1 (none) + noisy block 1
                [1, 1, 0, 0, 0, 1, 1, 0],  # N1
                [1, 1, 1, 1, 0, 0, 0, 1]]  # N2: prefix + clean block 1 + noisy block 2
    assert _mask(blocks, kinds).tolist() == expected


def test_clean_queries_never_see_noisy_keys_in_a_long_layout():
    blocks, kinds = training_layout(prefix_len=7, response_len=13, block_size=4)
    m = _mask(blocks, kinds).bool()
    clean_q, noisy_k = kinds == CLEAN, kinds == NOISY
    assert not m[clean_q][:, noisy_k].any()
    assert m.sum(dim=1).min() >= 1


def test_left_padding_is_invisible_to_real_tokens_and_pad_rows_are_not_empty():
    valid = torch.tensor([[False, False, True, True, True]])
    blocks, kinds = prompt_layout(valid, 1)
    assert kinds[0].tolist() == [PAD, PAD, PREFIX, PREFIX, PREFIX]
    m = _mask(blocks[0], kinds[0])
    assert m[2:, :2].sum() == 0
    assert m[:2, :2].tolist() == [[1, 1], [1, 1]]
    assert m[4].tolist() == [0, 0, 1, 1, 1]


def test_sdpa_and_flex_backends_agree_on_the_training_layout():
    torch.manual_seed(0)
    blocks, kinds = training_layout(prefix_len=5, response_len=6, block_size=4)
    L = blocks.numel()
    q = torch.randn(1, 4, L, 16)
    k = torch.randn(1, 2, L, 16)
    v = torch.randn(1, 2, L, 16)
    spec = BlockSpec(blocks[None], kinds[None], blocks[None], kinds[None])
    out_sdpa, _ = _sdpa(None, q, k, v, None, scaling=0.25, block_spec=spec)
    out_flex, _ = _flex(None, q, k, v, None, scaling=0.25, block_spec=spec)
    assert out_sdpa.shape == (1, L, 4, 16)
    assert torch.allclose(out_sdpa, out_flex, atol=1e-5)
