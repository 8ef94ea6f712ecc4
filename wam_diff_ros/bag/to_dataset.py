"""`wam-diff-bag to-dataset BAG... --out DIR`: planning samples from recorded drives, in the format of `wam-diff data`
(docs/architecture.md; `wam-diff-train --data DIR/train.json` reads them): a camera frame every `period_s` (default
0.5 s: `wam-diff data --every 5` at 10 Hz), the ego state of the latest odometry as `wam-diff data` states it
and the planner node holds it (ego_motion.EgoMotion), the command and route target the planner node would hold at that frame (inputs.py),
and as the answer the next 4 s of the recorded odometry, 8 waypoints 0.5 s apart in the frame's ego frame
(odometry_track.OdometryTrack). Frames without 4 s of odometry after them (the end of a drive, a gap) are skipped
and counted.

Splits go by bag, never by frame: bags given with --val land in val.json, the others in train.json. Each finished
bag is written to OUT/parts/<bag>.json, so a rerun resumes; train.json, val.json and stats.json are rebuilt at the end.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from wam_diff_core.constants import IMAGE_PLACEHOLDER, WAYPOINT_DT_S

from . import topics as T
from .errors import BagError
from .inputs import Cameras, NodeInputs
from .odometry_track import OdometryTrack
from .reading import BagReader

DATASOURCE = "rosbag2"
_TOLERANCE_NS = 1_000_000  # a frame 1 ms early still counts as on the sampling period


def bag_name(path) -> str:
    p = Path(path)
    return p.stem if p.is_file() else p.name


def route_meta(custom: dict) -> dict:
    """route_id, scenario and seed of a bag `record` wrote (its custom_data), so the training data filters
    (scenarios, route targets) treat its samples as `wam-diff data`'s; {} for other bags."""
    try:
        route = json.loads(custom.get("wam_diff.route", ""))
        return {"route_id": route["route_id"], "scenario": route["scenario"], "seed": route["seed"]}
    except (ValueError, KeyError, TypeError):
        return {}


def planning_sample(name: str, index: int, rel: str, frame_size, stamp_ns: int, t0_ns: int, ego, command: str,
                    target, label, split: str, extra: dict) -> dict:
    from wam_diff_core.codec import format_trajectory
    from wam_diff_core.prompts import planning_prompt

    return {"id": f"{name}_{index:04d}_plan", "datasource": DATASOURCE, "task": "planning", "image": [rel],
            "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{planning_prompt(ego, command, target)}"},
                              {"from": "gpt", "value": format_trajectory(label)}],
            "meta": {"bag": name, **extra, "frame": index, "stamp_ns": stamp_ns, "t": round((stamp_ns - t0_ns) * 1e-9, 6),
                     "split": split, "command": command, "ego": [ego.vx, ego.vy, ego.ax, ego.ay, ego.yaw_rate],
                     "frame_size": [int(frame_size[0]), int(frame_size[1])]}}


def _topics(reader: BagReader, camera_topic: str, odometry_topic: str, command_topic: str, route_target_topic: str):
    compressed = reader.require(camera_topic, T.CAMERA_TYPES) == T.COMPRESSED_IMAGE
    reader.require(odometry_topic, (T.ODOMETRY,))
    optional = [t for t, types in ((command_topic, (T.STRING,)), (route_target_topic, (T.POINT_STAMPED,)))
                if reader.require(t, types, optional=True)]
    return compressed, [camera_topic, odometry_topic] + optional


