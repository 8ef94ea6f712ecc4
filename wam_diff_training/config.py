"""Training configuration: dataclasses, YAML files and `section.key=value` overrides.

Every key is declared here; an unknown key in a file or an override is an error naming it (the
reference code read keys and ignored them; this one refuses them).
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from wam_diff_core.constants import TRAJECTORY_FORMATS
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.settings import check_route_target_scenarios
from wam_diff_core.plain_yaml import yaml_problem

from .perception import OCCUPANCY_CELLS


class ConfigError(WamDiffError, ValueError):
    """A config file, key or value is invalid (the message names it)."""


@dataclass
class DataConfig:
    train: list = field(default_factory=list)  # [{"path": ..., "weight": 1.0, "name": ...}] or paths
    val: Optional[str] = None  # validation split evaluated after each stage
    max_prompt_tokens: int = 4096
    max_response_tokens: int = 512
    on_bad_sample: str = "skip"  # skip (drop and count) | error (stop, naming the sample)
    epoch_size: Optional[int] = None  # draws per epoch over the weighted mix; default: every sample once
    num_workers: int = 0
    trajectory_format: Optional[str] = None  # official | fixed; default: the initial checkpoint's
    # false: planning prompts lose their route target sentence, the model plans without; a list of junction route
    # types (e.g. [roundabout]): they keep it on those alone (meta.scenario), and the world states it there alone
    route_targets: Union[bool, list] = True


@dataclass
class OptimConfig:
    lr: float = 4e-5
    vision_lr: float = 2e-6  # the vision tower's learning rate (a lower one, as in the reference)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.05
    warmup_ratio: float = 0.03
    warmup_steps: Optional[int] = None  # overrides warmup_ratio
    min_lr_ratio: float = 0.0  # cosine floor, as a share of the peak
    grad_clip: float = 1.0  # max global gradient norm; 0 disables


@dataclass
class NoiseConfig:
    t_min: float = 0.05  # noise level range of a response block; stratified across blocks
    t_max: float = 1.0
    chain_share: float = 0.0  # share of fixed-trajectory blocks corrupted as number-order decoding meets them


@dataclass
class TrainConfig:
    epochs: float = 5.0
    max_steps: Optional[int] = None  # optimizer steps per stage; overrides epochs
    batch_size: int = 8  # micro-batch per process
    grad_accum: int = 1
    seed: int = 0
    backend: str = "sdpa"  # text attention backend: sdpa | flex
    device: str = "auto"  # auto (cuda if present) | cpu | cuda
    threads: Optional[int] = None  # torch CPU threads per process (default: torch's own choice)
    bf16: bool = True  # bf16 autocast on GPU
    cpu_bf16: bool = False  # bf16 autocast on the CPU too (wam_diff_training/precision.py; AMX / AVX-512 BF16 CPUs)
    compile: bool = False  # torch.compile the text layers for the steps (wam_diff_training/compiled.py)
    parallel: str = "ddp"  # ddp | fsdp2 (under torchrun)
    log_every: int = 1
    save_every: int = 200  # optimizer steps between resumable checkpoints
    stop_after: Optional[int] = None  # end this invocation after so many steps, checkpoint kept (preemption drills)
    tensorboard: bool = True
    progress: bool = True


@dataclass
class DistillConfig:
    teacher: Optional[str] = None  # checkpoint directory
    teacher_block_size: Optional[int] = None  # default: the teacher's trained_block_size
    ratio: float = 1.0  # loss = (1 - ratio) CE + ratio divergence
    divergence: str = "jsd"  # jsd | forward_kl | reverse_kl
    beta: float = 0.5
    temperature: float = 1.0
    chunk_size: int = 1024  # rows per divergence chunk (full vocabulary each)
    on_policy_every: int = 0  # > 0: every N steps the student generates the responses it is trained on
    on_policy_steps: Optional[int] = None  # decoder steps K for on-policy generation (default B)
    # an AR teacher (teacher_block_size 1) reads [prefix | clean] alone: its logits come from the clean copy,
    # which never attends to the noisy one (same logits within float rounding, about 1.5x less teacher work);
    # off by default so that earlier recipes rebuild their stages bit for bit
    ar_teacher_clean_only: bool = False


@dataclass
class EvalConfig:
    enabled: bool = True
    max_samples: int = 64
    batch_size: int = 8
    steps: Optional[int] = None  # denoising steps K per block (default B: one token per step)
    strategy: str = "low_confidence_static"
    threshold: float = 0.9
    max_new_tokens: int = 128


@dataclass
class PerceptionConfig:
    occupancy_weight: float = 0.0  # > 0: add the visual-token occupancy loss (wam_diff_training/perception.py)
    occupancy_cells: int = 4  # cells per visual token side (4: 8x8 px cells of a 32x32 px token)


@dataclass
class Config:
    model: str = "nano"  # initial weights: a checkpoint directory, or a preset name (random weights)
    out: str = "runs/train"
    block_size: int = 1  # ar: 1; distill: the student's block size
    block_sizes: list = field(default_factory=lambda: [4, 8, 16, 32])  # adapt chain
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    perception: PerceptionConfig = field(default_factory=PerceptionConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {f.name: f for f in dataclasses.fields(Config)}
_BOOL_OR_LIST = "Union[bool, list]"  # the declared type of a field that takes true/false or a list


def _coerce(value: Any, current: Any, name: str) -> Any:
    if value is None or current is None:
        return value
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 3e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    if isinstance(current, str) and not isinstance(value, str):
        return str(value)
    if isinstance(current, list) and isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(current, list) and not isinstance(value, list):
        if isinstance(value, str):
            return [int(v) if v.strip().lstrip("-").isdigit() else v.strip() for v in value.split(",") if v.strip()]
        raise ConfigError(f"{name}: expected a list, got {value!r}")
    return value


def set_key(cfg: Config, dotted: str, value: Any) -> None:
    """Set `section.key` (or a top-level key) from a parsed value, checking the key exists."""
    parts = dotted.split(".")
    target: Any = cfg
    for i, part in enumerate(parts[:-1]):
        if not dataclasses.is_dataclass(target) or part not in {f.name for f in dataclasses.fields(target)}:
            raise ConfigError(f"unknown config section {part!r} in {dotted!r}; {_expected(target, parts[:i], part)}")
        target = getattr(target, part)
    key = parts[-1]
    if not dataclasses.is_dataclass(target) or key not in {f.name for f in dataclasses.fields(target)}:
        raise ConfigError(f"unknown config key {dotted!r}; {_expected(target, parts[:-1], key)}")
    current = getattr(target, key)
    declared = {f.name: f.type for f in dataclasses.fields(target)}[key]
    declared = declared if isinstance(declared, str) else getattr(declared, "__name__", "")
    if declared == _BOOL_OR_LIST:  # a switch that may instead name what it applies to
        if not isinstance(value, (bool, list)):
            raise ConfigError(f"{dotted}: expected true/false or a list, got {value!r}")
        setattr(target, key, value)
        return
    if current is None and value is not None:  # Optional[...] field: coerce by its declared type
        current = 0 if "int" in declared else 0.0 if "float" in declared else ""
    if dataclasses.is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted}: expected a mapping of keys, got {value!r}")
        for k, v in value.items():
            set_key(cfg, f"{dotted}.{k}", v)
        return
    setattr(target, key, _coerce(value, current, dotted))


def _expected(target: Any, prefix: list[str], name: str) -> str:
    """What `name` could have been: the closest key of `target`, else all of them (dotted like the input)."""
    keys = [f.name for f in dataclasses.fields(target)] if dataclasses.is_dataclass(target) else []
    close = difflib.get_close_matches(name, keys, n=1)
    dotted = [".".join(prefix + [k]) for k in (close or keys)]
    if close:
        return f"did you mean {dotted[0]!r}?"
    return f"expected one of {', '.join(dotted)}" if dotted else f"{'.'.join(prefix)} has no keys"


BASE_KEY = "base"  # a config file's parent: its keys first, then this file's (sections merge key by key)


def _apply_file(cfg: Config, path: Path, chain: tuple = ()) -> None:
    """Set `cfg` from one YAML file, after the file its `base:` names (relative to it), recursively."""
    if not path.is_file():
        via = f" (the base of {chain[-1]})" if chain else ""
        raise ConfigError(f"config file not found: {path}{via}")
    if path.resolve() in {p.resolve() for p in chain}:
        raise ConfigError(f"config base cycle: {' -> '.join(str(p) for p in chain + (path,))}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    base = raw.pop(BASE_KEY, None)
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{path}: {BASE_KEY} must be a config file path, got {base!r}")
        _apply_file(cfg, path.parent / base, chain + (path,))
    for key, value in raw.items():
        try:
            set_key(cfg, key, value)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from exc


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None) -> Config:
    """Defaults, then the YAML file (after the file its `base:` key names, if any), then `key=value`
    overrides (values parsed as YAML)."""
    cfg = Config()
    if path is not None:
        _apply_file(cfg, Path(path))
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: {yaml_problem(exc)}") from exc
        set_key(cfg, key.strip(), value)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    if cfg.data.trajectory_format not in (None,) + TRAJECTORY_FORMATS:
        raise ConfigError(f"data.trajectory_format must be one of {TRAJECTORY_FORMATS}, got {cfg.data.trajectory_format!r}")
    if cfg.data.on_bad_sample not in ("skip", "error"):
        raise ConfigError(f"data.on_bad_sample must be skip or error, got {cfg.data.on_bad_sample!r}")
    if cfg.train.batch_size < 1 or cfg.train.grad_accum < 1:
        raise ConfigError("train.batch_size and train.grad_accum must be >= 1")
    if cfg.block_size < 1 or any(int(b) < 1 for b in cfg.block_sizes):
        raise ConfigError(f"block sizes must be >= 1, got {cfg.block_size} / {cfg.block_sizes}")
    if not 0.0 <= cfg.noise.t_min <= cfg.noise.t_max <= 1.0 or cfg.noise.t_max <= 0:
        raise ConfigError(f"need 0 <= noise.t_min <= noise.t_max <= 1, got {cfg.noise.t_min}, {cfg.noise.t_max}")
    if not 0.0 <= cfg.noise.chain_share <= 1.0:
        raise ConfigError(f"noise.chain_share must be in [0, 1], got {cfg.noise.chain_share!r}")
    if cfg.distill.divergence not in ("jsd", "forward_kl", "reverse_kl"):
        raise ConfigError(f"distill.divergence must be jsd, forward_kl or reverse_kl, got {cfg.distill.divergence!r}")
    if not 0.0 <= cfg.distill.ratio <= 1.0:
        raise ConfigError(f"distill.ratio must be in [0, 1], got {cfg.distill.ratio}")
    if cfg.train.parallel not in ("ddp", "fsdp2"):
        raise ConfigError(f"train.parallel must be ddp or fsdp2, got {cfg.train.parallel!r}")
    if cfg.perception.occupancy_weight < 0:
        raise ConfigError(f"perception.occupancy_weight must be >= 0, got {cfg.perception.occupancy_weight}")
    if cfg.perception.occupancy_cells not in OCCUPANCY_CELLS:
        raise ConfigError(f"perception.occupancy_cells must be one of {OCCUPANCY_CELLS}, got {cfg.perception.occupancy_cells}")
    if not isinstance(cfg.data.route_targets, bool):
        try:
            check_route_target_scenarios(cfg.data.route_targets)
        except ValueError as exc:
            raise ConfigError(f"data.route_targets: true, false or {exc}") from exc
    if cfg.train.backend not in ("sdpa", "flex"):
        raise ConfigError(f"train.backend must be sdpa or flex, got {cfg.train.backend!r}")
