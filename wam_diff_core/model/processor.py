"""Text + image preprocessing for Qwen3-VL checkpoints: a tokenizer and a Qwen2-VL image processor.

transformers' Qwen3VLProcessor insists on a video processor that needs torchvision; this project only
feeds images, so it pairs the checkpoint's tokenizer with the PIL image processor itself and expands
each `<|image_pad|>` to the image's token count exactly as Qwen3VLProcessor does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..constants import IMAGE_PAD_TOKEN, MASK_TOKEN

IMAGE_PROCESSOR_FILE = "preprocessor_config.json"  # the image processor's own file (transformers 4.5x, this project)
PROCESSOR_FILE = "processor_config.json"  # transformers 5: the image processor is its "image_processor" section


@dataclass
class PromptBatch:
    """Left-padded prompts. input_ids/attention_mask/mm_token_type_ids: (batch, L);
    pixel_values: (num_patches, patch_dim) or None; image_grid_thw: (num_images, 3) or None."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: Optional[torch.Tensor]
    image_grid_thw: Optional[torch.Tensor]

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "PromptBatch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return PromptBatch(*(move(t) for t in (self.input_ids, self.attention_mask, self.mm_token_type_ids,
                                               self.pixel_values, self.image_grid_thw)))


def check_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    """Validate one camera image: HxWx3 uint8 RGB, non-empty. Raises ValueError naming what is wrong."""
    if not isinstance(image, np.ndarray):
        raise ValueError(f"{name} must be a numpy array (H, W, 3) uint8, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ValueError(f"{name} must have dtype uint8, got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"{name} must have shape (H, W, 3), got {image.shape}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {image.shape}")
    return image


class VLProcessor:
    """Tokenizer + image processor of one checkpoint."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, image_processor: Qwen2VLImageProcessorPil):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.tokenizer.padding_side = "left"
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
        if MASK_TOKEN not in tokenizer.get_vocab():
            # A stock Qwen3-VL tokenizer has no mask token: add it as a special token; its id is a spare
            # embedding row of the model (Qwen's embedding matrix is larger than its vocabulary).
            tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
        self.mask_token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)

    @property
    def merge_size(self) -> int:
        return int(self.image_processor.merge_size)

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(str(path))
        self.image_processor.save_pretrained(str(path))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "VLProcessor":
        path = Path(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        # reads processor_config.json's "image_processor" section when there is one, else preprocessor_config.json
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
        return cls(tokenizer, image_processor)

    def encode(self, prompts: Sequence[str], images: Sequence[Sequence[np.ndarray]] | None = None) -> PromptBatch:
        """Tokenize chat-form prompts (each `<|image_pad|>` stands for one image of that prompt)."""
        images = images if images is not None else [[] for _ in prompts]
        if len(images) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(images)} image lists")
        flat = []
        for i, (text, imgs) in enumerate(zip(prompts, images)):
            n_pads = text.count(IMAGE_PAD_TOKEN)
            if n_pads != len(imgs):
                raise ValueError(f"prompt {i} has {n_pads} {IMAGE_PAD_TOKEN} markers but {len(imgs)} images")
            flat.extend(check_image(img, f"prompt {i} image {j}") for j, img in enumerate(imgs))
        pixel_values = grid = None
        if flat:
            out = self.image_processor(images=flat, return_tensors="pt")
            pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
            counts = (grid.prod(-1) // self.merge_size**2).tolist()
        texts, k = [], 0
        placeholder = "\x00"
        for text in prompts:
            parts = text.split(IMAGE_PAD_TOKEN)
            expanded = parts[0]
            for part in parts[1:]:
                expanded += placeholder * counts[k] + part
                k += 1
            texts.append(expanded.replace(placeholder, IMAGE_PAD_TOKEN))
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        input_ids = enc["input_ids"]
        attention_mask = enc["attention_mask"].bool()
        mm = (input_ids == self.image_token_id).to(torch.int32)
        return PromptBatch(input_ids, attention_mask, mm, pixel_values, grid)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