def bag_samples(bag_path, out_dir: Path, split: str = "train", *, period_s: float = 5 * 0.1,
                camera_topic: str = T.CAMERA_TOPIC, odometry_topic: str = T.ODOMETRY_TOPIC,
                command_topic: str = T.COMMAND_TOPIC, route_target_topic: str = T.ROUTE_TARGET_TOPIC,
                bar=None) -> dict:
    """One bag's samples and counts (a part: `samples`, `frames`, `skipped`, ...); frames saved under
    OUT/images/<bag>/."""
    from PIL import Image

    name = bag_name(bag_path)
    period_ns = int(round(period_s * 1e9))
    img_dir = out_dir / "images" / name
    img_dir.mkdir(parents=True, exist_ok=True)
    track, inputs, skipped = OdometryTrack(), NodeInputs(), Counter()
    taken: list[tuple] = []  # (index, rel, size, stamp, ego, command, target)
    next_ns, index, t0_ns = None, -1, None
    with BagReader(bag_path) as reader:
        compressed, read = _topics(reader, camera_topic, odometry_topic, command_topic, route_target_topic)
        camera = Cameras([camera_topic], [compressed])
        extra = route_meta(reader.custom)
        for m in reader.messages(read, last=[camera_topic]):
            if m.topic == odometry_topic:
                track.add(m.msg.header.stamp.sec * 1_000_000_000 + m.msg.header.stamp.nanosec, m.msg)
            if m.topic != camera_topic:
                inputs.feed(m.topic, m.msg, odometry_topic, command_topic, route_target_topic)
                continue
            index += 1
            if bar is not None:
                bar.update(1)
            stamp = m.msg.header.stamp.sec * 1_000_000_000 + m.msg.header.stamp.nanosec
            if next_ns is not None and stamp < next_ns - _TOLERANCE_NS:
                continue
            frame_set = camera.add(camera_topic, m.msg)
            if frame_set is None:
                skipped["rejected frame"] += 1
                continue
            next_ns = stamp + period_ns
            t0_ns = stamp if t0_ns is None else t0_ns
            frame = frame_set.frames[0].frame
            rel = f"images/{name}/{index:04d}.png"
            Image.fromarray(frame).save(out_dir / rel, compress_level=1)
            taken.append((index, rel, (frame.shape[1], frame.shape[0]), stamp, inputs.ego, inputs.command,
                          inputs.target_for(stamp)))
    samples = []
    for frame_index, rel, size, stamp, ego, command, target in taken:
        label, why = track.label(stamp)
        if label is None:
            skipped[why] += 1
            (out_dir / rel).unlink(missing_ok=True)
            continue
        samples.append(planning_sample(name, frame_index, rel, size, stamp, t0_ns, ego, command, target, label, split,
                                       extra))
    return {"bag": str(bag_path), "name": name, "split": split, "camera_frames": index + 1, "frames_taken": len(taken),
            "frames": len(samples), "skipped": dict(skipped), "inputs_rejected": dict(inputs.rejected),
            "odometry_samples": len(track), "samples": samples}


def to_dataset(train_bags: Sequence, out_dir, val_bags: Sequence = (), *, period_s: float = 0.5,
               progress: bool = True, **topics) -> dict:
    """Samples of every bag in OUT (parts, then train.json, val.json and stats.json); returns the statistics."""
    from wam_diff_core.sim.datagen import write_part

    out_dir = Path(out_dir)
    jobs = [(b, "train") for b in train_bags] + [(b, "val") for b in val_bags]
    names = Counter(bag_name(b) for b, _ in jobs)
    twice = sorted(n for n, c in names.items() if c > 1)
    if twice:
        raise BagError(f"bags named {twice} given more than once (a bag's name names its images and samples)")
    if not period_s > 0:
        raise BagError(f"--period-s {period_s}: expected a positive number of seconds")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    todo = [(b, s) for b, s in jobs if not (out_dir / "parts" / f"{bag_name(b)}.json").is_file()]
    bar = _bar(progress, todo)
    try:
        for bag, split in todo:
            write_part(out_dir, bag_name(bag), bag_samples(bag, out_dir, split, period_s=period_s, bar=bar, **topics))
    finally:
        if bar is not None:
            bar.close()
    return merge(out_dir, [bag_name(b) for b, _ in jobs], time.perf_counter() - t0)


def _bar(progress: bool, todo: list):
    if not progress or not todo:
        return None
    from tqdm import tqdm

    total = 0
    for bag, _ in todo:
        with BagReader(bag) as reader:
            total += max((n for t, (m, n) in reader.topics.items() if m in T.CAMERA_TYPES), default=0)
    return tqdm(total=total, desc="to-dataset", unit="frame")


def merge(out_dir: Path, names: list[str], wall_s: float) -> dict:
    """OUT/train.json, OUT/val.json and OUT/stats.json from the parts of `names`."""
    splits: dict[str, list] = {"train": [], "val": []}
    skipped, per_bag, commands = Counter(), {}, Counter()
    for name in names:
        part = json.loads((out_dir / "parts" / f"{name}.json").read_text())
        splits[part["split"]].extend(part["samples"])
        skipped.update(part["skipped"])
        per_bag[name] = {k: part[k] for k in ("split", "camera_frames", "frames_taken", "frames", "skipped")}
        commands.update(s["meta"]["command"] for s in part["samples"])
    for split, samples in splits.items():
        (out_dir / f"{split}.json").write_text(json.dumps(samples))
    stats = {"bags": len(names), "samples": {k: len(v) for k, v in splits.items()}, "skipped": dict(skipped),
             "per_bag": per_bag, "commands": dict(commands.most_common()), "wall_s": round(wall_s, 2),
             "waypoint_dt_s": WAYPOINT_DT_S}
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats
