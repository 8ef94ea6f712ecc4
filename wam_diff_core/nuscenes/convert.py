"""`wam-diff data --nuscenes DATAROOT --version v1.0-mini|v1.0-trainval --out DIR`: a nuScenes release as the
project's datasets, read through the official devkit (`reader`).

Every CAM_FRONT keyframe (2 Hz) of the release's scenes becomes samples of three tasks that share its image, in
the format `wam-diff data` writes (docs/architecture.md), so `wam-diff-train` trains on OUT/train.json as it is:
  planning  - ego state (from the ego poses) and the navigation command in the prompt; answer = the ego positions
              of the next 8 keyframes in the current ego frame (`labels.future_trajectory`);
  detection - the annotated vehicles CAM_FRONT sees as grounding JSON (`reader.camera_objects`);
  qa        - the embedded world's questions answered from the annotations (`labels.qa_answers`).
Detection samples come from every keyframe; planning and QA from keyframes with a regular 4 s future. The
official scene splits of the version (nuscenes.utils.splits: mini_train / mini_val, train / val) make
OUT/train.json and OUT/val.json; scenes outside them are left out and counted. OUT/future_boxes_<split>.jsonl holds
each planning sample's annotated vehicle boxes at the 8 future keyframes for the collision rate of
`wam-diff score --nuscenes`. Each scene is written to OUT/parts/ first, so a rerun resumes; OUT/stats.json counts
what was kept and skipped.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import IMAGE_PLACEHOLDER, NUM_WAYPOINTS
from ..errors import UsageError
from ..types import Detection
from . import reader
from .labels import DT_TOLERANCE_S, future_trajectory, navigation_command, qa_answers

DATASOURCE = "nuscenes"
TASKS = ("planning", "detection", "qa")
FUTURE_BOX_RANGE_M = 80.0  # future boxes kept around the ego (ST-P3's grid spans +-50 m)


@dataclass(frozen=True)
class ConvertOptions:
    """min_visibility: least visibility token (1..4) of a detection box; dt_tolerance: s, see labels;
    frame_size: (W, H) the images are resized to, None keeps the camera's; tasks: a subset of TASKS."""

    min_visibility: int = reader.DEFAULT_MIN_VISIBILITY
    dt_tolerance: float = DT_TOLERANCE_S
    frame_size: Optional[tuple[int, int]] = None
    tasks: tuple = TASKS


def _write_image(src: Path, dst: Path, frame_size) -> tuple[int, int]:
    """The keyframe image at dst (a copy, or resized to frame_size); its (W, H)."""
    from PIL import Image

    dst.parent.mkdir(parents=True, exist_ok=True)
    if not src.is_file():
        raise UsageError(f"nuScenes image missing: {src} (expected the release's samples/{reader.CAMERA} files)")
    if frame_size is None:
        shutil.copyfile(src, dst)
        with Image.open(dst) as img:
            return img.size
    with Image.open(src) as img:
        img.convert("RGB").resize(tuple(frame_size), Image.BILINEAR).save(dst, quality=92)
    return tuple(frame_size)


def _detections(objects, src_size, size) -> list[Detection]:
    sx, sy = size[0] / src_size[0], size[1] / src_size[1]
    out = []
    for o in objects:
        x1, y1, x2, y2 = o.box_px[0] * sx, o.box_px[1] * sy, o.box_px[2] * sx, o.box_px[3] * sy
        norm = (x1 / size[0] * 1000, y1 / size[1] * 1000, x2 / size[0] * 1000, y2 / size[1] * 1000)
        out.append(Detection(o.label, (x1, y1, x2, y2), tuple(round(v) for v in norm)))
    return out


def _sample(sid: str, task: str, rel: str, question: str, answer: str, meta: dict) -> dict:
    return {"id": sid, "datasource": DATASOURCE, "task": task, "image": [rel],
            "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{question}"},
                              {"from": "gpt", "value": answer}], "meta": meta}


@dataclass
class _Scene:
    """What every keyframe of a scene reads: the devkit, the keyframes with their times (N,) s, ego positions (N, 2)
    and headings (N,), the annotated boxes per sample token (`reader.sample_boxes`, cached), where samples go."""

    nusc: object
    frames: list
    name: str
    split: str
    out_dir: Path
    opts: ConvertOptions

    def __post_init__(self):
        self.times = np.array([f.t for f in self.frames])
        self.xy = np.array([f.xy for f in self.frames], dtype=np.float64).reshape(-1, 2)
        self.yaw = np.array([f.yaw for f in self.frames])
        self.boxes_of = functools.lru_cache(maxsize=None)(functools.partial(reader.sample_boxes, self.nusc))

    def objects(self, sample_token: str, i: int) -> list:
        """A sample's annotated boxes in keyframe i's ego frame."""
        return reader.plane_objects(self.boxes_of(sample_token), self.frames[i].xy, self.frames[i].yaw)


