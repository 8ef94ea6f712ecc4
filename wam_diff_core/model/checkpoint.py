"""Loading and saving checkpoints: a local Hugging Face Qwen3-VL directory plus `wam_diff.json`.

Loading is from a local path only (`local_files_only`), safetensors only (a pickle checkpoint is
refused, never unpickled), never remote code (an `auto_map` naming code to import is refused), and
only files inside the directory (a weight map naming a file elsewhere is refused). A missing or
corrupt file raises an error that names the file.

Layouts: whatever transformers 4.5x and 5.x write with `save_pretrained`: one `model.safetensors` or shards
named by `model.safetensors.index.json`; the image processor in `preprocessor_config.json` (4.5x, and this
project's own save) or as the "image_processor" section of `processor_config.json` (5.x, which writes no
`preprocessor_config.json`); config.json stating its dtype as "dtype" or (before 4.56) "torch_dtype".
Weights load in the dtype asked for, else the checkpoint's own on a GPU and float32 on a CPU (`precision`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch
from safetensors import safe_open
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from ..constants import EOS_TOKEN, IMAGE_PAD_TOKEN, PAD_TOKEN, VIDEO_PAD_TOKEN, VISION_END_TOKEN, VISION_START_TOKEN, WAM_DIFF_CONFIG_NAME
from ..errors import WamDiffError
from ..perception import BoxHead, load_box_head, save_box_head
from .atomic import atomic_directory
from .presets import QWEN_SPECIAL_IDS, PresetError, build_config, get_preset, preset_names
from .precision import parse_dtype, resolve_dtype, stored_dtype
from .processor import IMAGE_PROCESSOR_FILE, PROCESSOR_FILE, VLProcessor
from .settings import WamDiffSettings
from .shipped import resolve_model
from .tokenizer import nano_image_processor, train_nano_tokenizer

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # torch.save / pickle formats
# the JSON files transformers reads when loading; an `auto_map` in any of them names code to import
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# The id a stock Qwen3-VL tokenizer gives the added mask token: the first spare embedding row.
QWEN_MASK_TOKEN_ID = 151669


class CheckpointError(WamDiffError, ValueError):
    """A checkpoint directory is missing a file or holds a corrupt one (the message names it)."""


@dataclass
class LoadedModel:
    model: Qwen3VLForConditionalGeneration
    processor: Optional[VLProcessor]  # None for architecture presets without a tokenizer
    settings: WamDiffSettings
    name: str
    box_head: Optional[BoxHead] = None  # the checkpoint's box head (`perception`), if it has one

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self.processor, self.settings)


def pad_token_id(processor: VLProcessor, settings: WamDiffSettings) -> int:
    """The id that left-pads prompts and pads targets: the tokenizer's pad token, else EOS."""
    pad = processor.tokenizer.pad_token_id
    return settings.eos_token_id if pad is None else int(pad)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"corrupt checkpoint file {path}: not valid JSON ({exc})") from exc


def _indexed_files(path: Path) -> list[Path]:
    """The shards `model.safetensors.index.json` names: safetensors files inside `path`, nothing else."""
    index = _read_json(path / SAFETENSORS_INDEX)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
    if not names:
        raise CheckpointError(f"corrupt checkpoint file {path / SAFETENSORS_INDEX}: empty weight_map")
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") \
                or not name.endswith(".safetensors"):
            raise CheckpointError(f"{path / SAFETENSORS_INDEX}: weight_map names {name!r}; expected the file name "
                                  f"of a .safetensors shard in the same directory")
    return [path / name for name in names]


def _weight_files(path: Path) -> list[Path]:
    if (path / SAFETENSORS_INDEX).is_file():
        files = _indexed_files(path)
    elif (path / SAFETENSORS_FILE).is_file():
        files = [path / SAFETENSORS_FILE]
    else:
        pickles = [path / name for name in PICKLE_FILES if (path / name).exists()]
        pickles += sorted(f for f in path.iterdir() if f.suffix in PICKLE_SUFFIXES and f not in pickles)
        if pickles:
            raise CheckpointError(f"{pickles[0]}: pickle checkpoints are refused (never unpickled); convert to "
                                  f"{SAFETENSORS_FILE}")
        raise CheckpointError(f"missing checkpoint file: {path / SAFETENSORS_FILE}")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"missing checkpoint file: {f}")
        try:
            with safe_open(str(f), framework="pt") as handle:
                keys = list(handle.keys())
                if keys:
                    handle.get_slice(keys[-1])  # touch the last tensor's header
        except Exception as exc:  # safetensors raises several error types for bad files
            raise CheckpointError(f"corrupt checkpoint file {f}: {exc}; copy or export the model again") from exc
    return files


