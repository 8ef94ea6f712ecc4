"""`wam-diff dagger`: planning data on the states a learned policy reaches (DAgger, Ross et al. 2011).

The expert-driven data of `wam-diff data` only shows states the expert visits; a cloned policy drifts
off them (too close to a lead vehicle, between lanes, late at a junction) and has never seen how to
recover. Here the learned policy drives each route in the closed loop (`wam-diff drive`'s loop, same
controller and replanning); at every planning tick the frame becomes a planning sample whose answer is
what the expert would drive from exactly that state: a copy of the world with the ego handed to the
rule-based expert, stepped HORIZON_S ahead (`HighwayWorld.expert_rollout`). With probability `beta` the
expert's plan is executed instead of the policy's (the DAgger mixture; 0 = the policy always drives).

Stationary stretches are trimmed as `wam-diff data` trims them when `--wait-keep-s` is given: a drive
that ends stuck (the policy blocked, and the expert's rollout from there often blocked too) keeps only
its first seconds, and a wait the ego drives off from keeps its first --wait-keep-s and its last
--wait-lead-s. Without it every labelled tick is kept: one untrimmed DAgger set drew 97 % of its
intersection "stop" labels from such stuck stretches, and a model trained on them stopped at every
junction. With --keep-departures a trimmed stretch still keeps every sample whose expert label drives off
(the controller would move on it): where the policy stands still while the expert would go (an empty
roundabout that model waited at for 30 s), those labels are the lesson DAgger is for. The parts keep
every sample; the trimming happens when train.json is merged, so a rerun with another setting re-merges
without driving again.

Only routes of the training split are driven (the split `wam-diff data` assigns by route seed, so the
held-out routes stay unseen), with seed offsets that change their traffic. Output follows `wam-diff
data`: OUT/parts/<route>.json per finished route (a rerun resumes), OUT/train.json, OUT/stats.json with
the drives' own Bench2Drive summary, and OUT/images/.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import FRAME_SIZE, HORIZON_S, IMAGE_PLACEHOLDER, REPLAN_EVERY
from ..decoding.options import add_decoding_arguments, decoding_arguments
from ..eval import bench2drive
from ..types import Plan
from .closed_loop import run_route
from .datagen import (DATASOURCE, STUCK_KEEP_S, VAL_FRACTION, add_split_arguments, add_wait_arguments, merge_parts,
                      pending_routes, training_copies, waiting_keep, write_part)
from .jobs import add_progress_argument, route_jobs
from .policies import expert_plan, safe_plan
from .routes import (Route, add_frame_size_argument, add_selection_arguments, load_routes, parse_seed_offsets,
                     resolve_frame_size, select_routes)

DEFAULT_SEED_OFFSETS = (3000, 4000)  # `wam-diff data` recipes use 0, 1000, 2000


def planning_sample(out_dir: Path, route: Route, tick: int, dt: float, frame: np.ndarray, ego, command: str,
                    label: np.ndarray, source: str, suffix: str = "", target=None, **meta) -> dict:
    """One planning sample in the dataset format (docs/architecture.md): saves the frame as
    OUT/images/<route>/<tick><suffix>.png and asks the planning question (with the route target point `target`
    when the world has one) with `label` as the answer; `source` and `meta` go into its meta."""
    from PIL import Image

    from ..codec import format_trajectory
    from ..prompts import planning_prompt

    rel = f"images/{route.route_id}/{tick:04d}{suffix}.png"
    (Path(out_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(frame).save(Path(out_dir) / rel, compress_level=1)
    return {
        "id": f"{route.route_id}_{tick:04d}{suffix}_plan", "datasource": DATASOURCE, "task": "planning", "image": [rel],
        "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{planning_prompt(ego, command, target)}"},
                          {"from": "gpt", "value": format_trajectory(label)}],
        "meta": {"route_id": route.route_id, "scenario": route.scenario, "seed": route.seed, "tick": tick,
                 "t": round(tick * dt, 3), "split": "train", "command": command,
                 "ego": [ego.vx, ego.vy, ego.ax, ego.ay, ego.yaw_rate], "source": source,
                 "frame_size": [int(frame.shape[1]), int(frame.shape[0])], **meta}}


class DaggerPolicy:
    """Wraps a policy: every plan call records (frame, ego, command, expert rollout) as a planning
    sample and returns the policy's plan, or with probability `beta` the expert's."""

    needs_images = True
    drives_itself = False

    def __init__(self, inner, route: Route, out_dir: Path, beta: float = 0.0, seed: int = 0):
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta {beta}: expected a probability in [0, 1]")
        self.inner, self.route, self.out_dir, self.beta = inner, route, Path(out_dir), float(beta)
        if getattr(inner, "route_target_scenarios", None):  # the world states targets as for the policy it wraps
            self.route_target_scenarios = inner.route_target_scenarios
        self.rng = np.random.default_rng(seed)
        self.world = None
        self.samples: list[dict] = []
        self.expert_crashed = 0
        self.expert_steps = 0
        self.label_s = 0.0

    def bind(self, world) -> None:
        self.world = world

    def plan(self, images, ego, command: str, target=None) -> Plan:
        world = self.world
        k = world._ticks
        t0 = time.perf_counter()
        label, crashed = expert_plan(world)
        self.label_s += time.perf_counter() - t0
        self.expert_crashed += int(crashed)
        if images:
            self.samples.append(planning_sample(self.out_dir, self.route, k, world.dt, images[0], ego, command, label, target=target,
                                                source="dagger", expert_crashed=bool(crashed)))
        if self.beta > 0.0 and self.rng.random() < self.beta:
            self.expert_steps += 1
            return Plan(trajectory=label, valid=True)
        return safe_plan(self.inner, images, ego, command, target)


def label_departs(sample: dict) -> bool:
    """Whether a planning sample's answer drives off: the controller's target speed on it (the mean over
    its first segments) reaches the speed below which the controller holds a stop."""
    from ..codec import ParseError, parse_trajectory
    from ..control import ControllerConfig, target_speed

    label = parse_trajectory(sample["conversations"][1]["value"])
    if isinstance(label, ParseError):
        return False
    cfg = ControllerConfig()
    return target_speed(label, cfg.speed_from_waypoints) >= cfg.stop_speed_mps


def trim_waits(part: dict, wait_keep_s: float, wait_lead_s: float = HORIZON_S,
               keep_departures: bool = False) -> tuple[list[dict], int]:
    """A part's samples without the long stationary stretches (`datagen.waiting_keep` over the sampled
    ticks, the ego's speed from each sample's meta): (kept samples in time order, samples dropped).
    `keep_departures`: samples whose label drives off (`label_departs`) are kept wherever they are."""
    if not wait_keep_s >= 0:
        raise ValueError(f"wait_keep_s {wait_keep_s}: expected seconds >= 0")
    samples = sorted(part["samples"], key=lambda s: s["meta"]["t"])
    if not samples:
        return [], 0
    speeds = np.array([math.hypot(s["meta"]["ego"][0], s["meta"]["ego"][1]) for s in samples])
    times = np.array([s["meta"]["t"] for s in samples])
    ended = part["completed"] or part["crashed"]  # a crash ends a drive, as in `wam-diff data`
    keep = waiting_keep(speeds, times, ended, stuck_keep_s=min(STUCK_KEEP_S, wait_keep_s), wait_keep_s=wait_keep_s,
                        lead_s=wait_lead_s)
    if keep_departures:
        keep |= np.array([label_departs(s) for s in samples])
    return [s for s, k in zip(samples, keep) if k], int((~keep).sum())


def _trimmed(part: dict, wait_keep_s: float, wait_lead_s: float, keep_departures: bool = False) -> dict:
    """The part as merged with --wait-keep-s: one labelled plan per frame, so frames follow the samples."""
    samples, dropped = trim_waits(part, wait_keep_s, wait_lead_s, keep_departures)
    return part | {"samples": samples, "frames": len(samples), "waiting_ticks_dropped": dropped}


# ---------------------------------------------------------------- one route, workers
def collect_route(route: Route, policy, out_dir: Path, beta: float = 0.0, frame_size=FRAME_SIZE,
                  every: int = REPLAN_EVERY, seed: int = 0) -> dict:
    """Drive one route with `policy`, labelling every planning tick; write OUT/parts/<route_id>.json."""
    out_dir = Path(out_dir)
    dag = DaggerPolicy(policy, route, out_dir, beta=beta, seed=seed)
    rec = run_route(route, dag, frame_size=frame_size, replan_every=every)
    part = {"route": route.to_dict(), "split": "train", "crashed": rec["status"] == "Failed - collision",
            "completed": rec["status"] == "Completed", "status": rec["status"], "score": rec["score"],
            "ticks": rec["ticks"], "frames": len(dag.samples), "samples": dag.samples, "scenes": [],
            "expert_crashed": dag.expert_crashed, "expert_steps": dag.expert_steps,
            "invalid_plans": rec["invalid_plans"], "wall_s": rec["wall_s"], "label_s": round(dag.label_s, 3),
            "record": rec}  # the drive's own closed-loop record, scored in stats.json
    write_part(out_dir, route.route_id, part)
    return {k: v for k, v in part.items() if k not in ("samples", "scenes", "record")} | {"num_samples": len(dag.samples)}


def _worker(route_dict: dict, policy_spec: str, device: str, out_dir: str, beta: float, frame_size, every: int,
            decoding: Optional[dict]) -> dict:
    from .policies import cached_policy

    route = Route(**route_dict)
    return collect_route(route, cached_policy(policy_spec, device, decoding), Path(out_dir), beta=beta,
                         frame_size=frame_size, every=every, seed=route.seed)


def _samples_postfix(done: list) -> dict:
    return {"samples": sum(r["num_samples"] for r in done)}


def collect(routes: list[Route], policy_spec: str, out_dir: Path, *, seed_offsets=DEFAULT_SEED_OFFSETS,
            val_fraction: float = VAL_FRACTION, beta: float = 0.0, frame_size=FRAME_SIZE, every: int = REPLAN_EVERY, workers: int = 1,
            device: str = "cpu", decoding: Optional[dict] = None, progress: bool = True,
            split_over: Optional[list[Route]] = None, wait_keep_s: Optional[float] = None,
            wait_lead_s: float = HORIZON_S, keep_departures: bool = False) -> dict:
    """Drive the training-split routes (once per seed offset) and write the DAgger dataset. The split is
    drawn over `split_over` (the whole suite; default: `routes`). With `wait_keep_s`, stationary stretches
    are trimmed when the dataset is merged (`trim_waits`; `keep_departures` as there). `decoding`: DecoderConfig
    fields the policy decodes with on top of its checkpoint's own."""
    if every < 1:
        raise ValueError(f"every {every}: expected a whole number of ticks >= 1")
    if wait_keep_s is not None and not wait_keep_s >= 0:
        raise ValueError(f"wait_keep_s {wait_keep_s}: expected seconds >= 0")
    out_dir = Path(out_dir)
    driven, held_out = training_copies(routes, val_fraction, seed_offsets, split_over)
    todo = pending_routes(out_dir, driven)
    t0 = time.perf_counter()
    args = [(r.to_dict(), policy_spec, device, str(out_dir), beta, tuple(frame_size), every, decoding or None)
            for r in todo]
    done = [res for res in route_jobs(_worker, args, workers, desc=f"dagger {policy_spec}" if progress else None,
                                      total=len(driven), postfix=_samples_postfix) if res is not None]
    generated = sum(res["num_samples"] for res in done)
    wall = time.perf_counter() - t0
    stats = merge_parts(out_dir, driven, wall, generated,
                        select=None if wait_keep_s is None else partial(_trimmed, wait_keep_s=wait_keep_s,
                                                                          wait_lead_s=wait_lead_s,
                                                                          keep_departures=keep_departures))
    parts = [json.loads(p.read_text()) for r in driven if (p := out_dir / "parts" / f"{r.route_id}.json").is_file()]
    drives = bench2drive.summarize([p["record"] for p in parts], expected_route_ids=[r.route_id for r in driven])
    stats.update({
        "policy": policy_spec, "policy_overrides": decoding or {}, "beta": beta, "every": every,
        "seed_offsets": list(seed_offsets), "held_out_routes": held_out,
        "wait_keep_s": wait_keep_s, "wait_lead_s": wait_lead_s if wait_keep_s is not None else None,
        "keep_departures": bool(keep_departures and wait_keep_s is not None),
        "expert_crashed_labels": int(sum(p["expert_crashed"] for p in parts)),
        "expert_executed_plans": int(sum(p["expert_steps"] for p in parts)),
        "label_s": round(sum(p["label_s"] for p in parts), 2),
        "drives": {k: drives[k] for k in ("driving_score", "success_rate", "abilities", "num_routes") if k in drives},
        "statuses": {p["route"]["route_id"]: p["status"] for p in parts},
    })
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


