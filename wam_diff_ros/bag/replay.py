"""`wam-diff-bag replay BAG --model M --out OUT_BAG`: the planner run on every frame set of a recorded drive,
deterministically and as fast as the model allows (no DDS): the node's camera matching, ego-state, command and
route-target rules (inputs.py), its outputs (plan_outputs.py) written with the input stamps into a new bag that
Foxglove or RViz opens. Unlike the live node, no frame set is dropped while the model is busy.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from wam_diff_core.types import Plan

from . import plan_outputs as out_msgs
from . import topics as T
from .errors import BagError
from .inputs import Cameras, NodeInputs
from .reading import BagReader
from .writing import BagWriter


class Replay:
    """The planning half of the node over one bag: `run()` plans each frame set and writes the outputs."""

    def __init__(self, policy, tasks: Sequence[str] = ("planning",), questions: Sequence[str] = (),
                 ask_every: int = 10, base_frame_id: str = T.BASE_FRAME_ID):
        if ask_every < 1:
            raise ValueError(f"ask_every {ask_every}: expected a whole number of frame sets >= 1")
        self.policy, self.tasks, self.questions, self.ask_every = policy, tuple(tasks), list(questions), ask_every
        self.base_frame_id = base_frame_id
        self.latencies: list[float] = []
        self.answer_latencies: list[float] = []
        self.counts: Counter = Counter()
        self.plans: list[dict] = []  # per frame set: stamp, command, valid, trajectory (for tests and --json)

    def plan(self, frame_set, inputs: NodeInputs) -> tuple[Plan, float]:
        """The node's `_plan`: the policy on the frame set's frames with the current inputs; a policy failure is an
        invalid plan naming it."""
        frames = [f.frame for f in frame_set.frames]
        target = inputs.target_for(frame_set.stamp_ns)
        t0 = time.perf_counter()
        try:
            plan = self.policy.plan(frames, inputs.ego, inputs.command, tasks=self.tasks, target=target)
        except Exception as exc:  # noqa: BLE001 - as the node: a bad input for the model must not end planning
            self.counts["plan_errors"] += 1
            plan = Plan(trajectory=None, valid=False, errors={"policy": f"policy.plan failed: {type(exc).__name__}: {exc}"})
        seconds = time.perf_counter() - t0
        self.counts["plans_with_route_target"] += target is not None
        return plan, seconds

    def write_outputs(self, bag: BagWriter, frame_set, plan: Plan, seconds: float, command: str) -> None:
        store, ns = bag.store, frame_set.stamp_ns
        camera_frame = frame_set.frames[0].frame_id
        decoding = getattr(self.policy, "config", None)  # the policy's effective B and K
        msgs = {"trajectory": out_msgs.trajectory_msg(store, plan, ns, self.base_frame_id, command,
                                                      getattr(decoding, "block_size", 0), getattr(decoding, "steps", 0),
                                                      seconds),
                "path": out_msgs.path_msg(store, plan, ns, self.base_frame_id),
                "markers": out_msgs.marker_array_msg(store, plan, ns, self.base_frame_id)}
        if "detection" in self.tasks:
            msgs["detections"] = out_msgs.detections_msg(store, plan.detections, ns, camera_frame)
        for name, msg in msgs.items():
            topic, msgtype = T.OUTPUTS[name]
            bag.write(topic, msgtype, ns, msg)

    def ask(self, bag: BagWriter, frame_set) -> None:
        frames = [f.frame for f in frame_set.frames]
        topic, msgtype = T.OUTPUTS["answer"]
        for question in self.questions:
            t0 = time.perf_counter()
            answer = self.policy.ask(frames, question)
            seconds = time.perf_counter() - t0
            self.answer_latencies.append(seconds)
            bag.write(topic, msgtype, frame_set.stamp_ns, out_msgs.answer_msg(
                bag.store, frame_set.stamp_ns, frame_set.frames[0].frame_id, question, answer.text, seconds))

    def on_frame_set(self, bag: BagWriter, frame_set, inputs: NodeInputs) -> None:
        plan, seconds = self.plan(frame_set, inputs)
        self.latencies.append(seconds)
        self.counts["plans"] += 1
        self.counts["invalid_plans"] += not (plan.valid and plan.trajectory is not None)
        self.write_outputs(bag, frame_set, plan, seconds, inputs.command)
        self.plans.append({"stamp_ns": frame_set.stamp_ns, "command": inputs.command, "valid": bool(plan.valid),
                           "trajectory": None if plan.trajectory is None else np.asarray(plan.trajectory).tolist()})
        if self.questions and (self.counts["plans"] - 1) % self.ask_every == 0:
            self.ask(bag, frame_set)


def _camera_types(reader: BagReader, camera_topics: Sequence[str]) -> list[bool]:
    return [reader.require(topic, T.CAMERA_TYPES) == T.COMPRESSED_IMAGE for topic in camera_topics]


def replay(bag_path, policy, out_path, *, camera_topics: Sequence[str] = (T.CAMERA_TOPIC,),
           odometry_topic: str = T.ODOMETRY_TOPIC, command_topic: str = T.COMMAND_TOPIC,
           route_target_topic: str = T.ROUTE_TARGET_TOPIC, tasks: Sequence[str] = ("planning",),
           questions: Sequence[str] = (), ask_every: int = 10, storage: str = "mcap", copy_inputs: bool = False,
           progress: bool = True, model_name: str = "") -> dict:
    """Replay `bag_path` through `policy` into the new bag `out_path`; returns the summary (`summary`)."""
    runner = Replay(policy, tasks, questions, ask_every)
    t0 = time.perf_counter()
    with BagReader(bag_path) as reader:
        compressed = _camera_types(reader, camera_topics)
        optional = {odometry_topic: (T.ODOMETRY,), command_topic: (T.STRING,), route_target_topic: (T.POINT_STAMPED,)}
        present = [t for t, types in optional.items() if reader.require(t, types, optional=True)]
        cameras, inputs = Cameras(camera_topics, compressed), NodeInputs()
        wanted = list(camera_topics) + present
        # --copy-inputs: every input topic whose type the typestore knows (/clock too) goes into the output bag
        copied = [t for t, (m, _) in reader.topics.items() if m in reader.store.types] if copy_inputs else []
        total = sum(reader.topics[t][1] for t in camera_topics[:1])
        custom = {"wam_diff.replay_of": str(bag_path), "wam_diff.model": model_name, "wam_diff.tasks": ",".join(tasks)}
        with BagWriter(out_path, reader.store, storage, custom) as bag:
            bar = _bar(progress, total)
            for m in reader.messages(wanted + [t for t in copied if t not in wanted], last=camera_topics):
                if m.topic in copied:
                    bag.write(m.topic, m.msgtype, m.log_ns, m.msg)
                if m.topic not in cameras.index:
                    inputs.feed(m.topic, m.msg, odometry_topic, command_topic, route_target_topic)
                    continue
                if bar is not None and m.topic == camera_topics[0]:
                    bar.update(1)
                frame_set = cameras.add(m.topic, m.msg)
                if frame_set is not None:
                    runner.on_frame_set(bag, frame_set, inputs)
            if bar is not None:
                bar.close()
    return summary(runner, cameras, inputs, bag, bag_path, out_path, time.perf_counter() - t0, model_name)


def _bar(progress: bool, total: int):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="replay", unit="frame")


def _ms(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1e3, 1) if values else None


def summary(runner: Replay, cameras: Cameras, inputs: NodeInputs, bag: BagWriter, bag_path, out_path, wall_s: float,
            model_name: str) -> dict:
    plans = runner.counts["plans"]
    return {
        "bag": str(bag_path), "out": str(out_path), "model": model_name, "tasks": list(runner.tasks),
        "frame_sets": plans, "plans": plans, "invalid_plans": runner.counts["invalid_plans"],
        "plan_errors": runner.counts["plan_errors"], "plans_with_route_target": runner.counts["plans_with_route_target"],
        "frames_rejected": cameras.rejected, "frames_unmatched": cameras.sync.unmatched,
        "inputs_rejected": dict(inputs.rejected), "odometry": "received" if inputs.odometry_seen else "none (ego speed 0)",
        "frame_sizes": sorted(f"{w}x{h}" for w, h in cameras.frame_sizes),
        "latency_ms": {"p50": _ms(runner.latencies, 50), "p95": _ms(runner.latencies, 95),
                       "max": _ms(runner.latencies, 100),
                       "mean": round(float(np.mean(runner.latencies)) * 1e3, 1) if runner.latencies else None},
        "answers": len(runner.answer_latencies), "answer_latency_ms_p50": _ms(runner.answer_latencies, 50),
        "wall_s": round(wall_s, 2), "plans_per_s": round(plans / wall_s, 2) if wall_s > 0 else None,
        "policy_plans_per_s": round(plans / sum(runner.latencies), 2) if runner.latencies else None,
        "written": dict(bag.counts),
    }


def format_summary(s: dict) -> str:
    """The summary as a small table (what the command prints)."""
    lat = s["latency_ms"]
    rows = [("frame sets planned", s["plans"]), ("invalid plans", s["invalid_plans"]),
            ("frames rejected / unmatched", f"{s['frames_rejected']} / {s['frames_unmatched']}"),
            ("plan latency p50 / p95 / max (ms)", f"{lat['p50']} / {lat['p95']} / {lat['max']}"),
            ("plans/s (wall, whole replay)", s["plans_per_s"]), ("plans/s (policy time only)", s["policy_plans_per_s"]),
            ("answers", s["answers"]), ("wall (s)", s["wall_s"])]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("written: " + ", ".join(f"{t} {n}" for t, n in sorted(s["written"].items())))
    return "\n".join(lines)


def write_json(summary_: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary_, indent=2))


__all__ = ["BagError", "Replay", "format_summary", "replay", "summary", "write_json"]
