"""rosbags message instances built from the typestore's definitions: every field present, zero unless given.

rosbags' generated message classes have no field defaults (rclpy's have), so a Marker needs all nineteen of its
fields; `blank` fills what a caller leaves out the way rclpy would: numbers 0 (or the definition's stated default),
strings empty, sequences empty, fixed arrays of zeros, nested messages blank in turn.
"""
from __future__ import annotations

import numpy as np

from .errors import BagError

NODE_BASE, NODE_NAME, NODE_ARRAY, NODE_SEQUENCE = 1, 2, 3, 4  # rosbags.typesys.base.Nodetype values
# Default values the .msg definitions state (rosbags' parsed definitions drop them): among the ROS 2 Jazzy messages
# this project uses, only geometry_msgs/Quaternion's "float64 w 1" (the identity rotation).
STATED_DEFAULTS = {"geometry_msgs/msg/Quaternion": {"w": 1.0}}
_NUMPY_NAMES = {"bool": "bool_", "char": "uint8"}  # ROS base type -> numpy dtype name where they differ


def _dtype(base: str):
    return np.dtype(_NUMPY_NAMES.get(base, base))


def _is_numeric(base: str) -> bool:
    return base != "string"


def _default(store, desc):
    kind, detail = desc
    kind = int(kind)
    if kind == NODE_BASE:
        base = detail[0]
        if base == "string":
            return ""
        if base == "bool":
            return False
        return 0.0 if base.startswith("float") else 0
    if kind == NODE_NAME:
        return blank(store, detail)
    sub, length = detail
    if int(sub[0]) == NODE_BASE and _is_numeric(sub[1][0]):
        return np.zeros(length if kind == NODE_ARRAY else 0, dtype=_dtype(sub[1][0]))
    if kind == NODE_ARRAY:
        return [_default(store, sub) for _ in range(length)]
    return []


def blank(store, typename: str, **fields):
    """An instance of `typename` with `fields` set and every other field at its zero value."""
    try:
        _, defs = store.fielddefs[typename]
        cls = store.types[typename]
    except KeyError:
        raise BagError(f"message type {typename} is not in the typestore (ROS 2 Jazzy types and wam_diff_msgs)") from None
    unknown = set(fields) - {name for name, _ in defs}
    if unknown:
        raise ValueError(f"{typename} has no field(s) {sorted(unknown)}")
    stated = STATED_DEFAULTS.get(typename, {})
    values = {name: fields[name] if name in fields else stated.get(name, _default(store, desc)) for name, desc in defs}
    return cls(**values)


def stamp(store, ns: int):
    """builtin_interfaces/Time of integer nanoseconds."""
    return blank(store, "builtin_interfaces/msg/Time", sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def header(store, ns: int, frame_id: str):
    return blank(store, "std_msgs/msg/Header", stamp=stamp(store, ns), frame_id=str(frame_id))


def duration(store, seconds: float):
    """builtin_interfaces/Duration of `seconds` (rounded to nanoseconds), as the node writes time_from_start."""
    nanos = int(round(seconds * 1e9))
    return blank(store, "builtin_interfaces/msg/Duration", sec=nanos // 1_000_000_000, nanosec=nanos % 1_000_000_000)


def stamp_to_ns(time_msg) -> int:
    return int(time_msg.sec) * 1_000_000_000 + int(time_msg.nanosec)
