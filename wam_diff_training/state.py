"""Resumable training checkpoints: the model as a Hugging Face directory plus the trainer state.

Layout of a resume point `<stage>/resume/`: `model/` (safetensors, processor, wam_diff.json) and
`trainer_state.pt` (optimizer, scheduler, step, RNG states: tensors and plain values only, read with
`torch.load(weights_only=True)`, so loading one never runs code). The whole directory is written to a
temporary sibling first and renamed into place, so a crash mid-write leaves the previous point intact.
"""
from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from wam_diff_core.console import one_line
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.atomic import atomic_directory
from wam_diff_core.model.checkpoint import LoadedModel, save_model

STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"


class ResumeStateError(WamDiffError, ValueError):
    """A resume point whose trainer state is not tensors and plain values."""


def _numpy_state() -> tuple:
    """numpy's global RNG state with its key array as a tensor, so the resume file holds only what
    `torch.load(weights_only=True)` reads (no pickled numpy objects)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)


def _set_numpy_state(state: tuple) -> None:
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": _numpy_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    _set_numpy_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model_as(loaded: LoadedModel, model: torch.nn.Module, block_size: int, path: Path,
                  state_dict: Optional[dict] = None) -> Path:
    """Save `model` (the unwrapped module being trained) with loaded's processor, trained_block_size = B
    and decoding defaults at B (so a policy loading it decodes as it was trained).
    `state_dict`: full weights gathered from a sharded model (FSDP2), written in place of the module's own."""
    settings = loaded.settings.for_block_size(block_size)
    return save_model(LoadedModel(model, loaded.processor, settings, loaded.name), path, state_dict=state_dict)


def save_resume(path: Path, loaded: LoadedModel, model: torch.nn.Module, block_size: int,
                optim_state: dict, scheduler: Any, step: int, extra: Optional[dict] = None,
                model_state: Optional[dict] = None) -> Path:
    """Write a resume point atomically (rank 0; under DDP every rank holds the same state; under FSDP2
    pass the full model and optimizer state dicts gathered beforehand)."""
    with atomic_directory(path) as tmp:
        save_model_as(loaded, model, block_size, tmp / MODEL_DIR, model_state)
        torch.save({
            "step": step,
            "optimizer": optim_state,
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "extra": extra or {},
        }, tmp / STATE_FILE)
    return Path(path)


def load_resume(path: Path) -> dict:
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"resume state not found: {state_file}")
    try:  # tensors and plain Python values only: a resume state never runs code when it is read
        return torch.load(state_file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ResumeStateError(f"resume state {state_file} holds objects other than tensors and plain values; "
                               f"refused ({one_line(exc)[:200]}); start the stage again with --overwrite") from None
