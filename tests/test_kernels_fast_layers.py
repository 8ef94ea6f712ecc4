"""The fast text layers (merged projections, fewer operations per layer) against the model's own layers,
on the CPU: same numbers within float32 rounding, the same decoded tokens, fewer ATen operations."""
import copy
import shutil
from dataclasses import replace

import pytest
import torch

from wam_diff_kernels.fast_layers import FastTextLayers, rms_norm
from wam_diff_kernels.graph_runner import GraphRunner, forward_static
from wam_diff_kernels.ladder import launch_count
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module


@pytest.fixture(scope="module")
def padded(two_prompts, encode_prompts):
    return encode_prompts(two_prompts)


def _cfg(B, K, **kw):
    return DecoderConfig(**{"block_size": B, "steps": K, "strategy": "low_confidence_static",
                            "max_new_tokens": 2 * B + 4, "ignore_eos": True, **kw})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_models_rmsnorm(nano, dtype):
    norm = copy.deepcopy(nano.model.model.language_model.layers[0].input_layernorm).to(dtype)
    x = torch.randn(2, 5, norm.weight.shape[0], generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.allclose(rms_norm(x, norm.weight, norm.variance_epsilon).float(), norm(x).float(), rtol=1e-5,
                          atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_one_static_forward_matches_the_models_layers(nano, nano_runner, padded):
    """Hidden states of one block step through both layer stacks, from the same static cache state."""
    cfg = _cfg(32, 4)
    static = GraphRunner(nano_runner, nano.settings.mask_token_id)
    static.generate(padded, cfg, nano.settings.eos_token_id)
    st = next(iter(static.buckets.values())).state
    rope = nano_runner.rope(st.pos)
    with torch.inference_mode():
        want = forward_static(nano_runner, st.x, rope, st.cache, st.cache.begin(st.plain_limits))
        got = FastTextLayers(nano.model).forward(st.x, rope, st.cache, st.cache.begin(st.plain_limits))
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("B,K", [(4, 4), (32, 8)])
def test_fast_layers_decode_the_reference_tokens(nano, nano_runner, padded, B, K):
    ids = nano.settings
    ref = generate(nano_runner, padded, _cfg(B, K), ids.mask_token_id, ids.eos_token_id)
    fast = GraphRunner(nano_runner, ids.mask_token_id, fast_layers=True)
    assert fast.layers is not None and not fast.layers.compiled
    assert fast.generate(padded, _cfg(B, K), ids.eos_token_id).token_ids == ref.token_ids


def test_fast_layers_run_about_half_the_operations_per_layer(nano, nano_runner, padded):
    """The point of the fast layers: a captured GPU step pays a few microseconds per kernel (H200).
    Counted here as top-level ATen operations per forward (nano: 4 layers): 244 -> 132 when measured."""
    static = GraphRunner(nano_runner, nano.settings.mask_token_id)
    static.generate(padded, _cfg(32, 4), nano.settings.eos_token_id)
    st = next(iter(static.buckets.values())).state
    rope = nano_runner.rope(st.pos)
    fast = FastTextLayers(nano.model)
    model_ops = launch_count(lambda: forward_static(nano_runner, st.x, rope, st.cache, st.cache.begin(st.plain_limits)), CPU)
    fast_ops = launch_count(lambda: fast.forward(st.x, rope, st.cache, st.cache.begin(st.plain_limits)), CPU)
    layers = len(fast.layers)
    assert (model_ops - 2) / layers >= 55 and (fast_ops - 2) / layers <= 35, (model_ops, fast_ops)


def test_fast_layers_refuse_a_model_they_do_not_implement(nano):
    model = copy.deepcopy(nano.model)
    model.config.text_config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act is 'gelu'"):
        FastTextLayers(model)
    model = copy.deepcopy(nano.model)
    model.model.language_model.layers[1].post_attention_layernorm.variance_epsilon = 1e-3
    with pytest.raises(ValueError, match="one RMSNorm epsilon"):
        FastTextLayers(model)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("cc") is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_fast_layers_decode_the_reference_tokens(nano, nano_runner, padded):
    """torch.compile of the two pure parts of a layer (one compiled graph serves every layer)."""
    ids = nano.settings
    cfg = DecoderConfig(block_size=8, steps=2, strategy="low_confidence_static", max_new_tokens=8, ignore_eos=True)
    ref = generate(nano_runner, padded, cfg, ids.mask_token_id, ids.eos_token_id)
    compiled = GraphRunner(nano_runner, ids.mask_token_id, compile_layers=True)
    assert compiled.layers.compiled
    assert compiled.generate(padded, cfg, ids.eos_token_id).token_ids == ref.token_ids


def test_decoder_config_text_layers_pick_the_layers_of_either_path(nano, nano_runner, padded, monkeypatch):
    """`DecoderConfig(text_layers=...)` (policy, CLI, ROS parameter): the eager decoder (dynamic remasking)
    runs the fast layers for its steps and restores the runner's own after; with CUDA graphs asked for (the
    static path; no graphs on a CPU) the GraphRunner gets them. Same tokens as the model's layers."""
    from wam_diff_kernels import graph_runner
    from wam_diff_kernels.fast_layers import FastTextLayers

    monkeypatch.setattr(graph_runner, "_RUNNERS", {})
    ids = nano.settings
    dyn = DecoderConfig(block_size=8, steps=4, max_new_tokens=20)
    ref = generate(nano_runner, padded, dyn, ids.mask_token_id, ids.eos_token_id)
    calls = []
    monkeypatch.setattr(FastTextLayers, "forward", lambda self, *a, _f=FastTextLayers.forward: calls.append(1) or _f(self, *a))
    fast = generate(nano_runner, padded, replace(dyn, text_layers="fast"), ids.mask_token_id, ids.eos_token_id)
    assert fast.token_ids == ref.token_ids and len(calls) == fast.forwards - 1  # every step but the prefill
    assert nano_runner.layers is None and not nano_runner._stacks["fast"].compiled
    static = replace(_cfg(8, 2), text_layers="fast", cuda_graphs=True)
    assert generate(nano_runner, padded, static, ids.mask_token_id, ids.eos_token_id).token_ids == \
        generate(nano_runner, padded, _cfg(8, 2), ids.mask_token_id, ids.eos_token_id).token_ids
    (runner,) = graph_runner._RUNNERS.values()
    assert runner.layers is not None and not runner.layers.compiled
    with pytest.raises(ValueError, match="text_layers 'fused' not in \\('model', 'fast', 'compiled'\\)"):
        DecoderConfig(text_layers="fused")
    with pytest.raises(ValueError, match="text layers 'fused' not in"):
        with nano_runner.text_layers("fused"):
            pass
