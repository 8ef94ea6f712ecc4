"""`wam-diff-train export SRC DST --dtype bfloat16`: a checkpoint rewritten in a compact dtype for
shipping (half the bytes of float32), processor and `wam_diff.json` unchanged. Loading upcasts to the
dtype asked for (float32 on CPU by default), so the shipped weights are the evaluated ones.
`--steps K` also sets the checkpoint's default denoising steps per block (the operating point it was
evaluated at); `--schedule cosine` its commit schedule (`remasking.masked_after`); `--forward-only on` its
kinematic envelope's forward-only bound (`envelope.forward_bounds`); `--route-target off` makes its policies plan without route target points (a checkpoint
trained with them, shipped to a stack that has no route, or asked as it was before); everything else
in `wam_diff.json` is kept."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from wam_diff_core.model.checkpoint import load_model, save_model
from wam_diff_core.decoding.remasking import check_schedule

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export(src: str | Path, dst: str | Path, dtype: str = "bfloat16", steps: Optional[int] = None,
           route_target: Optional[bool] = None, schedule: Optional[str] = None,
           forward_only: Optional[bool] = None, name: Optional[str] = None, version: Optional[str] = None) -> Path:
    """Copy a checkpoint in `dtype`; the other arguments, when given, replace what its wam_diff.json says
    (decoding defaults, route targets, the model's name and version)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps {steps}: expected a number of denoising steps >= 1")
    if schedule is not None:
        check_schedule(schedule)
    loaded = load_model(src)
    s = loaded.settings
    if steps is not None and s.trained_block_size == 1 and steps != 1:
        raise ValueError(f"steps {steps}: {src} decodes autoregressively (block size 1), one step per token")
    decoding = {k: v for k, v in (("steps", steps), ("schedule", schedule), ("forward_only", forward_only))
                if v is not None}
    top = {k: v for k, v in (("route_target", route_target), ("name", name), ("version", version)) if v is not None}
    loaded.settings = replace(s, decoding=replace(s.decoding, **decoding), **top)
    loaded.model.to(DTYPES[dtype])
    loaded.model.config.dtype = DTYPES[dtype]
    return save_model(loaded, dst)
