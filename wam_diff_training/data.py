"""Training datasets in the format of docs/architecture.md, encoded with the model's own processor.

A dataset file is a JSON list or JSONL of samples `{"id", "datasource", "task", "image": [paths
relative to the file], "conversations": [human, gpt]}`. Each sample becomes an `Example`: prompt
token ids (chat form, image pads expanded), the response token ids ending in EOS, and the image
tensors. Several task datasets are mixed by weight (`MixSampler`).

Bad samples (unparseable conversation, missing or unreadable image, response or prompt over the
limit) are found by `scan` before training starts: with `on_bad_sample="skip"` they are dropped and
counted, with `"error"` the run stops naming the sample. A sample that still fails when it is read
during training (a file deleted meanwhile) comes back as a `BadSample`, which the collate drops and
counts, so an epoch never crashes halfway.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch
from PIL import Image

from wam_diff_core.codec import ParseError, format_trajectory, parse_trajectory
from wam_diff_core.constants import EOS_TOKEN, TRAJECTORY_FORMATS
from wam_diff_core.decoding.constraint import TrajectoryGrammar
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.processor import VLProcessor
from wam_diff_core.prompts import parse_planning_ego, parse_route_target, sample_to_chat, without_route_target
from wam_diff_core.types import EgoState

from .perception import sample_occupancy

BAD_SAMPLE_POLICIES = ("skip", "error")


def spaced_indices(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n) (all of them when k >= n): validation splits are ordered
    by route, so their first k samples would all come from one route."""
    if k >= n:
        return list(range(n))
    return sorted({int(i) for i in np.linspace(0, n - 1, k).round()})


def spaced_examples(dataset, limit: int) -> list:
    """Up to `limit` usable Examples of a dataset, spread evenly over it (BadSamples left out)."""
    return [x for x in (dataset[i] for i in spaced_indices(len(dataset), limit)) if isinstance(x, Example)]


class DataError(WamDiffError, ValueError):
    """A dataset file or sample is unusable; the message names the file or sample."""


@dataclass
class Example:
    """One encoded sample. prompt_ids / mm_token_type_ids: (P,); response_ids: (R,) ending in EOS;
    pixel_values: (patches, patch_dim) or None; image_grid_thw: (images, 3) or None."""

    sample_id: str
    task: str
    prompt_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    response_ids: torch.Tensor
    pixel_values: Optional[torch.Tensor]
    image_grid_thw: Optional[torch.Tensor]
    response_text: str = ""
    occupancy: Optional[torch.Tensor] = None  # (visual tokens, cells^2) perception targets (wam_diff_training/perception.py)
    chained: bool = False  # the response is a fixed-style trajectory: its numbers are chains (codec)
    ego: Optional[EgoState] = None  # a planning prompt's ego state (the decoders' kinematic envelope)

    def with_response(self, response_ids: torch.Tensor) -> "Example":
        chained = self.chained and len(response_ids) == len(self.response_ids)
        return Example(self.sample_id, self.task, self.prompt_ids, self.mm_token_type_ids, response_ids,
                       self.pixel_values, self.image_grid_thw, "", self.occupancy, chained, self.ego)


@dataclass
class BadSample:
    sample_id: str
    reason: str


def require_dataset_file(path: Union[str, Path]) -> Path:
    """`path` as a Path when it is a file; a DataError naming it otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path} (expected a JSON or JSONL file of samples)")
    return path


def read_samples(path: Union[str, Path]) -> list[dict]:
    """Samples of a JSON list or JSONL file. Raises DataError naming the file (and line) when unreadable."""
    path = require_dataset_file(path)
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            samples = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from exc
    else:
        samples = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{n}: not valid JSON ({exc})") from exc
    if not isinstance(samples, list):
        raise DataError(f"{path}: expected a JSON list of samples, got {type(samples).__name__}")
    return samples


def load_image(path: Path) -> np.ndarray:
    """HxWx3 uint8 RGB array of an image file. Raises DataError naming the file."""
    if not path.is_file():
        raise DataError(f"image not found: {path}")
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # PIL raises many kinds for truncated or foreign files
        raise DataError(f"unreadable image {path}: {exc}") from exc


@dataclass
class DatasetStats:
    total: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason kind -> count

    def count(self, reason: str) -> None:
        kind = reason.split(":", 1)[0]
        self.skipped[kind] = self.skipped.get(kind, 0) + 1

    @property
    def kept(self) -> int:
        return self.total - sum(self.skipped.values())


def _meta(sample) -> dict:
    """A sample's `meta` object, or {} when it has none."""
    meta = sample.get("meta") if isinstance(sample, dict) else None
    return meta if isinstance(meta, dict) else {}


