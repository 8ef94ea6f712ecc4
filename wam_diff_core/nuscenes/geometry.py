"""Plane geometry of the nuScenes reader and scorer (numpy only): poses, the 2D box of projected box corners
clipped to the image, and box overlap.

Frames: nuScenes' global frame and ego frame are x forward, y left, z up (the ego frame's origin is the rear
axle); the project's trajectories are ego-frame (x, y) metres.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

# The ego box of the ST-P3 / VAD / UniAD collision metric (nuScenes' Renault Zoe), metres.
EGO_LENGTH_M = 4.084
EGO_WIDTH_M = 1.85
# Its centre ahead of the ego pose (the rear axle): ST-P3 places the box 0.5 m ahead of the LIDAR_TOP point,
# which sits 0.94 m ahead of the rear axle on nuScenes' cars.
EGO_CENTRE_AHEAD_M = 1.44


def yaw_of(quaternion: Sequence[float]) -> float:
    """Heading (rad, CCW about z) of a nuScenes rotation quaternion [w, x, y, z]."""
    w, x, y, z = (float(v) for v in quaternion)
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def yaw_quaternion(yaw: float) -> list[float]:
    """The rotation quaternion [w, x, y, z] of a heading (rad) about z."""
    return [math.cos(yaw / 2.0), 0.0, 0.0, math.sin(yaw / 2.0)]


def to_frame(points: np.ndarray, origin: Sequence[float], yaw: float) -> np.ndarray:
    """Points (..., 2) of the global plane in the frame at `origin` (x, y) heading `yaw` (rad)."""
    d = np.asarray(points, dtype=np.float64) - np.asarray(origin, dtype=np.float64)[:2]
    c, s = math.cos(yaw), math.sin(yaw)
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


def convex_hull(points: np.ndarray) -> np.ndarray:
    """Counter-clockwise convex hull (M, 2) of points (N, 2) (Andrew's monotone chain)."""
    pts = sorted(set(map(tuple, np.asarray(points, dtype=np.float64).tolist())))
    if len(pts) <= 2:
        return np.array(pts, dtype=np.float64).reshape(-1, 2)

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.array(lower[:-1] + upper[:-1], dtype=np.float64)


def _clip_half_plane(poly: list, axis: int, bound: float, keep_below: bool) -> list:
    """One Sutherland-Hodgman pass: the part of a convex polygon on one side of x_axis = bound."""
    def inside(p):
        return p[axis] <= bound if keep_below else p[axis] >= bound

    out = []
    for i, cur in enumerate(poly):
        prev = poly[i - 1]
        if inside(cur) != inside(prev):
            t = (bound - prev[axis]) / (cur[axis] - prev[axis])
            out.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
        if inside(cur):
            out.append(cur)
    return out


def image_box(points_px: np.ndarray, width: int, height: int) -> Optional[tuple[float, float, float, float]]:
    """(x1, y1, x2, y2) of the convex hull of projected corners (N, 2) intersected with the image canvas
    [0, width] x [0, height], as the devkit's 2D re-projection export draws it; None when they do not meet."""
    poly = [tuple(p) for p in convex_hull(points_px)]
    for axis, bound, below in ((0, 0.0, False), (0, float(width), True), (1, 0.0, False), (1, float(height), True)):
        if not poly:
            return None
        poly = _clip_half_plane(poly, axis, bound, below)
    if len(poly) < 3:
        return None
    p = np.array(poly)
    x1, y1 = p.min(axis=0)
    x2, y2 = p.max(axis=0)
    if x2 <= x1 or y2 <= y1:
        return None
    return float(x1), float(y1), float(x2), float(y2)


def box_corners(x: float, y: float, yaw: float, length: float, width: float) -> np.ndarray:
    """The 4 plane corners (4, 2) of a box centred at (x, y), heading yaw (rad), length along the heading."""
    c, s = math.cos(yaw), math.sin(yaw)
    half = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]], dtype=np.float64) * [length / 2.0, width / 2.0]
    return half @ np.array([[c, s], [-s, c]]) + [x, y]


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two convex quadrilaterals (4, 2) share area (separating-axis test; touching edges do not count)."""
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for nx, ny in np.stack([-edges[:, 1], edges[:, 0]], axis=1):
            pa, pb = a @ [nx, ny], b @ [nx, ny]
            if pa.max() <= pb.min() or pb.max() <= pa.min():
                return False
    return True
