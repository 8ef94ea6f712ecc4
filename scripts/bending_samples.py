"""Planning samples whose target bends: a dataset file of those only, beside its source.

47 % of the embedded world's planning targets are straight (every lateral offset 0.00), and B = 32 models fall
into that mode where the road bends (v10 in models/nano-s-b32/README.md). A training config weights this subset
up next to the full file. For each source `DIR/train.json` it writes `DIR/train_bending.json` (image paths stay
valid: they are relative to DIR) with the samples whose answer parses as a trajectory with some |y| >= --min-m.

    .venv/bin/python scripts/bending_samples.py runs/occ/data_plan/train.json runs/occ/dagger_t/train.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wam_diff_core.codec import parse_trajectory  # noqa: E402

SUFFIX = "_bending"
DEFAULT_MIN_M = 0.01  # one step of the two-decimal trajectory text


def bends(sample: dict, min_m: float = DEFAULT_MIN_M) -> bool:
    """Whether a planning sample's answer is a trajectory with a lateral offset of at least min_m metres."""
    traj = parse_trajectory(sample["conversations"][1]["value"])
    return isinstance(traj, np.ndarray) and bool(np.abs(traj[:, 1]).max() >= min_m)


def write_bending(src: Path, min_m: float = DEFAULT_MIN_M) -> tuple[Path, int, int]:
    """Write SRC's bending samples beside it; returns (path, samples in, samples kept)."""
    samples = json.loads(src.read_text())
    if not isinstance(samples, list):
        raise SystemExit(f"{src}: expected a JSON list of samples, got {type(samples).__name__}")
    keep = [s for s in samples if s.get("task", "planning") == "planning" and bends(s, min_m)]
    out = src.with_name(src.stem + SUFFIX + src.suffix)
    out.write_text(json.dumps(keep))
    return out, len(samples), len(keep)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path, help="planning dataset JSON files")
    parser.add_argument("--min-m", type=float, default=DEFAULT_MIN_M, help="smallest |y| (m) that counts as bending")
    args = parser.parse_args(argv)
    for src in args.sources:
        if not src.is_file():
            raise SystemExit(f"{src}: no such dataset file")
        out, n, k = write_bending(src, args.min_m)
        print(f"{src}: {k} of {n} samples bend -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
