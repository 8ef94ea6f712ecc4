"""Weight dtypes: the names a user gives (`DTYPES`) and the dtype a checkpoint's weights are stored in.

Unset (None) means the checkpoint's own on an accelerator and float32 on a CPU: a CPU has the memory, and its
bf16 / fp16 matmuls are slow. A checkpoint states its own in config.json ("dtype"; transformers 4.5x before 4.56
wrote "torch_dtype"), else its first floating-point tensor does; a preset (random weights) has float32.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

from ..constants import DTYPES
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
    raise DtypeError(f"dtype {value!r}: expected one of {', '.join(DTYPES)} (unset: the checkpoint's own on a GPU, "
                     f"float32 on a CPU)")


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


def resolve_dtype(requested, device: str | torch.device, stored: Optional[torch.dtype] = None) -> torch.dtype:
    """The dtype weights load in: `requested` (a DTYPES name or torch dtype) when set, else float32 on a CPU and
    `stored` (the checkpoint's own; float32 when unknown) on any other device."""
    dtype = parse_dtype(requested)
    if dtype is not None:
        return dtype
    if torch.device(device).type == "cpu":
        return torch.float32
    return stored or torch.float32


__all__ = ["DTYPES", "DtypeError", "dtype_name", "parse_dtype", "resolve_dtype", "stored_dtype"]
