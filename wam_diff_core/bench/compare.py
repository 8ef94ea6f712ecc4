"""`wam-diff bench --compare MODEL_A MODEL_B ...`: whole plans of several policies on the same frames, taking
turns frame by frame, with planning L2 against the expert beside the speed.

    wam-diff bench --compare models/nano-s-ar models/nano-s-b32 --samples 100

A plan is `DrivingPolicy.plan` as the ROS node and the closed loops call it: image conversion, vision encoder,
prefill, decoding under the grammar and envelope, parsing. Every frame is planned once by every entry (order
rotated or shuffled per frame, `interleave`); speed ratios to the first entry are taken per frame and
summarised (median, min-max, IQR), with tokens/s and plans/s over the whole run. Planning L2 (m, mean over
the waypoints) is scored against the expert's trajectory, and each entry's gap to the first is paired on the
frames both planned validly, with a 95 % bootstrap interval. Frames: `--data` (a split `wam-diff data`
wrote), else the shipped models' planning validation split rendered on the spot (`frames`). Prints a markdown
table, writes JSON (--out) and the table beside it (.md).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..constants import FRAME_SIZE
from ..decoding.options import add_decoding_arguments, decoding_arguments
from ..errors import UsageError
from ..eval.l2 import l2_per_sample, l2_report
from ..eval.paired import paired_gap
from .entries import Entry, parse_entries
from .frames import Frame, planning_frames, route_target_for
from .interleave import ORDERS, interleaved, round_ratios, spread
from .machine import describe, load_average, load_text, machine


def add_arguments(parser) -> None:
    parser.add_argument("--compare", nargs="+", required=True, metavar="MODEL",
                        help="[LABEL=]MODEL[@K | @BxK][:KEY=VALUE ...] per entry (wam_diff_core/bench/entries.py); "
                             "the first is the reference of the ratios and the L2 gaps")
    parser.add_argument("--data", default=None,
                        help="planning split (`wam-diff data`'s val.json); default: the shipped models' planning "
                             "validation split, rendered into --frames-dir on first use")
    parser.add_argument("--frames-dir", default="runs/bench", help="where rendered frames are kept between runs")
    parser.add_argument("--samples", type=int, default=100, help="frames, evenly spaced over the split")
    parser.add_argument("--order", default="rotate", choices=ORDERS,
                        help="order of the entries on a frame: rotated by one per frame, or shuffled with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of --order shuffle")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    parser.add_argument("--out", default="runs/bench_compare.json")
    add_decoding_arguments(parser)  # each unset: every checkpoint's own; an entry's own settings on top


def target_rule(policy) -> tuple[bool, tuple[str, ...] | None]:
    """(asks with a route target, only on these scenario types) of a policy, from its checkpoint's settings."""
    settings = getattr(getattr(policy, "loaded", None), "settings", None)
    return (bool(settings.route_target), settings.route_targets_only_on) if settings is not None else (False, None)


def plan_record(plan, frame: Frame, seconds: float) -> dict:
    """What one timed plan gives: seconds, tokens and forwards of its decode, validity, its L2 (m, mean over
    the waypoints) against the expert where valid."""
    decode = (getattr(plan, "stats", None) or {}).get("decode")
    tokens = int(decode.tokens) if decode is not None else 0
    valid = bool(plan.valid and plan.trajectory is not None)
    l2 = float(l2_per_sample(plan.trajectory, frame.truth).mean()) if valid else None
    return {"seconds": seconds, "tokens": tokens, "forwards": int(decode.forwards) if decode is not None else 0,
            "tokens_per_s": tokens / seconds, "valid": valid, "l2": l2,
            "trajectory": np.asarray(plan.trajectory).tolist() if valid else None}


def plan_timer(policy, frames: Sequence[Frame], threads: int | None = None) -> Callable[[int], dict]:
    """A timer planning frames[r] with `policy` (at `threads` torch threads, restored after)."""
    asks, only_on = target_rule(policy)

    def timer(r: int) -> dict:
        frame = frames[r]
        target = route_target_for(frame, asks, only_on)
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            start = time.perf_counter()
            plan = policy.plan([frame.image], frame.ego, frame.command, target=target)
            seconds = time.perf_counter() - start
        finally:
            torch.set_num_threads(before)
        return plan_record(plan, frame, seconds)

    return timer


def compare_plans(policies: Sequence, frames: Sequence[Frame], order: str = "rotate", seed: int = 0,
                  threads: Sequence[int | None] | None = None, progress: bool = True) -> list[list[dict]]:
    """Every frame planned once by every policy, taking turns (one warm-up plan each on frames[0] first);
    per frame, the policies' `plan_record`s in policy order, each with its "position" on the frame."""
    timers = [plan_timer(p, frames, t) for p, t in zip(policies, threads or [None] * len(policies))]
    for timer in timers:
        timer(0)
    bar = tqdm(total=len(frames), desc="compare", unit="frame", disable=not progress)
    rounds = interleaved(timers, len(frames), order, seed, on_round=lambda r: bar.update())
    bar.close()
    return rounds


