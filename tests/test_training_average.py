"""`wam-diff-train average`: the weighted parameter average of checkpoints of one lineage."""
from __future__ import annotations

import json

import pytest
import torch

from wam_diff_training.average import AVERAGE_FILE, AverageError, average, parse_weights
from wam_diff_training.cli import main
from wam_diff_core.model.checkpoint import load_model, save_model


def _shifted(src, dst, delta: float, **settings):
    """`src` with every parameter + delta (and settings replaced), saved to `dst`."""
    loaded = load_model(src)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(delta)
    if settings:
        from dataclasses import replace
        loaded.settings = replace(loaded.settings, **settings)
    save_model(loaded, dst)
    return dst


def test_weighted_average_is_the_linear_combination_and_is_recorded(nano_ckpt, tmp_path):
    a = _shifted(nano_ckpt, tmp_path / "a", 0.0, frame_size=(256, 128))
    b = _shifted(nano_ckpt, tmp_path / "b", 0.4, frame_size=(256, 128))
    assert main(["average", str(a), str(b), "--out", str(tmp_path / "soup"), "--weights", "3,1"]) == 0
    pa = dict(load_model(a).model.named_parameters())
    got = load_model(tmp_path / "soup")
    for name, p in got.model.named_parameters():
        assert torch.allclose(p, pa[name] + 0.1, atol=1e-6), name  # 0.75 * a + 0.25 * (a + 0.4)
    assert got.settings.frame_size == (256, 128)
    record = json.loads((tmp_path / "soup" / AVERAGE_FILE).read_text())
    assert [s["weight"] for s in record["sources"]] == [0.75, 0.25]
    assert record["sources"][0]["param_digest"] != record["sources"][1]["param_digest"]


def test_average_of_one_model_twice_is_that_model(nano_ckpt, tmp_path):
    out = average([nano_ckpt, nano_ckpt], tmp_path / "same")
    want = dict(load_model(nano_ckpt).model.named_parameters())
    for name, p in load_model(out).model.named_parameters():
        assert torch.equal(p, want[name]), name
    record = json.loads((out / AVERAGE_FILE).read_text())
    assert record["param_digest"] == record["sources"][0]["param_digest"]


def test_frame_size_is_kept_where_the_recorded_ones_agree(nano_ckpt, tmp_path, capsys):
    a = _shifted(nano_ckpt, tmp_path / "a", 0.0, frame_size=(256, 128))
    b = _shifted(nano_ckpt, tmp_path / "b", 0.0, frame_size=(384, 192))
    assert load_model(average([a, b], tmp_path / "soup")).settings.frame_size is None
    assert "different frame sizes" in capsys.readouterr().out
    # a source that records no frame size (trained before checkpoints recorded it) does not veto the others'
    old = _shifted(nano_ckpt, tmp_path / "old", 0.0, frame_size=None)
    assert load_model(average([old, a], tmp_path / "soup2")).settings.frame_size == (256, 128)
    assert "old record no frame size; the average keeps (256, 128)" in capsys.readouterr().out
    assert load_model(average([old, old], tmp_path / "soup3")).settings.frame_size is None


def test_sources_that_do_not_decode_alike_are_refused_by_name(nano_ckpt, tmp_path, capsys):
    b32 = load_model(nano_ckpt)
    b32.settings = b32.settings.for_block_size(32)
    save_model(b32, tmp_path / "b32")
    with pytest.raises(AverageError, match=r"b32: trained_block_size 32 differs from .*'s 1"):
        average([nano_ckpt, tmp_path / "b32"], tmp_path / "x")
    assert not (tmp_path / "x").exists()
    assert main(["average", str(nano_ckpt), str(tmp_path / "b32"), "--out", str(tmp_path / "x")]) == 2
    assert "trained_block_size 32" in capsys.readouterr().err
    with pytest.raises(AverageError, match="at least two"):
        average([nano_ckpt], tmp_path / "x")
    assert main(["average", str(nano_ckpt), str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def test_sources_with_other_shapes_are_refused(nano_ckpt, tmp_path):
    from transformers import Qwen3VLForConditionalGeneration

    loaded = load_model(nano_ckpt)
    cfg = loaded.model.config
    cfg.text_config.intermediate_size = cfg.text_config.intermediate_size // 2
    loaded.model = Qwen3VLForConditionalGeneration._from_config(cfg)
    save_model(loaded, tmp_path / "narrow")
    with pytest.raises(AverageError, match=r"narrow: parameter .*mlp.* has shape"):
        average([nano_ckpt, tmp_path / "narrow"], tmp_path / "x")


@pytest.mark.parametrize("text, n, message", [
    ("0.5,x", 2, "comma-separated numbers"), ("1,1,1", 2, "3 values for 2"), ("1,-1", 2, "non-negative"),
    ("0,0", 2, "positive sum"),
])
def test_bad_weights_name_the_value(text, n, message):
    with pytest.raises(AverageError, match=message):
        parse_weights(text, n)
    assert parse_weights("1,3", 2) == [0.25, 0.75]
    assert parse_weights(None, 4) == [0.25] * 4


def test_average_scales_its_weights_and_refuses_bad_ones(nano_ckpt, tmp_path):
    out = average([nano_ckpt, nano_ckpt], tmp_path / "scaled", weights=[2.0, 6.0])
    assert [s["weight"] for s in json.loads((out / AVERAGE_FILE).read_text())["sources"]] == [0.25, 0.75]
    with pytest.raises(AverageError, match=r"weights \[1.0\]: 1 values for 2"):
        average([nano_ckpt, nano_ckpt], tmp_path / "x", weights=[1.0])