def _future_boxes(sc: _Scene, i: int) -> list:
    """Per future keyframe, the annotated vehicle.* boxes [x, y, yaw, length, width] in keyframe i's ego frame."""
    return [[[round(o.x, 3), round(o.y, 3), round(o.yaw, 4), round(o.length, 3), round(o.width, 3)]
             for o in sc.objects(sc.frames[i + j].sample_token, i)
             if o.category.startswith(reader.COLLISION_CATEGORY_PREFIX) and math.hypot(o.x, o.y) <= FUTURE_BOX_RANGE_M]
            for j in range(1, NUM_WAYPOINTS + 1)]


def _keyframe(sc: _Scene, i: int):
    """The samples of keyframe i, its future boxes row (None without a trajectory) and why it has none ("")."""
    from ..codec import format_detections, format_trajectory
    from ..prompts import detection_prompt, planning_prompt, qa_prompt

    kf, opts = sc.frames[i], sc.opts
    rel = f"images/{sc.name}/{kf.index:03d}.jpg"
    size = _write_image(kf.image, sc.out_dir / rel, opts.frame_size)
    dets = _detections(reader.camera_objects(sc.nusc, kf.camera_token, opts.min_visibility), kf.size, size)
    ego = reader.ego_motion(sc.nusc, kf.camera_token)
    future, why = future_trajectory(sc.times, sc.xy, sc.yaw, i, opts.dt_tolerance)
    command = navigation_command(future) if future is not None else None
    meta = {"scene": sc.name, "scenario": DATASOURCE, "split": sc.split, "sample_token": kf.sample_token,
            "t": round(kf.t - sc.frames[0].t, 3), "command": command,
            "ego": [round(v, 4) for v in (ego.vx, ego.vy, ego.ax, ego.ay, ego.yaw_rate)],
            "frame_size": list(size), "boxes_px": [[round(c, 1) for c in d.box_px] for d in dets]}
    base = f"{sc.name}_{kf.index:03d}"
    samples = []
    if "detection" in opts.tasks:
        samples.append(_sample(f"{base}_det", "detection", rel, detection_prompt(), format_detections(dets), meta))
    if future is None:
        return samples, None, why
    if "planning" in opts.tasks:
        samples.append(_sample(f"{base}_plan", "planning", rel, planning_prompt(ego, command),
                               format_trajectory(future), meta))
    if "qa" in opts.tasks:
        vehicles = [o for o in sc.objects(kf.sample_token, i) if o.category in reader.DETECTION_LABELS]
        for kind, question, answer in qa_answers(vehicles, len(dets), ego, command, future):
            samples.append(_sample(f"{base}_qa_{kind}", "qa", rel, qa_prompt(question), answer, {**meta, "qa_kind": kind}))
    return samples, {"id": f"{base}_plan", "boxes": _future_boxes(sc, i)}, ""


def convert_scene(nusc, scene: dict, split: str, out_dir: Path, opts: ConvertOptions) -> dict:
    """One scene's samples, future boxes and counts (a part, as `wam-diff data` writes per route)."""
    t0 = time.perf_counter()
    sc = _Scene(nusc, reader.scene_keyframes(nusc, scene), scene["name"], split, out_dir, opts)
    samples, boxes, skipped = [], [], Counter()
    for i in range(len(sc.frames)):
        s, b, why = _keyframe(sc, i)
        samples += s
        if b is None:
            skipped[why] += 1
        else:
            boxes.append(b)
    return {"scene": scene["name"], "split": split, "keyframes": len(sc.frames), "planning_frames": len(boxes),
            "skipped": dict(skipped), "samples": samples, "boxes": boxes, "wall_s": round(time.perf_counter() - t0, 3)}


