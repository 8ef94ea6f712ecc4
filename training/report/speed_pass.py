"""`wam-diff-train speed-pass`: planning tokens/s of several decodings in one pass, taking turns sample by
sample (load on the machine falls on all of them alike), as the report's speed pass does, with the kinematic
envelope on or off per entry.

    wam-diff-train speed-pass --data runs/nano_s/data_plan/val.json --samples 64 --out runs/speed \\
        nano-s-ar=models/nano-s-ar:forward nano-s-b32=models/nano-s-b32:forward "nano-s-b32 raw=models/nano-s-b32:raw"

Each entry is LABEL=CHECKPOINT_DIR[@K | @BxK][:SCHEDULE][:raw | :forward] (`:raw`: without the envelope;
`:forward`: with its forward-only bound; @K, @BxK and SCHEDULE as in `wam-diff-train l2-gap`); the first is the
reference of the x columns. Writes OUT/speed.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from wam_diff_core.decoding.config import step_count
from wam_diff_core.policy import TASK_BUDGET

from .l2_gap_cli import STRATEGY, THRESHOLD, parse_model, split_schedule
from .open_loop import decode_in_turns, decoder_config, load_split

RAW = ":raw"
FORWARD = ":forward"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+",
                   help="LABEL=CHECKPOINT_DIR[@K | @BxK][:SCHEDULE][:raw | :forward], the first the reference")
    p.add_argument("--data", required=True, help="planning validation split (wam-diff data val.json)")
    p.add_argument("--samples", type=_positive_int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", required=True)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _decodings(specs: list[str], default_steps: int) -> list[tuple]:
    """(label, loaded checkpoint, decoder config) per entry; a checkpoint named twice is loaded once."""
    from wam_diff_core.model.checkpoint import load_model

    runs, cache = [], {}
    for spec in specs:
        raw, forward = spec.endswith(RAW), spec.endswith(FORWARD)
        spec, schedule = split_schedule(spec[: -len(RAW)] if raw else spec[: -len(FORWARD)] if forward else spec)
        label, path, block, steps = parse_model(spec, default_steps)
        loaded = cache.setdefault(path, load_model(path))
        B = block or loaded.settings.trained_block_size
        cfg = dataclasses.replace(decoder_config(B, step_count(B, steps), STRATEGY, THRESHOLD,
                                                 TASK_BUDGET["planning"], True, not raw, forward), schedule=schedule)
        runs.append((label, loaded, cfg))
    return runs


def run(args: argparse.Namespace) -> int:
    import torch

    runs = _decodings(args.models, args.steps)
    split = {}  # the samples, encoded once per checkpoint as it is asked them
    for _, loaded, _ in runs:
        if id(loaded) not in split:
            split[id(loaded)] = load_split(args.data, loaded, "planning", args.samples)
    totals = decode_in_turns([(loaded, cfg, split[id(loaded)]) for _, loaded, cfg in runs])
    examples = split[id(runs[0][1])]
    ref = totals[0].tokens_per_s
    result = {"data": args.data, "samples": len(examples), "threads": torch.get_num_threads(),
              "models": [{"label": label, "block_size": cfg.block_size, "steps": cfg.steps,
                          "kinematic_envelope": cfg.kinematic_envelope, "forward_only": cfg.forward_only,
                          "schedule": cfg.schedule,
                          "tokens": acc.tokens, "seconds": acc.seconds,
                          "tokens_per_s": acc.tokens_per_s, "x_reference": acc.tokens_per_s / ref,
                          "ms_per_plan": 1000 * acc.seconds / len(examples)}
                         for (label, _, cfg), acc in zip(runs, totals)]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(result, indent=2))
    print(f"{len(examples)} planning samples, {result['threads']} threads, entries taking turns per sample\n")
    print("| decoding | B | K | envelope | tokens/s | x first | ms per plan |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in result["models"]:
        print(f"| {m['label']} | {m['block_size']} | {m['steps']} | {envelope_name(m)} | "
              f"{m['tokens_per_s']:.0f} | {m['x_reference']:.2f} | {m['ms_per_plan']:.0f} |")
    print(f"\nwritten: {out / 'speed.json'}")
    return 0


def envelope_name(entry: dict) -> str:
    """off, on, or forward (on with the forward-only bound)."""
    return "forward" if entry.get("forward_only") else "on" if entry["kinematic_envelope"] else "off"
