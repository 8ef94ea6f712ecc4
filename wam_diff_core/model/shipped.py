"""The shipped model's name: SHIPPED_MODEL ("nano-s-b32") stands for the repository's models/nano-s-b32 wherever a
model is asked for (the checkpoint loader, the closed loops' look at a checkpoint's wam_diff.json). No torch import."""
from __future__ import annotations

import sys
from pathlib import Path

from ..constants import SHIPPED_MODEL

SHIPPED_MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / SHIPPED_MODEL


def resolve_model(model: str) -> str:
    """What `model` names for a loader: SHIPPED_MODEL is the repository's models/nano-s-b32, or the untrained
    `nano` preset (with a one-line warning on stderr) where that directory is absent; a directory of that name
    here, and every other name, stay as they are."""
    if model != SHIPPED_MODEL or Path(model).is_dir():
        return model
    if SHIPPED_MODEL_DIR.is_dir():
        return str(SHIPPED_MODEL_DIR)
    print(f"warning: the shipped model {SHIPPED_MODEL} is not at {SHIPPED_MODEL_DIR}; using the untrained 'nano' "
          f"preset", file=sys.stderr)
    return "nano"
