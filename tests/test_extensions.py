"""The extension registry: plugins registered directly (no entry point) serve the core's requests for
attention backends, text layers and the static decoder; a request nobody registered fails in one line
naming what was asked and what to install; entry points load once and never replace a direct registration."""
from dataclasses import replace

import pytest

from wam_diff_core import extensions
from wam_diff_core.attention.backends import use_backend
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.policy import DrivingPolicy


@pytest.fixture
def registry(monkeypatch):
    """An empty registry that never reads entry points, in place of the process-wide one."""
    fresh = extensions.Registry(discover=False)
    monkeypatch.setattr(extensions, "REGISTRY", fresh)
    return fresh


class ModelOwnLayers:
    """A text layer stack that runs the model's own layers (so the reference tokens) and counts its forwards."""

    def __init__(self, model):
        self.text, self.forwards = model.model.language_model, 0

    def forward(self, tokens, rope, cache, spec):
        self.forwards += 1
        h = self.text.embed_tokens(tokens)
        for layer in self.text.layers:
            h = layer(h, position_embeddings=rope, attention_mask=None, cache=cache, block_spec=spec)
        return self.text.norm(h)


def test_a_plugin_registered_directly_serves_text_layers_to_the_eager_decoder(registry, nano, two_prompts,
                                                                               encode_prompts):
    extensions.register(lambda r: r.add_text_layers("fast", ModelOwnLayers))
    batch, ids = encode_prompts(two_prompts), nano.settings
    cfg = DecoderConfig(block_size=4, steps=2, max_new_tokens=8, ignore_eos=True)
    runner = ModelRunner(nano.model, "sdpa")
    ref = generate(runner, batch, cfg, ids.mask_token_id, ids.eos_token_id)
    fast = generate(runner, batch, replace(cfg, text_layers="fast"), ids.mask_token_id, ids.eos_token_id)
    assert fast.token_ids == ref.token_ids
    stack = runner.layer_stack("fast")
    assert isinstance(stack, ModelOwnLayers) and stack.forwards == fast.forwards - 1  # every step but the prefill
    assert runner.layers is None  # the model's own layers are back after the decode


def test_the_static_decoder_and_attention_backends_come_from_the_registry(registry, nano, two_prompts,
                                                                          encode_prompts):
    calls = []

    def plugin(r):
        r.add_decoder("static", lambda runner, batch, cfg, mask_id, eos_id, constraint: calls.append(cfg) or "static")
        r.add_attention_backend("paged", lambda model: calls.append(model), lambda: ["a GPU"])

    extensions.register(plugin)
    cfg = DecoderConfig(block_size=4, steps=2, max_new_tokens=8, cuda_graphs=True)
    runner = ModelRunner(nano.model, "sdpa")
    assert generate(runner, encode_prompts(two_prompts), cfg, 1, 2) == "static" and calls == [cfg]
    model = object()
    use_backend(model, "paged")
    assert calls[-1] is model
    assert extensions.attention_backend("paged").missing() == ["a GPU"]


def test_the_policy_names_what_a_registered_backend_lacks_on_this_machine(registry, nano):
    extensions.register(lambda r: r.add_attention_backend("flashinfer", lambda model: None,
                                                          lambda: ["CUDA", "the flashinfer package"]))
    with pytest.raises(ValueError, match="^backend 'flashinfer' needs CUDA and the flashinfer package$"):
        DrivingPolicy(nano, DecoderConfig(backend="flashinfer"))


@pytest.mark.parametrize("ask", [lambda: extensions.text_layers("fast"), lambda: extensions.decoder("static"),
                                 lambda: extensions.attention_backend("flashinfer")])
def test_a_request_nobody_registered_fails_in_one_line_naming_it_and_the_install(registry, ask):
    with pytest.raises(extensions.MissingExtension) as err:
        ask()
    message = str(err.value)
    assert "\n" not in message and "not available" in message
    assert any(f"{kind} '{name}'" in message for kind, name in
               [("text layers", "fast"), ("decoder", "static"), ("attention backend", "flashinfer")])
    assert extensions.ENTRY_POINT_GROUP in message and "pip install" in message


def test_an_unknown_attention_backend_is_rejected_by_name(registry, nano):
    registry.add_attention_backend("flashinfer", lambda model: None)
    with pytest.raises(ValueError, match="attention backend 'dense' is not available .*'flashinfer'"):
        ModelRunner(nano.model, "dense")


def test_entry_points_load_once_and_keep_a_direct_registration(monkeypatch):
    loads = []

    class Point:
        name, value = "stand-in", "tests:plugin"

        def load(self):
            loads.append(1)
            return lambda r: (r.add_text_layers("fast", "entry point's"), r.add_text_layers("compiled", "entry point's"))

    monkeypatch.setattr(extensions, "entry_points", lambda group: [Point()] if group == extensions.ENTRY_POINT_GROUP else [])
    registry = extensions.Registry()
    registry.add_text_layers("fast", "direct")
    assert registry.get("text layers", "fast") == "direct" and loads == []  # answered without loading plugins
    assert registry.get("text layers", "compiled") == "entry point's" and loads == [1]
    assert registry.get("text layers", "fast") == "direct"
    assert registry.names("text layers") == ("compiled", "fast") and loads == [1]
    with pytest.raises(extensions.MissingExtension, match="registered by extensions: 'compiled', 'fast'"):
        registry.get("text layers", "fused")
    assert loads == [1]


def test_a_plugin_that_fails_to_load_is_named(monkeypatch):
    class Broken:
        name, value = "broken", "nowhere.plugin:register"

        def load(self):
            raise ImportError("No module named 'nowhere'")

    monkeypatch.setattr(extensions, "entry_points", lambda group: [Broken()])
    with pytest.raises(extensions.MissingExtension,
                       match=r"^extension 'broken' \(nowhere.plugin:register\) failed to load: ImportError"):
        extensions.Registry().get("decoder", "static")
