"""`wam-diff-train box-head`: train a checkpoint's box head on its own frozen vision features.

    wam-diff-train box-head --model runs/nano_s/nano-s-b32 --train runs/nano_s/data_plan/train.json \\
        --val runs/nano_s/data_all/val.json --report results/perception/box_head_nano-s-b32.json

The model's weights do not change: its vision encoder runs once over every frame of the splits that carry the
world's boxes (`meta.boxes_px`, `meta.frame_size`: every `wam-diff data` split), in each dtype of `--dtypes`
(the head then reads float32 and bfloat16 encoders alike), and the head (`wam_diff_core.perception`) learns
CenterNet-style maps from those features: a focal loss on each label's centre heat map, smooth L1 on the
centre's offset and log size at the centre cell. It is written into the checkpoint directory
(`box_head.json`, `box_head.safetensors`), and scored on the validation frames with COCO mAP (JSON report).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from tqdm import tqdm

from wam_diff_core.errors import WamDiffError
from wam_diff_core.eval.coco import coco_map
from wam_diff_core.model.checkpoint import LoadedModel, load_model
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.perception import (FEATURES, BoxHead, BoxHeadConfig, boxes_from_maps, feature_width,
                                      resized_size, save_box_head, vision_features)
from wam_diff_core.prompts import chat_prompt, detection_prompt
from wam_diff_core.types import Detection

from .box_head_targets import centre_targets

BATCH_FRAMES = 16  # frames per vision-encoder call while extracting
BATCH = 64  # frames per optimizer step
PEAK_LR = 2e-3
WEIGHT_DECAY = 1e-4
SMOOTH_L1_BETA = 0.1


class BoxHeadDataError(WamDiffError, ValueError):
    """A split without the world's boxes, or frames of different sizes (the message names the file)."""


def frames_with_boxes(split: str | Path) -> list[tuple[Path, list, tuple[int, int]]]:
    """(image path, boxes_px, frame_size) of every distinct frame of a dataset split whose samples carry boxes."""
    split = Path(split)
    if not split.is_file():
        raise BoxHeadDataError(f"{split}: no such dataset file")
    samples = json.loads(split.read_text())
    if not isinstance(samples, list):
        raise BoxHeadDataError(f"{split}: expected a JSON list of samples, got {type(samples).__name__}")
    frames: dict[str, tuple[Path, list, tuple[int, int]]] = {}
    for s in samples:
        meta = s.get("meta") or {}
        if "boxes_px" in meta and "frame_size" in meta and s.get("image"):
            image = s["image"][0]
            frames.setdefault(image, (split.parent / image, meta["boxes_px"], tuple(meta["frame_size"])))
    if not frames:
        raise BoxHeadDataError(f"{split}: no sample carries meta.boxes_px and meta.frame_size "
                               f"(a `wam-diff data` split)")
    sizes = {f[2] for f in frames.values()}
    if len(sizes) > 1:
        raise BoxHeadDataError(f"{split}: frames of several sizes {sorted(sizes)}; expected one")
    return list(frames.values())


@torch.inference_mode()
def extract_features(loaded: LoadedModel, frames: Sequence[tuple[Path, list, tuple[int, int]]],
                     features: Sequence[str], progress: bool = True, desc: str = "features"
                     ) -> tuple[torch.Tensor, tuple[int, int]]:
    """(frames, width, rows, cols) float32 features of every frame, and the frame size the processor resized to
    (W, H)."""
    runner, processor = ModelRunner(loaded.model), loaded.processor
    prompt, merge, out = chat_prompt(detection_prompt(), 1), processor.merge_size, []
    patch = loaded.model.config.vision_config.patch_size
    resized = None
    for start in tqdm(range(0, len(frames), BATCH_FRAMES), desc=desc, unit="batch", disable=not progress):
        chunk = frames[start:start + BATCH_FRAMES]
        images = [[np.asarray(Image.open(path).convert("RGB"))] for path, _, _ in chunk]
        batch = processor.encode([prompt] * len(chunk), images).to(runner.device)
        vision = runner.encode_images(batch)["image"]
        grid = batch.image_grid_thw
        out += [vision_features(vision, grid, merge, features, image=i) for i in range(len(chunk))]
        resized = resized_size(grid, patch)
    return torch.cat(out), resized


