"""wam_diff_training.provenance: digests of a run's inputs and outputs, and the comparison that names the first difference."""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from wam_diff_training.cli import main as train_main
from wam_diff_training.provenance import compare, file_sha256, output_record, stage_inputs, tree_sha256
from wam_diff_training.recipe import RECORD_FILE, load_recipe, run_recipe


def _tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_digests_change_with_any_byte_or_name_and_not_with_where_the_tree_lives(tmp_path):
    files = {"images/a/0.png": "x", "images/b.png": "yy", "train.json": "[]"}
    a, b = _tree(tmp_path / "a", files), _tree(tmp_path / "b", files)
    assert file_sha256(a / "train.json") == hashlib.sha256(b"[]").hexdigest()
    assert tree_sha256(a) == tree_sha256(b)
    (b / "images" / "b.png").write_text("yz")
    assert tree_sha256(a) != tree_sha256(b)
    c = _tree(tmp_path / "c", {"images/a/0.png": "x", "images/c.png": "yy", "train.json": "[]"})  # a renamed frame
    assert tree_sha256(a) != tree_sha256(c)


def test_output_record_covers_checkpoint_weights_and_data_frames_beside_the_done_file(tmp_path):
    ckpt = _tree(tmp_path / "ckpt", {"config.json": "{}", "model.safetensors": "w1"})
    data = _tree(tmp_path / "data", {"train.json": "[]", "images/0.png": "p"})
    assert output_record(tmp_path / "missing.json") is None
    rec = output_record(ckpt / "config.json")
    assert rec == {"done": file_sha256(ckpt / "config.json"), "weights": file_sha256(ckpt / "model.safetensors")}
    assert output_record(data / "train.json") == {"done": file_sha256(data / "train.json"),
                                                  "images": tree_sha256(data / "images")}
    assert set(output_record(ckpt)) == {"done", "weights"}  # a directory: its tree, and its weights


def test_compare_names_what_differs_and_what_one_side_did_not_record():
    a = {"inputs": {"data": [{"path": "runs/a/d.json", "sha256": "1", "images": "2"}], "init": {"preset": "nano"}},
         "param_digest": "p"}
    b = json.loads(json.dumps(a))
    b["inputs"]["data"][0]["path"] = "runs/rebuilt/d.json"  # another directory, the same bytes
    assert {v for _, v, *_ in compare(a, b)} == {"same"}
    b["inputs"]["data"][0]["images"] = "3"
    b["param_digest"] = "q"
    rows = {k: v for k, v, *_ in compare(a, b)}
    assert rows == {"inputs.data.0.sha256": "same", "inputs.data.0.images": "differs",
                    "inputs.init.preset": "same", "param_digest": "differs"}
    old = {"stage": "ar"}  # a summary written before digests were
    assert {v for _, v, *_ in compare(a, old)} == {"unrecorded"}


def test_two_builds_of_a_recipe_agree_step_by_step_until_one_makes_something_else(tmp_path, capsys):
    def build(out: str, second: str) -> Path:
        d = tmp_path / out
        steps = [{"name": "data", "run": f"{sys.executable} -c \"import pathlib; p = pathlib.Path(r'{d}/data'); "
                                         f"(p / 'images').mkdir(parents=True); (p / 'images' / '0.png').write_text('f'); "
                                         f"(p / 'train.json').write_text('[]')\"", "done": str(d / "data" / "train.json")},
                 {"name": "model", "run": f"{sys.executable} -c \"import pathlib; p = pathlib.Path(r'{d}/m'); "
                                          f"p.mkdir(); (p / 'config.json').write_text('{{}}'); "
                                          f"(p / 'model.safetensors').write_text('{second}')\"",
                  "done": str(d / "m" / "config.json")}]
        path = tmp_path / f"{out}.yaml"
        path.write_text(yaml.safe_dump({"name": out, "out": str(d), "steps": steps}))
        run_recipe(load_recipe(path), echo=lambda *_: None)
        return d / RECORD_FILE

    first, same, other = build("first", "w"), build("same", "w"), build("other", "v")
    rows = json.loads(first.read_text())["steps"]
    assert set(rows[0]["outputs"]) == {"done", "images"} and set(rows[1]["outputs"]) == {"done", "weights"}
    assert train_main(["provenance", str(first), str(same)]) == 0
    assert "4 same, 0 differ" in capsys.readouterr().out
    assert train_main(["provenance", str(first.parent), str(other)]) == 1  # a directory holding recipe.json works too
    out = capsys.readouterr().out
    assert "model.weights  differs" in out and "first difference: model.weights" in out
    assert "data.images" in out and "3 same, 1 differ" in out
    # a resumed build records the digests of the steps it finds done
    again = run_recipe(load_recipe(tmp_path / "first.yaml"), resume=True, echo=lambda *_: None)
    assert [r["outputs"] for r in again["steps"]] == [r["outputs"] for r in rows]


