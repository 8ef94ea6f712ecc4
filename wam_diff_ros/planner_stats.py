"""Counters and latency percentiles the planner node reports as diagnostics. No ROS imports."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional

import numpy as np


class PlannerStats:
    """Thread-safe counters (frames received / rejected / unmatched / dropped / planned) and the
    latencies of the last `window` plans, in seconds."""

    COUNTERS = ("frames_received", "frames_rejected", "frames_unmatched", "frames_dropped",
                "plans_published", "plans_invalid", "plan_errors", "questions_answered",
                "frames_off_size",  # camera frames of another size than the model was trained on
                "plans_with_route_target",  # published plans whose policy call was given a route target point
                "route_targets_rejected",  # route target messages in another frame or with non-finite x, y
                "odometry_rejected", "commands_rejected", "questions_rejected",  # input_checks.py refused them
                "sync_resets")  # camera stamps that jumped back (a looped bag, a restarted simulator)

    def __init__(self, window: int = 200):
        self._lock = threading.Lock()
        self._window = window
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.counts = {name: 0 for name in self.COUNTERS}
            self.latency_s: deque[float] = deque(maxlen=self._window)   # newest frame received -> outputs published
            self.policy_s: deque[float] = deque(maxlen=self._window)    # policy.plan() wall time
            self.stamp_age_s: deque[float] = deque(maxlen=self._window)  # clock now - input stamp at publish
            self.last_error = ""
            self.last_error_kind = ""  # what failed: "image", "odometry", "plan", ... (planner_diagnostics.py)
            self.last_error_wall: Optional[float] = None
            self.last_ok_wall: Optional[float] = None

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def set_count(self, name: str, value: int) -> None:
        with self._lock:
            self.counts[name] = value

    def error(self, text: str, kind: str = "") -> None:
        with self._lock:
            self.last_error = text
            self.last_error_kind = kind
            self.last_error_wall = time.time()

    def clear_error(self) -> None:
        """Forget the last error (a transition that succeeded after a failed one): the status is no longer ERROR."""
        with self._lock:
            self.last_error = ""
            self.last_error_kind = ""
            self.last_error_wall = None

    def plan_done(self, latency_s: float, policy_s: float, stamp_age_s: float, valid: bool) -> None:
        with self._lock:
            self.counts["plans_published"] += 1
            if not valid:
                self.counts["plans_invalid"] += 1
            self.latency_s.append(latency_s)
            self.policy_s.append(policy_s)
            self.stamp_age_s.append(stamp_age_s)
            self.last_ok_wall = time.time()

    @property
    def in_error(self) -> bool:
        """True while the most recent event was an error (no good plan since)."""
        with self._lock:
            if self.last_error_wall is None:
                return False
            return self.last_ok_wall is None or self.last_error_wall >= self.last_ok_wall

    def snapshot(self) -> dict[str, str]:
        """All values as strings, ready for diagnostic_msgs/KeyValue (milliseconds for latencies)."""
        with self._lock:
            values = {name: str(v) for name, v in self.counts.items()}
            for label, series in (("latency", self.latency_s), ("policy", self.policy_s),
                                  ("stamp_age", self.stamp_age_s)):
                for q in (50, 95, 99):
                    values[f"{label}_p{q}_ms"] = _percentile_ms(series, q)
                values[f"{label}_max_ms"] = _percentile_ms(series, 100)
            values["latency_window"] = str(len(self.latency_s))
            values["last_error"] = self.last_error
            values["last_error_kind"] = self.last_error_kind
            return values


def _percentile_ms(series, q: float) -> str:
    if not series:
        return "nan"
    return f"{float(np.percentile(np.fromiter(series, float), q)) * 1e3:.1f}"
