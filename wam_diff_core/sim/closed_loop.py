"""`wam-diff drive`: closed-loop driving over the embedded route suite, Bench2Drive-style scoring.

Each route runs in a worker process: policy plan -> controller -> world, 10 Hz, until the route
is completed, the ego crashes, deviates from its route, is blocked, or times out. One JSON per
route (completion, infractions with time and kind, status, comfort and efficiency inputs) lands in
OUT/routes/, then OUT/summary.json and a printed table; chosen routes get a video with the plan drawn.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..constants import FRAME_SIZE, JUNCTION_SCENARIOS, NUM_WAYPOINTS, REPLAN_EVERY, WAYPOINT_DT_S
from ..eval import bench2drive
from ..model.settings import SCHEDULES, TEXT_LAYERS, steps_for_block
from ..control import ControllerConfig
from .routes import Route, add_frame_size_argument, add_selection_arguments, resolve_frame_size, select_routes, suite_version

ROUTE_DEVIATION_M = {"corridor": 6.0, "road": 3.0}   # junction routes: from the route; others: beyond the road edge
BLOCKED_AFTER_S = 30.0
BLOCKED_SPEED_MPS = 0.1


def shift_plan(traj: np.ndarray, age_s: float) -> np.ndarray:
    """A plan made `age_s` ago, re-timed: waypoint k is where the plan was at t_k + age (still in the
    frame the plan was made in). The last segment is extended at constant velocity."""
    knots_t = np.arange(NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    knots = np.vstack([[0.0, 0.0], traj])
    t = knots_t[1:] + age_s
    out = np.stack([np.interp(t, knots_t, knots[:, 0]), np.interp(t, knots_t, knots[:, 1])], axis=1)
    beyond = t > knots_t[-1]
    if beyond.any():
        v = (knots[-1] - knots[-2]) / WAYPOINT_DT_S
        out[beyond] = knots[-1] + np.outer(t[beyond] - knots_t[-1], v)
    return out


def _to_frame(points: np.ndarray, from_pose, to_pose) -> np.ndarray:
    """Points in the ego frame of `from_pose` (X, Y, yaw world) into the ego frame of `to_pose`."""
    from .highway import ego_to_world, world_to_ego

    w = ego_to_world(points, np.array(from_pose[:2]), from_pose[2])
    return world_to_ego(w, np.array(to_pose[:2]), to_pose[2])


def latency_ticks(seconds: float, dt: float) -> int:
    """Whole ticks a plan computed in `seconds` of wall time arrives after (0 for an instant policy)."""
    return max(0, math.ceil(seconds / dt - 1e-9))


def route_target_scenarios(policy) -> tuple[str, ...]:
    """The route types on which the world states a route target point for `policy`: its checkpoint's
    route_target_scenarios when it learned targets on some only (a policy attribute), else every junction type."""
    return tuple(getattr(policy, "route_target_scenarios", None) or JUNCTION_SCENARIOS)


def run_route(route: Route, policy, *, out_dir: Optional[Path] = None, video: bool = False,
              frame_size=FRAME_SIZE, replan_every: int = 1, controller_config=None, realtime: bool = False,
              stale_after_s: Optional[float] = None) -> dict:
    """Drive one route with a policy (a .plan(images, ego, command) object). Returns the route record.

    realtime: the world does not wait for the planner. A plan asked for at tick k from that tick's frame arrives
    `latency_ticks(measured wall time)` ticks later (the first plan of the route excepted: the planner is taken
    to be running before the route starts); until then the controller tracks the previous plan, aged from the tick
    it was asked for, and the next plan is asked for when this one has arrived and `replan_every` ticks have
    passed. Off (the default): every plan is applied at the tick it was asked for, as in a lockstep simulator.
    stale_after_s: the controller's limit on a plan's age (it brakes on older plans), in place of its config's."""
    from ..control import Controller
    from .highway import WHEELBASE_M, HighwayWorld
    from .policies import safe_plan

    drives_itself = bool(getattr(policy, "drives_itself", False))
    needs_images = bool(getattr(policy, "needs_images", True))
    world = HighwayWorld(route, frame_size=frame_size, driver="expert" if drives_itself else "policy",
                         render=needs_images or video, route_target_scenarios=route_target_scenarios(policy))
    if hasattr(policy, "bind"):
        policy.bind(world)
    config = controller_config or ControllerConfig(wheelbase_m=WHEELBASE_M)
    if stale_after_s is not None:
        config = dataclasses.replace(config, stale_after_s=float(stale_after_s))
    ctl = Controller(config)
    wall0 = time.perf_counter()
    tick = world.reset()
    corridor = world._corridor_route
    max_dev = ROUTE_DEVIATION_M["corridor" if corridor else "road"]
    infractions, frames = [], []
    speeds, lon, lat, yaw_rates, traffic = [], [], [], [], []
    frame_hash = hashlib.sha256()
    state_hash = hashlib.sha256()
    invalid_plans = 0
    plan_time = 0.0
    plan, plan_pose, plan_tick = None, None, -10 ** 9
    request_tick, pending = -10 ** 9, None  # pending: (Plan, pose, tick asked, tick it arrives)
    latencies: list[int] = []
    offroad_m, driven_m = 0.0, 0.0
    last_pose = tick.pose
    stopped_since = None
    status = None
    while True:
        k = world._ticks
        while True:  # a plan arriving now first, then the next one asked for (applied at once when it takes no ticks)
            if pending is not None and k >= pending[3]:
                p, plan_pose, plan_tick, _ = pending
                pending = None
                if not p.valid:
                    invalid_plans += 1
                    plan = None
                else:
                    plan = np.asarray(p.trajectory, dtype=np.float64)
            if pending is None and k - request_tick >= replan_every:
                t0 = time.perf_counter()
                p = safe_plan(policy, [tick.frame] if tick.frame is not None else [], tick.ego, tick.command,
                              tick.route_target)
                wall = time.perf_counter() - t0
                plan_time += wall
                lag = latency_ticks(wall, world.dt) if realtime and request_tick >= 0 else 0
                latencies.append(lag)
                pending, request_tick = (p, tick.pose, k, k + lag), k
                continue
            break
        traj_now = None
        if plan is not None:
            age = (k - plan_tick) * world.dt
            traj_now = plan if age == 0 else _to_frame(shift_plan(plan, age), plan_pose, tick.pose)
        if video and tick.frame is not None:
            from .video import draw_plan

            px = world.ego_to_pixels(np.vstack([[0.0, 0.0], traj_now])) if traj_now is not None else None
            frames.append(draw_plan(tick.frame, px, f"{route.route_id} t={tick.t:4.1f}s v={tick.ego.speed:4.1f} {tick.command}"))
        if tick.frame is not None:
            frame_hash.update(tick.frame.tobytes())
        # the next tick's frame is rendered only when it is read: by the video, or by the plan asked for then
        frame_next = video or (needs_images and (pending is None or k + 1 >= pending[3])
                               and k + 1 - request_tick >= replan_every)
        if drives_itself:
            tick = world.step(frame=frame_next)
        else:
            c = ctl.step(traj_now, tick.ego.speed, world.dt, plan_age_s=0.0 if plan is None else (k - plan_tick) * world.dt)
            tick = world.step(c.accel, c.steer, frame=frame_next)
        state_hash.update(np.asarray(world.snapshot()["vehicles"], dtype=np.float64).tobytes())
        # bookkeeping
        step_m = math.hypot(tick.pose[0] - last_pose[0], tick.pose[1] - last_pose[1])
        last_pose = tick.pose
        driven_m += step_m
        if tick.off_road:
            offroad_m += step_m
        speeds.append(tick.ego.speed)
        lon.append(tick.ego.ax)
        lat.append(tick.ego.ay)
        yaw_rates.append(tick.ego.yaw_rate)
        near = [math.hypot(*v.velocity) for v in tick.vehicles if math.hypot(*v.xy) < 50.0]
        if near:
            traffic.append(float(np.mean(near)))
        if tick.ego.speed < BLOCKED_SPEED_MPS:
            stopped_since = tick.t if stopped_since is None else stopped_since
        else:
            stopped_since = None
        if tick.collision:
            infractions.append({"kind": "collision_vehicle", "time_s": tick.t})
            status = "Failed - collision"
        elif tick.progress_m >= route.target_distance_m:
            status = "Completed"
        elif tick.route_deviation_m > max_dev:
            infractions.append({"kind": "route_deviation", "time_s": tick.t})
            status = "Failed - route deviation"
        elif stopped_since is not None and tick.t - stopped_since >= BLOCKED_AFTER_S:
            infractions.append({"kind": "agent_blocked", "time_s": tick.t})
            status = "Failed - agent blocked"
        elif tick.t >= route.time_limit_s - 1e-9:
            infractions.append({"kind": "route_timeout", "time_s": tick.t})
            status = "Failed - timeout"
        if status:
            break
    if driven_m > 0 and offroad_m > 0:
        infractions.append({"kind": bench2drive.OUTSIDE_LANES, "time_s": tick.t,
                            "pct": round(100.0 * offroad_m / driven_m, 3)})
    world.close()
    completion = 100.0 * min(tick.progress_m / route.target_distance_m, 1.0)
    rec = {
        **route.to_dict(),
        "abilities": list(route.abilities),
        "policy": getattr(policy, "name", type(policy).__name__),
        "status": status,
        "completion": round(max(completion, 0.0), 4),
        "infractions": infractions,
        "duration_s": round(tick.t, 3),
        "ticks": world._ticks,
        "invalid_plans": invalid_plans,
        "efficiency": {"ego_mean_speed": float(np.mean(speeds)) if speeds else 0.0,
                       "traffic_mean_speed": float(np.mean(traffic)) if traffic else 0.0},
        "comfort": {"dt": world.dt, "lon_accel": [round(v, 4) for v in lon], "lat_accel": [round(v, 4) for v in lat],
                    "yaw_rate": [round(v, 5) for v in yaw_rates]},
        "offroad_m": round(offroad_m, 3),
        "driven_m": round(driven_m, 3),
        "frame_hash": frame_hash.hexdigest() if needs_images or video else None,
        "state_hash": state_hash.hexdigest(),
        "wall_s": round(time.perf_counter() - wall0, 3),
        "plan_s": round(plan_time, 3),
        "plans": len(latencies),
    }
    if realtime:
        rec["realtime"] = {"latency_ticks_mean": round(float(np.mean(latencies)), 3) if latencies else 0.0,
                           "latency_ticks_max": int(max(latencies, default=0))}
    rec["score"] = bench2drive.route_score(rec["completion"], infractions)
    if video and frames and out_dir is not None:
        from .video import write_video

        rec["video"] = str(write_video(frames, Path(out_dir) / "videos" / f"{route.route_id}.mp4"))
    return rec


