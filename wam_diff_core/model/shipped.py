"""The shipped model's name: SHIPPED_MODEL ("nano-s-b32") stands for its directory wherever a model is asked for (the
checkpoint loader, the closed loops' look at a checkpoint's wam_diff.json). The directory is the repository's
models/nano-s-b32 in a clone or an editable install, and share/wam_diff_ros/models/nano-s-b32 of an install prefix
(a colcon install space on AMENT_PREFIX_PATH, or this Python's prefix after `pip install .`). No torch import."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..constants import SHIPPED_MODEL
from ..errors import WamDiffError

SHIPPED_MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / SHIPPED_MODEL
INSTALLED_MODELS = Path("share") / "wam_diff_ros" / "models"  # where setup.py's data_files put models/ in a prefix


def shipped_model_candidates() -> list[Path]:
    """Where the shipped model may live, in search order: the source tree, each AMENT_PREFIX_PATH prefix, sys.prefix."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    return [SHIPPED_MODEL_DIR] + [Path(p) / INSTALLED_MODELS / SHIPPED_MODEL for p in prefixes]


def resolve_model(model: str) -> str:
    """What `model` names for a loader: SHIPPED_MODEL is the first of `shipped_model_candidates()` that exists
    (a WamDiffError naming the places looked at when none does); a directory of that name here, and every other
    name, stay as they are."""
    if model != SHIPPED_MODEL or Path(model).is_dir():
        return model
    for candidate in shipped_model_candidates():
        if candidate.is_dir():
            return str(candidate)
    looked = ", ".join(str(p) for p in shipped_model_candidates())
    raise WamDiffError(f"the shipped model {SHIPPED_MODEL!r} was not found (looked in {looked}); pass a checkpoint "
                       f"directory, or 'nano' for the untrained preset")
