"""`wam-diff sensitivity`: does a planner react to the traffic in its camera frame?

The expert drives each route (so every policy is probed on the same states); every `every` ticks the
policy plans twice from the same ego state and command: once from the real frame, once from the same
frame rendered without the other vehicles (`HighwayWorld.render_without_traffic`). The expert is
asked the same counterfactual question (its plan in the world as it is, and in a copy without
traffic, `HighwayWorld.without_traffic`), which says how much a plan *should* change.

Per probe: the gap to the nearest vehicle ahead in the ego's lane, the mean waypoint distance between
the two plans, and the "shortening": how much nearer the 4 s waypoint is with traffic than without
(positive = the planner slows for what it sees). Summarised per gap bin, so "the model ignores the
car 15 m ahead" is a number, not an impression. Writes OUT/sensitivity.json and OUT/sensitivity.png.

    wam-diff sensitivity --policy models/nano-s-b32 --out runs/probe --ids highway_dense_00,cut_in_01
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import FRAME_SIZE
from ..decoding.options import add_decoding_arguments, decoding_arguments
from ..errors import UsageError
from .closed_loop import route_target_scenarios
from .jobs import add_progress_argument, route_jobs
from .routes import Route, add_frame_size_argument, add_selection_arguments, resolve_frame_size, select_routes

# gap bins (m, centre to centre) to the nearest same-lane vehicle ahead; beyond the last: "clear"
GAP_BINS = ((0.0, 20.0), (20.0, 40.0), (40.0, 65.0))
CLEAR = "clear"
DEFAULT_SCENARIOS = ("highway", "highway_dense", "emergency_brake", "cut_in")
DEFAULT_EVERY = 10  # ticks (1 s at 10 Hz)
DEFAULT_MAX_S = 30.0


def bin_name(gap: Optional[float]) -> str:
    for lo, hi in GAP_BINS:
        if gap is not None and lo <= gap < hi:
            return f"{lo:g}-{hi:g} m"
    return CLEAR


def lead_gap(vehicles) -> Optional[float]:
    """Distance (m) to the nearest vehicle ahead in the ego's lane, None if there is none."""
    ahead = [v.xy[0] for v in vehicles if v.same_lane and v.xy[0] > 0.0]
    return float(min(ahead)) if ahead else None


def probe_route(route: Route, policy, *, every: int = DEFAULT_EVERY, max_s: float = DEFAULT_MAX_S,
                frame_size=FRAME_SIZE) -> dict:
    """Probe one route; returns {"route_id", "probes": [...], "invalid": n, "wall_s"}."""
    from .highway import ExpertDrive
    from .policies import expert_plan, safe_plan

    t0 = time.perf_counter()
    probes, invalid = [], 0
    for world, tick in ExpertDrive(route, frame_size, every, max_s, route_target_scenarios(policy)):
        real = safe_plan(policy, [tick.frame], tick.ego, tick.command, tick.route_target)
        empty = safe_plan(policy, [world.render_without_traffic()], tick.ego, tick.command, tick.route_target)
        if not (real.valid and empty.valid):
            invalid += 1
            continue
        a, b = np.asarray(real.trajectory), np.asarray(empty.trajectory)
        e_real, _ = expert_plan(world)
        e_empty, _ = expert_plan(world.without_traffic())
        gap = lead_gap(tick.vehicles)
        probes.append({
            "t": tick.t, "gap_m": None if gap is None else round(gap, 2), "bin": bin_name(gap),
            "plan_change_m": round(float(np.linalg.norm(a - b, axis=1).mean()), 4),
            "shortening_m": round(float(b[-1, 0] - a[-1, 0]), 4),
            "expert_change_m": round(float(np.linalg.norm(e_real - e_empty, axis=1).mean()), 4),
            "expert_shortening_m": round(float(e_empty[-1, 0] - e_real[-1, 0]), 4),
        })
    return {"route_id": route.route_id, "scenario": route.scenario, "probes": probes, "invalid": invalid,
            "wall_s": round(time.perf_counter() - t0, 2)}


def summarize(routes: list[dict]) -> dict:
    """Means per gap bin (and over all probes) of plan change and shortening, policy and expert."""
    probes = [p for r in routes for p in r["probes"]]
    names = [bin_name(lo) for lo, _ in GAP_BINS] + [CLEAR]

    def stats(rows):
        if not rows:
            return {"probes": 0}
        mean = lambda k: float(np.mean([p[k] for p in rows]))  # noqa: E731
        out = {"probes": len(rows), "plan_change_m": mean("plan_change_m"), "shortening_m": mean("shortening_m"),
               "expert_change_m": mean("expert_change_m"), "expert_shortening_m": mean("expert_shortening_m")}
        # the share of the expert's slow-down the policy reproduces (only where the expert slows down)
        out["response"] = out["shortening_m"] / out["expert_shortening_m"] if out["expert_shortening_m"] > 0.5 else None
        return out

    return {"bins": {n: stats([p for p in probes if p["bin"] == n]) for n in names}, "all": stats(probes),
            "invalid": int(sum(r["invalid"] for r in routes)), "routes": len(routes)}


