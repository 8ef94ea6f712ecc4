"""Does a checkpoint's vision path carry "is there a vehicle close ahead in my lane"?

A linear probe: the expert drives routes of the embedded suite; every `--every` ticks the frame and the
gap to the nearest vehicle ahead in the ego lane are recorded. Each frame goes through the checkpoint's
vision tower (the visual tokens the language model reads, flattened); a ridge classifier learns
"vehicle within --near m" on the training-split routes and is scored on the held-out ones. The same
probe on the raw pixels (grey, 4x downsampled) says how easy the question is from the image itself.

    .venv/bin/python scripts/vision_probe.py --model models/nano-s-b32 --out runs/vision_probe.json

Prints a table and writes JSON: balanced accuracy (mean of the two classes' recalls) per feature set.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from wam_diff_core.sim.datagen import VAL_FRACTION, assign_splits
from wam_diff_core.sim.highway import ExpertDrive, route_over
from wam_diff_core.sim.routes import load_routes, parse_frame_size
from wam_diff_core.sim.sensitivity import DEFAULT_SCENARIOS, lead_gap


def collect(routes, every: int, max_s: float, frame_size) -> list[dict]:
    """Frames and lead gaps while the expert drives (the tick that ends a route left out)."""
    return [{"route": r.route_id, "frame": tick.frame, "gap": lead_gap(tick.vehicles)}
            for r in routes for _, tick in ExpertDrive(r, frame_size, every, max_s) if not route_over(r, tick, max_s)]


@torch.no_grad()
def visual_features(loaded, frames: list[np.ndarray], batch: int = 32) -> np.ndarray:
    from PIL import Image

    ip = loaded.processor.image_processor
    out = []
    for i in range(0, len(frames), batch):
        enc = ip(images=[Image.fromarray(f) for f in frames[i:i + batch]], return_tensors="pt")
        feats = loaded.model.model.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
        embeds = feats.pooler_output if hasattr(feats, "pooler_output") else feats[0]
        out += [e.float().reshape(-1).numpy() for e in embeds]
    return np.stack(out)


def pixel_features(frames: list[np.ndarray]) -> np.ndarray:
    g = np.stack([f.astype(np.float32).mean(-1) for f in frames]) / 255.0
    n, h, w = g.shape
    return g[:, : h // 4 * 4, : w // 4 * 4].reshape(n, h // 4, 4, w // 4, 4).mean((2, 4)).reshape(n, -1)


def ridge_probe(x_tr, y_tr, x_te, y_te, lam: float) -> float:
    """Balanced accuracy of a ridge classifier (targets +-1, standardised features) on the test set."""
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    a, b = (x_tr - mu) / sd, (x_te - mu) / sd
    t = np.where(y_tr, 1.0, -1.0)
    # dual form: n x n system, cheap when features outnumber samples
    k = a @ a.T
    alpha = np.linalg.solve(k + lam * np.eye(len(a)), t - t.mean())
    pred = (b @ (a.T @ alpha) + t.mean()) > 0
    recalls = [float((pred[y_te == c] == c).mean()) for c in (True, False) if (y_te == c).any()]
    return float(np.mean(recalls))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="checkpoint path or preset (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--near", type=float, default=40.0, help="the question: a vehicle ahead in the ego lane within this (m)")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--frame-size", default="256x128")
    ap.add_argument("--lambdas", default="1,10,100,1000")
    args = ap.parse_args()
    from wam_diff_core.model.checkpoint import load

    w, h = parse_frame_size(args.frame_size)
    suite = load_routes()
    routes = [r for r in suite if r.scenario in DEFAULT_SCENARIOS]
    split = assign_splits(suite, VAL_FRACTION)
    t0 = time.perf_counter()
    rows = collect(routes, args.every, args.max_seconds, (w, h))
    y = np.array([r["gap"] is not None and r["gap"] < args.near for r in rows])
    test = np.array([split[r["route"]] == "val" for r in rows])
    frames = [r["frame"] for r in rows]
    print(f"{len(rows)} frames from {len(routes)} routes in {time.perf_counter() - t0:.0f} s; "
          f"positive share {y.mean():.2f}; test frames {test.sum()} (held-out routes)")
    lams = [float(v) for v in args.lambdas.split(",")]
    sets = {"pixels (grey, 4x down)": pixel_features(frames)}
    for m in args.model:
        sets[f"visual tokens: {m}"] = visual_features(load(m), frames)
    result = {"near_m": args.near, "frames": len(rows), "positive_share": float(y.mean()),
              "test_frames": int(test.sum()), "lambdas": lams, "probes": {}}
    print(f"{'features':<60}{'dims':>7}  balanced accuracy on held-out routes per lambda")
    for name, x in sets.items():
        accs = [ridge_probe(x[~test], y[~test], x[test], y[test], lam) for lam in lams]
        result["probes"][name] = {"dims": int(x.shape[1]), "balanced_accuracy": accs}
        print(f"{name:<60}{x.shape[1]:>7}  " + "  ".join(f"{a:.3f}" for a in accs))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
