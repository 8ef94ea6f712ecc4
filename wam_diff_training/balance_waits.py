"""`wam-diff-train balance-waits`: junction waits rebalanced, a dataset file beside its source with fewer "keep
standing" samples.

A model that cannot tell whether a junction's crossing traffic has cleared learns the majority answer for a
standing ego, and in the expert's planning data that answer is "stay": of the standing intersection samples
94 % have labels the controller holds a stop on (345 of 368). Such a model, once stopped at an intersection,
never drives off. For each source `DIR/train.json` this writes `DIR/train_balanced.json` (image paths stay valid:
relative to DIR) where, per junction scenario, the standing samples whose label stays are subsampled (seeded) to
at most --ratio times the standing samples whose label drives off (`label_departs`, the controller's rule);
every other sample is kept in its order.

    wam-diff-train balance-waits runs/nano_s/data_junction/train.json runs/nano_s/dagger1/train.json
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from wam_diff_core.control import ControllerConfig
from wam_diff_core.errors import WamDiffError
from wam_diff_core.prompts import parse_planning_ego
from wam_diff_core.sim.dagger import label_departs

SUFFIX = "_balanced"
JUNCTION_SCENARIOS = ("intersection", "roundabout")
DEFAULT_RATIO = 1.0
DEFAULT_SEED = 0


class BalanceError(WamDiffError, ValueError):
    """A source that is not a dataset file, or a ratio below 0."""


def standing(sample: dict) -> bool:
    """Whether a planning sample's prompt states an ego slower than the controller's stop speed."""
    ego = parse_planning_ego(sample["conversations"][0]["value"])
    return ego is not None and math.hypot(ego.vx, ego.vy) < ControllerConfig().stop_speed_mps


def balance(samples: list, ratio: float = DEFAULT_RATIO, seed: int = DEFAULT_SEED) -> tuple[list, dict]:
    """The samples with each junction scenario's standing-and-staying samples cut to <= ratio x its
    standing-and-departing ones; returns (kept samples in order, per-scenario counts)."""
    if not ratio >= 0.0:
        raise BalanceError(f"ratio {ratio}: expected >= 0")
    stay, go = defaultdict(list), defaultdict(int)
    for i, s in enumerate(samples):
        scenario = s.get("meta", {}).get("scenario")
        if s.get("task", "planning") != "planning" or scenario not in JUNCTION_SCENARIOS or not standing(s):
            continue
        if label_departs(s):
            go[scenario] += 1
        else:
            stay[scenario].append(i)
    rng = np.random.default_rng(seed)
    drop, counts = set(), {}
    for scenario in JUNCTION_SCENARIOS:
        idx = stay.get(scenario, [])
        keep_n = min(len(idx), int(math.floor(ratio * go[scenario])))
        kept = set(rng.choice(idx, size=keep_n, replace=False).tolist()) if keep_n else set()
        drop.update(i for i in idx if i not in kept)
        counts[scenario] = {"standing_stay": len(idx), "standing_depart": go[scenario], "stay_kept": keep_n}
    return [s for i, s in enumerate(samples) if i not in drop], counts


def write_balanced(src: Path, ratio: float = DEFAULT_RATIO, seed: int = DEFAULT_SEED) -> tuple[Path, int, int, dict]:
    """Write SRC's rebalanced samples beside it; returns (path, samples in, samples kept, per-scenario counts)."""
    samples = json.loads(src.read_text())
    if not isinstance(samples, list):
        raise BalanceError(f"{src}: expected a JSON list of samples, got {type(samples).__name__}")
    keep, counts = balance(samples, ratio, seed)
    out = src.with_name(src.stem + SUFFIX + src.suffix)
    out.write_text(json.dumps(keep))
    return out, len(samples), len(keep), counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", type=Path, help="planning dataset JSON files")
    parser.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                        help="standing-and-staying samples kept per standing-and-departing one, per junction scenario")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the subsample")


def run(args: argparse.Namespace) -> int:
    if not args.ratio >= 0.0:
        raise BalanceError(f"--ratio {args.ratio}: expected a number >= 0")
    for src in args.sources:
        if not src.is_file():
            raise BalanceError(f"{src}: no such dataset file")
        out, n, k, counts = write_balanced(src, args.ratio, args.seed)
        print(f"{src}: kept {k} of {n} samples -> {out}; {json.dumps(counts)}")
    return 0
