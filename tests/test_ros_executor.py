"""ReadyOnceExecutor: each ready callback reaches the thread pool once, while rclpy's MultiThreadedExecutor (Jazzy)
submits a callback again every time it finds it still waiting for a worker."""
from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")

from rclpy.callback_groups import ReentrantCallbackGroup  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402

from wam_diff_ros.executor import ReadyOnceExecutor  # noqa: E402

BUSY_S = 0.02  # each callback holds the GIL this long, as the planner's Python between torch calls does


def _busy() -> None:
    end = time.perf_counter() + BUSY_S
    while time.perf_counter() < end:
        pass


def _spin(executor_cls, seconds: float = 1.0) -> tuple[int, int]:
    """Three 5-ms timers with GIL-holding callbacks on a two-worker pool: (submissions to the pool, callbacks run)."""
    context = Context()
    rclpy.init(context=context)
    node = rclpy.create_node("ready_once", context=context)
    ran = []
    group = ReentrantCallbackGroup()
    for i in range(3):
        node.create_timer(0.005, lambda i=i: (ran.append(i), _busy()), callback_group=group)
    executor = executor_cls(num_threads=2, context=context)
    submitted = [0]
    submit = executor._executor.submit

    def counting_submit(*args, **kwargs):
        submitted[0] += 1
        return submit(*args, **kwargs)

    executor._executor.submit = counting_submit
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    time.sleep(seconds)
    executor.shutdown(timeout_sec=1.0)
    node.destroy_node()
    rclpy.try_shutdown(context=context)
    thread.join(timeout=2.0)
    return submitted[0], len(ran)


def test_the_pool_gets_each_ready_callback_once():
    submitted, ran = _spin(ReadyOnceExecutor)
    assert ran > 20  # the timers kept firing
    assert submitted <= ran + 3  # the callbacks still queued when the spin stopped (one per timer) never ran


def test_rclpys_own_executor_submits_waiting_callbacks_again():
    """What ReadyOnceExecutor is for: the same load on the stock executor queues many duplicates."""
    submitted, ran = _spin(MultiThreadedExecutor)
    assert submitted > 2 * ran  # measured 3.0-3.9x on the 2-core CPU
