"""`wam-diff counterfactual`: planning pairs that differ only in the traffic the camera sees.

A cloned planner can score well by reading the ego speed in its prompt and ignoring the image (the
"copycat" / causal-confusion failure of behaviour cloning; `wam-diff sensitivity` measures it). Here
the expert drives each training-split route; every `every` ticks two samples share the ego state and
the command: the real frame with the expert's plan from the world as it is, and the same frame
rendered without the other vehicles (`HighwayWorld.render_without_traffic`) with the expert's plan in a
copy of the world without them (`HighwayWorld.without_traffic`). Only the image tells the two answers
apart, so the pair's loss can only fall by looking at the traffic. Pairs whose two plans differ by
less than `min_change_m` (mean waypoint distance) teach nothing new and are left out.

Output follows `wam-diff data` (OUT/parts/<route>.json, resumable; OUT/train.json; OUT/stats.json;
OUT/images/), samples with meta.source "counterfactual", meta.traffic true/false and meta.pair.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import FRAME_SIZE
from ..errors import UsageError
from .dagger import planning_sample
from .datagen import VAL_FRACTION, add_split_arguments, merge_parts, pending_routes, training_copies, write_part
from .jobs import add_progress_argument, route_jobs
from .routes import (Route, add_frame_size_argument, add_selection_arguments, load_routes, parse_frame_size, parse_seed_offsets,
                     select_routes)

DEFAULT_SEED_OFFSETS = (5000,)  # `wam-diff data` uses 0, 1000, 2000; `wam-diff dagger` 3000, 4000
DEFAULT_EVERY = 10
DEFAULT_MIN_CHANGE_M = 1.0


def generate_route(route: Route, out_dir: Path, every: int = DEFAULT_EVERY, frame_size=FRAME_SIZE,
                   min_change_m: float = DEFAULT_MIN_CHANGE_M) -> dict:
    """Drive one route with the expert and write its pairs to OUT/parts/<route_id>.json."""
    from .highway import ExpertDrive
    from .policies import expert_plan

    t0 = time.perf_counter()
    drive = ExpertDrive(route, frame_size, every)
    samples, probes, skipped_small, skipped_crash = [], 0, 0, 0
    for world, tick in drive:
        k = world._ticks
        probes += 1
        real, crashed = expert_plan(world)
        empty, crashed_empty = expert_plan(world.without_traffic())
        change = float(np.linalg.norm(real - empty, axis=1).mean())
        if crashed or crashed_empty:
            skipped_crash += 1
        elif change < min_change_m:
            skipped_small += 1
        else:
            first = planning_sample(out_dir, route, k, world.dt, tick.frame, tick.ego, tick.command, real,
                                    source="counterfactual", target=tick.route_target, traffic=True, plan_change_m=round(change, 3))
            second = planning_sample(out_dir, route, k, world.dt, world.render_without_traffic(), tick.ego,
                                     tick.command, empty, source="counterfactual", suffix="_cf", target=tick.route_target, traffic=False,
                                     plan_change_m=round(change, 3), pair=first["id"])
            first["meta"]["pair"] = second["id"]
            samples += [first, second]
    part = {"route": route.to_dict(), "split": "train", "crashed": bool(drive.last.collision), "frames": probes,
            "samples": samples, "scenes": [], "skipped_small_change": skipped_small,
            "skipped_expert_crashed": skipped_crash, "wall_s": round(time.perf_counter() - t0, 2)}
    write_part(out_dir, route.route_id, part)
    return {"route_id": route.route_id, "pairs": len(samples) // 2, "probes": probes}


def _worker(route_dict: dict, out_dir: str, every: int, frame_size, min_change_m: float) -> dict:
    return generate_route(Route(**route_dict), Path(out_dir), every, frame_size, min_change_m)


def generate(routes: list[Route], out_dir: Path, *, seed_offsets=DEFAULT_SEED_OFFSETS, val_fraction: float = VAL_FRACTION,
             every: int = DEFAULT_EVERY, frame_size=FRAME_SIZE, min_change_m: float = DEFAULT_MIN_CHANGE_M,
             workers: int = 1, progress: bool = True, split_over: Optional[list[Route]] = None) -> dict:
    """Pairs on the training-split routes (once per seed offset); held-out routes are never driven. The
    split is drawn over `split_over` (the whole suite; default: `routes`)."""
    if every < 1:
        raise ValueError(f"every {every}: expected a whole number of ticks >= 1")
    if min_change_m < 0:
        raise ValueError(f"min_change_m {min_change_m}: expected metres >= 0")
    out_dir = Path(out_dir)
    driven, held_out = training_copies(routes, val_fraction, seed_offsets, split_over)
    todo = pending_routes(out_dir, driven)
    t0 = time.perf_counter()
    args = [(r.to_dict(), str(out_dir), every, tuple(frame_size), min_change_m) for r in todo]
    done = [res for res in route_jobs(_worker, args, workers, desc="counterfactual" if progress else None,
                                      total=len(driven), postfix=lambda d: {"pairs": sum(r["pairs"] for r in d)})
            if res is not None]
    pairs = sum(r["pairs"] for r in done)
    stats = merge_parts(out_dir, driven, time.perf_counter() - t0, 2 * pairs)
    parts = [json.loads(p.read_text()) for r in driven if (p := out_dir / "parts" / f"{r.route_id}.json").is_file()]
    stats.update({"every": every, "min_change_m": min_change_m, "seed_offsets": list(seed_offsets),
                  "pairs": sum(len(p["samples"]) // 2 for p in parts),
                  "skipped_small_change": sum(p["skipped_small_change"] for p in parts),
                  "skipped_expert_crashed": sum(p["skipped_expert_crashed"] for p in parts),
                  "held_out_routes": held_out})
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="dataset directory")
    add_selection_arguments(parser)
    add_split_arguments(parser, DEFAULT_SEED_OFFSETS)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY, help="ticks between pairs")
    parser.add_argument("--min-change", type=float, default=DEFAULT_MIN_CHANGE_M,
                        help="leave out pairs whose expert plans differ by less (mean waypoint distance, m)")
    add_frame_size_argument(parser, policy_default=False)
    parser.add_argument("--workers", type=int, default=1)
    add_progress_argument(parser)


def run(args) -> int:
    routes = select_routes(args)
    if not routes:
        print("no routes selected")
        return 2
    offsets, (w, h) = parse_seed_offsets(args.seed_offsets), parse_frame_size(args.frame_size)
    try:
        stats = generate(routes, Path(args.out), seed_offsets=offsets, val_fraction=args.val_fraction, every=args.every,
                         frame_size=(w, h), min_change_m=args.min_change, workers=args.workers,
                         progress=not args.no_progress, split_over=load_routes(args.routes))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({k: stats[k] for k in ("pairs", "samples", "routes", "skipped_small_change",
                                             "skipped_expert_crashed", "wall_s")}, indent=2))
    return 0
