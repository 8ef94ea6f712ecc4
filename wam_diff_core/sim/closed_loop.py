"""`wam-diff drive`: closed-loop driving over the embedded route suite, Bench2Drive-style scoring.

Each route runs in a worker process: policy plan -> controller -> world, 10 Hz, until the route
is completed, the ego crashes, deviates from its route, is blocked, or times out. One JSON per
route (completion, infractions with time and kind, status, comfort and efficiency inputs) lands in
OUT/routes/, then OUT/summary.json and a printed table; chosen routes get a video with the plan drawn.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import BLOCKED_SPEED_MPS, FRAME_SIZE, JUNCTION_SCENARIOS, NUM_WAYPOINTS, REPLAN_EVERY, WAYPOINT_DT_S
from ..control import ControllerConfig
from ..decoding.options import add_decoding_arguments, decoding_arguments
from ..errors import UsageError
from ..eval import bench2drive
from .jobs import add_progress_argument, route_jobs
from .routes import (Route, add_frame_size_argument, add_selection_arguments, parse_seed_offsets, resolve_frame_size,
                     select_routes, suite_version, with_seed_offsets)

ROUTE_DEVIATION_M = {"corridor": 6.0, "road": 3.0}   # junction routes: from the route; others: beyond the road edge
BLOCKED_AFTER_S = 30.0


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


@dataclasses.dataclass
class _Plans:
    """The plans of one route: the one the controller tracks (made at plan_tick from plan_pose) and the one on
    its way (pending: (Plan, pose, tick asked, tick it arrives)), with their counts and clocks."""

    policy: object
    dt: float
    replan_every: int
    realtime: bool
    plan: Optional[np.ndarray] = None
    plan_pose: Optional[tuple] = None
    plan_tick: int = -10 ** 9
    request_tick: int = -10 ** 9
    pending: Optional[tuple] = None
    invalid_plans: int = 0
    plan_time: float = 0.0
    latencies: list = dataclasses.field(default_factory=list)

    def update(self, k: int, tick) -> None:
        """At tick k: a plan arriving now first, then the next one asked for (applied at once when it takes no
        ticks)."""
        from .policies import safe_plan

        while True:
            if self.pending is not None and k >= self.pending[3]:
                p, self.plan_pose, self.plan_tick, _ = self.pending
                self.pending = None
                if not p.valid:
                    self.invalid_plans += 1
                    self.plan = None
                else:
                    self.plan = np.asarray(p.trajectory, dtype=np.float64)
            if self.pending is None and k - self.request_tick >= self.replan_every:
                t0 = time.perf_counter()
                p = safe_plan(self.policy, [tick.frame] if tick.frame is not None else [], tick.ego, tick.command,
                              tick.route_target, tick)
                wall = time.perf_counter() - t0
                self.plan_time += wall
                lag = latency_ticks(wall, self.dt) if self.realtime and self.request_tick >= 0 else 0
                self.latencies.append(lag)
                self.pending, self.request_tick = (p, tick.pose, k, k + lag), k
                continue
            break

    def tracked(self, k: int, pose) -> Optional[np.ndarray]:
        """The tracked plan at tick k in the ego frame of `pose`, re-timed by its age; None without one."""
        if self.plan is None:
            return None
        age = (k - self.plan_tick) * self.dt
        return self.plan if age == 0 else _to_frame(shift_plan(self.plan, age), self.plan_pose, pose)

    def age_s(self, k: int) -> float:
        return 0.0 if self.plan is None else (k - self.plan_tick) * self.dt

    def asks_at(self, k: int) -> bool:
        """Whether a plan is asked for at tick k (so that tick's frame is read)."""
        return (self.pending is None or k >= self.pending[3]) and k - self.request_tick >= self.replan_every


@dataclasses.dataclass
class _Trace:
    """What one route's drive leaves behind for its record: distances, ego signals, infractions, hashes."""

    last_pose: tuple
    offroad_m: float = 0.0
    driven_m: float = 0.0
    stopped_since: Optional[float] = None
    infractions: list = dataclasses.field(default_factory=list)
    speeds: list = dataclasses.field(default_factory=list)
    lon: list = dataclasses.field(default_factory=list)
    lat: list = dataclasses.field(default_factory=list)
    yaw_rates: list = dataclasses.field(default_factory=list)
    traffic: list = dataclasses.field(default_factory=list)
    frame_hash: object = dataclasses.field(default_factory=hashlib.sha256)
    state_hash: object = dataclasses.field(default_factory=hashlib.sha256)

    def add(self, tick) -> None:
        step_m = math.hypot(tick.pose[0] - self.last_pose[0], tick.pose[1] - self.last_pose[1])
        self.last_pose = tick.pose
        self.driven_m += step_m
        if tick.off_road:
            self.offroad_m += step_m
        self.speeds.append(tick.ego.speed)
        self.lon.append(tick.ego.ax)
        self.lat.append(tick.ego.ay)
        self.yaw_rates.append(tick.ego.yaw_rate)
        near = [math.hypot(*v.velocity) for v in tick.vehicles if math.hypot(*v.xy) < 50.0]
        if near:
            self.traffic.append(float(np.mean(near)))
        if tick.ego.speed < BLOCKED_SPEED_MPS:
            self.stopped_since = tick.t if self.stopped_since is None else self.stopped_since
        else:
            self.stopped_since = None

    def status(self, tick, route: Route, max_dev: float) -> Optional[str]:
        """How the route ended at this tick (its infraction recorded), None while it goes on."""
        if tick.collision:
            self.infractions.append({"kind": "collision_vehicle", "time_s": tick.t})
            return "Failed - collision"
        if tick.progress_m >= route.target_distance_m:
            return "Completed"
        if tick.route_deviation_m > max_dev:
            self.infractions.append({"kind": "route_deviation", "time_s": tick.t})
            return "Failed - route deviation"
        if self.stopped_since is not None and tick.t - self.stopped_since >= BLOCKED_AFTER_S:
            self.infractions.append({"kind": "agent_blocked", "time_s": tick.t})
            return "Failed - agent blocked"
        if tick.t >= route.time_limit_s - 1e-9:
            self.infractions.append({"kind": "route_timeout", "time_s": tick.t})
            return "Failed - timeout"
        return None


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
    max_dev = ROUTE_DEVIATION_M["corridor" if world._corridor_route else "road"]
    plans = _Plans(policy, world.dt, replan_every, realtime)
    trace, frames, status = _Trace(tick.pose), [], None
    while status is None:
        k = world._ticks
        plans.update(k, tick)
        traj_now = plans.tracked(k, tick.pose)
        if video and tick.frame is not None:
            frames.append(_video_frame(world, route, tick, traj_now))
        if tick.frame is not None:
            trace.frame_hash.update(tick.frame.tobytes())
        # the next tick's frame is rendered only when it is read: by the video, or by the plan asked for then
        frame_next = video or (needs_images and plans.asks_at(k + 1))
        if drives_itself:
            tick = world.step(frame=frame_next)
        else:
            c = ctl.step(traj_now, tick.ego.speed, world.dt, plan_age_s=plans.age_s(k))
            tick = world.step(c.accel, c.steer, frame=frame_next)
        trace.state_hash.update(np.asarray(world.snapshot()["vehicles"], dtype=np.float64).tobytes())
        trace.add(tick)
        status = trace.status(tick, route, max_dev)
    if trace.driven_m > 0 and trace.offroad_m > 0:
        trace.infractions.append({"kind": bench2drive.OUTSIDE_LANES, "time_s": tick.t,
                                  "pct": round(100.0 * trace.offroad_m / trace.driven_m, 3)})
    world.close()
    rec = _route_record(route, policy, world, tick, status, trace, plans, hashed_frames=needs_images or video,
                        wall_s=time.perf_counter() - wall0)
    if video and frames and out_dir is not None:
        from .video import write_video

        rec["video"] = str(write_video(frames, Path(out_dir) / "videos" / f"{route.route_id}.mp4"))
    return rec


def _video_frame(world, route: Route, tick, traj_now: Optional[np.ndarray]) -> np.ndarray:
    from .video import draw_plan

    px = world.ego_to_pixels(np.vstack([[0.0, 0.0], traj_now])) if traj_now is not None else None
    return draw_plan(tick.frame, px, f"{route.route_id} t={tick.t:4.1f}s v={tick.ego.speed:4.1f} {tick.command}")


def _route_record(route: Route, policy, world, tick, status: str, trace: _Trace, plans: _Plans, *,
                  hashed_frames: bool, wall_s: float) -> dict:
    """The route record of a finished drive (completion, infractions, comfort and efficiency inputs, score)."""
    completion = 100.0 * min(tick.progress_m / route.target_distance_m, 1.0)
    rec = {
        **route.to_dict(),
        "abilities": list(route.abilities),
        "policy": getattr(policy, "name", type(policy).__name__),
        "status": status,
        "completion": round(max(completion, 0.0), 4),
        "infractions": trace.infractions,
        "duration_s": round(tick.t, 3),
        "ticks": world._ticks,
        "invalid_plans": plans.invalid_plans,
        "efficiency": {"ego_mean_speed": float(np.mean(trace.speeds)) if trace.speeds else 0.0,
                       "traffic_mean_speed": float(np.mean(trace.traffic)) if trace.traffic else 0.0},
        "comfort": {"dt": world.dt, "lon_accel": [round(v, 4) for v in trace.lon],
                    "lat_accel": [round(v, 4) for v in trace.lat], "yaw_rate": [round(v, 5) for v in trace.yaw_rates]},
        "offroad_m": round(trace.offroad_m, 3),
        "driven_m": round(trace.driven_m, 3),
        "frame_hash": trace.frame_hash.hexdigest() if hashed_frames else None,
        "state_hash": trace.state_hash.hexdigest(),
        "wall_s": round(wall_s, 3),
        "plan_s": round(plans.plan_time, 3),
        "plans": len(plans.latencies),
    }
    planner = getattr(policy, "planner", None)  # a learned policy's CandidatePlanner: this route's counts (bind resets)
    if planner is not None:
        rec["candidates"] = {**planner.settings(), **planner.stats.as_dict()}
    if plans.realtime:
        lat = plans.latencies
        rec["realtime"] = {"latency_ticks_mean": round(float(np.mean(lat)), 3) if lat else 0.0,
                           "latency_ticks_max": int(max(lat, default=0))}
    rec["score"] = bench2drive.route_score(rec["completion"], trace.infractions)
    return rec


# ---------------------------------------------------------------- workers


def _worker(route_dict: dict, policy_spec: str, device: str, out_dir: str, video: bool, frame_size, replan_every: int,
            decoding: Optional[dict] = None, realtime: bool = False, stale_after_s: Optional[float] = None,
            candidates: Optional[dict] = None) -> dict:
    from .policies import cached_policy

    route = Route(**route_dict)
    rec = run_route(route, cached_policy(policy_spec, device, decoding, candidates), out_dir=Path(out_dir), video=video,
                    frame_size=frame_size, replan_every=replan_every, realtime=realtime,
                    stale_after_s=stale_after_s)
    path = Path(out_dir) / "routes" / f"{route.route_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return rec


def drive_suite(routes: list[Route], policy_spec: str, out_dir: Path, workers: int = 1, video_ids=(),
                frame_size=FRAME_SIZE, replan_every: int = 1, device: str = "cpu", resume: bool = False,
                progress: bool = True, decoding: Optional[dict] = None, realtime: bool = False,
                stale_after_s: Optional[float] = None, candidates: Optional[dict] = None) -> dict:
    """Run routes (in `workers` processes), write per-route JSON and summary.json; return the summary.
    `decoding`: DecoderConfig fields a learned policy decodes with on top of its checkpoint's own
    (`resolve_decoding`; recorded in the summary as policy_overrides); `candidates`: a learned policy's candidate
    settings ({"candidates": N, "scorer": NAME, "sampling": METHOD}; `candidate_summary`)."""
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
             decoding or None, realtime, stale_after_s, candidates or None) for r in todo]
    records += [rec for rec in route_jobs(_worker, args, workers, desc=f"drive {policy_spec}" if progress else None,
                                          total=len(routes))
                if rec is not None]
    summary = bench2drive.summarize(records, expected_route_ids=[r.route_id for r in routes])
    summary.update({
        "policy": policy_spec,
        "policy_overrides": decoding or {},
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
        "ms_per_plan": _ms_per_plan(records),
    })
    if candidates:
        summary["candidates"] = candidate_summary(records, candidates)
    if realtime:
        lags = [r["realtime"]["latency_ticks_mean"] for r in records if r.get("realtime")]
        summary["latency_ticks_mean"] = round(float(np.mean(lags)), 3) if lags else None
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _ms_per_plan(records: list[dict]) -> Optional[float]:
    """Mean wall time of a policy call over every plan of the records, milliseconds (None without plans)."""
    plans = sum(r.get("plans", 0) for r in records)
    return round(1000.0 * sum(r.get("plan_s", 0.0) for r in records) / plans, 2) if plans else None


