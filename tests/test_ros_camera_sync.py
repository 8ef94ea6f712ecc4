"""Approximate-time camera matching and the newest-only planning worker (pure Python)."""
import threading
import time

import pytest

from wam_diff_ros.camera_sync import ApproximateTimeSync, StampedFrame
from wam_diff_ros.planning_worker import PlanningWorker

MS = 1_000_000


def _f(ms, tag=None):
    return StampedFrame(int(ms * MS), tag if tag is not None else ms)


def test_single_camera_every_frame_is_a_set():
    sync = ApproximateTimeSync(1, 0.05)
    assert sync.add(0, _f(0)).stamp_ns == 0
    assert sync.add(0, _f(100)).stamp_ns == 100 * MS
    assert sync.unmatched == 0


def test_two_cameras_20ms_apart_match_and_200ms_apart_do_not():
    sync = ApproximateTimeSync(2, 0.05)
    assert sync.add(0, _f(1000)) is None
    matched = sync.add(1, _f(1020))
    assert matched is not None and [f.frame for f in matched.frames] == [1000, 1020]
    assert matched.stamp_ns == 1000 * MS and matched.spread_ns == 20 * MS
    assert sync.add(0, _f(2000)) is None
    assert sync.add(1, _f(2200)) is None  # 200 ms apart: no set
    assert sync.unmatched == 0
    # a later good pair is matched; the two stale frames are then counted as unmatched
    assert sync.add(0, _f(3000)) is None
    assert [f.frame for f in sync.add(1, _f(3010)).frames] == [3000, 3010]
    assert sync.unmatched == 2


def test_matching_picks_the_closest_frame_and_never_goes_back_in_time():
    sync = ApproximateTimeSync(2, 0.05)
    for ms in (0, 33, 66):
        sync.add(0, _f(ms))
    matched = sync.add(1, _f(40))
    assert [f.frame for f in matched.frames] == [33, 40]
    assert sync.unmatched == 1  # frame 0 of camera 0 is older than the emitted set
    assert sync.add(1, _f(30)) is None  # older than the last set on camera 1
    assert sync.unmatched == 2


def test_history_overflow_counts_unmatched_frames():
    sync = ApproximateTimeSync(2, 0.01, history=3)
    for ms in range(0, 500, 100):
        assert sync.add(0, _f(ms)) is None
    assert sync.unmatched == 2


def test_invalid_sync_arguments_are_rejected():
    with pytest.raises(ValueError, match="num_cameras"):
        ApproximateTimeSync(0, 0.05)
    with pytest.raises(ValueError, match="slop_s"):
        ApproximateTimeSync(1, -1.0)
    with pytest.raises(ValueError, match="camera index 2"):
        ApproximateTimeSync(2, 0.05).add(2, _f(0))


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_worker_plans_on_the_newest_item_and_counts_the_replaced_ones_as_dropped():
    planned, gate = [], threading.Event()

    def plan(item):
        gate.wait(5)
        planned.append(item)

    worker = PlanningWorker(plan, lambda q: q, lambda e: None)
    worker.start()
    worker.submit(0)
    _wait(lambda: not worker.idle and worker._pending is None)  # item 0 taken, worker blocked
    for i in range(1, 50):
        worker.submit(i)
    gate.set()
    _wait(lambda: worker.idle)
    assert planned == [0, 49]
    assert worker.dropped == 48 and worker.planned == 2
    assert worker.stop(1.0)


def test_worker_answers_questions_before_planning_and_survives_exceptions():
    errors = []

    def plan(item):
        raise RuntimeError(f"boom {item}")

    worker = PlanningWorker(plan, lambda q: f"answer to {q}", errors.append)
    worker.start()
    worker.submit(1)
    assert worker.ask("why?").result(timeout=5) == "answer to why?"
    _wait(lambda: worker.idle)
    assert errors == ["RuntimeError: boom 1"]
    worker.submit(2)
    _wait(lambda: len(errors) == 2)
    assert worker.stop(1.0)
    with pytest.raises(RuntimeError, match="not running"):
        worker.ask("late").result(timeout=1)


def test_worker_rate_cap_spaces_plans_by_min_period():
    starts = []
    worker = PlanningWorker(lambda item: starts.append(time.monotonic()), lambda q: q, lambda e: None,
                            min_period_s=0.1)
    worker.start()
    for i in range(3):
        worker.submit(i)
        _wait(lambda: len(starts) == i + 1)
    assert worker.stop(1.0)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= 0.099
