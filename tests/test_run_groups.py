"""training.report.permutation and scripts/run_groups.py: groups of runs against the first, exact permutation p."""
import importlib.util
import json
from pathlib import Path

import pytest

from training.report.permutation import exact_test, group_stats

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_groups", REPO / "scripts" / "run_groups.py")
rg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rg)


def test_exact_test_counts_every_split():
    t = exact_test([1.0, 2.0, 3.0], [4.0, 5.0])  # the two largest of five: 1 split in C(5, 2) = 10
    assert t["difference"] == pytest.approx(4.5 - 2.0) and t["splits"] == 10
    assert t["p_one_sided"] == pytest.approx(0.1) and t["smallest_p"] == pytest.approx(0.1)
    assert t["p_two_sided"] == pytest.approx(0.2)  # {1, 2} is as far the other way
    below = exact_test([4.0, 5.0, 3.0], [1.0, 2.0])
    assert below["p_one_sided"] == pytest.approx(1.0) and below["p_two_sided"] == pytest.approx(0.2)
    # ties: every split of equal values is as extreme as the observed one
    assert exact_test([2.0, 2.0], [2.0, 2.0])["p_one_sided"] == pytest.approx(1.0)
    # interleaved groups: {2, 4} of 1..4 has difference +1; {2,4},{3,4} reach it: 2 of 6 one-sided
    mid = exact_test([1.0, 3.0], [2.0, 4.0])
    assert mid["difference"] == pytest.approx(1.0) and mid["p_one_sided"] == pytest.approx(2 / 6)
    assert mid["p_two_sided"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="both groups need runs, got 2 and 0"):
        exact_test([1.0, 2.0], [])
    with pytest.raises(ValueError, match="more than"):
        exact_test(list(range(30)), list(range(30)))


def test_group_stats():
    assert group_stats([1.0, 3.0]) == pytest.approx({"runs": 2, "mean": 2.0, "min": 1.0, "max": 3.0, "sd": 2 ** 0.5})
    assert group_stats([2.5])["sd"] is None
    with pytest.raises(ValueError, match="at least one run"):
        group_stats([])


def _results(path: Path, values: dict) -> Path:
    path.write_text(json.dumps({"models": [{"label": k, "l2_mean": v} for k, v in values.items()]}))
    return path


def test_main_writes_table_json_and_plot(tmp_path, capsys):
    res = _results(tmp_path / "l2_gap.json", {"F1": 2.9, "F2": 3.0, "F3": 2.8, "C1": 3.4, "C2": 3.2, "R1": 3.1})
    assert rg.main([str(res), "--out", str(tmp_path / "g"), "f=F1,F2,F3", "c=C1,C2", "r=R1"]) == 0
    out = json.loads((tmp_path / "g" / "run_groups.json").read_text())
    f, c, r = out["groups"]
    assert out["reference"] == "f" and "test" not in f and f["mean"] == pytest.approx(2.9)
    assert c["values"] == {"C1": 3.4, "C2": 3.2} and c["test"]["difference"] == pytest.approx(0.4)
    assert c["test"]["p_one_sided"] == pytest.approx(0.1)  # the two largest of five
    assert c["test"]["p_two_sided"] == pytest.approx(0.1)  # the two smallest differ by less (-0.35)
    assert r["test"]["p_one_sided"] == pytest.approx(0.25)  # 3.1 is the largest of four
    md = (tmp_path / "g" / "run_groups.md").read_text()
    assert "| c | 2 | 3.300 | 3.20 - 3.40 | 0.141 | +0.400 | 0.100 | 0.100 | C1 3.40, C2 3.20 |" in md
    assert (tmp_path / "g" / "run_groups.png").stat().st_size > 0


def test_bad_arguments_exit_naming_them(tmp_path):
    res = _results(tmp_path / "l2_gap.json", {"F1": 2.9, "C1": 3.4})
    with pytest.raises(SystemExit, match="no model labelled 'X9' in the results \\(there: F1, C1\\)"):
        rg.main([str(res), "--out", str(tmp_path), "f=F1", "c=X9"])
    with pytest.raises(SystemExit, match="expected NAME=LABEL"):
        rg.main([str(res), "--out", str(tmp_path), "f=F1", "c="])
    with pytest.raises(SystemExit, match="at least two groups, got 1"):
        rg.main([str(res), "--out", str(tmp_path), "f=F1"])
    with pytest.raises(SystemExit, match="not found"):
        rg.main([str(tmp_path / "none.json"), "--out", str(tmp_path), "f=F1", "c=C1"])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match="not an l2_gap.json with a 'l2_mean' per model"):
        rg.main([str(tmp_path / "bad.json"), "--out", str(tmp_path), "f=F1", "c=C1"])