def candidate_summary(records: list[dict], settings: dict) -> dict:
    """The candidate settings and, over the routes' records, how often a candidate other than 0 won, how often
    braking plans were added and won, the invalid candidates dropped, and the time scoring took per plan."""
    counts = [r["candidates"] for r in records if r.get("candidates")]
    total = {k: sum(c.get(k, 0) for c in counts) for k in ("plans", "scored", "non_greedy_wins", "braking_plans",
                                                            "braking_wins", "candidates_drawn", "invalid_candidates",
                                                            "score_s")}
    plans = max(total["plans"], 1)
    return {**settings, **{k: v for k, v in total.items() if k != "score_s"},
            "non_greedy_share": round(total["non_greedy_wins"] / plans, 4),
            "braking_share": round(total["braking_wins"] / plans, 4),
            "invalid_share": round(total["invalid_candidates"] / max(total["candidates_drawn"], 1), 4),
            "score_ms_per_plan": round(1000.0 * total["score_s"] / plans, 2)}


# ---------------------------------------------------------------- CLI
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
                             "training data drove offsets 0-20000, so take others for a robustness check")
    parser.add_argument("--realtime", action="store_true",
                        help="the world does not wait for the planner: each plan arrives after its measured decode "
                             "time, rounded up to 10 Hz ticks, and the controller tracks the previous plan meanwhile "
                             "(results then depend on this machine's speed and load)")
    parser.add_argument("--stale-after-s", type=float, default=None,
                        help="the controller brakes on plans older than this (default: its config's, "
                             f"{ControllerConfig.stale_after_s:g} s)")
    parser.add_argument("--resume", action="store_true", help="keep routes already written in OUT/routes")
    add_progress_argument(parser)
    add_decoding_arguments(parser)
    from ..scoring.planner import add_candidate_arguments  # torch: a learned policy's settings

    add_candidate_arguments(parser, world=True)


