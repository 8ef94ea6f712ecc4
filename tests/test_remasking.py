import math

import pytest
import torch

from wam_diff_core.decoding.remasking import commit_mask, predict, static_quota, step_count


def test_static_quotas_spread_the_block_evenly_and_sum_to_b():
    for B, K in [(32, 4), (32, 8), (32, 32), (8, 3), (4, 16), (1, 4)]:
        quotas = [static_quota(B, K, s) for s in range(step_count(B, K))]
        assert sum(quotas) == B
        assert max(quotas) - min(quotas) <= 1


def test_dynamic_commits_every_confident_position_and_at_least_what_the_schedule_needs():
    conf = torch.tensor([[0.95, 0.2, 0.91, 0.5, 0.3, 0.1, 0.6, 0.4]])
    masked = torch.ones(1, 8, dtype=torch.bool)
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, steps=8, step=0)
    assert commit[0].nonzero().flatten().tolist() == [0, 2]  # two above threshold, one needed
    # with 2 steps left and 8 masked, 4 must go now: the four most confident
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.99, steps=2, step=0)
    assert commit[0].nonzero().flatten().tolist() == [0, 2, 3, 6]


def test_dynamic_commits_at_least_one_even_when_nothing_is_confident():
    conf = torch.tensor([[0.1, 0.3, 0.2, 0.05]])
    masked = torch.tensor([[True, True, False, True]])
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, steps=4, step=0)
    assert commit[0].tolist() == [False, True, False, False]


def test_static_never_commits_unmasked_positions_and_commits_its_quota():
    conf = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.1, 0.2, 0.3, 0.4]])
    masked = torch.tensor([[False, True, True, True], [True, True, True, True]])
    commit = commit_mask(conf, masked, "low_confidence_static", 0.9, steps=2, step=0)
    assert commit.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_sequential_commits_leftmost_masked_positions_first():
    conf = torch.rand(1, 6)
    masked = torch.tensor([[False, True, True, True, True, True]])
    commit = commit_mask(conf, masked, "sequential", 0.9, steps=3, step=1)
    assert commit[0].tolist() == [False, True, True, False, False, False]


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="nope"):
        commit_mask(torch.rand(1, 2), torch.ones(1, 2, dtype=torch.bool), "nope", 0.9, 2, 0)


def test_greedy_prediction_is_the_argmax_with_its_probability():
    logits = torch.tensor([[[0.0, 2.0, 1.0]]])
    pred, conf = predict(logits, 0.0)
    assert pred.item() == 1
    assert conf.item() == pytest.approx(torch.softmax(logits, -1).max().item())


def test_an_excluded_token_is_never_predicted_and_confidences_are_over_the_other_tokens():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [2.0, 9.0, 2.0]]])
    pred, conf = predict(logits, 0.0, exclude=1)
    assert pred[0].tolist() == [2, 0]  # token 0 and 2 tie at position 1: the first wins, as in argmax
    assert conf[0].tolist() == pytest.approx([math.e / (1 + math.e), 0.5])  # softmax over tokens 0 and 2
    assert logits[0, 0, 1] == 5.0  # the caller's logits are untouched
    gen = torch.Generator().manual_seed(0)
    sampled, probs = predict(logits.expand(500, 2, 3), 1.0, gen, exclude=1)
    assert 1 not in sampled.unique().tolist() and set(sampled[:, 0].unique().tolist()) == {0, 2}
    assert probs[:, 1].tolist() == pytest.approx([0.5] * 500)


# number order: chains of positions committed left to right (the digits of a fixed-style number)

def _chains(*runs: int) -> torch.Tensor:
    """(1, sum(runs)) chain starts for consecutive runs of the given lengths."""
    starts, p = [], 0
    for n in runs:
        starts += [p] * n
        p += n
    return torch.tensor([starts])


def test_chained_commit_fills_the_quota_from_each_chains_frontier_only():
    # two chains of 4; the most confident positions sit at the chains' ends
    conf = torch.tensor([[0.30, 0.20, 0.10, 0.80, 0.60, 0.50, 0.40, 0.85]])
    masked = torch.ones(1, 8, dtype=torch.bool)
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, steps=4, step=0, chain_start=_chains(4, 4))
    # need = 2 of 8 in 4 steps: the two frontiers (0 and 4), not positions 3 and 7
    assert commit[0].nonzero().flatten().tolist() == [0, 4]
    masked = masked & ~commit
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, steps=4, step=1, chain_start=_chains(4, 4))
    assert commit[0].nonzero().flatten().tolist() == [1, 5]  # the new frontiers


def test_a_confident_position_commits_only_behind_a_committed_or_confident_prefix():
    conf = torch.tensor([[0.95, 0.99, 0.50, 0.97, 0.20, 0.99, 0.99, 0.99]])
    masked = torch.ones(1, 8, dtype=torch.bool)
    commit = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, steps=4, step=0, chain_start=_chains(4, 4))
    # chain 1: 0 and 1 are confident from its start, 3 waits behind the unsure 2; chain 2: its start (0.20)
    # is unsure, so nothing of it is confident-committed, but the quota (2) takes the best frontier, 4
    assert commit[0].nonzero().flatten().tolist() == [0, 1, 4]


def test_chained_commit_finishes_the_block_on_the_last_step():
    conf = torch.rand(2, 8)
    masked = torch.tensor([[True] * 8, [False, True, True, False, True, True, True, True]])
    for strategy in ("low_confidence_dynamic", "low_confidence_static", "sequential"):
        commit = commit_mask(conf, masked, strategy, 0.9, steps=4, step=3, chain_start=_chains(8).expand(2, 8))
        assert commit.equal(masked)


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static", "sequential"])
def test_one_position_per_chain_is_the_unchained_rule(strategy):
    gen = torch.Generator().manual_seed(0)
    own = torch.arange(16).expand(3, 16)
    for step in range(3):  # the last step: the chained rule commits all that is left (tested above)
        conf = torch.rand(3, 16, generator=gen)
        masked = torch.rand(3, 16, generator=gen) < 0.7
        plain = commit_mask(conf, masked, strategy, 0.8, steps=4, step=step)
        chained = commit_mask(conf, masked, strategy, 0.8, steps=4, step=step, chain_start=own)
        assert chained.equal(plain), (strategy, step)
