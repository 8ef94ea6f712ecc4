"""The samples `wam-diff evaluate` asks a model: evenly spread over a split, every QA template alike.

A split file is what `wam-diff data` writes (docs/architecture.md, datasets): a JSON list or JSONL of
`{"id", "task", "image", "conversations", "meta"}`. Splits are ordered by route and a frame's QA samples
follow one another template by template, so the first N samples would come from a few routes and a plain
stride could ask one template only: planning and detection samples are taken evenly spaced over the
split, QA samples evenly spaced within each template (`meta.qa_kind`, else the question), N shared out
among the templates.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .constants import TASKS
from .errors import WamDiffError
from .prompts import parse_planning_ego, sample_to_chat, without_route_target
from .types import EgoState


class EvalDataError(WamDiffError, ValueError):
    """A split file that cannot be evaluated on; the message names the file."""


@dataclass(frozen=True)
class EvalSample:
    """One question: its chat-form prompt (as the checkpoint was trained to read it), the reference answer, the
    image files, the template it asks (QA; the task's name otherwise) and a planning prompt's ego state."""

    sample_id: str
    task: str
    prompt: str
    reference: str
    images: tuple[Path, ...]
    template: str
    ego: Optional[EgoState] = None


def spaced_indices(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n) (all of them when k >= n)."""
    if k >= n:
        return list(range(n))
    return sorted({int(i) for i in np.linspace(0, n - 1, k).round()})


def read_split(path: str | Path) -> list[dict]:
    """The samples of a JSON list or JSONL split file; EvalDataError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"data file not found: {path} (expected a split written by `wam-diff data`, e.g. "
                            f"runs/nano_s/data_all/val.json)")
    text = path.read_text(encoding="utf-8")
    try:
        samples = json.loads(text) if text.lstrip().startswith("[") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise EvalDataError(f"{path}: not a JSON list or JSONL of samples ({exc})") from None
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise EvalDataError(f"{path}: expected a list of sample objects")
    return samples


def template_of(sample: dict) -> str:
    """A QA sample's template: `meta.qa_kind` as `wam-diff data` writes it, else the question's first line."""
    meta = sample.get("meta") if isinstance(sample.get("meta"), dict) else {}
    if meta.get("qa_kind"):
        return str(meta["qa_kind"])
    human = sample["conversations"][0]["value"]
    return next((line for line in human.replace("<image>", "").splitlines() if line.strip()), "").strip()


def pick(samples: Sequence[dict], task: str, limit: int) -> list[dict]:
    """Up to `limit` samples of `task` (module docstring: evenly spaced; QA evenly within each template)."""
    of_task = [s for s in samples if s.get("task") == task]
    if task != "qa":
        return [of_task[i] for i in spaced_indices(len(of_task), limit)]
    groups: dict[str, list[dict]] = {}
    for s in of_task:
        groups.setdefault(template_of(s), []).append(s)
    names = sorted(groups)
    chosen = []
    for i, name in enumerate(names):
        share = limit // len(names) + (1 if i < limit % len(names) else 0)
        chosen += [groups[name][j] for j in spaced_indices(len(groups[name]), share)]
    return chosen


def keeps_route_target(route_targets: bool | tuple[str, ...], sample: dict) -> bool:
    """Whether a checkpoint that learned route targets on `route_targets` (WamDiffSettings.prompt_route_targets)
    reads this sample's planning prompt with its route target sentence."""
    if isinstance(route_targets, bool):
        return route_targets
    meta = sample.get("meta") if isinstance(sample.get("meta"), dict) else {}
    return meta.get("scenario") in route_targets


def load_task(path: str | Path, task: str, limit: int, route_targets: bool | tuple[str, ...] = True) -> list[EvalSample]:
    """`limit` samples of `task` from a split (`pick`), as EvalSamples; EvalDataError when it has none or a
    sample is malformed."""
    if task not in TASKS:
        raise EvalDataError(f"task {task!r}: expected one of {TASKS}")
    path = Path(path)
    out = []
    for s in pick(read_split(path), task, limit):
        try:
            prompt, reference = sample_to_chat(s)
        except ValueError as exc:
            raise EvalDataError(f"{path}: {exc}") from None
        if task == "planning" and not keeps_route_target(route_targets, s):
            prompt = without_route_target(prompt)
        ego = parse_planning_ego(prompt) if task == "planning" else None
        out.append(EvalSample(str(s["id"]), task, prompt, reference, tuple(path.parent / p for p in s["image"]),
                              template_of(s) if task == "qa" else task, ego))
    if not out:
        raise EvalDataError(f"{path}: no {task!r} samples (its tasks: "
                            f"{sorted({str(s.get('task')) for s in read_split(path)})})")
    return out
