"""The interleaved timing behind `wam-diff bench`: round order, per-round ratios, their spread."""
import random
import time

import pytest

from wam_diff_core.bench.interleave import interleaved, round_order, round_ratios, spread


def sleeper(seconds: float):
    def timer(r: int) -> dict:
        start = time.perf_counter()
        time.sleep(seconds)
        return {"seconds": time.perf_counter() - start, "round": r}

    return timer


def test_rotation_starts_each_round_one_entry_later():
    assert [round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_rotation_puts_every_entry_in_every_position_once_per_cycle():
    n = 4
    positions = [[round_order(n, r).index(i) for r in range(n)] for i in range(n)]
    assert all(sorted(p) == list(range(n)) for p in positions)


def test_shuffle_is_a_permutation_repeated_by_its_seed():
    a = [round_order(5, r, "shuffle", rng) for rng in [random.Random(7)] for r in range(6)]
    b = [round_order(5, r, "shuffle", rng) for rng in [random.Random(7)] for r in range(6)]
    assert a == b and all(sorted(p) == [0, 1, 2, 3, 4] for p in a)
    assert len({tuple(p) for p in a}) > 1


def test_unknown_order_is_named():
    with pytest.raises(ValueError, match="'zigzag'"):
        round_order(3, 0, "zigzag")


def test_results_come_back_in_entry_order_with_their_call_position():
    calls = []
    timers = [lambda r, i=i: calls.append(i) or {"seconds": 1.0, "entry": i} for i in range(3)]
    rounds = interleaved(timers, 3)
    assert calls == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert [[g["entry"] for g in got] for got in rounds] == [[0, 1, 2]] * 3
    assert [g["position"] for g in rounds[1]] == [2, 0, 1]


def test_a_configuration_against_itself_has_ratio_one():
    rounds = interleaved([sleeper(0.02), sleeper(0.02)], 7)
    ratio = spread(round_ratios(rounds, "seconds", higher_is_faster=False)[1])
    assert 0.8 <= ratio["median"] <= 1.25
    assert round_ratios(rounds, "seconds", higher_is_faster=False)[0] == [1.0] * 7  # the reference to itself


def test_twice_the_delay_shows_as_twice_the_speed():
    rounds = interleaved([sleeper(0.04), sleeper(0.02)], 7)
    assert 1.6 <= spread(round_ratios(rounds, "seconds", higher_is_faster=False)[1])["median"] <= 2.5


def test_spread_reports_median_quartiles_and_range():
    s = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["median"], s["min"], s["max"], s["q25"], s["q75"], s["iqr"], s["n"]) == (3.0, 1.0, 5.0, 2.0, 4.0, 2.0, 5)
    assert s["p95"] == pytest.approx(4.8)
