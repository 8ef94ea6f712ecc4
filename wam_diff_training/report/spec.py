"""The report's YAML spec: which models, which validation data, which decoding, which sweeps.

    data:        {planning: VAL.json, detection: VAL.json, qa: VAL.json}   (any subset)
    samples:     {planning: 64, detection: 32, qa: 64}   evenly spaced over each split
    max_new_tokens: {planning: 128, detection: 192, qa: 64}   token budget per answer (the policy's)
    decoding:    {steps: 8, strategy: low_confidence_dynamic, threshold: 0.9, number_order: true}   (B = 1: 1 step)
    closed_loop: {routes: null, ids: [], limit: null, frame_size: 256x128, replan_every: 4, workers: 1}
    models:
      - {name: nano-S AR, path: runs/.../model}                    block size: the checkpoint's own
      - {name: nano-S B32, path: ..., block_size: 32, teacher: nano-L B32, closed_loop: true}
      - {name: ... without grammar, path: ..., grammar: false, closed_loop: false}   a fixed-style
        checkpoint decoded without its trajectory grammar (an ablation; open loop only)
      - {name: ... confidence order, path: ..., number_order: false}   this model's digits committed in
        confidence order alone (default: decoding.number_order)
    sweeps:
      steps:       {model: nano-S B32, values: [2, 4, 8, 16, 32]}   quality against denoising steps
      block_size:  {model: nano-S B32, values: [1, 4, 8, 16, 32]}   tokens/s against block size
    baselines: [expert, expert-plan, constant-velocity]          closed-loop rows without a model
    sensitivity: {ids: [highway_dense_00, cut_in_01], max_seconds: 20, every: 10}   `wam-diff sensitivity`
                 of every closed-loop model on these routes: the "traffic response" column

    base: report.yaml            a spec this one continues (relative to this file): its keys first, then
                 this file's; mappings merge key by key, lists replace, except `models`, whose entries merge by
                 name (a new name is appended, a known one replaced in place)

Paths are relative to the working directory. Every error names the key and what was expected.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from wam_diff_core.constants import FRAME_SIZE, REPLAN_EVERY, TASKS
from wam_diff_core.errors import WamDiffError
from wam_diff_core.plain_yaml import yaml_problem
from wam_diff_core.constants import STRATEGIES
from wam_diff_core.policy import TASK_BUDGET
from wam_diff_core.sim.policies import BASELINES

from ..config import BASE_KEY  # the same `base:` key training configs continue one another with

DEFAULT_SAMPLES = {"planning": 64, "detection": 32, "qa": 64}


class SpecError(WamDiffError, ValueError):
    """The report spec is unusable; the message names the key."""


def slugify(name: str) -> str:
    """A model name as a file name: non-alphanumerics to "_", lower case (report cache and prediction files)."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str
    block_size: Optional[int] = None  # None: the checkpoint's trained block size
    teacher: Optional[str] = None  # name of another entry: top-5 agreement with it
    closed_loop: bool = True
    grammar: bool = True  # False: a fixed-style checkpoint decodes without its trajectory grammar
    number_order: Optional[bool] = None  # None: the spec's decoding.number_order

    @property
    def slug(self) -> str:
        return slugify(self.name)


@dataclass(frozen=True)
class Decoding:
    steps: int = 8
    strategy: str = "low_confidence_dynamic"
    threshold: float = 0.9
    number_order: bool = True


@dataclass(frozen=True)
class ClosedLoop:
    routes: Optional[str] = None  # None: the bundled suite
    ids: tuple[str, ...] = ()
    limit: Optional[int] = None
    frame_size: tuple[int, int] = FRAME_SIZE
    replan_every: int = REPLAN_EVERY
    workers: int = 1


@dataclass(frozen=True)
class Sensitivity:
    ids: tuple[str, ...]
    max_seconds: float = 20.0
    every: int = 10


@dataclass(frozen=True)
class Sweep:
    model: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class ReportSpec:
    data: dict[str, str]
    models: tuple[ModelEntry, ...]
    samples: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_SAMPLES))
    max_new_tokens: dict[str, int] = field(default_factory=lambda: dict(TASK_BUDGET))
    decoding: Decoding = Decoding()
    closed_loop: ClosedLoop = ClosedLoop()
    sweeps: dict[str, Sweep] = field(default_factory=dict)
    baselines: tuple[str, ...] = ()
    sensitivity: Optional[Sensitivity] = None

    def model(self, name: str) -> ModelEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise SpecError(f"no model named {name!r}; the spec has {[m.name for m in self.models]}")


