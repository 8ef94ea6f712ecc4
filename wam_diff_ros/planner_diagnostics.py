"""What the planner's /diagnostics status says, and how often errors may speak.

The node publishes one DiagnosticStatus every `diagnostics_period_s`, in every lifecycle state. An error also
publishes one at once when the last status did not already report its kind, at most once per period for each
kind (the immediate one restarts the period), and logs at most once per ERROR_LOG_PERIOD_S per kind: a flood of one
kind costs each message a counter update, and never silences the first report of another kind. No ROS calls here.
"""
from __future__ import annotations

import math
import threading
import time
from pathlib import PurePath
from typing import Callable, Optional

from diagnostic_msgs.msg import DiagnosticStatus

ERROR_LOG_PERIOD_S = 1.0

# The counter of each rejected input -> its error kind (one throttle each); other kinds: "plan" (the policy
# raised), "ask" (a question failed), "lifecycle" (a transition failed), "worker" (the planning thread).
INPUT_ERROR_KINDS = {"frames_rejected": "image", "odometry_rejected": "odometry", "commands_rejected": "command",
                     "route_targets_rejected": "route_target", "questions_rejected": "ask"}


class ErrorThrottle:
    """At most one `allow(kind)` True per `period_s` for each kind (monotonic seconds)."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic):
        self.period_s = float(period_s)
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def allow(self, kind: str) -> bool:
        now = self._clock()
        with self._lock:
            if now - self._last.get(kind, -math.inf) < self.period_s:
                return False
            self._last[kind] = now
            return True


def hardware_id(model: str, device: str) -> str:
    """'<device>/<model name>', e.g. 'cuda:0/nano-s-b32': a checkpoint directory is named by its last part."""
    name = PurePath(str(model).rstrip("/")).name or str(model)
    return f"{device}/{name}"


def planner_status(state: str, in_error: bool, last_error: str, plans_published: int,
                   off_size: Optional[str] = None) -> tuple[bytes, str]:
    """(level, message) of the planner's status: ERROR while the latest event is an error; WARN outside `active`
    (the lifecycle state names it), while waiting for frames, or with frames of another size than the model
    learned (`off_size` says which); else OK, 'planning'."""
    if in_error:
        return DiagnosticStatus.ERROR, last_error
    if state == "activating":
        return DiagnosticStatus.WARN, "activating: loading the model"
    if state != "active":
        return DiagnosticStatus.WARN, {"unconfigured": "unconfigured: configure and activate to plan",
                                       "inactive": "inactive: no model loaded"}.get(state, state)
    if plans_published == 0:
        return DiagnosticStatus.WARN, "waiting for camera frames"
    if off_size:
        return DiagnosticStatus.WARN, f"planning; {off_size}"
    return DiagnosticStatus.OK, "planning"
