"""The capture-ready decode path (static cache, on-device remasking, fixed K) against the reference
decoder on the nano model, on the CPU: same tokens, bounded host syncs."""
import pytest
import torch

from wam_diff_kernels import graph_runner
from wam_diff_kernels.graph_runner import GraphRunner, generate_static
from wam_diff_kernels.static_cache import StaticKVCache
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module


@pytest.fixture(scope="module")
def batches(two_prompts, encode_prompts):
    single, padded = encode_prompts(two_prompts[:1]), encode_prompts(two_prompts)
    assert bool(single.attention_mask.all()) and not bool(padded.attention_mask.all())
    return {"single": single, "padded": padded}


@pytest.fixture(scope="module")
def static(nano_runner, nano):
    return GraphRunner(nano_runner, nano.settings.mask_token_id)


def _cfg(B, K, strategy, **kw):
    return DecoderConfig(**{"block_size": B, "steps": K, "strategy": strategy, "threshold": 0.5,
                            "max_new_tokens": 2 * B + 4, "ignore_eos": True, **kw})


@pytest.mark.parametrize("which", ["single", "padded"])
@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static"])
@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("B", [4, 32])
def test_static_path_is_token_identical_to_the_reference_decoder(nano, nano_runner, static, batches, B, K, strategy, which):
    batch, cfg = batches[which], _cfg(B, K, strategy)
    ref = generate(nano_runner, batch, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    ours = static.generate(batch, cfg, nano.settings.eos_token_id)
    assert ours.token_ids == ref.token_ids
    assert all(len(t) == cfg.max_new_tokens for t in ours.token_ids)
    assert len({tok for row in ours.token_ids for tok in row}) > 4  # not a constant sequence
    assert ours.forwards == 1 + K * cfg.num_blocks  # fixed K steps per block, commits fused
    if strategy == "low_confidence_static":
        assert ours.forwards == ref.forwards


def test_sequential_strategy_and_sampling_match_the_reference(nano, nano_runner, static, batches):
    batch = batches["padded"]
    for cfg in (_cfg(8, 4, "sequential"), _cfg(8, 4, "low_confidence_static", temperature=1.3, seed=7)):
        ref = generate(nano_runner, batch, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
        assert static.generate(batch, cfg, nano.settings.eos_token_id).token_ids == ref.token_ids


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static"])
def test_cosine_schedule_matches_the_reference_and_changes_the_commits(nano, nano_runner, static, batches, strategy):
    batch = batches["padded"]
    cfg = _cfg(8, 4, strategy, schedule="cosine")
    ref = generate(nano_runner, batch, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    assert static.generate(batch, cfg, nano.settings.eos_token_id).token_ids == ref.token_ids
    if strategy == "low_confidence_static":  # random weights: the order of commits changes the tokens
        linear = generate(nano_runner, batch, _cfg(8, 4, strategy), nano.settings.mask_token_id, nano.settings.eos_token_id)
        assert linear.token_ids != ref.token_ids


def test_eos_stops_after_the_block_holding_it_like_the_reference(nano, nano_runner, static, batches):
    batch = batches["single"]
    free = static.generate(batch, _cfg(4, 4, "low_confidence_static", max_new_tokens=24), nano.settings.eos_token_id)
    row = free.token_ids[0]
    # pretend a token of block 2 (positions 8-11) that does not occur earlier is EOS
    first = next(i for i in range(8, 12) if row[i] not in row[:i])
    eos = row[first]
    cfg = _cfg(4, 4, "low_confidence_static", max_new_tokens=24, ignore_eos=False)
    ref = generate(nano_runner, batch, cfg, nano.settings.mask_token_id, eos)
    ours = static.generate(batch, cfg, eos)
    assert ours.token_ids == ref.token_ids == [row[:first]]
    assert ours.finished == [True]
    assert ours.forwards == 1 + 4 * 3  # blocks 0, 1, 2 and no more


class _SyncCounter:
    """Counts tensor -> host conversions (each one a device sync on CUDA)."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def wrapped(t, *a, _name=name, _orig=original, **kw):
                self.calls.append(_name)
                return _orig(t, *a, **kw)

            monkeypatch.setattr(torch.Tensor, name, wrapped)


def test_a_block_makes_no_host_sync_and_a_request_one_per_block(nano, nano_runner, static, batches, monkeypatch):
    batch, B, K = batches["padded"], 4, 4
    cfg = _cfg(B, K, "low_confidence_dynamic", max_new_tokens=5 * B, ignore_eos=False)
    eos = nano.settings.eos_token_id
    static.generate(batch, cfg, eos)  # bucket built outside the count
    counter = _SyncCounter(monkeypatch)
    blocks, starts = [], []
    original_block = graph_runner.run_block

    def counted_block(*a, **kw):
        starts.append(len(counter.calls))
        original_block(*a, **kw)
        blocks.append(len(counter.calls) - starts[-1])

    monkeypatch.setattr(graph_runner, "run_block", counted_block)
    res = static.generate(batch, cfg, eos)
    assert not any(res.finished)  # EOS never produced: every block runs
    assert blocks == [0] * 5  # no conversion at all inside a block's K steps
    # from the first block on: one EOS check per block, then the answer copied out once
    # (the prefill before it reads prompt metadata on the host, once per request)
    assert counter.calls[starts[0]:] == ["__bool__"] * 5 + ["tolist"]


def test_static_cache_writes_at_device_offsets_and_masks_past_each_query_limit():
    cache = StaticKVCache(num_layers=1, batch=2, kv_heads=1, head_dim=2, max_len=8, dtype=torch.float32, device="cpu")
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(1, 2, 1, 3, 2)
    lens = cache.load_prefill(keys, keys.clone(), pads=[0, 2])
    assert lens == [3, 1] and cache.lens.tolist() == [3, 1]
    assert torch.equal(cache.keys[0, 1, 0, :1], keys[0, 1, 0, 2:])  # padding removed, left-aligned
    spec = cache.begin(torch.tensor([1, 2]))
    new = torch.full((2, 1, 2, 2), -1.0)
    k, _ = cache.update(new, new, 0)
    assert k.shape == (2, 1, 8, 2)
    assert torch.equal(cache.keys[0, 0, 0, 3:5], new[0, 0]) and torch.equal(cache.keys[0, 1, 0, 1:3], new[1, 0])
    visible = spec.dense()[:, 0].sum(-1)  # slots seen per (sample, query)
    assert visible.tolist() == [[4, 5], [2, 3]]
    cache.commit(1)
    assert cache.lens.tolist() == [4, 2]


def test_generate_static_drop_in_keeps_one_bucket_per_shape(nano, nano_runner, batches):
    cfg = _cfg(4, 2, "low_confidence_static")
    first = generate_static(nano_runner, batches["single"], cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    again = generate_static(nano_runner, batches["single"], cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    assert first.token_ids == again.token_ids
    gr = graph_runner._RUNNERS[(id(nano_runner), "sdpa", False, nano.settings.mask_token_id, "model")]
    assert len(gr.buckets) == 1
    assert gr.captures == 0  # no graphs on a CPU, even if asked for


def test_block_size_one_is_delegated_to_the_reference_ar_path(nano, nano_runner, static, batches):
    cfg = DecoderConfig(block_size=1, steps=1, max_new_tokens=6, ignore_eos=True, cuda_graphs=True)
    ref = generate(nano_runner, batches["padded"], cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    ours = static.generate(batches["padded"], cfg, nano.settings.eos_token_id)
    assert ours.token_ids == ref.token_ids and ours.forwards == ref.forwards == 6


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "low_confidence_static", "sequential"])
def test_remask_step_traces_as_one_graph_and_commits_what_eager_commits(strategy):
    from wam_diff_kernels.remask_ops import remask_step

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, 50, generator=gen) * 3
    x = torch.full((3, 8), 7)
    masked = torch.rand(3, 8, generator=gen) > 0.3
    step = lambda lg, xx, mm: remask_step(lg, xx, mm, strategy, 0.6, 4, 1)  # noqa: E731
    traced = torch.compile(step, backend="eager", fullgraph=True)  # fullgraph: any graph break raises
    try:
        for got, want in zip(traced(logits, x, masked), step(logits, x, masked)):
            assert torch.equal(got, want)
    finally:
        torch._dynamo.reset()
    new_x, new_masked, probs = step(logits, x, masked)
    assert bool(masked.any(1).all())
    assert (masked & ~new_masked).sum(1).min() >= 1  # at least one commit per row
    assert torch.equal(new_x[~masked], x[~masked])  # committed positions never change
    committed = masked & ~new_masked  # each carries its token's softmax probability, the rest 0
    assert torch.allclose(probs[committed], logits.softmax(-1).gather(-1, new_x[..., None])[..., 0][committed])
    assert bool((probs[~committed] == 0).all()) and float(probs.max()) <= 1.0


def test_a_whole_block_traces_as_one_graph_with_the_same_tokens(nano, nano_runner, static, batches, monkeypatch):
    """fullgraph tracing of K steps (model layers, static cache, fused commit, remasking): no data-dependent
    Python and no host read anywhere in a block, the property CUDA-graph capture needs."""
    cfg = _cfg(4, 2, "low_confidence_dynamic", max_new_tokens=8)
    ref = static.generate(batches["single"], cfg, nano.settings.eos_token_id)
    monkeypatch.setattr(graph_runner, "run_block", torch.compile(graph_runner.run_block, backend="eager", fullgraph=True))
    try:
        traced = static.generate(batches["single"], cfg, nano.settings.eos_token_id)
    finally:
        torch._dynamo.reset()
    assert traced.token_ids == ref.token_ids