def _scenario(sample) -> Optional[str]:
    return _meta(sample).get("scenario")


def keep_scenarios(samples: list, scenarios: Union[str, Sequence[str]], path: Path) -> list:
    """The samples whose `meta.scenario` (as `wam-diff data` and `dagger` write it) is one of `scenarios`.
    Raises DataError naming the file when none is, or when a name is not a scenario of the file."""
    wanted = [scenarios] if isinstance(scenarios, str) else list(scenarios)
    if not wanted or not all(isinstance(w, str) and w for w in wanted):
        raise DataError(f"{path}: scenarios must be a non-empty list of scenario names, got {scenarios!r}")
    present = Counter(_scenario(x) for x in samples)
    missing = [w for w in wanted if w not in present]
    if missing:
        have = sorted(str(k) for k in present if k is not None)
        raise DataError(f"{path}: no sample of scenario(s) {missing}; the file has {have or 'no meta.scenario'}")
    return [x for x in samples if _scenario(x) in wanted]


def _forward_speed(sample) -> Optional[float]:
    ego = _meta(sample).get("ego")
    if not isinstance(ego, (list, tuple)) or not ego or isinstance(ego[0], bool) or not isinstance(ego[0], (int, float)):
        return None
    return float(ego[0])


def keep_fast(samples: list, min_speed_mps: float, path: Path) -> list:
    """The samples whose ego forward speed (`meta.ego[0]`, m/s, as `wam-diff data` and `dagger` write it) is at
    least `min_speed_mps`. Raises DataError naming the file when the bound is not a number >= 0 or no sample is
    that fast."""
    if isinstance(min_speed_mps, bool) or not isinstance(min_speed_mps, (int, float)) or not min_speed_mps >= 0:
        raise DataError(f"{path}: min_speed_mps must be a number of m/s >= 0, got {min_speed_mps!r}")
    speeds = [_forward_speed(x) for x in samples]
    kept = [x for x, v in zip(samples, speeds) if v is not None and v >= min_speed_mps]
    if not kept:
        known = [v for v in speeds if v is not None]
        have = f"the fastest is {max(known):.2f} m/s" if known else "no sample has meta.ego"
        raise DataError(f"{path}: no sample at min_speed_mps {min_speed_mps}; {have}")
    return kept


