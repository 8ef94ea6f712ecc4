"""A box head beside its checkpoint: `box_head.json` (its BoxHeadConfig) and `box_head.safetensors` (its weights).

Both files or neither: a checkpoint without them has no head (detections are decoded as text). A corrupt,
mismatched or half-present head is refused with one line naming the file, never half-loaded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file, save_file

from .head import BoxHead, BoxHeadConfig, BoxHeadError, feature_width

BOX_HEAD_CONFIG = "box_head.json"
BOX_HEAD_WEIGHTS = "box_head.safetensors"


def save_box_head(head: BoxHead, directory: str | Path) -> None:
    """Write the head's config and float32 weights into `directory` (a checkpoint directory)."""
    directory = Path(directory)
    state = {k: v.detach().float().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(directory / BOX_HEAD_WEIGHTS))
    (directory / BOX_HEAD_CONFIG).write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")


def load_box_head(directory: str | Path, vision_config=None, device: str | torch.device = "cpu") -> Optional[BoxHead]:
    """The head saved in `directory`, in float32 on `device`, or None when it has none. `vision_config`: the
    model's (Qwen3-VL) vision config, whose feature width is checked against the head's. Raises BoxHeadError
    naming the file for a missing half, a corrupt file or a mismatch."""
    directory = Path(directory)
    cfg_file, weights = directory / BOX_HEAD_CONFIG, directory / BOX_HEAD_WEIGHTS
    if not cfg_file.exists() and not weights.exists():
        return None
    for present, missing in ((cfg_file, weights), (weights, cfg_file)):
        if present.exists() and not missing.is_file():
            raise BoxHeadError(f"{missing}: missing (a box head needs both {BOX_HEAD_CONFIG} and {BOX_HEAD_WEIGHTS})")
    try:
        config = BoxHeadConfig.from_dict(json.loads(cfg_file.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, BoxHeadError) as exc:
        raise BoxHeadError(f"{cfg_file}: not a valid box head config ({exc})") from None
    in_channels = None if vision_config is None else feature_width(vision_config, config.features)
    if in_channels is not None and config.in_channels != in_channels:
        raise BoxHeadError(f"{cfg_file}: in_channels {config.in_channels} does not fit this model's vision features "
                           f"{list(config.features)} ({in_channels} wide)")
    head = BoxHead(config)
    try:
        state = load_file(str(weights))
        head.load_state_dict(state, strict=True)
    except Exception as exc:  # safetensors and torch raise several types for a corrupt or mismatched file
        raise BoxHeadError(f"{weights}: cannot load box head weights ({str(exc).splitlines()[0][:160]})") from None
    if not all(torch.isfinite(t).all() for t in head.state_dict().values()):
        raise BoxHeadError(f"{weights}: weights hold NaN or infinite values")
    return head.to(device).eval()
