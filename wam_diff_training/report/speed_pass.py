"""`wam-diff-train speed-pass`: planning tokens/s of several decodings in one pass, taking turns sample by
sample (load on the machine falls on all of them alike), as the report's speed pass does, with the kinematic
envelope on or off per entry.

    wam-diff-train speed-pass --data runs/nano_s/data_plan/val.json --samples 64 --out runs/speed \\
        nano-s-ar=models/nano-s-ar nano-s-b32=models/nano-s-b32 "nano-s-b32 raw=models/nano-s-b32:raw"

Each entry is LABEL=CHECKPOINT_DIR[@K | @BxK][:SCHEDULE][:raw | :envelope | :forward] and decodes as in
`wam-diff-train l2-gap`: its checkpoint's own settings (its wam_diff.json), the decoding options given on the
command line on top (unset: the checkpoint's own), the entry's own @K, @BxK and SCHEDULE on top of those; then
`:raw` decodes without the kinematic envelope, `:envelope` inside it without the forward-only bound, `:forward`
with that bound (the shipped models' files ask for it already). The first entry is the reference of the x
columns. Writes OUT/speed.json (each entry's settings and clock) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from wam_diff_core.decoding.options import add_decoding_arguments, decoding_arguments

from .l2_gap_cli import model_decoding, parse_model, settings_of, split_schedule
from .open_loop import decode_in_turns, load_split

# an entry's last suffix: the envelope it decodes with, as DecoderConfig fields
ENVELOPES = {":raw": {"kinematic_envelope": False},
             ":envelope": {"kinematic_envelope": True, "forward_only": False},
             ":forward": {"kinematic_envelope": True, "forward_only": True}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+",
                   help="LABEL=CHECKPOINT_DIR[@K | @BxK][:SCHEDULE][:raw | :envelope | :forward] (its own decoding, "
                        "on top of the options), the first the reference")
    p.add_argument("--data", required=True, help="planning validation split (wam-diff data val.json)")
    p.add_argument("--samples", type=_positive_int, default=64)
    p.add_argument("--out", required=True)
    add_decoding_arguments(p)  # each unset: the checkpoint's own; an entry's suffixes on top


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def split_envelope(spec: str) -> tuple[str, dict]:
    """SPEC[:raw | :envelope | :forward] -> (SPEC, the envelope settings it names; {} for none)."""
    for suffix, settings in ENVELOPES.items():
        if spec.endswith(suffix):
            return spec[: -len(suffix)], settings
    return spec, {}


def _decodings(specs: list[str], user: dict, device: str = "cpu") -> list[tuple]:
    """(label, loaded checkpoint, decoder config) per entry, `user` the command line's decoding options (its
    `dtype`, when given, is the weights'); a checkpoint named twice is loaded once."""
    from wam_diff_core.model.checkpoint import load_model

    user = dict(user)
    dtype = user.pop("dtype", None)
    runs, cache = [], {}
    for spec in specs:
        spec, envelope = split_envelope(spec)
        spec, schedule = split_schedule(spec)
        label, path, block, steps = parse_model(spec)
        if path not in cache:
            cache[path] = load_model(path, device=device, dtype=dtype)
        cfg = model_decoding(cache[path], user | envelope, block, steps, schedule)
        runs.append((label, cache[path], cfg))
    return runs


def run(args: argparse.Namespace) -> int:
    import torch

    user = decoding_arguments(args)
    runs = _decodings(args.models, user, args.device)
    split = {}  # the samples, encoded once per checkpoint as it is asked them
    for _, loaded, _ in runs:
        if id(loaded) not in split:
            split[id(loaded)] = load_split(args.data, loaded, "planning", args.samples)
    totals = decode_in_turns([(loaded, cfg, split[id(loaded)]) for _, loaded, cfg in runs])
    examples = split[id(runs[0][1])]
    ref = totals[0].tokens_per_s
    result = {"data": args.data, "samples": len(examples), "threads": torch.get_num_threads(), "decoding": user,
              "models": [{"label": label, "block_size": cfg.block_size, "steps": cfg.steps,
                          "kinematic_envelope": cfg.kinematic_envelope, "forward_only": cfg.forward_only,
                          "schedule": cfg.schedule, "decoding": settings_of(cfg),
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
    if not entry["kinematic_envelope"]:
        return "off"
    return "forward" if entry.get("forward_only") else "on"
