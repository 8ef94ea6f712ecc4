"""`wam-diff bench --candidates 1,4,8`: what N candidate plans from one prefill cost, and how far apart they land.

    wam-diff bench --candidates 1,4,8 --model models/nano-s-b32 --samples 50 --out results/candidates/cost.json

Entries: N = 1 (the plan without candidates), then every other N with every sampling method (`--methods`, at
`--temperature`), each a whole `DrivingPolicy.plan(..., candidates=N, sampling=...)` as the node calls it. Every
frame is planned once by every entry, the order rotated per frame (`interleave`), so a shared machine's load falls
on all entries alike; the time ratio to N = 1 is taken per frame and summarised. Per entry also: the allocator's
peak during one plan (torch.profiler's memory events: what the plan allocates beyond the weights), the process's
peak RSS, how many candidates were invalid, and the candidates' diversity: per frame the mean distance between
the last waypoints of every two valid candidates (m), and the best candidate's L2 to the expert beside candidate
0's (what a perfect scorer could gain). Frames: `--data` (a split `wam-diff data` wrote), else the shipped models'
planning validation split (`frames`). Prints a markdown table, writes JSON (--out) and the table beside it (.md).
"""
from __future__ import annotations

import json
import tempfile
import time
from itertools import combinations
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..constants import SHIPPED_MODEL
from ..decoding.candidates import SAMPLING_METHODS, CandidateSampling
from ..decoding.options import add_decoding_arguments, decoding_arguments
from ..errors import UsageError
from ..eval.l2 import l2_per_sample
from .compare import frame_source, target_rule, write_outputs
from .decode import _int_list
from .frames import Frame, route_target_for
from .interleave import ORDERS, interleaved, round_ratios, spread
from .machine import describe, load_average, load_text, machine


def add_arguments(parser) -> None:
    parser.add_argument("--candidates", required=True, help="candidate counts N, comma-separated (1 first: the reference)")
    parser.add_argument("--model", default=SHIPPED_MODEL, help="the shipped model (default) or a checkpoint directory")
    parser.add_argument("--methods", default=",".join(SAMPLING_METHODS), help=f"sampling methods of {SAMPLING_METHODS}")
    parser.add_argument("--temperature", type=float, default=1.0, help="the sampling methods' noise scale")
    parser.add_argument("--single-step", action="store_true",
                        help="also every entry with single-step candidates (each block committed at once)")
    parser.add_argument("--shared-blocks", default="0", help="answer blocks the candidates share with the greedy "
                                                            "one, comma-separated (every N and method with each)")
    parser.add_argument("--data", default=None, help="planning split (`wam-diff data`'s val.json); default: the "
                                                     "shipped models' planning validation split")
    parser.add_argument("--frames-dir", default="runs/bench", help="where rendered frames are kept between runs")
    parser.add_argument("--samples", type=int, default=50, help="frames, evenly spaced over the split")
    parser.add_argument("--order", default="rotate", choices=ORDERS, help="order of the entries on a frame")
    parser.add_argument("--seed", type=int, default=0, help="seed of --order shuffle")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    parser.add_argument("--out", default="runs/bench_candidates.json")
    add_decoding_arguments(parser)


def entries(counts: Sequence[int], methods: Sequence[str], temperature: float,
            shared: Sequence[int] = (0,),
            single: Sequence[bool] = (False,)) -> list[tuple[int, Optional[CandidateSampling]]]:
    """(N, sampling) per entry: N = 1 first (no sampling), then every other N with every method, every count
    of shared blocks and each single-step setting."""
    return [(1, None)] + [(n, CandidateSampling(m, temperature, k, one)) for n in counts if n > 1 for m in methods
                          for k in shared for one in single]


def label(n: int, sampling: Optional[CandidateSampling]) -> str:
    if sampling is None:
        return "N=1"
    return (f"N={n} {sampling.method}" + (f", {sampling.shared_blocks} shared" if sampling.shared_blocks else "")
            + (", single step" if sampling.single_step else ""))