# ---------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="checkpoint path or preset that drives")
    parser.add_argument("--out", required=True, help="dataset directory")
    add_selection_arguments(parser)
    add_split_arguments(parser, DEFAULT_SEED_OFFSETS, ", unlike the expert data")
    parser.add_argument("--beta", type=float, default=0.0, help="probability that a plan is the expert's (0..1)")
    parser.add_argument("--every", type=int, default=REPLAN_EVERY,
                        help="ticks between plans; each plan is one labelled sample")
    add_frame_size_argument(parser)
    parser.add_argument("--workers", type=int, default=1)
    add_wait_arguments(parser, "default: keep every labelled tick")
    parser.add_argument("--keep-departures", action="store_true",
                        help="with --wait-keep-s: keep every sample whose expert label drives off, trimmed stretch or not")
    add_progress_argument(parser)
    add_decoding_arguments(parser)


def run(args) -> int:
    routes = select_routes(args)
    if not routes:
        print("no routes selected")
        return 2
    offsets, (w, h) = parse_seed_offsets(args.seed_offsets), resolve_frame_size(args.frame_size, args.policy)
    stats = collect(routes, args.policy, Path(args.out), seed_offsets=offsets, val_fraction=args.val_fraction,
                    beta=args.beta, frame_size=(w, h), every=args.every, workers=args.workers, device=args.device,
                    decoding=decoding_arguments(args), progress=not args.no_progress, split_over=load_routes(args.routes),
                    wait_keep_s=args.wait_keep_s, wait_lead_s=args.wait_lead_s,
                    keep_departures=args.keep_departures)
    print(json.dumps({k: stats[k] for k in ("samples", "routes", "drives", "expert_crashed_labels",
                                             "expert_executed_plans", "wall_s", "label_s")}, indent=2))
    return 0
