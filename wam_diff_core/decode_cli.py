"""`wam-diff decode`: one image + ego state in, the plan out (JSON), with timings."""
from __future__ import annotations

import json

import numpy as np

from .constants import NAV_COMMANDS
from .model.settings import TEXT_LAYERS
from .policy import POLICY_TASKS, DrivingPolicy, PolicyConfig
from .types import EgoState, check_route_target


def add_policy_arguments(parser) -> None:
    parser.add_argument("--model", default="nano", help="preset name or local checkpoint directory")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--strategy", default="low_confidence_dynamic")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--backend", default="sdpa", choices=["sdpa", "flex", "flashinfer"])
    parser.add_argument("--cuda-graphs", choices=["on", "off"], default="off")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--text-layers", default="model", choices=TEXT_LAYERS,
                        help="text layers: the model's own, or kernels.fast_layers' (merged projections, "
                             "same math; 'compiled': torch.compiled)")


def policy_config(args, tasks=("planning",)) -> PolicyConfig:
    return PolicyConfig(block_size=args.block_size, steps=args.steps, strategy=args.strategy,
                        threshold=args.threshold, backend=args.backend, cuda_graphs=args.cuda_graphs == "on",
                        max_new_tokens=args.max_new_tokens, tasks=tuple(tasks), text_layers=args.text_layers)


def add_arguments(parser) -> None:
    add_policy_arguments(parser)
    parser.add_argument("--image", default=None, help="RGB image file (default: a gray test frame)")
    parser.add_argument("--vx", type=float, default=10.0)
    parser.add_argument("--vy", type=float, default=0.0)
    parser.add_argument("--ax", type=float, default=0.0)
    parser.add_argument("--ay", type=float, default=0.0)
    parser.add_argument("--command", default="follow lane", choices=NAV_COMMANDS)
    parser.add_argument("--tasks", default="planning", help=f"comma-separated subset of {POLICY_TASKS}")
    parser.add_argument("--target", default=None, metavar="X,Y",
                        help="route target point, metres in the ego frame (x forward, y left); stated to checkpoints "
                             "trained with route targets (wam_diff.json route_target), ignored by others")


def parse_target(text: str | None) -> tuple[float, float] | None:
    """--target 'X,Y' -> (x, y); None stays None. SystemExit naming the value otherwise."""
    if text is None:
        return None
    try:
        return check_route_target(tuple(float(v) for v in text.split(",")))
    except ValueError:
        raise SystemExit(f"--target {text!r}: expected X,Y in metres, two finite numbers") from None


def load_image(path: str | None) -> np.ndarray:
    if path is None:
        return np.full((128, 256, 3), 128, dtype=np.uint8)
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (FileNotFoundError, UnidentifiedImageError) as exc:
        raise SystemExit(f"--image {path}: cannot read an image ({exc})") from None


def plan_to_json(plan) -> dict:
    return {
        "valid": plan.valid,
        "trajectory": None if plan.trajectory is None else plan.trajectory.tolist(),
        "detections": None if plan.detections is None else [
            {"label": d.label, "box_px": list(d.box_px), "box_norm": list(d.box_norm)} for d in plan.detections],
        "raw_text": plan.raw_text,
        "errors": plan.errors,
        "timings_ms": {k: round(v * 1000, 2) for k, v in plan.timings.items()},
        "tokens": plan.stats["decode"].tokens,
        "forwards": plan.stats["decode"].forwards,
    }


def run(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    policy = DrivingPolicy.load(args.model, device=args.device, config=policy_config(args, tasks))
    plan = policy.plan([load_image(args.image)], EgoState(args.vx, args.vy, args.ax, args.ay), args.command,
                       target=parse_target(args.target))
    print(json.dumps(plan_to_json(plan), indent=2))
    return 0
