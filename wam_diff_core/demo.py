"""`wam-diff demo`: the decoding demo on the shipped model (models/nano-s-b32; the `nano` preset where it is absent).

Image + ego state in, trajectory out: the same frame is planned by autoregressive decoding (B = 1)
and by block diffusion (the checkpoint's own B and K unless told otherwise), with the tokens, forwards
and time per phase of each.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .decode_cli import add_policy_arguments, load_image, plan_to_json
from .decoding.config import resolve_decoding
from .decoding.options import decoding_arguments
from .policy import DrivingPolicy
from .types import EgoState


def add_arguments(parser) -> None:
    add_policy_arguments(parser)
    parser.add_argument("--image", default=None)
    parser.add_argument("--out", default="runs/demo.json")


def _frame(path: str | None) -> np.ndarray:
    if path:
        return load_image(path)
    # A synthetic top-down road: grey asphalt, white lane marks, a car ahead.
    img = np.full((128, 256, 3), 100, np.uint8)
    img[:, :, 1] = 110
    img[40:42, ::16] = 255
    img[86:88, ::16] = 255
    img[56:72, 150:180] = (40, 90, 200)
    return img


def run(args) -> int:
    image = _frame(args.image)
    ego = EgoState(vx=12.0, ax=0.3)
    policy = DrivingPolicy.load(args.model, device=args.device, **decoding_arguments(args))
    base = policy.config
    print(f"model: {policy.loaded.name}")
    results = {}
    for label, cfg in (("AR (B=1)", resolve_decoding(base, block_size=1)),
                       (f"block diffusion (B={base.block_size}, K={base.steps})", base)):
        policy.config = cfg
        plan = policy.plan([image], ego, "follow lane")
        summary = plan_to_json(plan)
        results[label] = summary
        decode_s = plan.timings["denoise"] + plan.timings["commit"]
        print(f"\n== {label}")
        print(f"  answer: {plan.raw_text['planning'][:120]!r}")
        print(f"  valid: {plan.valid}" + (f"  trajectory (m): {np.round(plan.trajectory, 2).tolist()}" if plan.valid else f"  error: {plan.errors.get('planning')}"))
        print(f"  tokens {summary['tokens']}, forwards {summary['forwards']}, decode {decode_s * 1000:.0f} ms "
              f"({summary['tokens'] / max(decode_s, 1e-9):.0f} tok/s), phases ms: {summary['timings_ms']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0
