"""`wam-diff-train bending-samples`: the planning samples whose target bends, a dataset file of those only beside
its source.

47 % of the embedded world's planning targets are straight (every lateral offset 0.00), and B = 32 models fall
into that mode where the road bends. A training config weights this subset up next to the full file. For each
source `DIR/train.json` it writes `DIR/train_bending.json` (image paths stay valid: they are relative to DIR) with
the samples whose answer parses as a trajectory with some |y| >= --min-m.

    wam-diff-train bending-samples runs/nano_s/data_plan/train.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from wam_diff_core.codec import parse_trajectory
from wam_diff_core.errors import WamDiffError

SUFFIX = "_bending"
DEFAULT_MIN_M = 0.01  # one step of the two-decimal trajectory text


class BendingError(WamDiffError, ValueError):
    """A source that is not a dataset file."""


def bends(sample: dict, min_m: float = DEFAULT_MIN_M) -> bool:
    """Whether a planning sample's answer is a trajectory with a lateral offset of at least min_m metres."""
    traj = parse_trajectory(sample["conversations"][1]["value"])
    return isinstance(traj, np.ndarray) and bool(np.abs(traj[:, 1]).max() >= min_m)


def write_bending(src: Path, min_m: float = DEFAULT_MIN_M) -> tuple[Path, int, int]:
    """Write SRC's bending samples beside it; returns (path, samples in, samples kept)."""
    samples = json.loads(src.read_text())
    if not isinstance(samples, list):
        raise BendingError(f"{src}: expected a JSON list of samples, got {type(samples).__name__}")
    keep = [s for s in samples if s.get("task", "planning") == "planning" and bends(s, min_m)]
    out = src.with_name(src.stem + SUFFIX + src.suffix)
    out.write_text(json.dumps(keep))
    return out, len(samples), len(keep)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", type=Path, help="planning dataset JSON files")
    parser.add_argument("--min-m", type=float, default=DEFAULT_MIN_M, help="smallest |y| (m) that counts as bending")


def run(args: argparse.Namespace) -> int:
    for src in args.sources:
        if not src.is_file():
            raise BendingError(f"{src}: no such dataset file")
        out, n, k = write_bending(src, args.min_m)
        print(f"{src}: {k} of {n} samples bend -> {out}")
    return 0