# ---------------------------------------------------------------- workers


@contextlib.contextmanager
def worker_threads(workers: int):
    """Spawned policy workers share the cores: unless OMP_NUM_THREADS is set, each gets cpu_count //
    workers torch threads (measured: two 2-thread workers on 2 cores drove the AR model 5 routes in 12
    min, one thread each 43 routes in 7.4 min)."""
    key = "OMP_NUM_THREADS"
    if workers <= 1 or key in os.environ:
        yield
        return
    os.environ[key] = str(max(1, (os.cpu_count() or 1) // workers))
    try:
        yield
    finally:
        os.environ.pop(key, None)


def _worker(route_dict: dict, policy_spec: str, device: str, out_dir: str, video: bool, frame_size, replan_every: int,
            overrides: Optional[dict] = None, realtime: bool = False, stale_after_s: Optional[float] = None) -> dict:
    from .policies import cached_policy

    route = Route(**route_dict)
    rec = run_route(route, cached_policy(policy_spec, device, overrides), out_dir=Path(out_dir), video=video,
                    frame_size=frame_size, replan_every=replan_every, realtime=realtime,
                    stale_after_s=stale_after_s)
    path = Path(out_dir) / "routes" / f"{route.route_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return rec


def route_jobs(worker, args: list[tuple], workers: int, *, desc: Optional[str] = None, total: Optional[int] = None,
               postfix: Optional[Callable[[list], dict]] = None):
    """worker(*a) for each job (a[0] is the route dict), in this process or a spawn pool of `workers`
    (one share of the cores each, `worker_threads`); yields each result as it finishes, None for a
    route whose worker crashed (reported: it costs its route, not the run). With `desc`: a progress bar
    over `total` routes (default: the jobs; more when some were done before), `postfix(results so far)`
    shown beside it."""
    bar = None
    if desc is not None:
        from tqdm import tqdm

        total = len(args) if total is None else total
        bar = tqdm(total=total, initial=total - len(args), desc=desc, unit="route")
    done = []  # the finished results, kept only for `postfix`
    try:
        for res in _run_jobs(worker, args, workers):
            if bar is not None:
                bar.update(1)
                if postfix is not None:
                    done += [res] if res is not None else []
                    bar.set_postfix(postfix(done))
            yield res
    finally:
        if bar is not None:
            bar.close()


def _run_jobs(worker, args: list[tuple], workers: int):
    if workers <= 1:
        for a in args:
            yield worker(*a)
        return
    with worker_threads(workers), \
            ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(worker, *a): a[0]["route_id"] for a in args}
        for f in as_completed(futs):
            try:
                yield f.result()
            except Exception as exc:
                print(f"route {futs[f]} failed in its worker: {type(exc).__name__}: {exc}")
                yield None


def drive_suite(routes: list[Route], policy_spec: str, out_dir: Path, workers: int = 1, video_ids=(),
                frame_size=FRAME_SIZE, replan_every: int = 1, device: str = "cpu", resume: bool = False,
                progress: bool = True, overrides: Optional[dict] = None, realtime: bool = False,
                stale_after_s: Optional[float] = None) -> dict:
    """Run routes (in `workers` processes), write per-route JSON and summary.json; return the summary.
    `overrides`: PolicyConfig fields for a learned policy (block_size, steps, ...)."""
    out_dir = Path(out_dir)
    (out_dir / "routes").mkdir(parents=True, exist_ok=True)
    records, todo = [], []
    for r in routes:
        p = out_dir / "routes" / f"{r.route_id}.json"
        if resume and p.is_file():
            records.append(json.loads(p.read_text()))
        else:
            todo.append(r)
    t0 = time.perf_counter()
    args = [(r.to_dict(), policy_spec, device, str(out_dir), r.route_id in set(video_ids), tuple(frame_size), replan_every,
             overrides, realtime, stale_after_s) for r in todo]
    records += [rec for rec in route_jobs(_worker, args, workers, desc=f"drive {policy_spec}" if progress else None)
                if rec is not None]
    summary = bench2drive.summarize(records, expected_route_ids=[r.route_id for r in routes])
    summary.update({
        "policy": policy_spec,
        "policy_overrides": overrides or {},
        "suite": suite_version(),
        "wall_s": round(time.perf_counter() - t0, 2),
        "workers": workers,
        "frame_size": [int(v) for v in frame_size],
        "replan_every": int(replan_every),
        "realtime": bool(realtime),
        "stale_after_s": stale_after_s,
        "plans": int(sum(r.get("plans", 0) for r in records)),
        "invalid_plans": int(sum(r.get("invalid_plans", 0) for r in records)),
        "videos": sorted(r["video"] for r in records if r.get("video")),
    })
    if realtime:
        lags = [r["realtime"]["latency_ticks_mean"] for r in records if r.get("realtime")]
        summary["latency_ticks_mean"] = round(float(np.mean(lags)), 3) if lags else None
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# ---------------------------------------------------------------- CLI
def policy_overrides(block_size: Optional[int], steps: Optional[int], number_order: Optional[bool] = None,
                     kinematic_envelope: Optional[bool] = None, schedule: Optional[str] = None,
                     forward_only: Optional[bool] = None, text_layers: Optional[str] = None) -> Optional[dict]:
    """PolicyConfig overrides from the command line; B = 1 always decodes one token per step."""
    out = {} if number_order is None else {"number_order": bool(number_order)}
    if text_layers is not None:
        out["text_layers"] = text_layers
    if kinematic_envelope is not None:
        out["kinematic_envelope"] = bool(kinematic_envelope)
    if forward_only is not None:
        out["forward_only"] = bool(forward_only)
    if schedule is not None:
        out["schedule"] = schedule
    if block_size is not None:
        out["block_size"] = block_size
        if steps is not None or block_size == 1:
            out["steps"] = steps_for_block(block_size, steps if steps is not None else 1)
    elif steps is not None:
        out["steps"] = steps
    return out or None


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --block-size, --steps, --number-order, --kinematic-envelope, --forward-only, --schedule,
    --text-layers: how every suite command runs a learned policy (see `policy_overrides`, `cli_overrides`)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--block-size", type=int, default=None,
                        help="learned policy: decode with this block size (default: the checkpoint's own)")
    parser.add_argument("--steps", type=int, default=None,
                        help="learned policy: denoising steps per block (default: the checkpoint's own)")
    parser.add_argument("--number-order", choices=("on", "off"), default=None,
                        help="learned policy: commit each trajectory number's digits most significant first "
                             "(default: the checkpoint's own, on when it does not say)")
    parser.add_argument("--kinematic-envelope", choices=("on", "off"), default=None,
                        help="learned policy: decode plans inside the kinematic envelope (default: on; "
                             "wam_diff_core/decoding/envelope.py)")
    parser.add_argument("--forward-only", choices=("on", "off"), default=None,
                        help="learned policy: the envelope also keeps plans from stepping back along the ego's "
                             "heading (default: the checkpoint's own, off when it does not say)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=None,
                        help="learned policy: how many positions each denoising step commits (default: the "
                             "checkpoint's own, linear when it does not say; wam_diff_core/decoding/remasking.py)")
    parser.add_argument("--text-layers", choices=TEXT_LAYERS, default=None,
                        help="learned policy: the model's text layers, or kernels.fast_layers' (the same plans, "
                             "faster; default: model)")


