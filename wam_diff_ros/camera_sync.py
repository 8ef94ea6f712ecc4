"""Approximate-time matching of several camera streams (message_filters is not installable here).

Each camera keeps a short history of frames. When a frame arrives, the matcher tries to build a
set around it: from every other camera the frame closest in time, accepted when the spread of
the set's stamps is within `slop_s`. Sets only move forward in time; frames older than the last
emitted set, or pushed out of the history unmatched, are counted as `unmatched`.
With one camera every frame is a set.

A frame more than `max_jump_back_s` (by default 1 s, or twice the slop if larger) older than its
camera's last used frame is not a late frame but a clock that jumped back (a bag replayed in a
loop, a restarted simulator, or one frame stamped far in the future before it): the matcher starts
afresh from it (`resets`) instead of discarding every frame until the stamps catch up again.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class StampedFrame:
    """One camera frame: stamp in integer nanoseconds, the payload (an RGB array), the camera frame id."""

    stamp_ns: int
    frame: Any
    frame_id: str = ""


@dataclass(frozen=True)
class FrameSet:
    """Frames of all cameras matched in time, in camera order. stamp_ns is camera 0's stamp."""

    frames: tuple[StampedFrame, ...]

    @property
    def stamp_ns(self) -> int:
        return self.frames[0].stamp_ns

    @property
    def spread_ns(self) -> int:
        stamps = [f.stamp_ns for f in self.frames]
        return max(stamps) - min(stamps)


class ApproximateTimeSync:
    """Matches `num_cameras` streams whose stamps lie within `slop_s` of each other. Thread-safe."""

    def __init__(self, num_cameras: int, slop_s: float, history: int = 4, max_jump_back_s: Optional[float] = None):
        if num_cameras < 1:
            raise ValueError(f"num_cameras must be >= 1, got {num_cameras}")
        if not slop_s >= 0.0:
            raise ValueError(f"slop_s must be >= 0 seconds, got {slop_s}")
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        if max_jump_back_s is None:
            max_jump_back_s = max(1.0, 2.0 * slop_s)
        if not max_jump_back_s > slop_s:
            raise ValueError(f"max_jump_back_s must be > slop_s ({slop_s} s), got {max_jump_back_s}")
        self.num_cameras = num_cameras
        self.slop_ns = int(round(slop_s * 1e9))
        self._queues: list[deque[StampedFrame]] = [deque() for _ in range(num_cameras)]
        self._history = history
        self._last_used_ns = [-1] * num_cameras
        self._lock = threading.Lock()
        self._max_jump_back_ns = int(round(max_jump_back_s * 1e9))
        self.unmatched = 0
        self.resets = 0

    def add(self, camera: int, frame: StampedFrame) -> Optional[FrameSet]:
        """Add a frame from camera index `camera`; return the newest complete set it completes, if any."""
        if not 0 <= camera < self.num_cameras:
            raise ValueError(f"camera index {camera} out of range 0..{self.num_cameras - 1}")
        with self._lock:
            if frame.stamp_ns < self._last_used_ns[camera] - self._max_jump_back_ns:
                self._clear()  # the clock jumped back: start afresh from this frame
                self.resets += 1
            if frame.stamp_ns <= self._last_used_ns[camera]:
                self.unmatched += 1  # older than a set already emitted: can never be used
                return None
            queue = self._queues[camera]
            queue.append(frame)
            while len(queue) > self._history:
                queue.popleft()
                self.unmatched += 1
            chosen = self._match_around(camera, frame)
            if chosen is None:
                return None
            for cam, used in enumerate(chosen):
                self._last_used_ns[cam] = used.stamp_ns
                q = self._queues[cam]
                while q and q[0].stamp_ns <= used.stamp_ns:
                    dropped = q.popleft()
                    if dropped is not used:
                        self.unmatched += 1
            return FrameSet(tuple(chosen))

    def _match_around(self, camera: int, pivot: StampedFrame) -> Optional[list[StampedFrame]]:
        chosen: list[StampedFrame] = []
        for cam, queue in enumerate(self._queues):
            if cam == camera:
                chosen.append(pivot)
                continue
            if not queue:
                return None
            best = min(queue, key=lambda f: abs(f.stamp_ns - pivot.stamp_ns))
            chosen.append(best)
        stamps = [f.stamp_ns for f in chosen]
        if max(stamps) - min(stamps) > self.slop_ns:
            return None
        return chosen

    def reset(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        for q in self._queues:
            q.clear()
        self._last_used_ns = [-1] * self.num_cameras
