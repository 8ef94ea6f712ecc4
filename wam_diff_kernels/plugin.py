"""This package's pieces in the core's extension registry (`wam_diff_core.extensions`).

Declared in setup.py as the entry point `kernels = wam_diff_kernels.plugin:register` of the group
`wam_diff_core.extensions`, so the core finds it without naming it. Registers:
- the attention backend "flashinfer" (`flashinfer_attention.use_flashinfer`; GPU only), with
  `missing_for_flashinfer` as its probe;
- the text layers "fast" and "compiled" (`fast_layers.FastTextLayers`, plain or with its pure parts
  torch.compiled);
- the decoder "static" (`graph_runner.generate_static`: the capture-ready block decoder, CUDA graphs on
  a GPU, eager on a CPU).
Registering imports nothing heavy: each piece imports its module on first use.
"""
from __future__ import annotations

from .availability import missing_for_flashinfer


def install_flashinfer(model) -> None:
    from .flashinfer_attention import use_flashinfer

    use_flashinfer(model)


def fast_layers(model):
    from .fast_layers import FastTextLayers

    return FastTextLayers(model, compile_layers=False)


def compiled_layers(model):
    from .fast_layers import FastTextLayers

    return FastTextLayers(model, compile_layers=True)


def generate_static(runner, batch, cfg, mask_id: int, eos_id: int, constraint=None):
    from .graph_runner import generate_static as generate

    return generate(runner, batch, cfg, mask_id, eos_id, constraint)


def register(registry) -> None:
    """Add this package's pieces to `registry` (a `wam_diff_core.extensions.Registry`)."""
    registry.add_attention_backend("flashinfer", install_flashinfer, missing_for_flashinfer)
    registry.add_text_layers("fast", fast_layers)
    registry.add_text_layers("compiled", compiled_layers)
    registry.add_decoder("static", generate_static)
