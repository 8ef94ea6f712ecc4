"""Diffusion settings stored beside a checkpoint as `wam_diff.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from ..constants import JUNCTION_SCENARIOS, MASK_TOKEN, TRAJECTORY_FORMATS, WAM_DIFF_CONFIG_NAME
from ..decoding.config import DecoderConfig, step_count


def check_frame_size(value: Sequence[int]) -> tuple[int, int]:
    """(W, H) as two positive ints; a ValueError names the value otherwise."""
    try:
        w, h = (int(v) for v in value)
        ok = w > 0 and h > 0 and all(float(v) == int(v) for v in value)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"frame_size {value!r}: expected [width, height] in pixels, two positive integers")
    return w, h


def check_route_target_scenarios(value: Sequence[str]) -> tuple[str, ...]:
    """A non-empty list of junction route types (JUNCTION_SCENARIOS) as a tuple; a ValueError names the value
    otherwise."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value \
            or any(v not in JUNCTION_SCENARIOS for v in value):
        raise ValueError(f"route_target_scenarios {value!r}: expected a non-empty list of {list(JUNCTION_SCENARIOS)}")
    return tuple(value)


@dataclass(frozen=True)
class WamDiffSettings:
    """mask_token_id / eos_token_id: ids in this checkpoint's vocabulary; trained_block_size: the block
    size the weights were trained for (1 = a plain autoregressive model); trajectory_format: the codec
    style its planning answers were trained in ("fixed": decoded under the trajectory grammar);
    frame_size: (W, H) of the embedded world's camera frames it learned to plan from (None: not recorded),
    the size closed-loop tools render for it, since the world draws a fixed 3 px/m and a larger frame
    shows more road, not the same road sharper; route_target: its planning data stated a route target point
    where one was known (prompts.ROUTE_TARGET_TEMPLATE), so its policy states one whenever its caller gives it
    (a checkpoint without it is asked the prompt it learned, target or not)."""

    mask_token_id: int
    eos_token_id: int
    mask_token: str = MASK_TOKEN
    trained_block_size: int = 1
    trajectory_format: str = "official"
    decoding: DecoderConfig = field(default_factory=DecoderConfig)  # written as its CHECKPOINT_KEYS
    frame_size: Optional[tuple[int, int]] = None  # (W, H) px of the camera frames its planning data was rendered at
    route_target: bool = False  # planning prompts state the route target point when the caller has one
    # with route_target: the route types whose planning data stated one (None: every route that had one); the
    # embedded world states targets on these alone for it
    route_target_scenarios: Optional[tuple[str, ...]] = None
    name: Optional[str] = None  # the model's name ("nano-s-b32"); written first, left out when None
    version: Optional[str] = None  # its release ("1.0.0"); written second, left out when None

    def __post_init__(self):
        if self.frame_size is not None:
            object.__setattr__(self, "frame_size", check_frame_size(self.frame_size))
        if self.route_target_scenarios is not None:
            object.__setattr__(self, "route_target_scenarios", check_route_target_scenarios(self.route_target_scenarios))
        for key in ("name", "version"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise ValueError(f"{key} {getattr(self, key)!r}: expected a string")

    @property
    def route_targets_only_on(self) -> Optional[tuple[str, ...]]:
        """The route types it is given route targets on when it learned them on some only; None otherwise."""
        return self.route_target_scenarios if self.route_target else None

    @property
    def prompt_route_targets(self) -> bool | tuple[str, ...]:
        """Which planning prompts of a dataset keep their route target sentence for this checkpoint: all (True),
        none (False), or those of its route_target_scenarios."""
        return (self.route_targets_only_on or True) if self.route_target else False

    def for_block_size(self, block_size: int) -> "WamDiffSettings":
        """These settings for weights trained at `block_size`: the decoding settings follow it (B = 1
        decodes one token per forward; a larger B keeps the stored steps, strategy and threshold)."""
        b = int(block_size)
        steps = step_count(b, self.decoding.steps)
        return replace(self, trained_block_size=b, decoding=replace(self.decoding, block_size=b, steps=steps))

    def to_dict(self) -> dict[str, Any]:
        """The wam_diff.json form: name and version first (when set), then the fields in order, the
        decoding settings as their CHECKPOINT_KEYS."""
        out = {key: getattr(self, key) for key in ("name", "version") if getattr(self, key) is not None}
        for f in fields(self):
            if f.name not in ("name", "version"):
                value = getattr(self, f.name)
                out[f.name] = value.to_checkpoint() if f.name == "decoding" else value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def save(self, directory: str | Path) -> None:
        (Path(directory) / WAM_DIFF_CONFIG_NAME).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "WamDiffSettings":
        """Read a wam_diff.json; a ValueError names the file and the bad key or value."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(raw) - known)
            if unknown:
                raise ValueError(f"unknown keys {unknown}; expected some of {sorted(known)}")
            decoding = DecoderConfig.from_checkpoint(raw.pop("decoding", {}))
            settings = cls(decoding=decoding, **raw)
        except (json.JSONDecodeError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a valid {WAM_DIFF_CONFIG_NAME} ({exc})") from exc
        if settings.trajectory_format not in TRAJECTORY_FORMATS:
            raise ValueError(f"{path}: trajectory_format {settings.trajectory_format!r} not in {TRAJECTORY_FORMATS}")
        if settings.trained_block_size < 1:
            raise ValueError(f"{path}: trained_block_size must be >= 1, got {settings.trained_block_size}")
        return settings
