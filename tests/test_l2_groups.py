"""wam_diff_training.report.groups and `wam-diff-train l2-gap --by-group`: planning L2 and along-track bias per kind of plan."""
import json
from pathlib import Path

import numpy as np
import pytest

from wam_diff_training.report import groups
from wam_diff_training.report import l2_gap_cli as gap
from wam_diff_training.report.l2_gap import plans_by_id
from wam_diff_core.codec import format_trajectory

# id -> (scenario, ego forward speed m/s); references run straight ahead at 1 m per 0.5 s
PLANS = {"i0": ("intersection", 5.0), "r0": ("roundabout", 8.0), "h0": ("highway", 19.9), "h1": ("cut_in", 20.0),
         "h2": ("merge", 30.0)}


def _truth() -> dict:
    return {i: np.stack([np.arange(1, 9, dtype=float), np.zeros(8)], axis=1) for i in PLANS}


def _split(path: Path) -> Path:
    samples = [{"id": i, "task": "planning", "conversations": [{"from": "human", "value": "q"},
                                                                {"from": "gpt", "value": format_trajectory(_truth()[i])}],
                "meta": {"scenario": sc, "ego": [v, 0.0, 0.0, 0.0]}} for i, (sc, v) in PLANS.items()]
    samples.append({"id": "d0", "task": "detection", "conversations": [], "meta": {"scenario": "highway"}})
    path.write_text(json.dumps(samples))
    return path


def test_plan_group_by_junction_scenario_then_ego_speed():
    assert groups.plan_group({"scenario": "intersection", "ego": [30.0]}) == "intersection"
    assert groups.plan_group({"scenario": "roundabout"}) == "roundabout"  # junctions need no speed
    assert groups.plan_group({"scenario": "highway", "ego": [19.99, 0.0]}) == "road<20"
    assert groups.plan_group({"scenario": "merge", "ego": [20.0, 0.0]}) == "road>=20"
    with pytest.raises(ValueError, match="without an ego state: {'scenario': 'highway'}"):
        groups.plan_group({"scenario": "highway"})
    assert groups.group_names()[-1] == "all" and len(groups.group_names()) == 5


def test_by_group_means_exact_errors_and_bias(tmp_path):
    kinds = groups.groups_of_split(_split(tmp_path / "val.json"))
    assert kinds == {"i0": "intersection", "r0": "roundabout", "h0": "road<20", "h1": "road>=20", "h2": "road>=20"}
    truth = _truth()
    plans = {i: t.copy() for i, t in truth.items()}
    plans["i0"][:, 1] = 2.0  # 2 m to the side everywhere: L2 2, no along-track bias
    plans["h1"][:, 0] += np.linspace(0.5, 4.0, 8)  # runs ahead, 4 m at 4 s: mean L2 2.25, bias +4
    plans["r0"][-1, 0] -= 8.0  # falls 8 m short at 4 s alone: mean L2 1, bias -8
    table = groups.by_group(truth, plans, kinds, sorted(PLANS))
    assert list(table) == ["intersection", "road<20", "road>=20", "roundabout", "all"]
    assert table["intersection"] == pytest.approx({"plans": 1, "l2_mean": 2.0, "x_bias_end": 0.0})
    assert table["roundabout"] == pytest.approx({"plans": 1, "l2_mean": 1.0, "x_bias_end": -8.0})
    assert table["road>=20"] == pytest.approx({"plans": 2, "l2_mean": 1.125, "x_bias_end": 2.0})
    assert table["road<20"] == pytest.approx({"plans": 1, "l2_mean": 0.0, "x_bias_end": 0.0})
    assert table["all"] == pytest.approx({"plans": 5, "l2_mean": 5.25 / 5, "x_bias_end": -4.0 / 5})
    # a selection without a group leaves that group out of the table and the markdown
    only = groups.by_group(truth, plans, kinds, ["i0", "h0"])
    assert list(only) == ["intersection", "road<20", "all"]
    md = groups.markdown({"m": table, "n": only})
    assert "| m | 2.00 (+0.00) n1 | 0.00 (+0.00) n1 | 1.12 (+2.00) n2 | 1.00 (-8.00) n1 | 1.05 (-0.80) n5 |" in md
    assert "| n | 2.00 (+0.00) n1 | 0.00 (+0.00) n1 | - | - | 1.00 (+0.00) n2 |" in md


def test_l2_gap_by_group_writes_the_table_from_saved_predictions(tmp_path):
    split = _split(tmp_path / "val.json")
    truth = _truth()
    pred = tmp_path / "m_planning.jsonl"
    rows = [{"id": i, "text": format_trajectory(t + [0.0, 1.0])} for i, t in truth.items() if i != "h2"]  # 1 m left
    rows.append({"id": "h2", "text": "garbage"})  # unparsable: left out of the plans every model parses
    pred.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plans, invalid = plans_by_id(pred)
    assert set(plans) == set(PLANS) - {"h2"} and invalid == ["h2"]
    gap.write_by_group(tmp_path, split, truth, [{"label": "m", "predictions": str(pred)}], ["i0", "r0", "h0", "h1"])
    saved = json.loads((tmp_path / "l2_by_group.json").read_text())
    assert saved["plans"] == 4 and saved["groups"]["m"]["all"]["l2_mean"] == pytest.approx(1.0)
    assert saved["groups"]["m"]["road>=20"]["plans"] == 1
    assert "| m | 1.00 (+0.00) n1 |" in (tmp_path / "l2_by_group.md").read_text()
