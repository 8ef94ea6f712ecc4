"""`wam-diff data`: planning, detection and driving-QA datasets from the embedded world.

The expert drives each route; every `--every` ticks a frame becomes samples of three tasks that
share its image:
  planning  - prompt with ego state and command; answer = the expert's actual next NUM_WAYPOINTS
              positions at WAYPOINT_DT_S in the ego frame (so frames need 4 s of future);
  detection - Qwen3-VL grounding JSON of the vehicles in view (0..1000 scale);
  qa        - questions answered from world state (lead vehicle, lane occupancy, next action...).
Samples follow docs/architecture.md (`id, datasource, task, image, conversations`, `<image>` in the human
turn) plus a `meta` dict. Splits go by route seed, never by frame. Each finished route is written to
OUT/parts/ so a rerun resumes; the merged OUT/train.json, OUT/val.json, OUT/scenes_val.jsonl (PDM
scenes of held-out planning frames) and OUT/stats.json are rebuilt at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import BLOCKED_SPEED_MPS, FRAME_SIZE, HORIZON_S, IMAGE_PLACEHOLDER, NUM_WAYPOINTS, WAYPOINT_DT_S
from ..errors import UsageError
from .jobs import add_progress_argument, route_jobs
from .routes import (Route, add_frame_size_argument, add_selection_arguments, parse_frame_size, parse_seed_offsets,
                     select_routes, suite_version, with_seed_offsets)

DATASOURCE = "wam-diff-highway"
# An expert run that ends stationary short of its target (blocked behind a deadlock, or timed out)
# teaches "stay stopped forever": of its final stationary stretch only the first STUCK_KEEP_S are kept.
STUCK_KEEP_S = 3.0
VAL_FRACTION = 0.2  # share of route seeds held out per scenario (the default split of every dataset)
LEAD_RANGE_M = 100.0
FREE_LANE_BEHIND_M = 10.0
FREE_LANE_AHEAD_M = 30.0


def waiting_keep(speeds: np.ndarray, times: np.ndarray, completed: bool, stuck_keep_s: float = STUCK_KEEP_S,
                 wait_keep_s: Optional[float] = None, lead_s: float = HORIZON_S) -> np.ndarray:
    """Which ticks may become frames, judged by stationary stretches (speed < BLOCKED_SPEED_MPS).
    A stretch that lasts to the end of a run that did not complete keeps only its first stuck_keep_s.
    With wait_keep_s set, a stretch the ego drives off from keeps its first wait_keep_s and its last
    lead_s (whose futures show the start), so long waits do not drown the rare starts. A policy
    without memory sees the same scene at every tick of a wait: a short lead_s teaches it to start
    when it is stopped, a long one to wait."""
    speeds, times = np.asarray(speeds, dtype=float), np.asarray(times, dtype=float)
    keep = np.ones(speeds.shape, dtype=bool)
    stopped = speeds < BLOCKED_SPEED_MPS
    i, n = 0, len(speeds)
    while i < n:
        if not stopped[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and stopped[j + 1]:
            j += 1
        t = times[i:j + 1]
        if j == n - 1 and not completed:
            keep[i:j + 1] = t <= times[i] + stuck_keep_s
        elif wait_keep_s is not None and j < n - 1:
            keep[i:j + 1] = (t <= times[i] + wait_keep_s) | (t >= times[j + 1] - lead_s)
        i = j + 1
    return keep


def training_copies(routes: list[Route], val_fraction: float, seed_offsets, split_over=None) -> tuple[list[Route], list[str]]:
    """The training-split routes of `routes`, once per seed offset (`with_seed_offsets`), and the held-out
    route ids among `routes`. The split is drawn over `split_over` (the whole suite; default: `routes`),
    so a selection (--ids) never drives a route `wam-diff data` holds out."""
    splits = {r.route_id: "train" for r in routes} | assign_splits(list(split_over or routes), val_fraction)
    driven, _ = with_seed_offsets([r for r in routes if splits[r.route_id] == "train"], list(seed_offsets))
    return driven, sorted(r.route_id for r in routes if splits[r.route_id] == "val")


def pending_routes(out_dir: Path, routes: list[Route]) -> list[Route]:
    """The routes without a part in OUT/parts yet (a rerun resumes there); creates OUT."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return [r for r in routes if not (Path(out_dir) / "parts" / f"{r.route_id}.json").is_file()]


