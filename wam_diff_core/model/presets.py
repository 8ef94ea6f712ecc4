"""Model architectures built from configs, no download.

`nano` is the project's own small Qwen3-VL (about 5 M parameters, its own BPE tokenizer) for tests,
CPU demos and training on a laptop; `nano-l` (about 20 M) is its teacher for cross-scale distillation; `qwen3-vl-2b` / `qwen3-vl-8b` are the real architectures with the
real vocabulary size (random weights) for speed measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import Qwen3VLConfig

from ..errors import WamDiffError

# Qwen3-VL's own special-token ids in its 151,936-token vocabulary.
QWEN_SPECIAL_IDS = {
    "pad_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "image_token_id": 151655,
    "video_token_id": 151656,
}
QWEN_VOCAB_SIZE = 151936


class PresetError(WamDiffError, ValueError):
    """A model preset name that is not one of `PRESETS`."""


@dataclass(frozen=True)
class TextArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    tie_word_embeddings: bool
    max_position_embeddings: int


@dataclass(frozen=True)
class VisionArch:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2


@dataclass(frozen=True)
class Preset:
    name: str
    text: TextArch
    vision: VisionArch
    own_tokenizer: bool  # True: the project's BPE tokenizer (nano); False: the Qwen vocabulary size


NANO_VOCAB_SIZE = 1024

PRESETS: dict[str, Preset] = {
    "nano": Preset(
        name="nano",
        text=TextArch(NANO_VOCAB_SIZE, 256, 768, 4, 4, 2, 64, 5e5, (12, 10, 10), True, 4096),
        vision=VisionArch(2, 128, 256, 4, 256, 256, (0, 1)),
        own_tokenizer=True,
    ),
    # The larger sibling for cross-scale distillation (about 20 M parameters); same tokenizer as nano.
    "nano-l": Preset(
        name="nano-l",
        text=TextArch(NANO_VOCAB_SIZE, 512, 1536, 6, 8, 4, 64, 5e5, (12, 10, 10), True, 4096),
        vision=VisionArch(2, 192, 384, 4, 512, 256, (0, 1)),
        own_tokenizer=True,
    ),
    "qwen3-vl-2b": Preset(
        name="qwen3-vl-2b",
        text=TextArch(QWEN_VOCAB_SIZE, 2048, 6144, 28, 16, 8, 128, 5e6, (24, 20, 20), True, 262144),
        vision=VisionArch(24, 1024, 4096, 16, 2048, 2304, (5, 11, 17)),
        own_tokenizer=False,
    ),
    "qwen3-vl-8b": Preset(
        name="qwen3-vl-8b",
        text=TextArch(QWEN_VOCAB_SIZE, 4096, 12288, 36, 32, 8, 128, 5e6, (24, 20, 20), False, 262144),
        vision=VisionArch(27, 1152, 4304, 16, 4096, 2304, (8, 16, 24)),
        own_tokenizer=False,
    ),
}


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise PresetError(f"unknown model preset {name!r}; expected one of {', '.join(preset_names())}")
    return PRESETS[name]


def build_config(preset: Preset, special_ids: dict[str, int]) -> Qwen3VLConfig:
    """Qwen3VLConfig for a preset; `special_ids` maps pad/eos/vision/image/video token ids."""
    t, v = preset.text, preset.vision
    if sum(t.mrope_section) * 2 != t.head_dim:
        raise ValueError(f"mrope_section {t.mrope_section} must sum to head_dim / 2 = {t.head_dim // 2}")
    text_config = dict(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_parameters=dict(
            rope_type="default", rope_theta=t.rope_theta, mrope_section=list(t.mrope_section), mrope_interleaved=True
        ),
        tie_word_embeddings=t.tie_word_embeddings,
        pad_token_id=special_ids["pad_token_id"],
        eos_token_id=special_ids["eos_token_id"],
    )
    vision_config = dict(
        depth=v.depth,
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_heads=v.num_heads,
        out_hidden_size=v.out_hidden_size,
        num_position_embeddings=v.num_position_embeddings,
        deepstack_visual_indexes=list(v.deepstack_visual_indexes),
        patch_size=v.patch_size,
        spatial_merge_size=v.spatial_merge_size,
        temporal_patch_size=v.temporal_patch_size,
    )
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=special_ids["image_token_id"],
        video_token_id=special_ids["video_token_id"],
        vision_start_token_id=special_ids["vision_start_token_id"],
        vision_end_token_id=special_ids["vision_end_token_id"],
        tie_word_embeddings=t.tie_word_embeddings,
    )