def endpoint_spread(trajectories: Sequence[np.ndarray]) -> Optional[float]:
    """Mean distance (m) between the last waypoints of every two trajectories; None for fewer than two."""
    ends = [np.asarray(t)[-1] for t in trajectories]
    pairs = [float(np.linalg.norm(a - b)) for a, b in combinations(ends, 2)]
    return float(np.mean(pairs)) if pairs else None


def candidate_record(plan, frame: Frame, seconds: float) -> dict:
    """One timed plan: seconds, candidates drawn, valid, distinct answers, endpoint spread, candidate 0's L2 and
    the best valid candidate's (m, mean over the waypoints), mean log-probability."""
    valid = [c for c in plan.candidates if c.valid]
    l2 = [float(l2_per_sample(c.trajectory, frame.truth).mean()) for c in valid]
    first = plan.candidates[0]
    return {"seconds": seconds, "candidates": len(plan.candidates), "valid": len(valid),
            "distinct": len({c.text for c in plan.candidates}), "spread_m": endpoint_spread([c.trajectory for c in valid]),
            "l2_first": l2[0] if first.valid else None, "l2_best": min(l2) if l2 else None,
            "logprob": float(np.mean([c.logprob for c in plan.candidates]))}


def candidate_timer(policy, frames: Sequence[Frame], n: int, sampling) -> Callable[[int], dict]:
    """A timer planning frames[r] with `n` candidates drawn by `sampling`."""
    asks, only_on = target_rule(policy)

    def timer(r: int) -> dict:
        frame = frames[r]
        start = time.perf_counter()
        plan = policy.plan([frame.image], frame.ego, frame.command, target=route_target_for(frame, asks, only_on),
                           candidates=n, sampling=sampling)
        return candidate_record(plan, frame, time.perf_counter() - start)

    return timer