class DrivingDataset(torch.utils.data.Dataset):
    """One dataset file. `__getitem__` returns an Example, or a BadSample for a sample that fails now."""

    def __init__(self, path: Union[str, Path], processor: VLProcessor, max_prompt_tokens: int = 4096,
                 max_response_tokens: int = 512, on_bad_sample: str = "skip", name: Optional[str] = None,
                 tasks: Optional[Sequence[str]] = None, trajectory_format: str = "official",
                 occupancy_cells: Optional[int] = None, scenarios: Optional[Sequence[str]] = None,
                 route_targets: Union[bool, Sequence[str]] = True, min_speed_mps: Optional[float] = None):
        if on_bad_sample not in BAD_SAMPLE_POLICIES:
            raise ValueError(f"on_bad_sample must be one of {BAD_SAMPLE_POLICIES}, got {on_bad_sample!r}")
        if trajectory_format not in TRAJECTORY_FORMATS:
            raise ValueError(f"trajectory_format must be one of {TRAJECTORY_FORMATS}, got {trajectory_format!r}")
        self.path = Path(path)
        self.root = self.path.parent
        self.name = name or self.path.stem
        self.processor = processor
        self.max_prompt_tokens = max_prompt_tokens
        self.max_response_tokens = max_response_tokens
        self.on_bad_sample = on_bad_sample
        self.stats = DatasetStats()
        self.skipped_ids: list[tuple[str, str]] = []
        self.tasks = [tasks] if isinstance(tasks, str) else (list(tasks) if tasks else None)
        self.occupancy_cells = occupancy_cells  # set: Examples carry perception targets from meta boxes
        # False: planning prompts lose their route target sentence (old checkpoints); route types: kept on those alone
        self.route_targets = route_targets if isinstance(route_targets, bool) else tuple(route_targets)
        self.metas: list = []  # the kept samples' meta (when occupancy_cells is set)
        self.planning_frame_sizes: Counter = Counter()  # (W, H) of the kept planning samples' images
        self.planning_route_targets = 0  # kept planning samples whose prompt states a route target point
        tok = processor.tokenizer
        self.eos_id = int(tok.convert_tokens_to_ids(EOS_TOKEN))
        self.grammar = TrajectoryGrammar(tok, self.eos_id) if trajectory_format == "fixed" else None
        samples = read_samples(self.path)
        if self.tasks is not None:  # one file holding several tasks, mixed by weight per task
            samples = [x for x in samples if isinstance(x, dict) and x.get("task") in self.tasks]
        if scenarios is not None:
            samples = keep_scenarios(samples, scenarios, self.path)
        if min_speed_mps is not None:
            samples = keep_fast(samples, min_speed_mps, self.path)
        self.samples = self.scan(samples)

    def _restyle(self, task: str, response: str) -> str:
        """The planning answer in the fixed style when this dataset asks for it; others unchanged."""
        if self.grammar is None or task != "planning":
            return response
        parsed = parse_trajectory(response)
        if isinstance(parsed, ParseError):
            raise DataError(f"unparsable planning answer: {parsed}")
        try:
            return format_trajectory(parsed, "fixed")
        except ValueError as exc:
            raise DataError(str(exc)) from exc

    def response_ids(self, task: str, response: str) -> list[int]:
        """Token ids of an answer ending in EOS (a fixed-style trajectory spelled one token per character)."""
        if self.grammar is not None and task == "planning":
            return self.grammar.encode(response) + [self.eos_id]
        return self.processor.tokenizer(response + EOS_TOKEN, add_special_tokens=False)["input_ids"]

    def _check(self, sample: dict) -> tuple[str, str, str, list[Path], list[tuple[int, int]]]:
        """Cheap checks before training: conversation form, image files, response length. Returns the task, prompt,
        response, image paths and the images' (W, H)."""
        try:
            prompt, response = sample_to_chat(sample)
        except ValueError as exc:
            raise DataError(f"bad conversation: {exc}") from exc
        keep = self.route_targets if isinstance(self.route_targets, bool) else _scenario(sample) in self.route_targets
        if not keep:
            prompt = without_route_target(prompt)
        task = str(sample.get("task", ""))
        response = self._restyle(task, response)
        paths = [self.root / p for p in sample["image"]]
        sizes = []
        for p in paths:
            if not p.is_file():
                raise DataError(f"missing image: {p}")
            try:
                with Image.open(p) as img:
                    sizes.append(tuple(img.size))
                    img.verify()
            except Exception as exc:
                raise DataError(f"unreadable image: {p} ({exc})") from exc
        n = len(self.response_ids(task, response))
        if n > self.max_response_tokens:
            raise DataError(f"response too long: {n} tokens > max_response_tokens {self.max_response_tokens}")
        return task, prompt, response, paths, sizes

    def _fail(self, sid: str, reason: str) -> None:
        if self.on_bad_sample == "error":
            raise DataError(f"{self.path}: sample {sid!r}: {reason}")
        self.stats.count(reason)
        self.skipped_ids.append((sid, reason))

    def scan(self, samples: list) -> list[tuple[str, str, str, str, list[Path]]]:
        """(id, task, prompt, response, image paths) of the usable samples; the rest skipped or an error."""
        kept = []
        for i, sample in enumerate(samples):
            sid = str(sample.get("id", f"#{i}")) if isinstance(sample, dict) else f"#{i}"
            self.stats.total += 1
            try:
                task, prompt, response, paths, sizes = self._check(sample)
            except DataError as exc:
                self._fail(sid, str(exc))
                continue
            kept.append((sid, task, prompt, response, paths))
            if task == "planning":
                self.planning_frame_sizes.update(sizes)
                self.planning_route_targets += parse_route_target(prompt) is not None
            if self.occupancy_cells:
                self.metas.append(sample.get("meta"))
        return kept

    def __len__(self) -> int:
        return len(self.samples)

    def encode(self, index: int) -> Example:
        sid, task, prompt, response, paths = self.samples[index]
        images = [load_image(p) for p in paths]
        enc = self.processor.encode([prompt], [images] if images else None)
        if enc.input_ids.shape[1] > self.max_prompt_tokens:
            raise DataError(f"prompt too long: {enc.input_ids.shape[1]} tokens > max_prompt_tokens {self.max_prompt_tokens}")
        resp = torch.tensor(self.response_ids(task, response), dtype=torch.long)
        occupancy = None
        if self.occupancy_cells and enc.image_grid_thw is not None:
            ip = self.processor.image_processor
            occupancy = sample_occupancy(self.metas[index], enc.image_grid_thw, int(ip.patch_size), int(ip.merge_size),
                                         self.occupancy_cells)
        ego = parse_planning_ego(prompt) if task == "planning" else None
        return Example(sid, task, enc.input_ids[0], enc.mm_token_type_ids[0], resp, enc.pixel_values,
                       enc.image_grid_thw, response, occupancy, self.grammar is not None and task == "planning", ego)

    def __getitem__(self, index: int) -> Union[Example, BadSample]:
        try:
            return self.encode(index)
        except (DataError, ValueError, OSError) as exc:
            return BadSample(self.samples[index][0], str(exc))


