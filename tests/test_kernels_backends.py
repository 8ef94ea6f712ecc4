"""`wam_diff_kernels` on a machine with no CUDA and no flashinfer: imports, clear errors, and the host-side
planning of the FlashInfer backend checked against the SDPA masks it replaces."""
import sys
from importlib.metadata import entry_points

import pytest
import torch

import wam_diff_kernels
from wam_diff_kernels import flashinfer_attention as fa
from wam_diff_kernels.graph_runner import GraphRunner
from wam_diff_kernels.static_cache import StaticKVCache
from wam_diff_core import extensions
from wam_diff_core.attention.block_mask import prompt_layout, visibility
from wam_diff_core.model.runner import ModelRunner

NO_FLASHINFER = bool(wam_diff_kernels.missing_for_flashinfer())


def test_import_kernels_needs_neither_cuda_nor_flashinfer():
    import wam_diff_kernels.graph_runner  # noqa: F401
    import wam_diff_kernels.remask_ops  # noqa: F401
    import wam_diff_kernels.ladder  # noqa: F401

    assert isinstance(wam_diff_kernels.cuda_available(), bool) and isinstance(wam_diff_kernels.flashinfer_installed(), bool)
    if not wam_diff_kernels.flashinfer_installed():
        assert "flashinfer" not in sys.modules  # probes look, they do not import
    from transformers import AttentionInterface

    assert fa.REGISTERED_NAME in AttentionInterface._global_mapping


def test_kernels_plug_into_the_core_through_the_entry_point():
    points = {p.name: p.value for p in entry_points(group=extensions.ENTRY_POINT_GROUP)}
    assert points.get("kernels") == "wam_diff_kernels.plugin:register", "entry point missing: reinstall with pip install -e ."
    registry = extensions.Registry()  # reads the entry points on its first lookup
    assert registry.names("attention backend") == ("flashinfer",)
    assert registry.names("text layers") == ("compiled", "fast") and registry.names("decoder") == ("static",)
    assert registry.get("attention backend", "flashinfer").missing() == wam_diff_kernels.missing_for_flashinfer()


@pytest.mark.skipif(not NO_FLASHINFER, reason="CUDA and flashinfer are both present: nothing is missing")
def test_flashinfer_backend_raises_naming_what_is_missing(nano):
    with pytest.raises(RuntimeError, match="flashinfer attention backend needs") as err:
        wam_diff_kernels.require_flashinfer()
    for missing in wam_diff_kernels.missing_for_flashinfer():
        assert missing.split(" ")[0] in str(err.value)
    with pytest.raises(RuntimeError, match="needs"):
        GraphRunner(ModelRunner(nano.model, "sdpa"), nano.settings.mask_token_id, attention="flashinfer")
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="needs"):
        fa.flashinfer_attention(None, q, q, q, None)


def test_unknown_static_attention_and_prefill_mode_are_rejected(nano, monkeypatch):
    with pytest.raises(ValueError, match="unknown attention 'flex'"):
        GraphRunner(ModelRunner(nano.model, "sdpa"), nano.settings.mask_token_id, attention="flex")
    monkeypatch.setenv("WAM_FLASHINFER_PREFILL", "dense")
    with pytest.raises(ValueError, match="block_sparse"):
        fa.prefill_mode()


@pytest.mark.parametrize("n_real,block", [(10, 4), (12, 4), (7, 32), (5, 1)])
def test_block_sparse_prefill_pattern_equals_the_block_causal_mask(n_real, block):
    indptr, indices = fa.block_causal_bsr(n_real, block)
    dense = torch.zeros(n_real, n_real, dtype=torch.bool)
    for row in range(len(indptr) - 1):
        for col in indices[indptr[row]:indptr[row + 1]].tolist():
            dense[row * block:(row + 1) * block, col * block:(col + 1) * block] = True
    blocks, kinds = prompt_layout(torch.ones(1, n_real, dtype=torch.bool), block)
    assert torch.equal(dense, visibility(blocks, kinds, blocks, kinds)[0])


def test_flashinfer_step_lengths_equal_the_static_sdpa_masks_key_limits():
    B = 4
    cache = StaticKVCache(num_layers=1, batch=2, kv_heads=1, head_dim=2, max_len=32, dtype=torch.float32, device="cpu")
    cache.lens.copy_(torch.tensor([5, 3]))
    fused_lens, plain_lens = fa.step_kv_lens([5, 3], B, fused=True)
    fused = cache.begin(torch.cat([torch.full((B,), B), torch.full((B,), 2 * B)])).dense()[:, 0].sum(-1)
    # requests per sample: [finished block, new block], each of B queries
    assert fused_lens == [9, 13, 7, 11]
    assert fused.tolist() == [[a] * B + [c] * B for a, c in zip(fused_lens[0::2], fused_lens[1::2])]
    cache.commit(B)
    plain = cache.begin(torch.full((B,), B)).dense()[:, 0].sum(-1)
    assert plain.tolist() == [[n] * B for n in plain_lens]
    assert fa.step_kv_lens([5, 3], B, fused=False) == (None, [9, 7])


def test_ladder_on_cpu_runs_the_eager_rungs_and_skips_the_gpu_ones_with_a_reason(nano, tmp_path):
    from wam_diff_kernels import ladder

    args = ladder.parser().parse_args([
        "--model", "nano", "--device", "cpu", "--dtype", "float32", "--block-size", "4", "--steps", "2",
        "--batch-sizes", "1", "--new-tokens", "8", "--repeats", "1", "--diversify", "0",
        "--rungs", "ar,sdpa_eager,static_sdpa,flashinfer_graphs", "--out", str(tmp_path / "ladder.json"),
    ])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = ladder.Ladder(args, loaded=nano).run()
    finally:
        torch.set_num_threads(threads)
    rows = {r["rung"]: r for r in result["rows"]}
    assert set(rows) == {"ar", "sdpa_eager", "static_sdpa", "flashinfer_graphs"}
    assert rows["static_sdpa"]["tokens_match_sdpa_eager"] is True
    assert rows["static_sdpa"]["forwards_per_token"] == rows["sdpa_eager"]["forwards_per_token"] == 2 * 2 / 8
    assert rows["ar"]["forwards_per_token"] == 7 / 8  # no forward after the last token
    # launches of one eager step of the static rung (CPU: top-level ATen operations): at least one per
    # operation of each of nano's 4 layers' ~60, and none counted for the reference decoder
    assert rows["static_sdpa"]["launches_per_step"] >= 4 * 55 and "launches_per_step" not in rows["sdpa_eager"]
    if NO_FLASHINFER:
        assert rows["flashinfer_graphs"]["error"].startswith("skipped:")
    assert all("token_ids" not in r for r in result["rows"])