def _entry_row(i: int, rounds: list[list[dict]], frames: Sequence[Frame]) -> dict:
    got = [r[i] for r in rounds]
    seconds = sum(g["seconds"] for g in got)
    tokens = sum(g["tokens"] for g in got)
    valid = [k for k, g in enumerate(got) if g["valid"]]
    row = {"plans": len(got), "valid": len(valid), "ms_per_plan": spread([1000 * g["seconds"] for g in got]),
           "plans_per_s": len(got) / seconds, "tokens_per_s": tokens / seconds, "tokens_per_plan": tokens / len(got),
           "forwards_per_plan": sum(g["forwards"] for g in got) / len(got),
           "l2": l2_report(np.stack([got[k]["trajectory"] for k in valid]),
                           np.stack([frames[k].truth for k in valid])) if valid else None}
    row["x_plans_per_s"] = spread(round_ratios(rounds, "seconds", higher_is_faster=False)[i])
    row["x_tokens_per_s"] = spread(round_ratios(rounds, "tokens_per_s")[i])
    ref = [r[0] for r in rounds]
    row["x_tokens_per_s_total"] = row["tokens_per_s"] / (sum(g["tokens"] for g in ref) / sum(g["seconds"] for g in ref))
    both = [k for k in valid if ref[k]["valid"]]
    row["l2_gap"] = paired_gap(np.array([ref[k]["l2"] for k in both]), np.array([got[k]["l2"] for k in both])) if both else None
    return row


def summarise(entries: Sequence[Entry], policies: Sequence, rounds: list[list[dict]], frames: Sequence[Frame]) -> dict:
    """Per entry: its settings, speed (per plan, per second, per token), ratios to the first entry (per frame,
    summarised, and over the run), L2 against the expert and its paired gap to the first entry; per frame the
    raw records (seconds, tokens, validity, L2), so every number can be recomputed."""
    rows = []
    for i, (entry, policy) in enumerate(zip(entries, policies)):
        config = getattr(policy, "config", None)
        rows.append({"label": entry.label, "model": entry.model, "threads": entry.threads, "dtype": entry.dtype,
                     "decoding": asdict(config) if is_dataclass(config) else dict(entry.decoding)}
                    | _entry_row(i, rounds, frames))
    per_frame = [{"id": f.id, "scenario": f.scenario,
                  "plans": [{"seconds": round(g["seconds"], 5), "tokens": g["tokens"], "forwards": g["forwards"],
                             "valid": g["valid"], "l2": None if g["l2"] is None else round(g["l2"], 5),
                             "position": g["position"]} for g in r]}
                 for f, r in zip(frames, rounds)]
    return {"entries": rows, "frames": per_frame}


def frame_source(args, policies) -> tuple[str, list[Frame]]:
    size = getattr(policies[0], "trained_frame_size", None) or FRAME_SIZE
    frames = planning_frames(args.data, args.frames_dir, tuple(size), args.samples)
    source = args.data or f"the planning validation split rendered at {size[0]}x{size[1]} ({args.frames_dir})"
    return source, frames


def load_entries(args, specs: list[str]) -> tuple[list, list, str, list]:
    """The command line's model entries loaded as policies (each at its own decoding, the options on top) and the
    frames they are timed on: (entries, policies, frame source, frames). Shared by --compare and --profile."""
    from ..policy import DrivingPolicy

    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: expected at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    entries = parse_entries(specs)
    user = decoding_arguments(args)
    dtype = user.pop("dtype", None)
    policies = [DrivingPolicy.load(e.model, device=args.device, dtype=e.dtype or dtype, **(user | e.decoding))
                for e in entries]
    source, frames = frame_source(args, policies)
    return entries, policies, source, frames


def run(args) -> int:
    entries, policies, source, frames = load_entries(args, args.compare)
    load_before = load_average()
    rounds = compare_plans(policies, frames, args.order, args.seed, [e.threads for e in entries])
    result = {"frames_source": source, "samples": len(frames), "machine": machine(args.device), "order": args.order,
              "seed": args.seed, "load_before": load_before, "load_after": load_average(),
              "timing": "whole plans (DrivingPolicy.plan), entries taking turns per frame after one warm-up plan each"}
    result |= summarise(entries, policies, rounds, frames)
    write_outputs(Path(args.out), result, markdown(result))
    return 0


def write_outputs(out: Path, result: dict, table: str) -> None:
    """Print the markdown `table`, write `result` to `out` (JSON, `write_json`) and the table beside it (.md)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    out.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


def write_json(path: Path, result: dict) -> None:
    """`result` as indented JSON, its per-frame records one line each (hundreds of frames stay readable)."""
    head = json.dumps({k: v for k, v in result.items() if k != "frames"}, indent=2)
    frames = ",\n".join("    " + json.dumps(f) for f in result.get("frames", []))
    path.write_text(head[:-2] + ',\n  "frames": [\n' + frames + "\n  ]\n}\n")


def _gap_text(gap: dict | None) -> str:
    if gap is None:
        return "-"
    lo, hi = gap["gap_ci"]
    return f"{100 * gap['gap']:+.1f} % [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def markdown(result: dict) -> str:
    """The comparison as a markdown table, with the machine and its load above it."""
    m = result["machine"]
    lines = [f"{result['samples']} frames from {result['frames_source']}; {describe(m)}; "
             f"{load_text(result['load_before'], result['load_after'])}", "",
             "| entry | B | K | valid | ms/plan p50 | p95 | plans/s | tokens/s | x tokens/s per frame (IQR, min-max) "
             "| x tokens/s total | L2 m | L2 gap, 95 % CI |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in result["entries"]:
        ms, x = e["ms_per_plan"], e["x_tokens_per_s"]
        l2 = f"{e['l2']['l2_mean']:.3f}" if e["l2"] else "-"
        lines.append(f"| {e['label']} | {e['decoding'].get('block_size', '-')} | {e['decoding'].get('steps', '-')} "
                     f"| {e['valid']}/{e['plans']} | {ms['median']:.0f} | {ms['p95']:.0f} | {e['plans_per_s']:.2f} "
                     f"| {e['tokens_per_s']:.0f} | {x['median']:.2f}x ({x['q25']:.2f}-{x['q75']:.2f}, "
                     f"{x['min']:.2f}-{x['max']:.2f}) | {e['x_tokens_per_s_total']:.2f}x | {l2} | {_gap_text(e['l2_gap'])} |")
    return "\n".join(lines)
