"""`wam-diff-train balance-waits` (wam_diff_training.balance_waits): standing junction samples whose label stays, cut to
the departing ones."""
import argparse
import json

import pytest

from wam_diff_training import balance_waits
from wam_diff_training.cli import main as train_main
from wam_diff_core.prompts import planning_prompt
from wam_diff_core.types import EgoState


def _main(argv: list) -> int:
    """The command as `wam-diff-train balance-waits` runs it, its errors raised rather than printed."""
    parser = argparse.ArgumentParser()
    balance_waits.add_arguments(parser)
    return balance_waits.run(parser.parse_args(argv))

STAY = ",".join("0.00,0.00" for _ in range(8))
GO = ",".join(f"{1.0 * i * i:.2f},0.00" for i in range(1, 9))  # 1 m in the first 0.5 s: drives off


def _sample(sid, scenario, speed, answer, task="planning"):
    prompt = "<image>\n" + planning_prompt(EgoState(vx=speed, vy=0.0, ax=0.0, ay=0.0), "go straight")
    return {"id": sid, "task": task, "image": ["images/a.png"], "meta": {"scenario": scenario},
            "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}]}


def test_cuts_standing_stays_per_junction_scenario_and_keeps_the_rest_in_order(tmp_path):
    samples = ([_sample(f"is{i}", "intersection", 0.0, STAY) for i in range(5)]
               + [_sample(f"ig{i}", "intersection", 0.0, GO) for i in range(2)]
               + [_sample("im", "intersection", 8.0, STAY)]          # moving: kept
               + [_sample(f"rs{i}", "roundabout", 0.2, STAY) for i in range(3)]   # no departures: all cut
               + [_sample("hs", "highway", 0.0, STAY), _sample("d", "intersection", 0.0, "[]", task="detection")])
    src = tmp_path / "train.json"
    src.write_text(json.dumps(samples))
    assert train_main(["balance-waits", str(src), "--ratio", "1.0", "--seed", "3"]) == 0
    kept = [s["id"] for s in json.loads((tmp_path / "train_balanced.json").read_text())]
    stays = [k for k in kept if k.startswith("is")]
    assert len(stays) == 2 and len(kept) == 2 + 2 + 1 + 0 + 2
    assert kept[-5:] == ["ig0", "ig1", "im", "hs", "d"]
    assert kept == [s["id"] for s in samples if s["id"] in set(kept)]   # order kept
    _, counts = balance_waits.balance(samples, ratio=0.5, seed=3)
    assert counts["intersection"] == {"standing_stay": 5, "standing_depart": 2, "stay_kept": 1}
    assert counts["roundabout"] == {"standing_stay": 3, "standing_depart": 0, "stay_kept": 0}
    again, _ = balance_waits.balance(samples, ratio=1.0, seed=3)
    assert [s["id"] for s in again] == kept                              # seeded: the same subset


def test_bad_input_is_named(tmp_path, capsys):
    with pytest.raises(balance_waits.BalanceError, match="no such dataset file"):
        _main([str(tmp_path / "missing.json")])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(balance_waits.BalanceError, match="expected a JSON list"):
        _main([str(tmp_path / "bad.json")])
    with pytest.raises(balance_waits.BalanceError, match="--ratio -1.0"):
        _main([str(tmp_path / "bad.json"), "--ratio", "-1"])
    with pytest.raises(ValueError, match="ratio -1"):
        balance_waits.balance([], ratio=-1.0)
    assert train_main(["balance-waits", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err == f"wam-diff-train balance-waits: error: {tmp_path / 'missing.json'}: no such dataset file\n"
