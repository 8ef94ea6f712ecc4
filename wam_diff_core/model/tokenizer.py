"""The nano preset's own tokenizer and processor, trained locally with `tokenizers` (no download).

A byte-level BPE over driving text whose pre-tokenizer splits every digit on its own (as Qwen does),
so trajectories and boxes tokenize uniformly. Saved in Hugging Face format so nano and real
checkpoints load through the same code.
"""
from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..codec import format_detections, format_trajectory
from ..constants import (
    EOS_TOKEN,
    IM_START_TOKEN,
    IMAGE_PAD_TOKEN,
    MASK_TOKEN,
    NAV_COMMANDS,
    NUM_WAYPOINTS,
    PAD_TOKEN,
    VIDEO_PAD_TOKEN,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
)
from ..prompts import chat_prompt, detection_prompt, planning_prompt, qa_prompt
from ..types import Detection, EgoState

# Order fixes the ids 0..7 of the nano vocabulary.
SPECIAL_TOKENS = (
    PAD_TOKEN,
    IM_START_TOKEN,
    EOS_TOKEN,
    VISION_START_TOKEN,
    VISION_END_TOKEN,
    IMAGE_PAD_TOKEN,
    VIDEO_PAD_TOKEN,
    MASK_TOKEN,
)

# Image processor settings of the nano preset: patch 16, merge 2 (a 224x224 image -> 49 tokens);
# the pixel budget keeps CPU prefill short.
NANO_MIN_PIXELS = 32 * 32
NANO_MAX_PIXELS = 256 * 256

_QA_WORDS = (
    "How many vehicles are ahead in my lane? What is the distance to the lead vehicle in metres? "
    "Is the left lane free? Is the right lane free? What should I do next? Should I brake? "
    "keep lane, slow down, accelerate, stop, yield, merge, overtake, turn, roundabout, intersection, "
    "highway, pedestrian, truck, bus, bicycle, traffic light, red, green, yes, no, none, one, two, three"
)


def _corpus(num_samples: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = [_QA_WORDS]
    for _ in range(num_samples):
        ego = EgoState(vx=rng.uniform(0, 35), vy=rng.uniform(-1, 1), ax=rng.uniform(-6, 3), ay=rng.uniform(-2, 2))
        traj = np.cumsum(np.array([[rng.uniform(0, 18), rng.uniform(-1.5, 1.5)] for _ in range(NUM_WAYPOINTS)]), 0)
        boxes = []
        for _ in range(rng.randint(0, 4)):
            x1, y1 = rng.randint(0, 900), rng.randint(0, 900)
            norm = (x1, y1, x1 + rng.randint(5, 99), y1 + rng.randint(5, 99))
            boxes.append(Detection("car", norm, norm))
        texts.append(chat_prompt(planning_prompt(ego, rng.choice(NAV_COMMANDS)), 1) + format_trajectory(traj) + EOS_TOKEN)
        texts.append(chat_prompt(detection_prompt(), 1) + format_detections(boxes) + EOS_TOKEN)
        texts.append(chat_prompt(qa_prompt("What is the distance to the lead vehicle?"), 1) + f"{rng.uniform(0, 80):.1f} m")
    return texts


@lru_cache(maxsize=4)
def _trained_bpe_json(vocab_size: int, seed: int, num_samples: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(num_samples, seed), trainer=trainer)
    return tok.to_str()


def train_nano_tokenizer(vocab_size: int, seed: int = 0, num_samples: int = 400) -> PreTrainedTokenizerFast:
    """Train the nano BPE tokenizer deterministically; `vocab_size` includes the special tokens.
    (Training runs once per process; later calls rebuild from the cached result.)"""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe_json(vocab_size, seed, num_samples)),
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD_TOKEN, EOS_TOKEN)],
        model_max_length=4096,
        padding_side="left",
    )
    return fast


def nano_image_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=NANO_MIN_PIXELS, max_pixels=NANO_MAX_PIXELS
    )

