"""Which of this frame's detections is which of the previous frame's: greedy nearest neighbours.

Boxes are matched where the camera saw them (ego-frame positions of each frame, not compensated for the ego's
motion): traffic mostly moves with the ego, so a vehicle moves little in the image between frames while the
road moves a lot. Pairs are taken nearest first, each detection at most once, up to a gate.
"""
from __future__ import annotations

import numpy as np

MAX_RELATIVE_SPEED_MPS = 30.0  # how fast a vehicle may move in the image (relative to the ego) and still match
GATE_MARGIN_M = 2.0  # box-centre noise allowed on top


def gate_m(age_s: float) -> float:
    """The farthest a detection may lie from its match `age_s` seconds earlier, metres."""
    return MAX_RELATIVE_SPEED_MPS * age_s + GATE_MARGIN_M


def match(current: np.ndarray, previous: np.ndarray, gate: float) -> np.ndarray:
    """current (N, 2), previous (M, 2) positions -> (N,) the index of each current position's match in
    `previous`, -1 for none: pairs by increasing distance, one-to-one, at most `gate` apart."""
    current = np.asarray(current, dtype=np.float64).reshape(-1, 2)
    previous = np.asarray(previous, dtype=np.float64).reshape(-1, 2)
    out = np.full(current.shape[0], -1, dtype=np.int64)
    if not current.shape[0] or not previous.shape[0]:
        return out
    dist = np.linalg.norm(current[:, None] - previous[None], axis=2)
    taken = np.zeros(previous.shape[0], dtype=bool)
    for flat in np.argsort(dist, axis=None, kind="stable"):
        i, j = divmod(int(flat), previous.shape[0])
        if dist[i, j] > gate:
            break
        if out[i] < 0 and not taken[j]:
            out[i], taken[j] = j, True
    return out
