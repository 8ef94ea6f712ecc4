"""Planning frames a benchmark plans from, each with the expert's trajectory to score the plan against.

From a dataset split (`wam-diff data`'s val.json, or any split in its format), or, where none is given, the
planning validation split the shipped models are evaluated on, rendered on the spot with the expert (the samples
`wam-diff data` writes for it: same routes, seeds, frames and order), cached in a folder so a second run reads
them back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from ..codec import ParseError, parse_trajectory
from ..errors import WamDiffError
from ..prompts import parse_planning_ego, parse_route_target
from ..types import EgoState


class FramesError(WamDiffError, ValueError):
    """A split that is missing, unreadable or holds no usable planning sample."""


@dataclass(frozen=True)
class Frame:
    """One planning sample: image (H, W, 3) uint8 RGB, ego state, command, route target (x, y) m or None,
    the route's scenario type, and the expert's trajectory (NUM_WAYPOINTS, 2) m in the ego frame."""

    id: str
    image: np.ndarray
    ego: EgoState
    command: str
    target: Optional[tuple[float, float]]
    scenario: Optional[str]
    truth: np.ndarray


def spaced(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n) (all of them when k >= n), first and last included."""
    if k >= n:
        return list(range(n))
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, k)})


def _frame(sample: dict, root: Path) -> Frame | None:
    """The Frame of one planning sample of a split, None when it lacks a prompt state or a parsable answer."""
    from PIL import Image

    prompt, answer = sample["conversations"][0]["value"], sample["conversations"][1]["value"]
    ego, truth = parse_planning_ego(prompt), parse_trajectory(answer)
    meta = sample.get("meta") or {}
    if ego is None or isinstance(truth, ParseError) or len(sample.get("image") or []) != 1:
        return None
    with Image.open(root / sample["image"][0]) as img:
        image = np.asarray(img.convert("RGB"))
    return Frame(sample["id"], image, ego, str(meta.get("command", "follow lane")), parse_route_target(prompt),
                 meta.get("scenario"), truth)


def split_frames(path: str | Path, limit: int) -> list[Frame]:
    """`limit` evenly spaced planning frames of a split file (image paths relative to its folder)."""
    path = Path(path)
    if not path.is_file():
        raise FramesError(f"--data {path}: no such file; expected a split written by `wam-diff data` (val.json)")
    try:
        samples = [s for s in json.loads(path.read_text()) if s.get("task") == "planning"]
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        raise FramesError(f"--data {path}: not a split (a JSON list of samples): {exc}") from None
    frames = [f for f in (_frame(samples[i], path.parent) for i in spaced(len(samples), limit)) if f is not None]
    if not frames:
        raise FramesError(f"--data {path}: no usable planning sample (of {len(samples)})")
    return frames


# The planning validation split the shipped models are evaluated on (wam_diff_training/recipes/nano_s.yaml,
# step data_plan: `wam-diff data --tasks planning --every 3 --seed-offsets 0,1000,2000 --wait-keep-s 3`)
EVERY = 3
SEED_OFFSETS = (0, 1000, 2000)
WAIT_KEEP_S = 3.0


def rendered_frames(cache: str | Path, frame_size: tuple[int, int], limit: int) -> list[Frame]:
    """`limit` evenly spaced planning frames of the validation split `wam-diff data` writes with the shipped
    models' settings (EVERY, SEED_OFFSETS, WAIT_KEEP_S): the suite's held-out routes, each once per seed offset,
    driven by the expert and rendered at `frame_size` (W, H) into `cache` where not there yet; samples in the
    order of that split's val.json."""
    from ..sim.datagen import VAL_FRACTION, assign_splits, generate_route, pending_routes
    from ..sim.routes import load_routes, with_seed_offsets

    cache = Path(cache)
    routes = load_routes()
    splits = assign_splits(routes, VAL_FRACTION)
    copies, base = with_seed_offsets(routes, list(SEED_OFFSETS))
    held_out = [r for r in copies if splits[base[r.route_id]] == "val"]
    todo = pending_routes(cache, held_out)
    for route in tqdm(todo, desc="render frames", unit="route", disable=not todo):
        generate_route(route, cache, every=EVERY, frame_size=frame_size, split="val", tasks=("planning",),
                       wait_keep_s=WAIT_KEEP_S)
    samples = []
    for route in held_out:
        samples += json.loads((cache / "parts" / f"{route.route_id}.json").read_text())["samples"]
    return [f for f in (_frame(samples[i], cache) for i in spaced(len(samples), limit)) if f is not None]


def planning_frames(data: Optional[str], cache: str | Path, frame_size: tuple[int, int], limit: int) -> list[Frame]:
    """The split `data` when given, else the rendered validation split (`rendered_frames`)."""
    if data:
        return split_frames(data, limit)
    return rendered_frames(Path(cache) / f"val_{frame_size[0]}x{frame_size[1]}", frame_size, limit)


def route_target_for(frame: Frame, route_target: bool, only_on: Optional[tuple[str, ...]]) -> Optional[tuple[float, float]]:
    """The target a checkpoint is asked with, as it was trained: none when it never learned one
    (`route_target` False), only on the scenario types it learned them on (`only_on`) when it has those."""
    if not route_target or frame.target is None:
        return None
    return frame.target if only_on is None or frame.scenario in only_on else None
