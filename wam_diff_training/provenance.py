"""Digests of what a run was made from and what it made, so that two runs of the same commands can be compared
input by input: a chain rebuilt from nothing that does not reproduce its weights then says where it first differs
(a data file, its frames, an initial checkpoint, a teacher) instead of leaving it to guesswork.

A training stage records `inputs` (every data file with its frames directory, the initial checkpoint, the teacher)
in run_config.json and summary.json, and its final `param_digest` in summary.json; a recipe records the digests of
what each step made (its `done` path, the checkpoint weights or data frames beside it) in recipe.json. `wam-diff-train provenance A B` compares two such records.

    wam-diff-train provenance runs/fast/recipe.json runs/fast_rebuilt/recipe.json
    wam-diff-train provenance runs/fast/nano_s/ar runs/rebuilt/nano_s/ar
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Optional

CHUNK = 1 << 20
IMAGES_DIR = "images"  # where `wam-diff data` and `wam-diff dagger` put the frames their samples name
WEIGHTS_FILE = "model.safetensors"
RUN_FILES = ("summary.json", "run_config.json", "recipe.json")  # what `compare` reads from a run directory


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_sha256(root: str | Path) -> str:
    """One digest of every file under `root`: their paths relative to it (sorted) and their contents."""
    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + bytes.fromhex(file_sha256(p)))
    return h.hexdigest()


def path_sha256(path: str | Path) -> Optional[str]:
    """A file's digest, a directory's tree digest, None when the path does not exist."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    if path.is_dir():
        return tree_sha256(path)
    return None


def output_record(done: str | Path) -> Optional[dict]:
    """What a recipe step made, by its `done` path: that path's digest, and beside it the weights of a checkpoint
    (`model.safetensors`, since a checkpoint's `done` is usually its config.json) and the frames of a data set
    (`images/`). None when the path does not exist."""
    done = Path(done)
    if not done.exists():
        return None
    record = {"done": path_sha256(done)}
    here = done.parent if done.is_file() else done
    if (here / WEIGHTS_FILE).is_file() and done.name != WEIGHTS_FILE:
        record["weights"] = file_sha256(here / WEIGHTS_FILE)
    if (here / IMAGES_DIR).is_dir():
        record["images"] = tree_sha256(here / IMAGES_DIR)
    return record


def data_record(path: str | Path, _trees: Optional[dict] = None) -> dict:
    """A data file's digest and that of the frames directory beside it (`images/`, None when there is none).
    `_trees` caches frame digests across files of one directory."""
    path = Path(path)
    images = path.parent / IMAGES_DIR
    trees = {} if _trees is None else _trees
    if images.is_dir() and images not in trees:
        trees[images] = tree_sha256(images)
    return {"sha256": file_sha256(path) if path.is_file() else None, "images": trees.get(images)}


def checkpoint_record(spec: Optional[str]) -> Optional[dict]:
    """A checkpoint directory's weights digest; a preset name (built from the seed) as itself."""
    if not spec:
        return None
    weights = Path(spec) / WEIGHTS_FILE
    if weights.is_file():
        return {"path": str(spec), "sha256": file_sha256(weights)}
    return {"preset": str(spec)}


def stage_inputs(data_paths: Iterable[str], val: Optional[str], init: Optional[str], teacher: Optional[str]) -> dict:
    """The data files in their config order (a rebuild under another directory compares entry by entry), the
    validation file, the initial checkpoint and the teacher."""
    trees: dict = {}
    return {"data": [{"path": str(p), **data_record(p, trees)} for p in data_paths],
            "val": {"path": str(val), **data_record(val, trees)} if val else None,
            "init": checkpoint_record(init), "teacher": checkpoint_record(teacher)}


# ---------------------------------------------------------------- comparing two records


def _flatten(value, prefix: str = "") -> dict:
    """Dotted keys to leaves; list items by index; `path` leaves left out (where a run lives is not what it
    was made from)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
    if items is None:
        return {prefix: value}
    out = {}
    for k, v in items:
        if k != "path":
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def digests(record: dict) -> dict:
    """The comparable digests of a stage summary / run config (`inputs.*`, `param_digest`) or a recipe record
    (`<step>.<done|weights|images>`), flattened to dotted keys."""
    if "steps" in record and isinstance(record["steps"], list):
        out = {}
        for r in record["steps"]:
            if isinstance(r, dict) and "name" in r:
                made = r.get("outputs")
                out.update({f"{r['name']}.{k}": v for k, v in made.items()} if isinstance(made, dict)
                           else {f"{r['name']}.done": None})
        return out
    # an input a stage did not have (no teacher, no validation file) is left out rather than "unrecorded"
    out = {f"inputs.{k}": v for k, v in _flatten(record.get("inputs") or {}).items() if v is not None}
    if "param_digest" in record:
        out["param_digest"] = record["param_digest"]
    return out


def read_record(path: str | Path) -> dict:
    """A record file, or the first of RUN_FILES in a run directory. Raises ValueError naming what is missing."""
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in RUN_FILES if (path / n).is_file()]
        if not found:
            raise ValueError(f"{path}: no {', '.join(RUN_FILES)} in this directory")
        path = found[0]
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(record).__name__}")
    return record


def compare(a: dict, b: dict) -> list[tuple[str, str, Optional[str], Optional[str]]]:
    """(key, verdict, a's digest, b's digest) per key of either record, in a's order then b's; verdict is
    'same', 'differs' or 'unrecorded' (absent or None on a side, as in records written before digests were)."""
    da, db = digests(a), digests(b)
    rows = []
    for key in list(dict.fromkeys([*da, *db])):
        x, y = da.get(key), db.get(key)
        verdict = "unrecorded" if x is None or y is None else ("same" if x == y else "differs")
        rows.append((key, verdict, x, y))
    return rows


def main(a: str, b: str) -> int:
    """Print the comparison; 0 when every digest both record agrees, 1 when one differs, 2 on a bad record."""
    try:
        rows = compare(read_record(a), read_record(b))
    except ValueError as exc:
        print(f"wam-diff-train provenance: {exc}")
        return 2
    if not rows:
        print(f"wam-diff-train provenance: neither {a} nor {b} records any digest (written before digests were?)")
        return 2
    width = max(len(k) for k, *_ in rows)
    for key, verdict, x, y in rows:
        detail = "" if verdict == "same" else f"  {str(x)[:16]} / {str(y)[:16]}"
        print(f"{key:<{width}}  {verdict}{detail}")
    counts = {v: sum(r[1] == v for r in rows) for v in ("same", "differs", "unrecorded")}
    first = next((k for k, v, *_ in rows if v == "differs"), None)
    print(f"{counts['same']} same, {counts['differs']} differ, {counts['unrecorded']} unrecorded"
          + (f"; first difference: {first}" if first else ""))
    return 1 if first else 0
