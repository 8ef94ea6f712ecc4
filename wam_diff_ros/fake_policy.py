"""A stand-in with DrivingPolicy's interface, for ROS wiring tests and dry runs without a model.

Selected by the planner parameter `model: fake`. It plans a straight line at the ego speed
(at least 1 m/s), takes `delay_s` per call like a slow model would, and records its calls (with the route
target point it was given, or None).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from wam_diff_core.constants import NUM_WAYPOINTS, TASKS, WAYPOINT_DT_S
from wam_diff_core.types import Answer, Detection, EgoState, Plan, check_command, check_route_target


class FakePolicy:
    """Deterministic fake policy: straight-line plans, a fixed detection, echoing answers."""

    uses_route_target = True  # as a DrivingPolicy whose checkpoint learned route targets: it records every one

    def __init__(self, delay_s: float = 0.0, tasks=("planning",)):
        self.delay_s = float(delay_s)
        self.tasks = tuple(tasks)
        self.plan_calls: list[dict] = []
        self.questions: list[str] = []
        self.closed = False
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str = "fake", device: str = "cpu", config=None) -> "FakePolicy":
        return cls(tasks=getattr(config, "tasks", ("planning",)))

    def plan(self, images, ego: EgoState, command: str, tasks=None, target=None) -> Plan:
        if self.closed:
            raise RuntimeError("FakePolicy used after close()")
        if not images:
            raise ValueError("plan() needs at least one image")
        for img in images:
            if not (isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3):
                raise ValueError(f"images must be HxWx3 uint8 RGB arrays, got {getattr(img, 'shape', type(img))}")
        command = check_command(command)
        target = check_route_target(target)
        tasks = tuple(tasks or self.tasks)
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown tasks {unknown}; expected a subset of {TASKS}")
        start = time.perf_counter()
        with self._lock:
            self.plan_calls.append({"shapes": [img.shape for img in images], "ego": ego, "command": command,
                                    "tasks": tasks, "target": target, "mean": float(np.mean(images[0]))})
        if self.delay_s:
            time.sleep(self.delay_s)
        speed = max(float(ego.vx), 1.0)
        t = WAYPOINT_DT_S * np.arange(1, NUM_WAYPOINTS + 1)
        trajectory = np.stack([speed * t, np.zeros_like(t)], axis=1)
        h, w = images[0].shape[:2]
        detections = None
        if "detection" in tasks:
            detections = [Detection("car", (w * 0.25, h * 0.5, w * 0.5, h * 0.75), (250.0, 500.0, 500.0, 750.0), 1.0)]
        text = ",".join(f"{v:.2f}" for v in trajectory.reshape(-1))
        return Plan(trajectory=trajectory, valid=True, detections=detections, raw_text={"planning": text},
                    timings={"total": time.perf_counter() - start})

    def ask(self, images, question: str) -> Answer:
        if self.closed:
            raise RuntimeError("FakePolicy used after close()")
        if not images:
            raise ValueError("ask() needs at least one image")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        with self._lock:
            self.questions.append(question)
        if self.delay_s:
            time.sleep(self.delay_s)
        text = f"fake answer to: {question.strip()} ({len(images)} image(s))"
        return Answer(question=question, text=text, raw_text=text, timings={"total": self.delay_s})

    def close(self) -> None:
        self.closed = True
