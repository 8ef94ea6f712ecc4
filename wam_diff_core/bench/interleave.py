"""Interleaved timing: round robin over repeats, every round timing each entry once, so a change of load on a
shared machine falls on all entries of a round alike and the per-round ratios hold still.

The order within a round moves every round (rotated by one, or shuffled with a seed), so no entry always runs
first after a pause or right after the heaviest one. Ratios are taken within a round and summarised over the
rounds (median, min-max, interquartile range).
"""
from __future__ import annotations

import random
from typing import Callable, Sequence

import numpy as np

ORDERS = ("rotate", "shuffle")


def round_order(n: int, round_index: int, order: str = "rotate", rng: random.Random | None = None) -> list[int]:
    """The entry indices of round `round_index`: `rotate` starts round r at entry r mod n ([r, r+1, ..., r-1]);
    `shuffle` draws a permutation from `rng` (seeded by the caller, so a run can be repeated)."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {ORDERS}")
    if order == "rotate":
        start = round_index % n
        return list(range(start, n)) + list(range(start))
    perm = list(range(n))
    (rng or random.Random(round_index)).shuffle(perm)
    return perm


def interleaved(timers: Sequence[Callable[[int], dict]], rounds: int, order: str = "rotate", seed: int = 0,
                on_round: Callable[[int], None] | None = None) -> list[list[dict]]:
    """Call every timer once per round, `rounds` rounds, in `round_order`. A timer takes the round's index (a
    frame to plan from, say) and returns a dict of what it measured. Returns per round the timers' dicts in
    entry order (not call order), each with its "position" in the round; `on_round(r)` runs after round r (a
    progress bar, a load sample)."""
    rng = random.Random(seed)
    out = []
    for r in range(rounds):
        got: list[dict | None] = [None] * len(timers)
        for position, i in enumerate(round_order(len(timers), r, order, rng)):
            got[i] = {**timers[i](r), "position": position}
        out.append(got)
        if on_round is not None:
            on_round(r)
    return out


def spread(values: Sequence[float]) -> dict:
    """Median, min, max, quartiles, interquartile range and 95th percentile of `values` (ratios or times)."""
    v = np.asarray(values, dtype=np.float64)
    q25, med, q75, p95 = np.quantile(v, [0.25, 0.5, 0.75, 0.95])
    return {"median": float(med), "min": float(v.min()), "max": float(v.max()), "q25": float(q25),
            "q75": float(q75), "iqr": float(q75 - q25), "p95": float(p95), "n": int(v.size)}


def round_ratios(rounds: list[list[dict]], key: str, reference: int = 0, higher_is_faster: bool = True) -> list[list[float]]:
    """Per entry, its ratio to entry `reference` in each round: speed over the reference's speed. `key` names a
    speed (tokens/s; `higher_is_faster`) or a time (seconds; the ratio is then reference time over entry time)."""
    n = len(rounds[0])
    out: list[list[float]] = [[] for _ in range(n)]
    for got in rounds:
        ref = got[reference][key]
        for i in range(n):
            out[i].append(got[i][key] / ref if higher_is_faster else ref / got[i][key])
    return out