def run(args) -> int:
    routes = select_routes(args)
    if not routes:
        print("no routes selected")
        return 2
    try:
        routes, _ = with_seed_offsets(routes, parse_seed_offsets(args.seed_offsets))
    except ValueError as exc:
        raise UsageError(f"--seed-offsets: {exc}")
    from ..scoring.planner import candidate_arguments
    from .policies import BASELINES

    decoding = decoding_arguments(args)
    candidates = candidate_arguments(args, has_world=True, where="wam-diff drive", decoding=decoding)
    if candidates and args.policy in BASELINES:
        raise UsageError(f"--candidates/--scorer: the {args.policy} baseline draws no candidates; give a checkpoint")
    w, h = resolve_frame_size(args.frame_size, args.policy)
    video_ids = [routes[0].route_id] if args.video == "first" else [v for v in args.video.split(",") if v]
    summary = drive_suite(routes, args.policy, Path(args.out), workers=args.workers, video_ids=video_ids,
                          frame_size=(w, h), replan_every=args.replan_every, device=args.device, resume=args.resume,
                          progress=not args.no_progress, decoding=decoding, realtime=args.realtime,
                          stale_after_s=args.stale_after_s, candidates=candidates)
    print(bench2drive.format_table(summary))
    print(f"wall {summary['wall_s']:.1f} s, plans {summary['plans']}, invalid plans {summary['invalid_plans']}, "
          f"{summary['ms_per_plan']} ms per plan")
    if candidates:
        c = summary["candidates"]
        print(f"candidates {c['candidates']} ({c['sampling']}), scorer {c['scorer']}: a candidate other than 0 won "
              f"{c['non_greedy_wins']} of {c['plans']} plans, {c['invalid_candidates']} of {c['candidates_drawn']} "
              f"candidates invalid (dropped), scoring {c['score_ms_per_plan']} ms per plan")
    if args.realtime:
        print(f"realtime: plans arrived {summary['latency_ticks_mean']} ticks (10 Hz) after their frame "
              "(the mean over routes of each route's mean)")
    for v in summary["videos"]:
        print(f"video: {v}")
    print(f"summary: {Path(args.out) / 'summary.json'}")
    return 0
