"""Lifecycle transitions that never raise and never overlap, for any rclpy LifecycleNode.

rclpy turns an exception in a transition callback into ERROR without a word; `transition(name)` logs one line
naming the transition and the exception first, and returns FAILURE instead of ERROR for a cause the user can fix
(TransitionFailure, or any WamDiffError: a bad parameter, a model that does not load). FAILURE leaves the node
in the state it was in; ERROR runs on_error, which (in the planner) frees everything and returns to unconfigured.

`serialize_change_state(node, lock)` lets one transition run at a time when the lifecycle services sit in a
reentrant callback group (so get_state answers during a slow transition): a change_state request that arrives
during another transition is answered success=false at once, as rclcpp's state machine answers a transition
requested from a transition state.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

from rclpy.lifecycle import TransitionCallbackReturn

from wam_diff_core.console import one_line
from wam_diff_core.errors import WamDiffError


class TransitionFailure(Exception):
    """A transition that cannot complete for a cause the user can fix: FAILURE (the state stays), not ERROR."""


def transition(name: str, on_exception: TransitionCallbackReturn = TransitionCallbackReturn.ERROR) -> Callable:
    """Decorate a transition callback `fn(node, state)`: an exception becomes one call of
    `node.transition_failed(name, text)` and FAILURE (TransitionFailure, WamDiffError) or `on_exception`."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(node, state) -> TransitionCallbackReturn:
            try:
                return fn(node, state)
            except (TransitionFailure, WamDiffError) as exc:
                node.transition_failed(name, one_line(exc))
                return TransitionCallbackReturn.FAILURE
            except Exception as exc:  # noqa: BLE001 - rclpy would swallow it; the caller gets ERROR and a log line
                node.transition_failed(name, f"{type(exc).__name__}: {one_line(exc)}")
                return on_exception

        return run

    return wrap


def serialize_change_state(node, lock: threading.Lock) -> None:
    """Guard `node`'s change_state service with `lock` (also held by the node's trigger_* calls): a request that
    finds another transition running is refused with success=false and a warning naming the state."""
    service = node._service_change_state  # created by LifecycleNodeMixin.__init__
    handle = service.callback

    def change_state(request, response):
        if not lock.acquire(blocking=False):
            node.get_logger().warning(f"change_state refused: a transition is in progress "
                                      f"(state {node._state_machine.current_state[1]!r})")
            response.success = False
            return response
        try:
            return handle(request, response)
        finally:
            lock.release()

    service.callback = change_state
