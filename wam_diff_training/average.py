"""`wam-diff-train average A B ... --out DST [--weights 0.5,0.5]`: a weighted average of the parameters of
checkpoints fine-tuned from one another (a "model soup"), written as a new checkpoint.

Averaging is meaningful only between models of one lineage that decode alike, so every source must have
the same parameter names and shapes, the same tokenizer (mask, EOS and pad ids; vocabulary), the same
trained block size and the same trajectory style; anything else raises `AverageError` naming the source
and the difference. The sum runs in float64 and is stored in float32 (`export` makes a compact copy). The
first source gives the processor and `wam_diff.json`, except `frame_size`: the size the sources that record
one agree on (none where they differ).
`average.json` in the output records the sources, their normalised weights and the parameter digests.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.checkpoint import LoadedModel, load_model, save_model

from .trainer import param_digest

AVERAGE_FILE = "average.json"


class AverageError(WamDiffError, ValueError):
    """Sources that cannot be averaged, or bad weights (the message names which and why)."""


def normalised(weights: Optional[Sequence[float]], n: int, text: Optional[str] = None) -> list[float]:
    """n non-negative weights with a positive sum -> scaled to sum 1; None -> uniform. `text`: how the user
    wrote them, for the error."""
    if weights is None:
        return [1.0 / n] * n
    shown = repr(text) if text is not None else list(weights)
    if len(weights) != n:
        raise AverageError(f"weights {shown}: {len(weights)} values for {n} checkpoints")
    if any(not w >= 0 for w in weights) or sum(weights) <= 0:
        raise AverageError(f"weights {shown}: expected non-negative numbers with a positive sum")
    total = sum(weights)
    return [float(w) / total for w in weights]


def parse_weights(text: Optional[str], n: int) -> list[float]:
    """'0.5,0.25,0.25' -> weights normalised to sum 1; None -> uniform."""
    if text is None:
        return normalised(None, n)
    try:
        raw = [float(w) for w in text.split(",")]
    except ValueError as exc:
        raise AverageError(f"weights {text!r}: expected comma-separated numbers") from exc
    return normalised(raw, n, text)


def _identity(loaded: LoadedModel) -> dict:
    """What two averaged checkpoints must share, beside their parameter shapes."""
    s = loaded.settings
    return {"trained_block_size": s.trained_block_size, "trajectory_format": s.trajectory_format,
            "mask_token_id": s.mask_token_id, "eos_token_id": s.eos_token_id, "pad_token_id": loaded.pad_token_id}


def _check_compatible(first: LoadedModel, first_state: dict, other: LoadedModel, other_state: dict, name: str,
                      first_name: str) -> None:
    a, b = _identity(first), _identity(other)
    for key in a:
        if a[key] != b[key]:
            raise AverageError(f"{name}: {key} {b[key]!r} differs from {first_name}'s {a[key]!r}")
    if first.processor.tokenizer.get_vocab() != other.processor.tokenizer.get_vocab():
        raise AverageError(f"{name}: its tokenizer's vocabulary differs from {first_name}'s")
    missing, extra = sorted(set(first_state) - set(other_state)), sorted(set(other_state) - set(first_state))
    if missing or extra:
        raise AverageError(f"{name}: parameters differ from {first_name}'s (missing {missing[:3]}, extra {extra[:3]})")
    for key, p in first_state.items():
        if other_state[key].shape != p.shape:
            raise AverageError(f"{name}: parameter {key} has shape {tuple(other_state[key].shape)}, "
                               f"{first_name}'s {tuple(p.shape)}")


def _frame_size(sizes: list, sources: list[Path]):
    """The planning frame size the sources recorded, when those that record one agree (a source without one,
    trained before checkpoints recorded it, does not veto); else None, with a note."""
    known = sorted({tuple(s) for s in sizes if s is not None})
    if len(known) > 1:
        print(f"note: the sources were trained on different frame sizes {known}; the average records none", flush=True)
        return None
    unrecorded = [str(src) for src, s in zip(sources, sizes) if s is None]
    if known and unrecorded:
        print(f"note: {', '.join(unrecorded)} record no frame size; the average keeps {known[0]} from the others",
              flush=True)
    return known[0] if known else None


def average(sources: Sequence[str | Path], dst: str | Path, weights: Optional[Sequence[float]] = None) -> Path:
    """Write the weighted parameter average of `sources` to `dst` (weights scaled to sum 1; default uniform);
    returns `dst`."""
    sources = [Path(s) for s in sources]
    if len(sources) < 2:
        raise AverageError(f"average needs at least two checkpoints, got {len(sources)}")
    weights = normalised(None if weights is None else list(weights), len(sources))
    first = load_model(sources[0], dtype=torch.float32)
    first_state = first.model.state_dict()
    acc = {k: v.detach().to(torch.float64) * weights[0] for k, v in first_state.items()}
    digests = [param_digest(first_state)]
    frame_sizes = [first.settings.frame_size]
    for src, w in zip(sources[1:], weights[1:]):
        other = load_model(src, dtype=torch.float32)
        other_state = other.model.state_dict()
        _check_compatible(first, first_state, other, other_state, str(src), str(sources[0]))
        for k, v in other_state.items():
            acc[k] += v.detach().to(torch.float64) * w
        digests.append(param_digest(other_state))
        frame_sizes.append(other.settings.frame_size)
        del other, other_state
    with torch.no_grad():
        for k, p in first_state.items():
            p.copy_(acc[k].to(p.dtype))  # state_dict tensors share storage with the module's parameters
    frame_size = _frame_size(frame_sizes, sources)
    first.settings = dataclasses.replace(first.settings, frame_size=frame_size)
    first.model.config.dtype = torch.float32
    record = {"sources": [{"path": str(s), "weight": w, "param_digest": d} for s, w, d in zip(sources, weights, digests)],
              "param_digest": param_digest(first.model.state_dict())}
    return save_model(first, dst, extra_files={AVERAGE_FILE: json.dumps(record, indent=2) + "\n"})