class MixedDataset(torch.utils.data.Dataset):
    """Several datasets behind one flat index (dataset d's samples follow those of datasets < d)."""

    def __init__(self, datasets: Sequence[DrivingDataset], weights: Optional[Sequence[float]] = None):
        if not datasets:
            raise DataError("no training datasets configured")
        weights = list(weights) if weights is not None else [1.0] * len(datasets)
        if len(weights) != len(datasets) or any(not (w >= 0) for w in weights) or sum(weights) <= 0:
            raise DataError(f"dataset weights must be >= 0 with a positive sum, one per dataset; got {weights}")
        for d, w in zip(datasets, weights):
            if w > 0 and len(d) == 0:
                raise DataError(f"{d.path}: no usable samples (skipped: {d.stats.skipped})")
        self.datasets = list(datasets)
        self.weights = weights
        self.offsets = np.cumsum([0] + [len(d) for d in datasets]).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: int):
        d = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return self.datasets[d][index - self.offsets[d]]

    @property
    def sizes(self) -> list[int]:
        return [len(d) for d in self.datasets]

    def _planning_sizes(self) -> Counter:
        sizes: Counter = Counter()
        for d, w in zip(self.datasets, self.weights):
            if w > 0:
                sizes.update(d.planning_frame_sizes)
        return sizes

    def planning_frame_size(self) -> Optional[tuple[int, int]]:
        """(W, H) of every planning image the weighted datasets hold, when they all share one; None when they
        hold no planning image or several sizes (a checkpoint then records no frame size)."""
        sizes = self._planning_sizes()
        return next(iter(sizes)) if len(sizes) == 1 else None

    def planning_frame_sizes(self) -> dict[str, int]:
        """'WxH' -> planning images of that size in the weighted datasets."""
        return {f"{w}x{h}": n for (w, h), n in sorted(self._planning_sizes().items())}

    def planning_route_targets(self) -> int:
        """Planning samples of the weighted datasets whose prompt states a route target point."""
        return sum(d.planning_route_targets for d, w in zip(self.datasets, self.weights) if w > 0)

    def skipped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.datasets:
            for k, v in d.stats.skipped.items():
                out[k] = out.get(k, 0) + v
        return out


