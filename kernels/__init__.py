"""GPU fast paths for the block-diffusion decoder (optional; `wam_diff_core` works without them).

- `static_cache`: a KV cache of static shape per bucket whose length lives in a device tensor;
- `remask_ops`: one on-device remasking step (confidence, argmax, threshold commit, at least one);
- `graph_runner`: the capture-ready decode path (fixed K steps, at most one host sync per block),
  captured as one CUDA graph per (batch, B) bucket on CUDA, run eagerly on a CPU;
- `flashinfer_attention`: the FlashInfer attention backend (GPU only, imported lazily);
- `ladder`: the speed ladder (AR -> B = 32 SDPA eager -> + FlashInfer -> + CUDA graphs).
- `teacher_forced`: bf16 variants' steps along a float32 decode (the correctness check of a kernel change).

Importing this package never imports flashinfer or touches CUDA: the probes below only look.
"""
from __future__ import annotations

import importlib.util

import torch


def cuda_available() -> bool:
    return torch.cuda.is_available()


def flashinfer_installed() -> bool:
    """True when the flashinfer package can be imported (it is not imported here)."""
    return importlib.util.find_spec("flashinfer") is not None


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def missing_for_flashinfer() -> list[str]:
    """What the FlashInfer backend lacks on this machine (empty when it can run)."""
    missing = []
    if not cuda_available():
        missing.append("CUDA (torch.cuda.is_available() is False)")
    if not flashinfer_installed():
        missing.append("the flashinfer package (pip install '.[gpu]', i.e. flashinfer-python==0.7.0)")
    return missing


def require_flashinfer():
    """Import and return flashinfer, or raise RuntimeError naming what is missing."""
    missing = missing_for_flashinfer()
    if missing:
        raise RuntimeError("the flashinfer attention backend needs " + " and ".join(missing))
    import flashinfer

    return flashinfer


__all__ = ["cuda_available", "flashinfer_installed", "triton_installed", "missing_for_flashinfer", "require_flashinfer"]
