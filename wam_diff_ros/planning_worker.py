"""The thread that owns the policy: plans on the newest frame set only and never builds a backlog.

Subscription callbacks hand frame sets to `submit()`, which keeps only the newest one; a set
replaced before the worker took it is a dropped frame. Questions (AskQuestion) go first. All
policy calls happen on this one thread, so the policy needs no lock.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Optional


class PlanningWorker:
    """Runs `plan_fn(item)` on the newest submitted item at most every `min_period_s` seconds,
    and `ask_fn(question)` for queued questions. Exceptions from either go to `on_error(text)`."""

    def __init__(
        self,
        plan_fn: Callable[[Any], None],
        ask_fn: Callable[[str], Any],
        on_error: Callable[[str], None],
        min_period_s: float = 0.0,
        name: str = "wam_diff_planning",
    ):
        self._plan_fn = plan_fn
        self._ask_fn = ask_fn
        self._on_error = on_error
        self._min_period_s = max(0.0, float(min_period_s))
        self._cond = threading.Condition()
        self._pending: Optional[Any] = None
        self._questions: deque[tuple[str, Future]] = deque()
        self._running = False
        self._busy = False
        self._last_plan_at = -float("inf")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.dropped = 0
        self.planned = 0

    @property
    def min_period_s(self) -> float:
        return self._min_period_s

    @min_period_s.setter
    def min_period_s(self, value: float) -> None:
        """Change the plan period while running (the planner's runtime rate_hz); the next plan waits for it."""
        with self._cond:
            self._min_period_s = max(0.0, float(value))
            self._cond.notify()

    def start(self) -> None:
        with self._cond:
            self._running = True
        self._thread.start()

    def submit(self, item: Any) -> bool:
        """Offer the newest frame set; returns True when it replaced one that was never planned."""
        with self._cond:
            replaced = self._pending is not None
            if replaced:
                self.dropped += 1
            self._pending = item
            self._cond.notify()
            return replaced

    def ask(self, question: str) -> Future:
        """Queue a question; the returned Future resolves to ask_fn's result (or its exception)."""
        future: Future = Future()
        with self._cond:
            if not self._running:
                future.set_exception(RuntimeError("planning worker is not running"))
                return future
            self._questions.append((question, future))
            self._cond.notify()
        return future

    def join(self, timeout_s: Optional[float] = None) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def idle(self) -> bool:
        """True when nothing is pending and no call is in progress (used by tests and shutdown)."""
        with self._cond:
            return self._pending is None and not self._questions and not self._busy

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop taking work; wait up to timeout_s for a call in progress. True if the thread ended."""
        with self._cond:
            self._running = False
            questions, self._questions = list(self._questions), deque()
            self._pending = None
            self._cond.notify_all()
        for _, future in questions:
            future.set_exception(RuntimeError("planner stopped before answering"))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _next_job(self):
        with self._cond:
            while True:
                if not self._running:
                    return None
                if self._questions:
                    self._busy = True
                    return ("ask",) + self._questions.popleft()
                if self._pending is not None:
                    wait_s = self._last_plan_at + self._min_period_s - time.monotonic()
                    if wait_s <= 0:
                        item, self._pending = self._pending, None
                        self._busy = True
                        return ("plan", item)
                    self._cond.wait(wait_s)
                else:
                    self._cond.wait()

    def _loop(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                if job[0] == "ask":
                    _, question, future = job
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(self._ask_fn(question))
                        except BaseException as exc:  # noqa: BLE001 - handed to the caller
                            future.set_exception(exc)
                else:
                    self._last_plan_at = time.monotonic()
                    try:
                        self._plan_fn(job[1])
                    finally:
                        self.planned += 1
            except Exception as exc:  # noqa: BLE001 - a bad plan must never end the thread
                try:
                    self._on_error(f"{type(exc).__name__}: {exc}")
                except Exception:  # noqa: BLE001
                    pass
            finally:
                with self._cond:
                    self._busy = False