def _seed_rank(seed: int) -> int:
    return int(hashlib.sha256(f"seed-{seed}".encode()).hexdigest()[:8], 16)


def assign_splits(routes: list[Route], val_fraction: float) -> dict[str, str]:
    """route_id -> 'train' | 'val', by route seed (never by frame): within each scenario type the
    round(val_fraction x n) routes (at least one when val_fraction > 0) with the smallest seed hash
    are held out, so every scenario is represented in both splits."""
    by_scen: dict[str, list[Route]] = {}
    for r in routes:
        by_scen.setdefault(r.scenario, []).append(r)
    out = {}
    for rs in by_scen.values():
        n_val = 0 if val_fraction <= 0 else max(1, int(round(val_fraction * len(rs))))
        if len(rs) == 1 and val_fraction < 0.5:
            n_val = 0
        ranked = sorted(rs, key=lambda r: (_seed_rank(r.seed), r.route_id))
        for i, r in enumerate(ranked):
            out[r.route_id] = "val" if i < n_val else "train"
    return out


# ---------------------------------------------------------------- QA from world state
def _lane_vehicles(tick, offset: int):
    return [v for v in tick.vehicles if v.lane_offset == offset]


def _lead(tick):
    ahead = [v for v in tick.vehicles if v.same_lane and 0.0 < v.xy[0] <= LEAD_RANGE_M]
    return min(ahead, key=lambda v: v.xy[0]) if ahead else None


def _lane_free(tick, offset: int) -> Optional[bool]:
    """None when there is no such lane; else whether no vehicle is in it near the ego."""
    if tick.lane_count <= 1:
        return None
    target = tick.lane_id + offset  # lane ids count from the right-most lane
    if target < 0 or target >= tick.lane_count:
        return None
    occupied = [v for v in _lane_vehicles(tick, offset) if -FREE_LANE_BEHIND_M <= v.xy[0] <= FREE_LANE_AHEAD_M]
    return not occupied


def next_action(future: np.ndarray, speed: float, command: str) -> str:
    """What the expert does next, from its own 4 s future (NUM_WAYPOINTS, 2) in the ego frame."""
    end = future[-1]
    heading = math.atan2(future[-1, 1] - future[-2, 1], future[-1, 0] - future[-2, 0]) if np.linalg.norm(future[-1] - future[-2]) > 0.2 else 0.0
    if command in ("turn left", "turn right") and abs(heading) > math.radians(30):
        return command
    if end[1] > 2.0 and abs(heading) < math.radians(30):
        return "change lane left"
    if end[1] < -2.0 and abs(heading) < math.radians(30):
        return "change lane right"
    v_end = np.linalg.norm(future[-1] - future[-2]) / WAYPOINT_DT_S
    if v_end < 0.5 and speed < 1.0:
        return "stay stopped"
    if v_end < 0.5:
        return "stop"
    if v_end < speed - 2.0:
        return "slow down"
    if v_end > speed + 2.0:
        return "speed up"
    return "keep lane"