def focal_loss(logits: torch.Tensor, heat: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), per centre."""
    p = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1).float()
    loss = pos * (1 - p) ** 2 * torch.log(p) + (1 - pos) * (1 - heat) ** 4 * p ** 2 * torch.log(1 - p)
    return -loss.sum() / pos.sum().clamp(min=1)


def head_loss(maps: torch.Tensor, heat: torch.Tensor, reg: torch.Tensor, mask: torch.Tensor, n_labels: int
              ) -> torch.Tensor:
    """Focal loss on the heat maps plus smooth L1 of the regression at the centre cells."""
    l1 = F.smooth_l1_loss(maps[:, n_labels:], reg, reduction="none", beta=SMOOTH_L1_BETA).sum(1)
    return focal_loss(maps[:, :n_labels], heat) + (l1 * mask).sum() / mask.sum().clamp(min=1)


def fit(head: BoxHead, x: torch.Tensor, targets: tuple[torch.Tensor, ...], steps: int, seed: int = 0,
        progress: bool = True) -> list[float]:
    """Train the head (features standardised first); returns the loss every 100 steps."""
    heat, reg, mask = targets
    head.mean.copy_(x.mean(dim=(0, 2, 3)))
    head.std.copy_(x.std(dim=(0, 2, 3)) + 1e-5)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=PEAK_LR, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, PEAK_LR, total_steps=steps)
    head.train()
    curve = []
    for step in tqdm(range(steps), desc="box head", unit="step", disable=not progress):
        idx = torch.randint(0, len(x), (min(BATCH, len(x)),), generator=gen)
        loss = head_loss(head(x[idx]), heat[idx], reg[idx], mask[idx], len(head.config.labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            curve.append(round(float(loss.detach()), 5))
    head.eval()
    return curve


@torch.inference_mode()
def score(head: BoxHead, x: torch.Tensor, frames: Sequence, resized: tuple[int, int]) -> dict:
    """COCO mAP of the head's boxes on the frames (their `boxes_px` as ground truth)."""
    preds, truths = [], []
    for i, (_, boxes, size) in enumerate(frames):
        preds.append(boxes_from_maps(head(x[i:i + 1])[0], head.config, size, resized))
        truths.append([Detection(head.config.labels[0], tuple(b), tuple(b)) for b in boxes])
    return coco_map(preds, truths)


def targets_for(frames: Sequence, config: BoxHeadConfig, resized: tuple[int, int], rows: int, cols: int
                ) -> tuple[torch.Tensor, ...]:
    per = [centre_targets(boxes, size, resized, config, rows, cols) for _, boxes, size in frames]
    return tuple(torch.stack([p[k] for p in per]) for k in range(3))


def train_box_head(model: str, train: str, val: str, steps: int, dtypes: Sequence[str], seed: int = 0,
                   progress: bool = True, config: Optional[BoxHeadConfig] = None) -> dict:
    """Train, write into the checkpoint, score; returns the JSON-ready report."""
    t0 = time.perf_counter()
    loaded = load_model(model)
    vc = loaded.model.config.vision_config
    merge = vc.spatial_merge_size
    config = config or BoxHeadConfig(in_channels=feature_width(vc, FEATURES), token_px=vc.patch_size * merge)
    train_frames, val_frames = frames_with_boxes(train), frames_with_boxes(val)
    xs = []
    for name in dtypes:
        loaded.model.to(getattr(torch, name))
        x, resized = extract_features(loaded, train_frames, config.features, progress, f"features {name}")
        xs.append(x)
    loaded.model.to(torch.float32)
    x_val, _ = extract_features(loaded, val_frames, config.features, progress, "validation features")
    rows, cols = xs[0].shape[-2:]
    targets = targets_for(train_frames, config, resized, rows, cols)
    targets = tuple(t.repeat(len(xs), *([1] * (t.dim() - 1))) for t in targets)
    torch.manual_seed(seed)
    head = BoxHead(config)
    t_fit = time.perf_counter()
    curve = fit(head, torch.cat(xs), targets, steps, seed, progress)
    fit_s = time.perf_counter() - t_fit
    save_box_head(head, model)
    scores = score(head, x_val, val_frames, resized)
    return {"model": str(model), "train": str(train), "val": str(val), "train_frames": len(train_frames),
            "val_frames": len(val_frames), "feature_dtypes": list(dtypes), "steps": steps, "seed": seed,
            "config": config.to_dict(), "parameters": sum(p.numel() for p in head.parameters()),
            "loss_every_100": curve, "fit_seconds": round(fit_s, 1),
            "wall_seconds": round(time.perf_counter() - t0, 1), "val_scores_float32": scores}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory; the head is written into it")
    parser.add_argument("--train", required=True, help="dataset split whose samples carry meta.boxes_px")
    parser.add_argument("--val", required=True, help="validation split (scored with COCO mAP)")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps of 64 frames")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated encoder dtypes whose features the head learns from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", help="write the JSON report here")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad or not dtypes:
        raise BoxHeadDataError(f"--dtypes {args.dtypes!r}: expected a comma-separated list of float32, bfloat16, "
                               f"float16")
    if args.steps < 1:
        raise BoxHeadDataError(f"--steps {args.steps}: expected a positive number of optimizer steps")
    report = train_box_head(args.model, args.train, args.val, args.steps, dtypes, args.seed, not args.no_progress)
    s = report["val_scores_float32"]
    print(f"box head -> {args.model}: mAP {100 * s['map']:.1f}, AP50 {100 * s['ap50']:.1f}, AP75 {100 * s['ap75']:.1f} "
          f"on {report['val_frames']} validation frames ({report['wall_seconds']:.0f} s)")
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    return 0
