"""`wam-diff-train bending-samples` (wam_diff_training.bending_samples): the planning samples whose target bends, written
beside their source."""
import argparse
import json

import pytest

from wam_diff_training import bending_samples as bending
from wam_diff_training.cli import main as train_main


def _main(argv: list) -> int:
    """The command as `wam-diff-train bending-samples` runs it, its errors raised rather than printed."""
    parser = argparse.ArgumentParser()
    bending.add_arguments(parser)
    return bending.run(parser.parse_args(argv))

STRAIGHT = ",".join(f"{5.0 * i:.2f},0.00" for i in range(1, 9))
BENDING = ",".join(f"{5.0 * i:.2f},{-0.01 * i:.2f}" for i in range(1, 9))  # the first waypoint 0.01 m right


def _sample(sid, answer, task="planning"):
    return {"id": sid, "task": task, "image": ["images/a.png"],
            "conversations": [{"from": "human", "value": "<image>\nplan"}, {"from": "gpt", "value": answer}]}


def test_keeps_planning_samples_with_a_lateral_offset_and_writes_beside_the_source(tmp_path):
    src = tmp_path / "train.json"
    src.write_text(json.dumps([_sample("s", STRAIGHT), _sample("b", BENDING), _sample("g", "garbage"),
                               _sample("d", "[]", task="detection")]))
    assert train_main(["bending-samples", str(src)]) == 0
    out = tmp_path / "train_bending.json"
    assert [s["id"] for s in json.loads(out.read_text())] == ["b"]
    assert bending.bends(_sample("b", BENDING), 0.01) and not bending.bends(_sample("b", BENDING), 0.09)
    with pytest.raises(bending.BendingError, match="no such dataset file"):
        _main([str(tmp_path / "missing.json")])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(bending.BendingError, match="expected a JSON list"):
        _main([str(tmp_path / "bad.json")])
