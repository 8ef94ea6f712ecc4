"""`wam-diff-train export SRC DST --dtype bfloat16`: a checkpoint rewritten in a compact dtype for
shipping (half the bytes of float32), processor and `wam_diff.json` unchanged. Loading upcasts to the
dtype asked for (float32 on CPU by default), so the shipped weights are the evaluated ones."""
from __future__ import annotations

from pathlib import Path

import torch

from wam_diff_core.model.checkpoint import load_model, save_model

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export(src: str | Path, dst: str | Path, dtype: str = "bfloat16") -> Path:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    loaded = load_model(src)
    loaded.model.to(DTYPES[dtype])
    loaded.model.config.dtype = DTYPES[dtype]
    return save_model(loaded, dst)
