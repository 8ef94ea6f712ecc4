"""What this machine has for the GPU fast paths: probes that look (importlib.util.find_spec,
torch.cuda.is_available) and never import flashinfer."""

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