def cli_overrides(args) -> Optional[dict]:
    """`policy_overrides` of the options `add_decoding_arguments` added."""
    order = None if args.number_order is None else args.number_order == "on"
    envelope = None if args.kinematic_envelope is None else args.kinematic_envelope == "on"
    forward = None if args.forward_only is None else args.forward_only == "on"
    return policy_overrides(args.block_size, args.steps, order, envelope, args.schedule, forward, args.text_layers)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="expert | expert-plan | constant-velocity | checkpoint path or preset")
    parser.add_argument("--out", required=True, help="output directory (routes/*.json, summary.json, videos/)")
    add_selection_arguments(parser)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--video", default="", help="comma-separated route ids to render as video, or 'first'")
    add_frame_size_argument(parser)
    parser.add_argument("--replan-every", type=int, default=REPLAN_EVERY,
                        help=f"ticks between policy calls (10 Hz ticks; default {REPLAN_EVERY})")
    parser.add_argument("--seed-offsets", default="0",
                        help="comma-separated traffic seed offsets: every route once per offset (0: the suite's own "
                             "traffic; others: the same road and scenario with other traffic, ids <route>_s<offset>); "
                             "training data drove offsets 0-20000 (v18), so take others for a robustness check")
    parser.add_argument("--realtime", action="store_true",
                        help="the world does not wait for the planner: each plan arrives after its measured decode "
                             "time, rounded up to 10 Hz ticks, and the controller tracks the previous plan meanwhile "
                             "(results then depend on this machine's speed and load)")
    parser.add_argument("--stale-after-s", type=float, default=None,
                        help="the controller brakes on plans older than this (default: its config's, "
                             f"{ControllerConfig.stale_after_s:g} s)")
    add_decoding_arguments(parser)
    parser.add_argument("--resume", action="store_true", help="keep routes already written in OUT/routes")