def merge(out_dir: Path, names: list[str], extra: dict) -> dict:
    """OUT/train.json, OUT/val.json, OUT/future_boxes_<split>.jsonl and OUT/stats.json from the scenes' parts."""
    splits = {"train": [], "val": []}
    boxes = {"train": [], "val": []}
    per_task, commands, skipped, qa_kinds, scenes = Counter(), Counter(), Counter(), Counter(), Counter()
    keyframes = planning = det_boxes = 0
    for name in names:
        part = json.loads((out_dir / "parts" / f"{name}.json").read_text())
        split = part["split"]
        scenes[split] += 1
        splits[split] += part["samples"]
        boxes[split] += part["boxes"]
        keyframes, planning = keyframes + part["keyframes"], planning + part["planning_frames"]
        skipped.update(part["skipped"])
        for s in part["samples"]:
            per_task[f"{split}/{s['task']}"] += 1
            commands.update([s["meta"]["command"]] if s["task"] == "planning" else [])
            qa_kinds.update([s["meta"]["qa_kind"]] if s["task"] == "qa" else [])
            det_boxes += len(s["meta"]["boxes_px"]) if s["task"] == "detection" else 0
    for split in splits:
        (out_dir / f"{split}.json").write_text(json.dumps(splits[split]))
        with open(out_dir / f"future_boxes_{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in boxes[split])
    stats = {**extra, "scenes": dict(scenes), "keyframes": keyframes, "planning_frames": planning,
             "planning_skipped": dict(skipped), "samples": {k: len(v) for k, v in splits.items()},
             "per_task": dict(sorted(per_task.items())), "commands": dict(commands.most_common()),
             "detection_boxes": det_boxes, "qa_kinds": dict(qa_kinds.most_common())}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def convert(dataroot: str | Path, version: str, out_dir: str | Path, opts: ConvertOptions = ConvertOptions(),
            progress: bool = True) -> dict:
    """The datasets of a nuScenes release in OUT (scenes with a part in OUT/parts are not converted again);
    returns the statistics written to OUT/stats.json."""
    from tqdm import tqdm

    from ..sim.datagen import write_part

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    nusc = reader.open_dataset(dataroot, version)
    load_s = time.perf_counter() - t0
    splits = reader.scene_splits(version)
    scenes = sorted(nusc.scene, key=lambda s: s["name"])
    kept = [s for s in scenes if s["name"] in splits]
    for scene in tqdm(kept, desc="nuscenes", unit="scene", disable=not progress):
        if not (out_dir / "parts" / f"{scene['name']}.json").is_file():
            write_part(out_dir, scene["name"], convert_scene(nusc, scene, splits[scene["name"]], out_dir, opts))
    extra = {"version": version, "dataroot": str(dataroot), "devkit_load_s": round(load_s, 3),
             "scenes_outside_splits": sorted(s["name"] for s in scenes if s["name"] not in splits),
             "min_visibility": opts.min_visibility, "dt_tolerance_s": opts.dt_tolerance,
             "wall_s": round(time.perf_counter() - t0, 2)}
    return merge(out_dir, [s["name"] for s in kept], extra)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nuscenes", required=True, metavar="DATAROOT",
                        help="the nuScenes directory (holding VERSION/scene.json, samples/, maps/)")
    parser.add_argument("--version", default="v1.0-mini", choices=sorted(reader.VERSIONS))
    parser.add_argument("--out", required=True, help="dataset directory")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--min-visibility", type=int, default=reader.DEFAULT_MIN_VISIBILITY, choices=(1, 2, 3, 4),
                        help="least visibility level of a detection box: 1 = 0-40 %%, 2 = 40-60 %%, 3 = 60-80 %%, "
                             "4 = 80-100 %% (default 2)")
    parser.add_argument("--dt-tolerance", type=float, default=DT_TOLERANCE_S,
                        help="keyframe intervals within 0.5 s +- this make a trajectory (default 0.1)")
    parser.add_argument("--frame-size", default=None, help="WxH to resize the images to (default: as recorded)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar over the scenes")


def run(args) -> int:
    from ..sim.routes import parse_frame_size

    tasks = tuple(t for t in args.tasks.split(",") if t)
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise UsageError(f"--tasks {args.tasks!r}: expected a comma-separated subset of {', '.join(TASKS)}")
    if not args.dt_tolerance >= 0:
        raise UsageError(f"--dt-tolerance {args.dt_tolerance}: expected seconds >= 0")
    frame_size = parse_frame_size(args.frame_size) if args.frame_size else None
    opts = ConvertOptions(args.min_visibility, args.dt_tolerance, frame_size, tasks)
    stats = convert(args.nuscenes, args.version, args.out, opts, progress=not args.no_progress)
    print(json.dumps(stats, indent=2))
    return 0
