"""Weight dtypes: the names a user gives (`DTYPES`) and the dtype a checkpoint's weights are stored in.

Unset (None) means the checkpoint's own on an accelerator and float32 on a CPU: a CPU has the memory, and its
bf16 / fp16 matmuls are slow unless it multiplies bf16 natively. "auto" (`auto_dtype`, applied by
`DrivingPolicy.load`, which knows the block size) takes bfloat16 on such a CPU for block decoding: the 32-token
forwards of a B = 32 plan run ~1.5x faster there, while one-token forwards (B = 1) run slower than in float32
(results/bench/cpu_dtype.md); without native bf16 a bf16 plan is up to ~3x slower than a float32 one.
A checkpoint states its own in config.json ("dtype"; transformers 4.5x before 4.56 wrote "torch_dtype"), else its
first floating-point tensor does; a preset (random weights) has float32.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

from ..constants import DTYPE_AUTO, DTYPE_CHOICES, DTYPES
from ..errors import WamDiffError

_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# safetensors' names of the floating types (a header's dtype field)
_SAFETENSORS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class DtypeError(WamDiffError, ValueError):
    """A dtype name that is not one of DTYPES."""


def parse_dtype(value) -> Optional[torch.dtype]:
    """None or "" (unset) -> None; a name of DTYPES or one of their torch dtypes -> the torch dtype."""
    if value is None or value == "":
        return None
    if isinstance(value, torch.dtype) and value in _TORCH.values():
        return value
    if isinstance(value, str) and value in _TORCH:
        return _TORCH[value]
    if value == DTYPE_AUTO:
        raise DtypeError(f"dtype {value!r} is chosen per policy (DrivingPolicy.load); loading weights expects one of "
                         f"{', '.join(DTYPES)}")
    raise DtypeError(f"dtype {value!r}: expected one of {', '.join(DTYPE_CHOICES)} (unset: the checkpoint's own on a "
                     f"GPU, float32 on a CPU)")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def _config_dtype(config: dict) -> Optional[str]:
    for section in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(section, dict) and section.get(key) in _TORCH:
                return section[key]
    return None


def _tensor_dtype(files: list[Path]) -> Optional[str]:
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                name = _SAFETENSORS.get(handle.get_slice(key).get_dtype())
                if name is not None:
                    return name
    return None


def stored_dtype(path: str | Path, weight_files: list[Path]) -> Optional[torch.dtype]:
    """The dtype a checkpoint directory states for its weights: config.json's "dtype" / "torch_dtype" (top level,
    else its text_config), else the first floating-point tensor of `weight_files`; None when neither says."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    name = _config_dtype(config) if isinstance(config, dict) else None
    name = name or _tensor_dtype(weight_files)
    return _TORCH[name] if name else None


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX tiles)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def auto_dtype(device: str | torch.device, block_size: int, loaded: torch.dtype) -> torch.dtype:
    """What "auto" means for a policy decoding blocks of `block_size` whose weights loaded in `loaded` (the
    checkpoint's own on a GPU, float32 on a CPU): on a CPU bfloat16 when block_size > 1 and `native_bf16()`, else
    float32; on any other device `loaded`."""
    if torch.device(device).type != "cpu":
        return loaded
    return torch.bfloat16 if block_size > 1 and native_bf16() else torch.float32


def resolve_dtype(requested, device: str | torch.device, stored: Optional[torch.dtype] = None) -> torch.dtype:
    """The dtype weights load in: `requested` (a DTYPES name or torch dtype) when set, else float32 on a CPU and
    `stored` (the checkpoint's own; float32 when unknown) on any other device."""
    dtype = parse_dtype(requested)
    if dtype is not None:
        return dtype
    if torch.device(device).type == "cpu":
        return torch.float32
    return stored or torch.float32


__all__ = ["DTYPES", "DTYPE_AUTO", "DTYPE_CHOICES", "DtypeError", "auto_dtype", "dtype_name", "native_bf16",
           "parse_dtype", "resolve_dtype", "stored_dtype"]