def test_bad_records_are_named(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    assert train_main(["provenance", str(tmp_path / "bad.json"), str(tmp_path / "bad.json")]) == 2
    assert "bad.json: not JSON" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert train_main(["provenance", str(tmp_path / "empty"), str(tmp_path / "bad.json")]) == 2
    assert "no summary.json, run_config.json, recipe.json" in capsys.readouterr().out
    (tmp_path / "old.json").write_text(json.dumps({"stage": "ar"}))
    assert train_main(["provenance", str(tmp_path / "old.json"), str(tmp_path / "old.json")]) == 2
    assert "records any digest" in capsys.readouterr().out


def _planning_set(root: Path, pixel: int = 0) -> Path:
    (root / "images").mkdir(parents=True)
    samples = []
    for i in range(4):
        frame = np.full((32, 64, 3), 40 * i, dtype=np.uint8)
        frame[0, 0, 0] = pixel
        Image.fromarray(frame).save(root / "images" / f"{i}.png")
        samples.append({"id": f"s{i}", "datasource": "toy", "task": "qa", "image": [f"images/{i}.png"],
                        "conversations": [{"from": "human", "value": f"<image>Case {i}?"},
                                          {"from": "gpt", "value": "keep lane"}]})
    (root / "train.json").write_text(json.dumps(samples))
    return root / "train.json"


def test_a_training_stage_records_its_inputs_and_weights_and_a_changed_frame_is_found(nano_ckpt, tmp_path, capsys):
    args = ["ar", "--init", str(nano_ckpt), "--max-steps", "1", "--batch-size", "2", "--set", "eval.enabled=false",
            "--no-progress", "--set", "train.threads=1", "--set", "train.tensorboard=false"]
    data = _planning_set(tmp_path / "d1")
    runs = {}
    for name, path in (("one", data), ("two", data), ("changed", _planning_set(tmp_path / "d2", pixel=1))):
        assert train_main([*args, "--data", str(path), "--out", str(tmp_path / name)]) == 0
        runs[name] = tmp_path / name / "ar"
    summary = json.loads((runs["one"] / "summary.json").read_text())
    assert summary["inputs"] == stage_inputs([str(data)], None, str(nano_ckpt), None)
    assert summary["inputs"]["init"]["sha256"] == file_sha256(Path(nano_ckpt) / "model.safetensors")
    assert summary["param_digest"] == (runs["one"] / "param_digest.rank0.txt").read_text().strip()
    assert json.loads((runs["one"] / "run_config.json").read_text())["inputs"] == summary["inputs"]
    assert train_main(["provenance", str(runs["one"]), str(runs["two"])]) == 0  # the same inputs, the same weights
    capsys.readouterr()
    # the same samples in another directory, one frame's pixel changed: that frame set is what is named
    assert train_main(["provenance", str(runs["one"]), str(runs["changed"])]) == 1
    out = capsys.readouterr().out
    assert "inputs.data.0.sha256" in out and "first difference: inputs.data.0.images" in out
    assert re.search(r"param_digest +differs", out) and "2 same, 2 differ, 0 unrecorded" in out