def qa_pairs(tick, future: np.ndarray) -> list[tuple[str, str, str]]:
    """(kind, question, answer) pairs for one frame."""
    out = []
    lead = _lead(tick)
    ahead_in_lane = [v for v in tick.vehicles if v.same_lane and 0.0 < v.xy[0] <= 50.0]
    out.append(("count_ahead", "How many vehicles are ahead of me in my lane within 50 m?", str(len(ahead_in_lane))))
    if lead is not None:
        gap = lead.xy[0] - (lead.length + 5.0) / 2.0
        out.append(("lead_distance", "How far is the vehicle ahead of me in my lane?", f"{max(gap, 0.0):.0f} m"))
    else:
        out.append(("lead_distance", "How far is the vehicle ahead of me in my lane?",
                    f"no vehicle ahead in my lane within {LEAD_RANGE_M:.0f} m"))
    for side, off in (("left", 1), ("right", -1)):
        free = _lane_free(tick, off)
        ans = f"no, there is no lane to the {side}" if free is None else ("yes" if free else "no")
        out.append((f"{side}_free", f"Is the lane to my {side} free?", ans))
    out.append(("visible_count", "How many vehicles are visible?", str(len(tick.detections))))
    out.append(("next_action", "What should I do next?", next_action(future, tick.ego.speed, tick.command)))
    return out


# ---------------------------------------------------------------- one route
def _pdm_scene(tick, lanes, future: np.ndarray, agent_futures: dict) -> dict:
    agents = []
    for v in tick.vehicles:
        if math.hypot(*v.xy) > 80.0:
            continue
        agents.append({"xy": list(v.xy), "heading": v.heading, "velocity": list(v.velocity), "length": v.length,
                       "width": v.width, "future": agent_futures.get(v.vid)})
    return {"ego_speed": tick.ego.speed, "agents": agents,
            "lanes": [{"centre": np.round(l["centre"], 2).tolist(), "width": l["width"]} for l in lanes],
            "reference_progress": float(future[-1, 0])}


def _expert_ticks(route: Route, frame_size, every: int) -> tuple[float, list, dict]:
    """The expert drives `route` to its end (`route_over`): (tick length s, every tick, tick -> lanes at the
    sampled ticks, the only ones whose frames are rendered)."""
    from .highway import HighwayWorld, route_over

    world = HighwayWorld(route, frame_size=frame_size, driver="expert", render=True)
    ticks, lanes_at = [world.reset()], {0: world.lanes_gt()}
    while True:
        tick = world.step(frame=len(ticks) % every == 0)  # only the sampled ticks' frames are read
        k = len(ticks)
        ticks.append(tick)
        if k % every == 0:
            lanes_at[k] = world.lanes_gt()
        if route_over(route, tick):
            break
    world.close()
    return world.dt, ticks, lanes_at


def _agent_futures(ticks: list, k: int, step_ticks: int, pose) -> dict:
    """vehicle id -> its logged future in tick k's ego frame (NUM_WAYPOINTS x [x, y, heading]), for the PDM
    score; vehicles that leave the view within the horizon are left out."""
    from .highway import world_to_ego

    agent_fut = {}
    for v in ticks[k].vehicles:
        pts = []
        for j in range(1, NUM_WAYPOINTS + 1):
            later = next((u for u in ticks[k + j * step_ticks].vehicles if u.vid == v.vid), None)
            if later is None:
                break
            # later.xy is in the later ego frame: back to world, then into this frame
            lp = np.array(ticks[k + j * step_ticks].pose)
            c, s = math.cos(lp[2]), math.sin(lp[2])
            w = np.array([lp[0] + c * later.xy[0] - s * later.xy[1], lp[1] + s * later.xy[0] + c * later.xy[1]])
            e = world_to_ego(w, pose[0], pose[1])
            pts.append([float(e[0]), float(e[1]), float(later.heading + lp[2] - pose[1])])
        if len(pts) == NUM_WAYPOINTS:
            agent_fut[v.vid] = pts
    return agent_fut