def peak_allocated_mb(policy, frame: Frame, n: int, sampling) -> float:
    """The torch allocator's peak (MiB) over one plan with `n` candidates: the most the plan's tensors held at
    once beyond what existed before it (the weights), from torch.profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    asks, only_on = target_rule(policy)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        policy.plan([frame.image], frame.ego, frame.command, target=route_target_for(frame, asks, only_on),
                    candidates=n, sampling=sampling)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    totals = [e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0) / 2**20


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _entry_row(i: int, rounds: list[list[dict]]) -> dict:
    got = [r[i] for r in rounds]
    drawn = sum(g["candidates"] for g in got)
    return {"plans": len(got), "ms_per_plan": spread([1000 * g["seconds"] for g in got]),
            "x_time_vs_n1": spread(round_ratios(rounds, "seconds")[i]),  # entry time over N = 1 time
            "candidates_drawn": drawn, "invalid": drawn - sum(g["valid"] for g in got),
            "distinct_per_plan": _mean(g["distinct"] for g in got),
            "endpoint_spread_m": _mean(g["spread_m"] for g in got),
            "endpoint_spread_m_median": float(np.median([g["spread_m"] for g in got if g["spread_m"] is not None]))
            if any(g["spread_m"] is not None for g in got) else None,
            "l2_first_m": _mean(g["l2_first"] for g in got), "l2_best_m": _mean(g["l2_best"] for g in got),
            "mean_logprob": _mean(g["logprob"] for g in got)}


def summarise(specs, rounds: list[list[dict]], memory: list[float], frames: Sequence[Frame]) -> dict:
    """Per entry: N, sampling, speed and its ratio to N = 1 (per frame, summarised), peak allocation, invalid
    candidates, diversity and L2; per frame the raw records."""
    rows = [{"label": label(n, s), "candidates": n, "method": None if s is None else s.method,
             "temperature": None if s is None else s.temperature,
             "shared_blocks": None if s is None else s.shared_blocks,
             "single_step": None if s is None else s.single_step, "peak_allocated_mb": mb} | _entry_row(i, rounds)
            for i, ((n, s), mb) in enumerate(zip(specs, memory))]
    per_frame = [{"id": f.id, "scenario": f.scenario,
                  "plans": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in g.items()} for g in r]}
                 for f, r in zip(frames, rounds)]
    return {"entries": rows, "frames": per_frame}


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    """The entries as a markdown table, with the model, frames, machine and load above it."""
    lines = [f"{result['model']}: {result['samples']} frames from {result['frames_source']}; "
             f"{describe(result['machine'])}; {load_text(result['load_before'], result['load_after'])}", "",
             "| entry | ms/plan p50 | p95 | x N=1 per frame (IQR) | peak alloc MiB | invalid | distinct/plan "
             "| endpoint spread m (mean, median) | L2 cand. 0 m | L2 best m |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in result["entries"]:
        ms, x = e["ms_per_plan"], e["x_time_vs_n1"]
        lines.append(f"| {e['label']} | {ms['median']:.0f} | {ms['p95']:.0f} | {x['median']:.2f}x "
                     f"({x['q25']:.2f}-{x['q75']:.2f}) | {e['peak_allocated_mb']:.1f} "
                     f"| {e['invalid']}/{e['candidates_drawn']} | {_fmt(e['distinct_per_plan'], '.1f')} "
                     f"| {_fmt(e['endpoint_spread_m'])}, {_fmt(e['endpoint_spread_m_median'])} "
                     f"| {_fmt(e['l2_first_m'], '.3f')} | {_fmt(e['l2_best_m'], '.3f')} |")
    return "\n".join(lines)


def _settings(args) -> tuple[list[int], list[str], list[int]]:
    try:
        counts = _int_list(args.candidates)
    except ValueError as exc:
        raise UsageError(f"--candidates {args.candidates!r}: {exc}") from None
    try:
        shared = [int(v) for v in args.shared_blocks.split(",") if v.strip()]
    except ValueError:
        shared = []
    if not shared or min(shared) < 0:
        raise UsageError(f"--shared-blocks {args.shared_blocks!r}: expected comma-separated integers >= 0")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in SAMPLING_METHODS]
    if bad or not methods:
        raise UsageError(f"--methods {args.methods!r}: expected some of {SAMPLING_METHODS}")
    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: expected at least 1")
    return counts, methods, shared


def run(args) -> int:
    from ..policy import DrivingPolicy

    counts, methods, shared = _settings(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    user = decoding_arguments(args)
    policy = DrivingPolicy.load(args.model, device=args.device, dtype=user.pop("dtype", None), **user)
    source, frames = frame_source(args, [policy])
    specs = entries(counts, methods, args.temperature, shared, (False, True) if args.single_step else (False,))
    timers = [candidate_timer(policy, frames, n, s) for n, s in specs]
    for timer in timers:  # warm-up
        timer(0)
    load_before = load_average()
    bar = tqdm(total=len(frames), desc="candidates", unit="frame")
    rounds = interleaved(timers, len(frames), args.order, args.seed, on_round=lambda r: bar.update())
    bar.close()
    load_after = load_average()
    memory = [peak_allocated_mb(policy, frames[0], n, s) for n, s in specs]
    result = {"model": args.model, "frames_source": source, "samples": len(frames), "machine": machine(args.device),
              "order": args.order, "seed": args.seed, "load_before": load_before, "load_after": load_after,
              "peak_rss_mb": _peak_rss_mb(),
              "timing": "whole plans (DrivingPolicy.plan), entries taking turns per frame after one warm-up plan each; "
                        "peak allocation: one plan of frame 0 under torch.profiler (profile_memory)"}
    result |= summarise(specs, rounds, memory, frames)
    write_outputs(Path(args.out), result, markdown(result))
    return 0


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
