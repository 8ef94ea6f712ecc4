"""Run a training recipe: a YAML list of named commands (data, stages, export) executed in order, each
one's log kept, its wall time and exit status written to `<out>/recipe.json` as it finishes.

A recipe is how a model card's "reproduce this model" becomes one command. With `--resume`, a step whose
`done` path exists is not run again (its earlier time, when recorded, is kept), so a recipe interrupted
after an hour picks up where it stopped. Each finished step's row also records `outputs`: digests of its
`done` path and of the checkpoint weights or data frames beside it, so `wam-diff-train provenance` can say
at which step a rebuild first made something different.

    name: nano-s-b32
    out: runs/repro                    # logs/<step>.log and recipe.json go here
    steps:
      - name: data_plan
        run: wam-diff data --out runs/repro/data_plan --tasks planning
        done: runs/repro/data_plan/train.json

`include: other.yaml` (a path relative to the including file) puts another recipe's steps first, so a recipe
that continues one does not copy its steps.

Steps run with the directory of the interpreter running the recipe first on PATH, so `wam-diff`, `wam-diff-train`
and `python` in a step are the project's own (the venv's) whether or not the venv is activated.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from wam_diff_core.errors import WamDiffError
from wam_diff_core.plain_yaml import yaml_problem

from .config import ConfigError
from .provenance import output_record

RECORD_FILE = "recipe.json"
LOG_DIR = "logs"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_STEP_KEYS = {"name", "run", "done"}
# statuses whose wall time, if any, is a finished run's, kept across --resume and --only runs (a skipped row's
# wall is one carried from such a run; a failed step's is not kept)
_CARRIED = ("ok", "done before", "skipped")


@dataclass(frozen=True)
class Step:
    name: str
    run: tuple[str, ...]  # argv, split like a shell would (no shell: no pipes, no globbing)
    done: Optional[str]  # a path that exists once the step has finished


@dataclass(frozen=True)
class Recipe:
    name: str
    out: Path
    steps: tuple[Step, ...]


def load_recipe(path: str | Path, _including: tuple[Path, ...] = ()) -> Recipe:
    """YAML file -> Recipe (an `include`d recipe's steps first). Raises ConfigError naming the file and the
    bad entry."""
    path = Path(path)
    if path.resolve() in _including:
        raise ConfigError(f"recipe {path}: includes itself (through {[str(p) for p in _including]})")
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"recipe {path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path}: {yaml_problem(exc)}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list) or not raw["steps"]:
        raise ConfigError(f"recipe {path}: expected a mapping with 'name', 'out' and a non-empty 'steps' list")
    unknown = set(raw) - {"name", "out", "steps", "include"}
    if unknown:
        raise ConfigError(f"recipe {path}: unknown keys {sorted(unknown)}; expected name, out, steps[, include]")
    for key in ("name", "out"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ConfigError(f"recipe {path}: '{key}' must be a non-empty string, got {raw.get(key)!r}")
    steps = []
    if "include" in raw:
        if not isinstance(raw["include"], str) or not raw["include"].strip():
            raise ConfigError(f"recipe {path}: 'include' must be a recipe path, got {raw['include']!r}")
        steps = list(load_recipe(path.parent / raw["include"], _including + (path.resolve(),)).steps)
    seen = {s.name for s in steps}
    for i, entry in enumerate(raw["steps"]):
        where = f"recipe {path}, step {i}"
        if not isinstance(entry, dict) or set(entry) - _STEP_KEYS or not {"name", "run"} <= set(entry):
            raise ConfigError(f"{where}: expected {{name, run[, done]}}, got {entry!r}")
        name, run, done = entry["name"], entry["run"], entry.get("done")
        if not isinstance(name, str) or not _NAME.match(name) or name in seen:
            raise ConfigError(f"{where}: name {name!r} must be unique and made of letters, digits, '_', '.', '-'")
        if not isinstance(run, str) or not run.strip():
            raise ConfigError(f"{where} ({name}): 'run' must be a non-empty command string, got {run!r}")
        if done is not None and (not isinstance(done, str) or not done.strip()):
            raise ConfigError(f"{where} ({name}): 'done' must be a path string, got {done!r}")
        seen.add(name)
        steps.append(Step(name, tuple(shlex.split(run)), done))
    return Recipe(raw["name"], Path(raw["out"]), tuple(steps))


def step_env(environ: Optional[dict] = None) -> dict:
    """The environment a step runs in: `environ` (default os.environ) with the running interpreter's directory
    (a venv's bin/, where the project's console scripts are) first on PATH."""
    env = dict(os.environ if environ is None else environ)
    bindir = str(Path(sys.executable).parent)
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
    env["PATH"] = os.pathsep.join([bindir] + rest)
    return env


class StepFailed(WamDiffError, RuntimeError):
    """A recipe step exited non-zero (the message names the step, its status and its log)."""


def _write_record(recipe: Recipe, rows: dict) -> dict:
    ran = [r["wall_s"] for r in rows.values() if r.get("wall_s") is not None]
    record = {"recipe": recipe.name, "steps": list(rows.values()), "total_wall_s": round(sum(ran), 1),
              "complete": all(r["status"] in ("ok", "done before") for r in rows.values())
              and len(rows) == len(recipe.steps)}
    recipe.out.mkdir(parents=True, exist_ok=True)
    tmp = recipe.out / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, recipe.out / RECORD_FILE)
    return record


def _previous(recipe: Recipe) -> dict:
    try:
        old = json.loads((recipe.out / RECORD_FILE).read_text())
        return {r["name"]: r for r in old.get("steps", []) if isinstance(r, dict) and "name" in r}
    except (OSError, ValueError):
        return {}


def _outputs(step: Step) -> Optional[dict]:
    """Digests of what the step made (`provenance.output_record`), so two builds compare step by step."""
    return output_record(step.done) if step.done else None


def run_recipe(recipe: Recipe, resume: bool = False, only: Optional[set] = None, echo=print) -> dict:
    """Run every step in order (with `only`: just those names). Returns the record written to
    `<out>/recipe.json`. Raises StepFailed at the first step that exits non-zero (the record says so)."""
    if only:
        unknown = only - {s.name for s in recipe.steps}
        if unknown:
            raise ConfigError(f"unknown step(s) {sorted(unknown)}; the recipe has {[s.name for s in recipe.steps]}")
    logs = recipe.out / LOG_DIR
    logs.mkdir(parents=True, exist_ok=True)
    env = step_env()
    earlier = _previous(recipe) if (resume or only) else {}
    rows: dict[str, dict] = {}
    n = len(recipe.steps)
    for i, step in enumerate(recipe.steps, 1):
        command = shlex.join(step.run)
        skip = bool(only) and step.name not in only
        if skip or (resume and step.done and Path(step.done).exists()):
            old = earlier.get(step.name, {})
            status = "skipped" if skip else "done before"
            rows[step.name] = {"name": step.name, "run": command, "status": status,
                               "wall_s": old.get("wall_s") if old.get("status") in _CARRIED else None,
                               "outputs": _outputs(step) if status == "done before" else old.get("outputs")}
            echo(f"[{i}/{n}] {step.name}: {status}")
            continue
        log_path = logs / f"{step.name}.log"
        echo(f"[{i}/{n}] {step.name}: {command}  (log: {log_path})")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(step.run, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
            except FileNotFoundError:
                rc = 127
                log.write(f"command not found: {step.run[0]}\n")
        wall = round(time.perf_counter() - t0, 1)
        ok = rc == 0 and (step.done is None or Path(step.done).exists())
        status = "ok" if ok else (f"exit {rc}" if rc else f"exit 0 but {step.done} is missing")
        rows[step.name] = {"name": step.name, "run": command, "status": status, "wall_s": wall, "log": str(log_path),
                           "outputs": _outputs(step) if ok else None}
        record = _write_record(recipe, rows)
        echo(f"[{i}/{n}] {step.name}: {status} in {wall:.0f} s (recipe so far {record['total_wall_s']:.0f} s)")
        if not ok:
            raise StepFailed(f"step {step.name!r} failed ({status}); see {log_path}")
    return _write_record(recipe, rows)


def main(path: str, resume: bool, only: Optional[str]) -> int:
    try:
        recipe = load_recipe(path)
        record = run_recipe(recipe, resume, {s for s in only.split(",") if s} if only else None)
    except StepFailed as exc:  # a step's own failure (exit 1); a bad recipe file is the console's one-line error
        print(f"wam-diff-train recipe: error: {exc}", file=sys.stderr)
        return 1
    print(f"{recipe.name}: {'complete' if record['complete'] else 'partial'}, "
          f"{record['total_wall_s']:.0f} s of measured step walls (this run's and earlier runs' kept); "
          f"{recipe.out / RECORD_FILE}")
    return 0