def _frame_samples(route: Route, tk, k: int, rel: str, future: np.ndarray, split: str, tasks) -> list[dict]:
    """The samples of one frame (image `rel`, the expert's `future` in its ego frame), one per task asked for."""
    from ..codec import format_detections, format_trajectory
    from ..prompts import detection_prompt, planning_prompt, qa_prompt

    meta = {"route_id": route.route_id, "scenario": route.scenario, "seed": route.seed, "tick": k, "t": tk.t,
            "split": split, "command": tk.command, "ego": [tk.ego.vx, tk.ego.vy, tk.ego.ax, tk.ego.ay, tk.ego.yaw_rate],
            # the other vehicles in view, boxes in the frame's pixels (the perception loss of wam_diff_training/perception.py)
            "frame_size": [int(tk.frame.shape[1]), int(tk.frame.shape[0])],
            "boxes_px": [[round(float(c), 1) for c in d.box_px] for d in tk.detections]}
    base = f"{route.route_id}_{k:04d}"
    samples = []
    if "planning" in tasks:
        samples.append({"id": f"{base}_plan", "datasource": DATASOURCE, "task": "planning", "image": [rel],
                        "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{planning_prompt(tk.ego, tk.command, tk.route_target)}"},
                                          {"from": "gpt", "value": format_trajectory(future)}],
                        "meta": meta})
    if "detection" in tasks:
        samples.append({"id": f"{base}_det", "datasource": DATASOURCE, "task": "detection", "image": [rel],
                        "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{detection_prompt()}"},
                                          {"from": "gpt", "value": format_detections(tk.detections)}],
                        "meta": meta})
    if "qa" in tasks:
        for kind, q, a in qa_pairs(tk, future):
            samples.append({"id": f"{base}_qa_{kind}", "datasource": DATASOURCE, "task": "qa", "image": [rel],
                            "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{qa_prompt(q)}"},
                                              {"from": "gpt", "value": a}],
                            "meta": {**meta, "qa_kind": kind}})
    return samples


def generate_route(route: Route, out_dir: Path, every: int = 5, frame_size=FRAME_SIZE, split: str = "train",
                   tasks=("planning", "detection", "qa"), wait_keep_s: Optional[float] = None,
                   wait_lead_s: float = HORIZON_S) -> dict:
    """Drive one route with the expert and write its samples to OUT/parts/<route_id>.json."""
    from PIL import Image

    from .highway import world_to_ego

    t0 = time.perf_counter()
    dt, ticks, lanes_at = _expert_ticks(route, frame_size, every)
    horizon = int(round(HORIZON_S / dt))
    step_ticks = int(round(WAYPOINT_DT_S / dt))
    crashed = ticks[-1].collision
    completed = ticks[-1].progress_m >= route.target_distance_m
    keep = waiting_keep(np.array([t.ego.speed for t in ticks]), np.array([t.t for t in ticks]), completed or crashed,
                        stuck_keep_s=STUCK_KEEP_S if wait_keep_s is None else min(STUCK_KEEP_S, wait_keep_s),
                        wait_keep_s=wait_keep_s, lead_s=wait_lead_s)
    img_dir = out_dir / "images" / route.route_id
    img_dir.mkdir(parents=True, exist_ok=True)
    samples, scenes = [], []
    # frames with a full 4 s future, and none of it after a crash
    last = len(ticks) - 1 - horizon
    for k in range(0, last + 1, every):
        tk = ticks[k]
        if tk.frame is None or tk.collision or not keep[k]:
            continue
        pose = np.array(tk.pose[:2]), tk.pose[2]
        fut_world = np.array([ticks[k + j * step_ticks].pose[:2] for j in range(1, NUM_WAYPOINTS + 1)])
        future = world_to_ego(fut_world, pose[0], pose[1])
        rel = f"images/{route.route_id}/{k:04d}.png"
        Image.fromarray(tk.frame).save(out_dir / rel, compress_level=1)
        samples += _frame_samples(route, tk, k, rel, future, split, tasks)
        if "planning" in tasks and split == "val":
            # agents' logged futures in this frame's ego frame, for the PDM score
            scenes.append({"id": f"{route.route_id}_{k:04d}_plan",
                           **_pdm_scene(tk, lanes_at.get(k, []), future, _agent_futures(ticks, k, step_ticks, pose))})
    part = {"route": route.to_dict(), "split": split, "crashed": crashed, "completed": completed,
            "waiting_ticks_dropped": int((~keep[:last + 1]).sum()) if last >= 0 else 0, "ticks": len(ticks),
            "frames": len({s["image"][0] for s in samples}), "samples": samples, "scenes": scenes,
            "wall_s": round(time.perf_counter() - t0, 3)}
    write_part(out_dir, route.route_id, part)
    return {k: v for k, v in part.items() if k not in ("samples", "scenes")} | {"num_samples": len(samples)}