def _refuse_remote_code(path: Path) -> None:
    """An `auto_map` names Python code in (or downloaded for) the checkpoint that transformers would import with
    trust_remote_code; this loader never sets it, and refuses such a directory rather than ignore the key."""
    for name in AUTO_MAP_FILES:
        if (path / name).is_file():
            data = _read_json(path / name)
            if isinstance(data, dict) and "auto_map" in data:
                raise CheckpointError(f"{path / name}: 'auto_map' names code to import ({data['auto_map']!r}); "
                                      f"checkpoints never run their own code here: remove the key")


def image_processor_file(path: Path) -> Path:
    """The file holding the image processor's settings, looked up as transformers does: the "image_processor"
    section of `processor_config.json` (transformers 5 writes it so), else `preprocessor_config.json` (4.5x)."""
    nested = path / PROCESSOR_FILE
    if nested.is_file():
        data = _read_json(nested)
        section = data.get("image_processor") if isinstance(data, dict) else None
        if isinstance(section, dict):
            return nested
        if section is not None:
            raise CheckpointError(f"corrupt checkpoint file {nested}: 'image_processor' is {section!r}, expected a "
                                  f"mapping of image processor settings")
    if not (path / IMAGE_PROCESSOR_FILE).is_file():
        raise CheckpointError(f"missing checkpoint file: {path / IMAGE_PROCESSOR_FILE} (or {PROCESSOR_FILE} with "
                              f"an 'image_processor' section, as transformers 5 writes it)")
    _read_json(path / IMAGE_PROCESSOR_FILE)
    return path / IMAGE_PROCESSOR_FILE


def _checked_files(path: Path) -> list[Path]:
    """Validate a checkpoint directory's files before loading; returns its weight files."""
    if not path.is_dir():
        raise CheckpointError(_not_found(path))
    _refuse_remote_code(path)
    config = _read_json(path / "config.json")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in ("qwen3_vl",):
        raise CheckpointError(f"{path / 'config.json'}: model_type {model_type!r}, expected 'qwen3_vl'")
    files = _weight_files(path)
    for name in TOKENIZER_FILES:
        if not (path / name).is_file():
            raise CheckpointError(f"missing checkpoint file: {path / name}")
    image_processor_file(path)
    if (path / WAM_DIFF_CONFIG_NAME).exists():
        _read_json(path / WAM_DIFF_CONFIG_NAME)
    return files


def check_checkpoint(path: str | Path) -> Path:
    """Validate a checkpoint directory's files before loading; returns the path."""
    _checked_files(Path(path))
    return Path(path)


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
               ) -> LoadedModel:
    """Load a local Qwen3-VL checkpoint (HF directory, safetensors) with its processor and diffusion settings.

    `dtype`: a `precision.DTYPES` name or torch dtype; None: the checkpoint's own on a GPU, float32 on a CPU.
    A checkpoint without `wam_diff.json` is a stock autoregressive model: trained block size 1 (and
    decoded at B = 1 by default), mask token added to its tokenizer.
    """
    parse_dtype(dtype)  # a bad name is reported before any file is read
    path = Path(path)
    dtype = resolve_dtype(dtype, device, stored_dtype(path, _checked_files(path)))
    try:
        processor = VLProcessor.from_pretrained(path)
    except Exception as exc:
        raise CheckpointError(f"cannot load tokenizer / image processor from {path}: {exc}") from exc
    try:
        model = Qwen3VLForConditionalGeneration.from_pretrained(
            str(path), local_files_only=True, use_safetensors=True, trust_remote_code=False, dtype=dtype,
        )
    except Exception as exc:
        raise CheckpointError(f"cannot load weights from {path}: {exc}") from exc
    model.to(device).eval()
    vocab = model.config.text_config.vocab_size
    if processor.mask_token_id >= vocab:
        raise CheckpointError(
            f"{path}: mask token id {processor.mask_token_id} does not fit the embedding matrix ({vocab} rows)"
        )
    settings_file = path / WAM_DIFF_CONFIG_NAME
    if settings_file.exists():
        try:
            settings = WamDiffSettings.load(settings_file)
        except ValueError as exc:  # the message names the file and the bad key or value
            raise CheckpointError(str(exc)) from exc
    else:
        settings = WamDiffSettings(
            mask_token_id=processor.mask_token_id,
            eos_token_id=processor.tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        ).for_block_size(1)
    head = load_box_head(path, model.config.vision_config, device)  # None without one; BoxHeadError names the file
    return LoadedModel(model, processor, settings, name=str(path), box_head=head)


