"""The multi-threaded executor the nodes spin on: rclpy's, submitting each ready callback to its thread pool once.

rclpy's MultiThreadedExecutor (Jazzy, rclpy 7.x) yields a callback again while it still waits in the thread pool
for a free worker, and submits it again each time; the duplicates return at once when they run, but each one
needs a worker and the GIL. While the planner's decoding thread also wants the GIL, a callback can wait long
enough for the spin thread to submit it thousands of times: the spin thread then runs at 100 % of a core for
seconds, the workers switch context thousands of times a second, and the camera frames that arrive meanwhile
overwrite each other in their depth-1 queue (measured on the 2-core CPU: 15-73 frames lost in transport in one
stretch, once per 3,000-frame run; docs/ros.md, "Latency"). rclpy 10.0.4 fixed this upstream (ros2/rclpy#1547).

`ReadyOnceExecutor` keeps one submission per waiting callback: when the same callback is yielded again before a
worker started it, the spin thread waits (without the GIL) until a worker has, instead of submitting it again.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from rclpy.executors import (
    ConditionReachedException,
    ExternalShutdownException,
    MultiThreadedExecutor,
    ShutdownException,
    TimeoutException,
)

# longest wait of the spin thread for a worker to start a callback it already submitted; it then looks again
START_WAIT_S = 0.05
_NOTHING_READY = (ExternalShutdownException, ShutdownException, TimeoutException, ConditionReachedException)


class ReadyOnceExecutor(MultiThreadedExecutor):
    """MultiThreadedExecutor whose thread pool holds each waiting callback once (module docstring)."""

    def __init__(self, num_threads: Optional[int] = None, **kwargs):
        super().__init__(num_threads=num_threads, **kwargs)
        self._waiting: dict = {}  # submitted callback -> Event set when a worker starts it
        self._waiting_lock = threading.Lock()
        self.submissions = 0  # callbacks handed to the pool (tests compare it with the callbacks that ran)

    def _spin_once_impl(self, timeout_sec=None, wait_condition: Callable[[], bool] = lambda: False) -> None:
        try:
            handler, _entity, _node = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except _NOTHING_READY:
            return
        with self._waiting_lock:
            started = self._waiting.get(handler)
            if started is None:
                started = self._waiting[handler] = threading.Event()
                submit = True
            else:
                submit = False
        if not submit:
            started.wait(START_WAIT_S)
            return
        self.submissions += 1
        self._executor.submit(self._run, handler, started)
        self._futures.append(handler)
        for future in self._futures[:]:
            if future.done():
                self._futures.remove(future)
                future.result()  # raise any exceptions, as the base class does

    def _run(self, handler, started: threading.Event) -> None:
        started.set()
        try:
            handler()
        finally:
            with self._waiting_lock:
                self._waiting.pop(handler, None)