def write_part(out_dir: Path, route_id: str, part: dict) -> None:
    """OUT/parts/<route_id>.json, written atomically: a killed run never leaves half a part."""
    pdir = Path(out_dir) / "parts"
    pdir.mkdir(parents=True, exist_ok=True)
    tmp = pdir / f"{route_id}.json.tmp"
    tmp.write_text(json.dumps(part))
    tmp.replace(pdir / f"{route_id}.json")


def _worker(route_dict, out_dir, every, frame_size, split, tasks, wait_keep_s, wait_lead_s):
    return generate_route(Route(**route_dict), Path(out_dir), every, frame_size, split, tasks, wait_keep_s, wait_lead_s)


def merge_parts(out_dir: Path, routes: list[Route], wall_s: float, generated_samples: int,
                select=None) -> dict:
    """Merge OUT/parts into train.json / val.json / scenes_val.jsonl; write and return the statistics.
    `select(part) -> part`, when given, rewrites each part as read (its samples, frames and
    waiting_ticks_dropped) before it is merged; the part on disk keeps every sample, so a rerun with
    another selection needs no new drive."""
    split_samples = {"train": [], "val": []}
    scenes = []
    per_scenario, per_task, commands, qa_kinds, next_actions = Counter(), Counter(), Counter(), Counter(), Counter()
    frames = Counter()
    crashed, waiting = [], {}
    for r in routes:
        p = out_dir / "parts" / f"{r.route_id}.json"
        if not p.is_file():
            continue
        part = json.loads(p.read_text())
        if part["crashed"]:
            crashed.append(r.route_id)
        if select is not None:
            part = select(part)
        if part.get("waiting_ticks_dropped"):
            waiting[r.route_id] = part["waiting_ticks_dropped"]
        split_samples[part["split"]].extend(part["samples"])
        scenes.extend(part["scenes"])
        frames[part["split"]] += part["frames"]
        for s in part["samples"]:
            per_task[f"{part['split']}/{s['task']}"] += 1
            per_scenario[r.scenario] += 1
            if s["task"] == "planning":
                commands[s["meta"]["command"]] += 1
            if s["task"] == "qa":
                qa_kinds[s["meta"]["qa_kind"]] += 1
                if s["meta"]["qa_kind"] == "next_action":
                    next_actions[s["conversations"][1]["value"]] += 1
    for split, samples in split_samples.items():
        (out_dir / f"{split}.json").write_text(json.dumps(samples))
    with open(out_dir / "scenes_val.jsonl", "w") as f:
        for s in scenes:
            f.write(json.dumps(s) + "\n")
    stats = {
        "suite": suite_version(), "routes": len(routes), "routes_crashed": crashed,
        "waiting_ticks_dropped": waiting,
        "samples": {k: len(v) for k, v in split_samples.items()}, "frames": dict(frames),
        "per_task": dict(sorted(per_task.items())), "per_scenario": dict(sorted(per_scenario.items())),
        "commands": dict(commands.most_common()), "qa_kinds": dict(qa_kinds.most_common()),
        "next_actions": dict(next_actions.most_common()),
        "wall_s": round(wall_s, 2), "generated_samples": generated_samples,
        "samples_per_s": round(generated_samples / wall_s, 2) if wall_s > 0 else None,
    }
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def generate(routes: list[Route], out_dir: Path, workers: int = 1, every: int = 5, frame_size=FRAME_SIZE,
             val_fraction: float = VAL_FRACTION, tasks=("planning", "detection", "qa"), progress: bool = True,
             seed_offsets=(0,), wait_keep_s: Optional[float] = None,
             wait_lead_s: float = HORIZON_S) -> dict:
    """The dataset of `routes` (once per seed offset, each copy in its route's split) in OUT: the parts of the
    routes not written yet, then the merged splits and statistics (`merge_parts`), which it returns."""
    out_dir = Path(out_dir)
    base_splits = assign_splits(routes, val_fraction)
    routes, base = with_seed_offsets(routes, list(seed_offsets))
    splits = {rid: base_splits[b] for rid, b in base.items()}
    todo = pending_routes(out_dir, routes)
    t0 = time.perf_counter()
    args = [(r.to_dict(), str(out_dir), every, tuple(frame_size), splits[r.route_id], tuple(tasks), wait_keep_s,
             wait_lead_s)
            for r in todo]
    done = [res for res in route_jobs(_worker, args, workers, desc="data" if progress else None, total=len(routes),
                                      postfix=lambda d: {"samples": sum(r["num_samples"] for r in d)})
            if res is not None]
    generated = sum(r["num_samples"] for r in done)
    return merge_parts(out_dir, routes, time.perf_counter() - t0, generated)