def run(args) -> int:
    from .datagen import with_seed_offsets
    from .routes import parse_seed_offsets

    routes = select_routes(args)
    if not routes:
        print("no routes selected")
        return 2
    try:
        routes, _ = with_seed_offsets(routes, parse_seed_offsets(args.seed_offsets))
    except ValueError as exc:
        raise SystemExit(f"--seed-offsets: {exc}")
    w, h = resolve_frame_size(args.frame_size, args.policy)
    video_ids = [routes[0].route_id] if args.video == "first" else [v for v in args.video.split(",") if v]
    summary = drive_suite(routes, args.policy, Path(args.out), workers=args.workers, video_ids=video_ids,
                          frame_size=(w, h), replan_every=args.replan_every, device=args.device, resume=args.resume,
                          overrides=cli_overrides(args), realtime=args.realtime, stale_after_s=args.stale_after_s)
    print(bench2drive.format_table(summary))
    print(f"wall {summary['wall_s']:.1f} s, plans {summary['plans']}, invalid plans {summary['invalid_plans']}")
    if args.realtime:
        print(f"realtime: plans arrived {summary['latency_ticks_mean']} ticks (10 Hz) after their frame "
              "(the mean over routes of each route's mean)")
    for v in summary["videos"]:
        print(f"video: {v}")
    print(f"summary: {Path(args.out) / 'summary.json'}")
    return 0