def plot(summary: dict, title: str, path: Path) -> Optional[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [(n, s) for n, s in summary["bins"].items() if s["probes"]]
    if not bins:
        return None
    x = np.arange(len(bins))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.bar(x - 0.2, [s["expert_shortening_m"] for _, s in bins], 0.4, label="expert")
    ax.bar(x + 0.2, [s["shortening_m"] for _, s in bins], 0.4, label="policy")
    ax.set_xticks(x, [f"{n}\n({s['probes']} probes)" for n, s in bins])
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("nearest vehicle ahead in the ego lane")
    ax.set_ylabel("4 s waypoint nearer with traffic (m)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- workers
def _worker(route_dict: dict, policy_spec: str, device: str, every: int, max_s: float, frame_size,
            decoding: Optional[dict]) -> dict:
    from .policies import cached_policy

    return probe_route(Route(**route_dict), cached_policy(policy_spec, device, decoding), every=every, max_s=max_s,
                       frame_size=frame_size)


def probe(routes: list[Route], policy_spec: str, out_dir: Path, *, every: int = DEFAULT_EVERY,
          max_s: float = DEFAULT_MAX_S, frame_size=FRAME_SIZE, workers: int = 1, device: str = "cpu",
          decoding: Optional[dict] = None, progress: bool = True) -> dict:
    """Probe `policy_spec` (decoding with `decoding`, DecoderConfig fields, on top of its checkpoint's own) on
    `routes`; writes OUT/sensitivity.json and OUT/sensitivity.png and returns the result."""
    if policy_spec in ("expert", "expert-plan"):
        raise ValueError(f"policy {policy_spec!r}: the probe compares a policy with the expert; give a model")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [(r.to_dict(), policy_spec, device, every, max_s, tuple(frame_size), decoding or None) for r in routes]
    t0 = time.perf_counter()
    done = [res for res in route_jobs(_worker, args, workers, desc=f"sensitivity {policy_spec}" if progress else None)
            if res is not None]
    result = {"policy": policy_spec, "policy_overrides": decoding or {}, "every": every, "max_s": max_s,
              "frame_size": list(frame_size), "gap_bins_m": [list(b) for b in GAP_BINS],
              "summary": summarize(done), "routes": done, "wall_s": round(time.perf_counter() - t0, 1)}
    (out_dir / "sensitivity.json").write_text(json.dumps(result, indent=2))
    made = plot(result["summary"], f"{policy_spec}: slow-down for the vehicle ahead", out_dir / "sensitivity.png")
    result["plot"] = str(made) if made else None
    return result


# ---------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True, help="checkpoint path or preset to probe")
    parser.add_argument("--out", required=True, help="output directory: sensitivity.json, sensitivity.png")
    add_selection_arguments(parser)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY, help="ticks between probes (10 Hz ticks)")
    parser.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_S, help="probe at most this long per route")
    add_frame_size_argument(parser)
    parser.add_argument("--workers", type=int, default=1)
    add_progress_argument(parser)
    add_decoding_arguments(parser)


def run(args) -> int:
    if not args.ids and not args.scenarios:
        args.scenarios = ",".join(DEFAULT_SCENARIOS)
    routes = select_routes(args)
    if not routes:
        print("no routes selected")
        return 2
    w, h = resolve_frame_size(args.frame_size, args.policy)
    try:
        res = probe(routes, args.policy, Path(args.out), every=args.every, max_s=args.max_seconds, frame_size=(w, h),
                    workers=args.workers, device=args.device, decoding=decoding_arguments(args),
                    progress=not args.no_progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    s = res["summary"]
    print(f"{'lead vehicle':<14}{'probes':>7}{'plan change m':>15}{'slow-down m':>13}{'expert slow-down m':>20}{'response':>10}")
    for name, b in list(s["bins"].items()) + [("all", s["all"])]:
        if not b["probes"]:
            continue
        resp = "-" if b["response"] is None else f"{b['response']:.2f}"
        print(f"{name:<14}{b['probes']:>7}{b['plan_change_m']:>15.2f}{b['shortening_m']:>13.2f}"
              f"{b['expert_shortening_m']:>20.2f}{resp:>10}")
    print(f"invalid plan pairs {s['invalid']}; wall {res['wall_s']:.1f} s")
    print(f"written: {Path(args.out) / 'sensitivity.json'}" + (f", {res['plot']}" if res["plot"] else ""))
    return 0