def add_split_arguments(parser: argparse.ArgumentParser, seed_offsets: tuple[int, ...], note: str = "") -> None:
    """--seed-offsets and --val-fraction of the commands that drive copies of the suite's training routes."""
    parser.add_argument("--seed-offsets", default=",".join(str(o) for o in seed_offsets),
                        help=f"comma-separated traffic seed offsets per route (default: {','.join(map(str, seed_offsets))}{note})")
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION,
                        help="share of route seeds held out (as in `wam-diff data`); held-out routes are not driven")


def add_wait_arguments(parser: argparse.ArgumentParser, default_note: str) -> None:
    """--wait-keep-s and --wait-lead-s (`waiting_keep`) of the commands that write driving data."""
    parser.add_argument("--wait-keep-s", type=float, default=None,
                        help="of each stationary wait keep frames from its first N s only, and from its last "
                             "--wait-lead-s s when the ego drives off (balances waiting against starting); a run "
                             f"stuck at its end keeps its first min(3, N) s; {default_note}")
    parser.add_argument("--wait-lead-s", type=float, default=HORIZON_S,
                        help="with --wait-keep-s: seconds before the ego drives off that are kept (default 4)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="dataset directory")
    add_selection_arguments(parser)
    parser.add_argument("--every", type=int, default=5, help="sample a frame every N ticks (10 Hz)")
    parser.add_argument("--tasks", default="planning,detection,qa")
    parser.add_argument("--val-fraction", type=float, default=VAL_FRACTION, help="share of route seeds held out")
    add_frame_size_argument(parser, policy_default=False)
    parser.add_argument("--workers", type=int, default=1)
    add_progress_argument(parser)
    add_wait_arguments(parser, "default: keep every wait frame (a run stuck at its end keeps its first 3 s)")
    parser.add_argument("--seed-offsets", default="0",
                        help="comma-separated: drive every route once per offset, its traffic seeded with seed + offset "
                             "(copies keep their route's split)")


def run(args) -> int:
    routes = select_routes(args)
    tasks = tuple(t for t in args.tasks.split(",") if t)
    bad = [t for t in tasks if t not in ("planning", "detection", "qa")]
    if bad:
        raise UsageError(f"unknown tasks {bad}; expected planning, detection, qa")
    offsets, (w, h) = parse_seed_offsets(args.seed_offsets), parse_frame_size(args.frame_size)
    stats = generate(routes, Path(args.out), workers=args.workers, every=args.every, frame_size=(w, h),
                     val_fraction=args.val_fraction, tasks=tasks, seed_offsets=offsets, progress=not args.no_progress,
                     wait_keep_s=args.wait_keep_s, wait_lead_s=args.wait_lead_s)
    print(json.dumps(stats, indent=2))
    return 0
