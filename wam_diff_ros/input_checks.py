"""Checks of the planner node's inputs other than images: odometry, command, route target, question.

Anyone who can publish on a topic can send NaN, infinities, absurd magnitudes, empty or megabyte
strings. Each check here takes the message's fields (duck typing: no ROS import), returns the
clean values the policy may see, or raises InputRejected naming the field and what was expected,
quoting a bad value short. Lengths are checked before any other work, so rejecting a long string
costs the same as a short one. Images: image_conversion.py.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

from wam_diff_core.errors import WamDiffError
from wam_diff_core.types import check_command

from .image_conversion import quote

# Odometry twist beyond these is a broken or hostile source, not a vehicle: 100 m/s is 360 km/h, and
# 10 rad/s turns a car around in a third of a second. They also keep the prompt's numbers short.
MAX_SPEED_MPS = 100.0
MAX_YAW_RATE_RPS = 10.0
# A route target is the route 25 m ahead (ROUTE_TARGET_AHEAD_M); far beyond that it is not a route point.
MAX_ROUTE_TARGET_M = 1000.0
# The longest navigation command is 17 characters; questions go into the prompt, whose length costs time.
MAX_COMMAND_CHARS = 64
MAX_QUESTION_CHARS = 1000
# Control characters other than tab and newlines have no place in a question (and in a log line).
_ALLOWED_CONTROL = "\t\n\r"


class InputRejected(WamDiffError, ValueError):
    """A message the planner does not use; the text says which field and why. The node reports it as a
    diagnostic ERROR, counts it and goes on."""


@dataclass(frozen=True)
class OdometrySample:
    """One checked Odometry: stamp in ns, ego-frame velocity (m/s) and yaw rate (rad/s)."""

    stamp_ns: int
    vx: float
    vy: float
    yaw_rate: float


def stamp_ns(stamp, what: str) -> int:
    """builtin_interfaces/Time -> integer nanoseconds; sec >= 0 and 0 <= nanosec < 1e9, else InputRejected."""
    sec, nanosec = getattr(stamp, "sec", None), getattr(stamp, "nanosec", None)
    if not (_is_int(sec) and _is_int(nanosec) and sec >= 0 and 0 <= nanosec < 1_000_000_000):
        raise InputRejected(f"{what} stamp sec={quote(sec)} nanosec={quote(nanosec)}: expected sec >= 0 and "
                            f"0 <= nanosec < 1e9")
    return int(sec) * 1_000_000_000 + int(nanosec)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _finite(value, name: str, bound: float, unit: str) -> float:
    """A real number with |value| <= bound, as float; InputRejected naming `name` otherwise."""
    try:
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond any float
        number = math.nan
    if not (math.isfinite(number) and abs(number) <= bound):
        raise InputRejected(f"{name} {quote(value)}: expected a finite number within +-{bound:g} {unit}")
    return number


def odometry_sample(msg) -> OdometrySample:
    """nav_msgs/Odometry -> OdometrySample: the header stamp and twist.twist (linear x, y; angular z), each
    finite and within MAX_SPEED_MPS / MAX_YAW_RATE_RPS. The pose is not used."""
    stamp = stamp_ns(msg.header.stamp, "odometry")
    twist = msg.twist.twist
    return OdometrySample(stamp, _finite(twist.linear.x, "odometry twist.linear.x", MAX_SPEED_MPS, "m/s"),
                          _finite(twist.linear.y, "odometry twist.linear.y", MAX_SPEED_MPS, "m/s"),
                          _finite(twist.angular.z, "odometry twist.angular.z", MAX_YAW_RATE_RPS, "rad/s"))


def command_text(data) -> str:
    """std_msgs/String data -> a navigation command of wam_diff_core.constants.NAV_COMMANDS (lower case)."""
    if not isinstance(data, str) or len(data) > MAX_COMMAND_CHARS:
        raise InputRejected(f"navigation command {quote(data)}: expected one of the navigation commands")
    try:
        return check_command(data)
    except ValueError as exc:
        raise InputRejected(str(exc)) from None


def route_target(msg, frame_id: str) -> tuple[int, tuple[float, float]]:
    """geometry_msgs/PointStamped -> (stamp ns, (x, y) m): in `frame_id`, x and y finite within
    MAX_ROUTE_TARGET_M (z is ignored)."""
    got = msg.header.frame_id
    if got != frame_id:
        raise InputRejected(f"frame_id {quote(got)}, expected the ego frame {frame_id!r}")
    stamp = stamp_ns(msg.header.stamp, "route target")
    x = _finite(msg.point.x, "route target x", MAX_ROUTE_TARGET_M, "m")
    y = _finite(msg.point.y, "route target y", MAX_ROUTE_TARGET_M, "m")
    return stamp, (x, y)


def question_text(question) -> str:
    """AskQuestion question -> the question: a string of 1..MAX_QUESTION_CHARS characters with some non-space
    and no control characters other than tab and newlines."""
    if not isinstance(question, str) or len(question) > MAX_QUESTION_CHARS:
        length = f"{len(question)} characters" if isinstance(question, str) else type(question).__name__
        raise InputRejected(f"question of {length}: expected at most {MAX_QUESTION_CHARS} characters of text")
    if not question.strip():
        raise InputRejected(f"question {quote(question)} is blank: expected a driving question")
    bad: Optional[str] = next((c for c in question if (c < " " or c == "\x7f") and c not in _ALLOWED_CONTROL), None)
    if bad is not None:
        raise InputRejected(f"question contains the control character {bad!r} at {question.index(bad)}: "
                            f"expected plain text")
    return question
