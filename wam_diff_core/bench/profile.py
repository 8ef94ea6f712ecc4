"""`wam-diff bench --profile MODEL ...`: where one plan's time goes, phase by phase, for each policy.

    wam-diff bench --profile models/nano-s-ar models/nano-s-b32 --samples 20

Each frame is planned once by every entry, taking turns as in `--compare`, with perf_counter spans around the
calls of `DrivingPolicy.plan` (`phases`): image conversion, prompt tokens, grammar set-up, vision encoder,
prefill, the decoder's forwards, LM head, grammar masking and remasking, detokenising, parsing; and per
response block its steps and time. Then a few more plans per entry under torch.profiler give the operators
that take the time (`--ops`). Entries are as `--compare`'s (`entries`). Prints markdown tables, writes JSON
(--out) and the tables beside it (.md).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..decoding.options import add_decoding_arguments
from .compare import load_entries, target_rule
from .frames import Frame, route_target_for
from .interleave import ORDERS, interleaved
from .machine import describe, load_average, load_text, machine
from .phases import Spans, installed, phases

MAX_BLOCK_ROWS = 8  # more response blocks than this (B = 1: one per token) are summarised in one row


def add_arguments(parser) -> None:
    parser.add_argument("--profile", nargs="+", required=True, metavar="MODEL",
                        help="[LABEL=]MODEL[@K | @BxK][:KEY=VALUE ...] per entry, as --compare's")
    parser.add_argument("--data", default=None, help="planning split; default: the planning validation split (rendered)")
    parser.add_argument("--frames-dir", default="runs/bench", help="where rendered frames are kept between runs")
    parser.add_argument("--samples", type=int, default=20, help="frames, evenly spaced over the split")
    parser.add_argument("--order", default="rotate", choices=ORDERS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    parser.add_argument("--ops", type=int, default=12, help="operators listed per entry (torch.profiler); 0 = none")
    parser.add_argument("--ops-plans", type=int, default=3, help="plans per entry under torch.profiler")
    parser.add_argument("--out", default="runs/bench_profile.json")
    add_decoding_arguments(parser)


def _plan(policy, frame: Frame):
    asks, only_on = target_rule(policy)
    return policy.plan([frame.image], frame.ego, frame.command, target=route_target_for(frame, asks, only_on))


def profile_timer(policy, frames: Sequence[Frame], threads: int | None = None):
    """A timer planning frames[r] with the phase spans installed; returns its seconds, tokens and `phases`."""
    spans = Spans()

    def timer(r: int) -> dict:
        spans.clear()
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            with installed(policy, spans):
                start = time.perf_counter()
                plan = _plan(policy, frames[r])
                seconds = time.perf_counter() - start
        finally:
            torch.set_num_threads(before)
        decode = plan.stats.get("decode")
        return {"seconds": seconds, "tokens": decode.tokens if decode else 0, "valid": bool(plan.valid),
                "phases": phases(spans.records, seconds)}

    return timer


def _block_rows(plans: list[dict]) -> list[dict]:
    counts = [len(p["phases"]["blocks"]) for p in plans]
    n = int(np.median(counts))
    if n > MAX_BLOCK_ROWS:
        blocks = [b for p in plans for b in p["phases"]["blocks"]]
        return [{"block": f"each of {n}", **{k: float(np.median([b[k] for b in blocks]))
                                            for k in ("steps", "ms", "forward_ms", "lm_head_ms", "mask_ms")}}]
    rows = []
    for j in range(n):
        got = [p["phases"]["blocks"][j] for p in plans if len(p["phases"]["blocks"]) > j]
        rows.append({"block": j, **{k: float(np.median([b[k] for b in got]))
                                   for k in ("steps", "ms", "forward_ms", "lm_head_ms", "mask_ms")}})
    return rows


def summarise_phases(plans: list[dict]) -> dict:
    """Per phase over the plans: median and mean ms and the share of the mean plan; the plan's total; blocks."""
    names = list(plans[0]["phases"]["ms"])
    total = float(np.mean([p["phases"]["total_ms"] for p in plans]))
    rows = [{"phase": k, "ms_median": float(np.median([p["phases"]["ms"][k] for p in plans])),
             "ms_mean": float(np.mean([p["phases"]["ms"][k] for p in plans])),
             "share": float(np.mean([p["phases"]["ms"][k] for p in plans])) / total} for k in names]
    return {"plans": len(plans), "valid": sum(p["valid"] for p in plans), "tokens_per_plan": float(np.mean([p["tokens"] for p in plans])),
            "total_ms_median": float(np.median([p["phases"]["total_ms"] for p in plans])), "total_ms_mean": total,
            "phases": rows, "blocks": _block_rows(plans)}


