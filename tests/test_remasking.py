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