class MixSampler:
    """Deterministic epochs of flat indices, datasets drawn in proportion to their weights.

    An epoch holds `epoch_size` draws (default: all samples once): dataset d gets
    round(epoch_size * w_d / sum(w)) of them, its samples cycled in a fresh permutation; the whole
    epoch is shuffled. The order depends only on (seed, epoch), so a resumed run sees the same data.
    With several processes each rank takes every world-th micro-batch.
    """

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], batch_size: int, seed: int = 0,
                 epoch_size: Optional[int] = None, rank: int = 0, world: int = 1):
        self.sizes, self.weights = list(sizes), list(weights)
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.epoch_size = epoch_size or sum(self.sizes)
        total_w = sum(weights)
        self.counts = [int(round(self.epoch_size * w / total_w)) if n > 0 else 0 for n, w in zip(sizes, weights)]
        self.offsets = np.cumsum([0] + self.sizes).tolist()

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches per epoch per rank (incomplete trailing batches are dropped)."""
        return sum(self.counts) // (self.batch_size * self.world)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        draws = []
        for d, (n, count) in enumerate(zip(self.sizes, self.counts)):
            reps = math.ceil(count / n) if n else 0
            perm = torch.cat([torch.randperm(n, generator=gen) for _ in range(reps)])[:count] if reps else torch.empty(0, dtype=torch.long)
            draws.append(perm + self.offsets[d])
        flat = torch.cat(draws)[torch.randperm(sum(self.counts), generator=gen)].tolist()
        per = self.batch_size
        batches = [flat[i * per:(i + 1) * per] for i in range(len(flat) // per)]
        usable = (len(batches) // self.world) * self.world
        return batches[self.rank:usable:self.world]

    def stream(self, start: int = 0) -> Iterator[tuple[int, list[int]]]:
        """(epoch, batch of indices) for micro-batches start, start + 1, ... forever."""
        n = self.batches_per_epoch
        if n == 0:
            raise DataError(f"an epoch of {sum(self.counts)} samples makes no batch of {self.batch_size} on "
                            f"{self.world} process(es); lower train.batch_size")
        epoch, offset = divmod(start, n)
        while True:
            for batch in self.epoch_batches(epoch)[offset:]:
                yield epoch, batch
            epoch, offset = epoch + 1, 0


ENTRY_KEYS = ("path", "weight", "name", "task", "scenarios", "min_speed_mps")


def build_datasets(entries: Sequence[dict], processor: VLProcessor, max_prompt_tokens: int, max_response_tokens: int,
                   on_bad_sample: str, base_dir: Optional[Path] = None, trajectory_format: str = "official",
                   occupancy_cells: Optional[int] = None, route_targets: Union[bool, Sequence[str]] = True
                   ) -> MixedDataset:
    """Datasets of config entries `{"path": ..., "weight": ..., "task": ..., "scenarios": [...], "min_speed_mps": v}`
    (paths relative to `base_dir`; `task`, a name or a list, keeps only those samples of the file; `scenarios`, only
    the samples of those scenario types, by `meta.scenario`; `min_speed_mps`, only those whose ego drives at least
    that fast, by `meta.ego[0]`). An entry key outside `ENTRY_KEYS` is an error. `route_targets` False strips planning
    prompts' route target sentence; a list of route types keeps it in their samples alone."""
    datasets, weights = [], []
    for entry in entries:
        if isinstance(entry, str):
            entry = {"path": entry}
        if "path" not in entry:
            raise DataError(f"dataset entry {entry!r} has no 'path'")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise DataError(f"dataset entry {entry!r}: unknown key(s) {unknown}; expected some of {list(ENTRY_KEYS)}")
        path = Path(entry["path"])
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        datasets.append(DrivingDataset(path, processor, max_prompt_tokens, max_response_tokens, on_bad_sample,
                                       name=entry.get("name"), tasks=entry.get("task"),
                                       trajectory_format=trajectory_format, occupancy_cells=occupancy_cells,
                                       scenarios=entry.get("scenarios"), route_targets=route_targets,
                                       min_speed_mps=entry.get("min_speed_mps")))
        weights.append(float(entry.get("weight", 1.0)))
    return MixedDataset(datasets, weights)
