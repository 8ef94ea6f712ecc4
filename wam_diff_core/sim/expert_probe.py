"""`wam-diff expert-probe`: where a policy's plans part from the expert's on a route the expert drives.

The expert plans and drives the route (its plans through the same controller as any policy); at every replan each
probed policy plans from the same frame, ego state and command. Per replan: time, speed and the lateral (y, metres,
left +) waypoint at 1, 2 and 4 s of the expert and of each policy. Writes OUT/<route>.json and prints the table, so
a route's failure point shows as the rows where the columns part.

    wam-diff expert-probe --route roundabout_01 --out runs/probe nano-s-b32=models/nano-s-b32 nano-s-ar=models/nano-s-ar
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..constants import REPLAN_EVERY, WAYPOINT_DT_S
from ..errors import WamDiffError
from .policies import safe_plan
from .routes import add_frame_size_argument, parse_frame_size

HORIZONS_S = (1.0, 2.0, 4.0)
_COLUMNS = [int(round(h / WAYPOINT_DT_S)) - 1 for h in HORIZONS_S]  # waypoint indices


class ProbeError(WamDiffError, ValueError):
    """A model argument without a label or with a label taken, or a route the suite does not hold."""


def lateral(plan) -> list | None:
    """The y coordinate of a valid plan at HORIZONS_S, else None."""
    if not plan.valid or plan.trajectory is None:
        return None
    return [round(float(v), 2) for v in np.asarray(plan.trajectory, dtype=np.float64)[_COLUMNS, 1]]


class ExpertProbe:
    """A closed-loop policy that returns the expert's plan and records every probed policy's plan beside it."""

    needs_images = True

    def __init__(self, expert, probed: dict):
        self.expert, self.probed, self.rows, self.world = expert, probed, [], None

    def bind(self, world) -> None:
        self.world = world
        self.expert.bind(world)
        for policy in self.probed.values():
            if hasattr(policy, "bind"):
                policy.bind(world)

    def plan(self, images, ego, command, target=None):
        plan = self.expert.plan(images, ego, command)
        row = {"t": round(float(self.world._t), 2), "speed": round(float(ego.speed), 2), "command": command,
               "expert": lateral(plan)}
        row.update({label: lateral(safe_plan(policy, images, ego, command, target)) for label, policy in self.probed.items()})
        self.rows.append(row)
        return plan


def table(rows: list, labels: list) -> str:
    head = f"{'t':>5} {'v':>5}  " + "  ".join(f"{name:>20}" for name in ["expert", *labels])
    lines = [f"lateral waypoint (m) at {', '.join(f'{h:g}' for h in HORIZONS_S)} s", head]
    for r in rows:
        cells = ["-" if r[k] is None else ",".join(f"{v:.1f}" for v in r[k]) for k in ["expert", *labels]]
        lines.append(f"{r['t']:5.1f} {r['speed']:5.1f}  " + "  ".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", help="LABEL=PATH (checkpoint, preset or baseline policy)")
    p.add_argument("--route", required=True, help="route id of the suite")
    p.add_argument("--routes", default=None, help="route suite JSON (default: the bundled one)")
    p.add_argument("--out", required=True)
    add_frame_size_argument(p, policy_default=False)
    p.add_argument("--replan-every", type=int, default=REPLAN_EVERY)


def run(args: argparse.Namespace) -> int:
    from .closed_loop import run_route
    from .policies import load_policy
    from .routes import load_routes

    probed = {}
    for spec in args.models:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise ProbeError(f"model {spec!r}: expected LABEL=PATH")
        if label in probed or label == "expert":
            raise ProbeError(f"model label {label!r} is taken")
        probed[label] = load_policy(path)
    frame_size = parse_frame_size(args.frame_size)
    try:
        route = load_routes(args.routes, ids=[args.route])[0]
    except (ValueError, FileNotFoundError) as exc:
        raise ProbeError(str(exc)) from None
    probe = ExpertProbe(load_policy("expert-plan"), probed)
    record = run_route(route, probe, replan_every=args.replan_every, frame_size=frame_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"route": route.route_id, "status": record["status"], "completion": record["completion"],
              "horizons_s": list(HORIZONS_S), "models": {k: v for k, v in zip(probed, args.models)},
              "rows": probe.rows}
    path = out / f"{route.route_id}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{route.route_id}: expert {record['status']} ({record['completion']:.1f} %)")
    print(table(probe.rows, list(probed)))
    print(f"written: {path}")
    return 0
