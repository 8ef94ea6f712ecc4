"""`wam-diff decode`: one image + ego state in, the plan out (JSON), with timings."""
from __future__ import annotations

import json

import numpy as np

from .constants import DETECTION_SOURCES, NAV_COMMANDS, SHIPPED_MODEL
from .decoding.options import add_decoding_arguments, decoding_arguments
from .errors import UsageError
from .policy import POLICY_TASKS, DrivingPolicy
from .scoring.planner import CandidatePlanner, add_candidate_arguments, candidate_arguments
from .types import EgoState, check_route_target


def add_policy_arguments(parser) -> None:
    """--model, --device and the decoding options (unset: the checkpoint's own)."""
    parser.add_argument("--model", default=SHIPPED_MODEL,
                        help=f"preset name, local checkpoint directory, or {SHIPPED_MODEL} (the shipped model, "
                             f"models/{SHIPPED_MODEL}; the default)")
    add_decoding_arguments(parser)


def add_arguments(parser) -> None:
    add_policy_arguments(parser)
    parser.add_argument("--image", default=None, help="RGB image file (default: a gray test frame)")
    parser.add_argument("--vx", type=float, default=10.0)
    parser.add_argument("--vy", type=float, default=0.0)
    parser.add_argument("--ax", type=float, default=0.0)
    parser.add_argument("--ay", type=float, default=0.0)
    parser.add_argument("--command", default="follow lane", choices=NAV_COMMANDS)
    parser.add_argument("--tasks", default="planning", help=f"comma-separated subset of {POLICY_TASKS}")
    parser.add_argument("--detections", default="auto", choices=DETECTION_SOURCES,
                        help="where detections come from: the box head, the text answer, or auto (the head when the "
                             "checkpoint has one)")
    parser.add_argument("--target", default=None, metavar="X,Y",
                        help="route target point, metres in the ego frame (x forward, y left); stated to checkpoints "
                             "trained with route targets (wam_diff.json route_target), ignored by others")
    add_candidate_arguments(parser)


def parse_target(text: str | None) -> tuple[float, float] | None:
    """--target 'X,Y' -> (x, y); None stays None; a UsageError naming the value otherwise."""
    if text is None:
        return None
    try:
        return check_route_target(tuple(float(v) for v in text.split(",")))
    except ValueError:
        raise UsageError(f"--target {text!r}: expected X,Y in metres, two finite numbers") from None


def load_image(path: str | None) -> np.ndarray:
    if path is None:
        return np.full((128, 256, 3), 128, dtype=np.uint8)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (FileNotFoundError, UnidentifiedImageError) as exc:
        raise UsageError(f"--image {path}: cannot read an image ({exc})") from None


def candidates_to_json(plan, scores=None) -> list[dict]:
    """Every candidate of a plan: index, source (model, or a braking plan), validity, trajectory or error, mean
    token log-probability, and its score when a scorer ranked them (None for an invalid one)."""
    out = []
    for c in plan.candidates:
        row = {"index": c.index, "source": c.source, "valid": c.valid,
               "trajectory": None if c.trajectory is None else c.trajectory.tolist(),
               "logprob": round(float(c.logprob), 4), "error": c.error}
        if scores is not None:
            row["score"] = round(float(scores[c.index]), 4) if np.isfinite(scores[c.index]) else None
        out.append(row)
    return out


def plan_to_json(plan) -> dict:
    return {
        "valid": plan.valid,
        "trajectory": None if plan.trajectory is None else plan.trajectory.tolist(),
        "detections": None if plan.detections is None else [
            {"label": d.label, "box_px": list(d.box_px), "box_norm": list(d.box_norm), "score": round(d.score, 4)}
            for d in plan.detections],
        "raw_text": plan.raw_text,
        "errors": plan.errors,
        "timings_ms": {k: round(v * 1000, 2) for k, v in plan.timings.items()},
        "tokens": plan.stats["decode"].tokens if "decode" in plan.stats else 0,  # none decoded: boxes from the head
        "forwards": plan.stats["decode"].forwards if "decode" in plan.stats else 0,
    }


def run(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    decoding = decoding_arguments(args)
    settings = candidate_arguments(args, has_world=False, where="wam-diff decode", decoding=decoding)
    target = parse_target(args.target)
    image = load_image(args.image)
    policy = DrivingPolicy.load(args.model, device=args.device, tasks=tasks, detections=args.detections, **decoding)
    planner = CandidatePlanner(policy, **settings, where="wam-diff decode")
    plan = planner.plan([image], EgoState(args.vx, args.vy, args.ax, args.ay), args.command, target=target)
    out = plan_to_json(plan)
    if settings:
        out.update({**planner.settings(), "chosen": plan.chosen, "score": plan.score,
                    "candidate_list": candidates_to_json(plan, planner.last_scores)})
    print(json.dumps(out, indent=2))
    return 0