def _positive_int(value, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def _mapping(raw, key: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(f"{key}: expected a mapping, got {type(raw).__name__}")
    return raw


def _only(raw: dict, allowed, key: str) -> None:
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise SpecError(f"{key}: unknown keys {unknown}; expected some of {sorted(allowed)}")


def _frame_size(value, key: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in str(value).lower().split("x"))
    except ValueError:
        raise SpecError(f"{key}: expected WxH such as 256x128, got {value!r}") from None
    return _positive_int(w, key), _positive_int(h, key)


def _per_task(raw, key: str, defaults: dict[str, int]) -> dict[str, int]:
    """A {task: positive integer} mapping over `defaults` (samples, max_new_tokens)."""
    out = dict(defaults)
    for task, n in _mapping(raw, key).items():
        _only({task: n}, TASKS, key)
        out[task] = _positive_int(n, f"{key}.{task}")
    return out


def _decoding(raw) -> Decoding:
    dec = _mapping(raw, "decoding")
    _only(dec, ("steps", "strategy", "threshold", "number_order"), "decoding")
    decoding = Decoding(**dec)
    _positive_int(decoding.steps, "decoding.steps")
    if decoding.strategy not in STRATEGIES:
        raise SpecError(f"decoding.strategy: expected one of {STRATEGIES}, got {decoding.strategy!r}")
    if not isinstance(decoding.number_order, bool):
        raise SpecError(f"decoding.number_order: expected true or false, got {decoding.number_order!r}")
    if not 0.0 < float(decoding.threshold) <= 1.0:
        raise SpecError(f"decoding.threshold: expected a value in (0, 1], got {decoding.threshold!r}")
    return decoding


def _closed_loop(raw) -> ClosedLoop:
    cl = _mapping(raw, "closed_loop")
    _only(cl, ("routes", "ids", "limit", "frame_size", "replan_every", "workers"), "closed_loop")
    return ClosedLoop(
        routes=cl.get("routes"), ids=tuple(cl.get("ids") or ()),
        limit=None if cl.get("limit") is None else _positive_int(cl["limit"], "closed_loop.limit"),
        frame_size=_frame_size(cl.get("frame_size", "x".join(map(str, FRAME_SIZE))), "closed_loop.frame_size"),
        replan_every=_positive_int(cl.get("replan_every", REPLAN_EVERY), "closed_loop.replan_every"),
        workers=_positive_int(cl.get("workers", 1), "closed_loop.workers"))


def _model_entry(raw, i: int) -> ModelEntry:
    m = _mapping(raw, f"models[{i}]")
    _only(m, ("name", "path", "block_size", "teacher", "closed_loop", "grammar", "number_order"), f"models[{i}]")
    if m.get("number_order") is not None and not isinstance(m["number_order"], bool):
        raise SpecError(f"models[{i}].number_order: expected true or false, got {m['number_order']!r}")
    if not m.get("name") or not m.get("path"):
        raise SpecError(f"models[{i}]: needs a name and a path, got {m!r}")
    if m.get("block_size") is not None:
        _positive_int(m["block_size"], f"models[{i}].block_size")
    entry = ModelEntry(name=str(m["name"]), path=str(m["path"]), block_size=m.get("block_size"),
                       teacher=m.get("teacher"), closed_loop=bool(m.get("closed_loop", True)),
                       grammar=bool(m.get("grammar", True)), number_order=m.get("number_order"))
    if not entry.grammar and entry.closed_loop:
        raise SpecError(f"models[{i}]: grammar: false is an open-loop ablation; add closed_loop: false")
    return entry


def _models(raw) -> tuple[ModelEntry, ...]:
    """The model entries: uniquely named, each teacher one of them."""
    if not isinstance(raw, list) or not raw:
        raise SpecError("models: expected a non-empty list of {name, path, ...}")
    models = tuple(_model_entry(m, i) for i, m in enumerate(raw))
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SpecError(f"models: names must be unique, got {names}")
    for m in models:
        if m.teacher is not None and m.teacher not in names:
            raise SpecError(f"models: {m.name!r} names teacher {m.teacher!r}, which is not in {names}")
    return models


def _sweeps(raw, names: list[str]) -> dict[str, Sweep]:
    sweeps = {}
    for kind, sw in _mapping(raw, "sweeps").items():
        _only({kind: sw}, ("steps", "block_size"), "sweeps")
        sw = _mapping(sw, f"sweeps.{kind}")
        if sw.get("model") not in names:
            raise SpecError(f"sweeps.{kind}.model: expected one of {names}, got {sw.get('model')!r}")
        values = sw.get("values")
        if not isinstance(values, list) or not values:
            raise SpecError(f"sweeps.{kind}.values: expected a non-empty list of integers, got {values!r}")
        sweeps[kind] = Sweep(sw["model"], tuple(_positive_int(v, f"sweeps.{kind}.values") for v in values))
    return sweeps


def _baselines(raw) -> tuple[str, ...]:
    baselines = tuple(raw or ())
    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise SpecError(f"baselines: {bad} not in {BASELINES}")
    return baselines


def _sensitivity(raw) -> Optional[Sensitivity]:
    if raw is None:
        return None
    sv = _mapping(raw, "sensitivity")
    _only(sv, ("ids", "max_seconds", "every"), "sensitivity")
    ids = sv.get("ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise SpecError(f"sensitivity.ids: expected a non-empty list of route ids, got {ids!r}")
    max_s = sv.get("max_seconds", 20.0)
    if isinstance(max_s, bool) or not isinstance(max_s, (int, float)) or max_s <= 0:
        raise SpecError(f"sensitivity.max_seconds: expected seconds > 0, got {max_s!r}")
    return Sensitivity(tuple(ids), float(max_s), _positive_int(sv.get("every", 10), "sensitivity.every"))


def parse_spec(raw) -> ReportSpec:
    """A spec mapping (YAML, after `base:` merging) as a ReportSpec; SpecError names the first bad key."""
    raw = _mapping(raw, "spec")
    _only(raw, ("data", "samples", "max_new_tokens", "decoding", "closed_loop", "models", "sweeps", "baselines",
                "sensitivity"), "spec")
    data = _mapping(raw.get("data"), "data")
    _only(data, TASKS, "data")
    if not data:
        raise SpecError(f"data: give at least one validation split, keys from {list(TASKS)}")
    samples = _per_task(raw.get("samples"), "samples", DEFAULT_SAMPLES)
    budget = _per_task(raw.get("max_new_tokens"), "max_new_tokens", TASK_BUDGET)
    decoding = _decoding(raw.get("decoding"))
    closed = _closed_loop(raw.get("closed_loop"))
    models = _models(raw.get("models"))
    sweeps = _sweeps(raw.get("sweeps"), [m.name for m in models])
    return ReportSpec(data=dict(data), models=models, samples=samples, max_new_tokens=budget, decoding=decoding,
                      closed_loop=closed, sweeps=sweeps, baselines=_baselines(raw.get("baselines")),
                      sensitivity=_sensitivity(raw.get("sensitivity")))


def _deep_merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`: mappings merge key by key, other values replace."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def merge_specs(base: dict, over: dict) -> dict:
    """`over` on top of `base` (raw YAML mappings): mappings merge key by key, other values replace, and `models`
    merge by entry name (a new name appended, a known one replaced where it stood)."""
    out = _deep_merge(base, {k: v for k, v in over.items() if k != "models"})
    models, base_models = over.get("models"), base.get("models")
    if isinstance(models, list) and isinstance(base_models, list):
        merged = list(base_models)
        where = {m.get("name"): i for i, m in enumerate(merged) if isinstance(m, dict)}
        for m in models:
            name = m.get("name") if isinstance(m, dict) else None
            if name is not None and name in where:
                merged[where[name]] = m
            else:
                merged.append(m)
        out["models"] = merged
    elif "models" in over:
        out["models"] = models
    return out


def _read_raw(path: Path, chain: tuple = ()) -> dict:
    """One spec file's mapping, after the spec its `base:` names (recursively)."""
    if path.resolve() in {p.resolve() for p in chain}:
        raise SpecError(f"report spec base cycle: {' -> '.join(str(p) for p in chain + (path,))}")
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        via = f" (the base of {chain[-1]})" if chain else ""
        raise SpecError(f"cannot read report spec {path}{via}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: {yaml_problem(exc)}") from exc
    if not isinstance(raw, dict):
        return raw
    base = raw.pop(BASE_KEY, None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base.strip():
        raise SpecError(f"{path}: {BASE_KEY}: expected a report spec path, got {base!r}")
    parent = _read_raw(path.parent / base, chain + (path,))
    if not isinstance(parent, dict):
        raise SpecError(f"{path.parent / base}: expected a mapping at the top level, got {type(parent).__name__}")
    return merge_specs(parent, raw)


def load_spec(path: str | Path) -> ReportSpec:
    path = Path(path)
    raw = _read_raw(path)
    try:
        return parse_spec(raw)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from exc
