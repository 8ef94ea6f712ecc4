"""Commit schedules: how many positions each denoising step commits (linear vs MaskGIT's cosine)."""
import json
import math

import pytest
import torch

from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.remasking import (commit_mask, done_after, dynamic_need, masked_after, static_quota,
                                              step_count)
from wam_diff_core.model.settings import WamDiffSettings


def test_masked_fraction_runs_from_one_to_zero():
    assert [masked_after("linear", 4, s) for s in range(4)] == [0.75, 0.5, 0.25, 0.0]
    cos = [masked_after("cosine", 4, s) for s in range(4)]
    assert cos[:3] == pytest.approx([math.cos(math.pi / 8), math.cos(math.pi / 4), math.cos(3 * math.pi / 8)])
    assert cos[3] == 0.0


def test_cosine_static_quotas_start_small_grow_and_sum_to_b():
    assert [static_quota(32, 4, s, "cosine") for s in range(4)] == [3, 7, 10, 12]
    assert [static_quota(32, 4, s) for s in range(4)] == [8, 8, 8, 8]  # linear unchanged
    for B, K in [(32, 4), (32, 8), (32, 32), (8, 3), (4, 16), (1, 4)]:
        quotas = [static_quota(B, K, s, "cosine") for s in range(step_count(B, K))]
        assert sum(quotas) == B and min(quotas) >= 0
        assert done_after(B, K, step_count(B, K) - 1, "cosine") == B


def test_dynamic_need_follows_the_schedule_on_what_is_left():
    left = torch.tensor([32, 20, 1, 0])
    assert dynamic_need(left, 4, 0).tolist() == [8, 5, 1, 0]  # linear: ceil(left / 4)
    assert dynamic_need(left, 4, 0, "cosine").tolist() == [3, 2, 1, 0]  # 32 - floor(32 cos(pi/8)) = 3
    # step 1 keeps cos(pi/4) / cos(pi/8) = 0.765 of what is left: 20 -> floor(15.3) = 15 kept, 5 committed
    assert dynamic_need(left, 4, 1, "cosine").tolist() == [8, 5, 1, 0]
    assert dynamic_need(left, 4, 3, "cosine").tolist() == [32, 20, 1, 0]  # the last step commits the rest


def test_cosine_commits_fewer_in_the_first_step_but_every_confident_position():
    conf = torch.linspace(0.1, 0.8, 32)[None].clone()
    conf[0, 5] = 0.95
    masked = torch.ones(1, 32, dtype=torch.bool)
    lin = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, 4, 0)
    cos = commit_mask(conf, masked, "low_confidence_dynamic", 0.9, 4, 0, schedule="cosine")
    assert int(lin.sum()) == 8 and int(cos.sum()) == 3
    assert bool(cos[0, 5]) and cos[0].nonzero().flatten().tolist() == [5, 30, 31]
    assert bool((cos <= lin).all())  # the cosine step's commits are the most confident of linear's


def test_unknown_schedules_are_named():
    with pytest.raises(ValueError, match="zigzag"):
        masked_after("zigzag", 4, 0)
    with pytest.raises(ValueError, match="zigzag"):
        commit_mask(torch.rand(1, 4), torch.ones(1, 4, dtype=torch.bool), "low_confidence_dynamic", 0.9, 2, 0,
                    schedule="zigzag")
    with pytest.raises(ValueError, match="schedule 'zigzag'"):
        DecoderConfig(schedule="zigzag")


def test_checkpoint_settings_carry_the_schedule(tmp_path):
    settings = WamDiffSettings(mask_token_id=7, eos_token_id=2)
    assert settings.decoding.schedule == "linear"
    settings.save(tmp_path)
    raw = json.loads((tmp_path / "wam_diff.json").read_text())
    raw["decoding"]["schedule"] = "cosine"
    (tmp_path / "wam_diff.json").write_text(json.dumps(raw))
    assert WamDiffSettings.load(tmp_path / "wam_diff.json").decoding.schedule == "cosine"
    raw["decoding"]["schedule"] = "zigzag"
    (tmp_path / "wam_diff.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="decoding.schedule 'zigzag'"):
        WamDiffSettings.load(tmp_path / "wam_diff.json")
    raw["decoding"]["schedule"] = "linear"
    raw["decoding"]["forward_only"] = "yes"
    (tmp_path / "wam_diff.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="decoding.forward_only 'yes': expected true or false"):
        WamDiffSettings.load(tmp_path / "wam_diff.json")


def test_the_policy_decodes_with_the_checkpoints_schedule_unless_told_otherwise():
    from dataclasses import replace

    from wam_diff_core.decoding.config import resolve_decoding

    settings = WamDiffSettings(mask_token_id=7, eos_token_id=2)
    cosine = replace(settings, decoding=replace(settings.decoding, schedule="cosine"))
    assert resolve_decoding(settings.decoding).schedule == "linear"
    assert resolve_decoding(cosine.decoding, schedule=None).schedule == "cosine"
    assert resolve_decoding(cosine.decoding, schedule="linear").schedule == "linear"