def save_model(loaded: LoadedModel, path: str | Path, state_dict: Optional[dict] = None,
               extra_files: Optional[Mapping[str, str]] = None) -> Path:
    """Write model (safetensors), processor and settings atomically: a temporary directory, then rename.

    `state_dict`: full weights to write instead of the module's own (e.g. gathered from a sharded
    model); with tied embeddings its `lm_head.weight` copy is dropped, as save_pretrained does.
    `extra_files`: file name -> text written into the same directory before the rename (a record that
    must not be missing from a model that exists)."""
    model = loaded.model
    if state_dict is not None and model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    with atomic_directory(path) as tmp:
        model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True)
        if loaded.processor is not None:
            loaded.processor.save_pretrained(tmp)
        loaded.settings.save(tmp)
        if loaded.box_head is not None:
            save_box_head(loaded.box_head, tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return Path(path)


def build_preset(name: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                 seed: int = 0) -> LoadedModel:
    """A preset architecture with random weights (seeded). `nano` comes with its own trained tokenizer
    and image processor; the real architectures have none (speed measurement only)."""
    preset = get_preset(name)
    if preset.own_tokenizer:
        tokenizer = train_nano_tokenizer(preset.text.vocab_size, seed=0)
        processor = VLProcessor(tokenizer, nano_image_processor())
        ids = {
            "pad_token_id": tokenizer.convert_tokens_to_ids(PAD_TOKEN),
            "eos_token_id": tokenizer.convert_tokens_to_ids(EOS_TOKEN),
            "vision_start_token_id": tokenizer.convert_tokens_to_ids(VISION_START_TOKEN),
            "vision_end_token_id": tokenizer.convert_tokens_to_ids(VISION_END_TOKEN),
            "image_token_id": tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN),
            "video_token_id": tokenizer.convert_tokens_to_ids(VIDEO_PAD_TOKEN),
        }
        mask_id = processor.mask_token_id
    else:
        processor, ids, mask_id = None, dict(QWEN_SPECIAL_IDS), QWEN_MASK_TOKEN_ID
    config: Qwen3VLConfig = build_config(preset, ids)
    dtype = resolve_dtype(dtype, "cpu")  # random weights have no dtype of their own: float32 unless asked
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=dtype)
    model.eval()
    settings = WamDiffSettings(mask_token_id=mask_id, eos_token_id=ids["eos_token_id"])
    return LoadedModel(model, processor, settings, name=name)


def load(model: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None) -> LoadedModel:
    """A local checkpoint directory, a preset name, or the shipped model's name (`resolve_model`); `dtype` as
    `load_model`'s (a preset: float32 unless asked)."""
    model = resolve_model(str(model))
    if Path(model).is_dir():
        return load_model(model, device=device, dtype=dtype)
    if Path(model).exists() or any(sep in str(model) for sep in ("/", "\\")) or str(model).startswith("."):
        raise CheckpointError(_not_found(model))
    try:
        return build_preset(str(model), device=device, dtype=dtype)
    except PresetError:
        raise CheckpointError(f"{str(model)!r} is neither a checkpoint directory nor a preset; expected a model "
                              f"directory or one of {', '.join(preset_names())}") from None


def _not_found(path: str | Path) -> str:
    what = "not a directory" if Path(path).exists() else "checkpoint directory not found"
    return (f"{what}: {path} (expected a model directory such as models/nano-s-b32, "
            f"or a preset: {', '.join(preset_names())})")