def top_ops(policy, frames: Sequence[Frame], plans: int, top: int, threads: int | None = None) -> list[dict]:
    """The `top` operators by self CPU time over `plans` plans (at `threads` torch threads) under torch.profiler:
    calls and self ms per plan and their share of the profiled self time (the profiler's own overhead inflates
    small operators)."""
    from torch.profiler import ProfilerActivity, profile

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for k in range(plans):
                _plan(policy, frames[k % len(frames)])
    finally:
        torch.set_num_threads(before)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [{"op": e.key, "calls_per_plan": e.count / plans, "self_ms_per_plan": e.self_cpu_time_total / 1000 / plans,
             "share": e.self_cpu_time_total / total} for e in events[:top]]


def run(args) -> int:
    entries, policies, source, frames = load_entries(args, args.profile)
    timers = [profile_timer(p, frames, e.threads) for p, e in zip(policies, entries)]
    load_before = load_average()
    for timer in timers:
        timer(0)
    bar = tqdm(total=len(frames), desc="profile", unit="frame")
    rounds = interleaved(timers, len(frames), args.order, args.seed, on_round=lambda r: bar.update())
    bar.close()
    load_after = load_average()
    result = {"frames_source": source, "samples": len(frames), "machine": machine(args.device),
              "load_before": load_before, "load_after": load_after, "entries": []}
    for i, (entry, policy) in enumerate(zip(entries, policies)):
        row = {"label": entry.label, "model": entry.model, "block_size": policy.config.block_size,
               "steps": policy.config.steps, **summarise_phases([r[i] for r in rounds])}
        if args.ops > 0:
            row["ops"] = top_ops(policy, frames, args.ops_plans, args.ops, entry.threads)
        result["entries"].append(row)
    table = markdown(result)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def markdown(result: dict) -> str:
    """The phase table (entries side by side), then per entry its blocks and its operators."""
    entries = result["entries"]
    lines = [f"{result['samples']} plans per entry from {result['frames_source']}; {describe(result['machine'])}; "
             f"{load_text(result['load_before'], result['load_after'])}", "",
             "| phase | " + " | ".join(f"{e['label']} ms (p50) | share" for e in entries) + " |",
             "| --- |" + " --- | --- |" * len(entries)]
    for k, name in enumerate(p["phase"] for p in entries[0]["phases"]):
        lines.append(f"| {name} | " + " | ".join(f"{e['phases'][k]['ms_median']:.1f} | {100 * e['phases'][k]['share']:.0f} %"
                                             for e in entries) + " |")
    lines.append("| **plan** | " + " | ".join(f"**{e['total_ms_median']:.0f}** | 100 %" for e in entries) + " |")
    for e in entries:
        lines += ["", f"{e['label']} (B = {e['block_size']}, K = {e['steps']}), response blocks (medians):", "",
                  "| block | steps | ms | forwards ms | LM head ms | masking ms |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {b['block']} | {b['steps']:.0f} | {b['ms']:.1f} | {b['forward_ms']:.1f} | {b['lm_head_ms']:.1f} "
                  f"| {b['mask_ms']:.1f} |" for b in e["blocks"]]
        if e.get("ops"):
            lines += ["", "| operator | calls per plan | self ms per plan | share |", "| --- | --- | --- | --- |"]
            lines += [f"| `{o['op']}` | {o['calls_per_plan']:.0f} | {o['self_ms_per_plan']:.1f} | {100 * o['share']:.0f} % |"
                      for o in e["ops"]]
    return "\n".join(lines)
