"""scripts/image_reliance.py: the image swap, the blank image and the loss it compares."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from training.data import Example
from wam_diff_core.constants import IMAGE_PAD_TOKEN

_spec = importlib.util.spec_from_file_location("image_reliance", Path(__file__).parents[1] / "scripts" / "image_reliance.py")
image_reliance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(image_reliance)

PROMPT = f"<|im_start|>user\n<|vision_start|>{IMAGE_PAD_TOKEN}<|vision_end|>Where next?<|im_end|>\n<|im_start|>assistant\n"


def _examples(nano, images):
    out = []
    for i, image in enumerate(images):
        enc = nano.processor.encode([PROMPT], [[image]])
        resp = nano.processor.tokenizer(f"{i}.00,0.00,2.10,0.0{i}<|im_end|>", add_special_tokens=False,
                                        return_tensors="pt")["input_ids"][0]
        out.append(Example(f"s{i}", "planning", enc.input_ids[0], enc.mm_token_type_ids[0], resp, enc.pixel_values,
                           enc.image_grid_thw))
    return out


def test_other_images_is_a_derangement_and_checks_grids(nano):
    rng = np.random.default_rng(0)
    examples = _examples(nano, [rng.integers(0, 256, (64, 96, 3), dtype=np.uint8) for _ in range(5)])
    swapped = image_reliance.other_images(examples)
    for i, ex in enumerate(swapped):
        assert torch.equal(ex.prompt_ids, examples[i].prompt_ids)
        assert not torch.equal(ex.pixel_values, examples[i].pixel_values)
        assert torch.equal(ex.pixel_values, examples[(i + 2) % 5].pixel_values)
    odd = _examples(nano, [rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)])
    with pytest.raises(ValueError, match="different image grids"):
        image_reliance.other_images(examples[:1] + odd)
    with pytest.raises(ValueError, match="at least 2"):
        image_reliance.other_images(examples[:1])
    assert float(image_reliance.blank_images(examples)[0].pixel_values.abs().sum()) == 0.0


def test_reliance_is_zero_when_every_image_is_the_same_and_not_otherwise(nano):
    rng = np.random.default_rng(1)
    same = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    row = image_reliance.reliance(nano, _examples(nano, [same] * 3), block_size=4)
    assert row["ce_own"] == pytest.approx(row["ce_other"], abs=1e-6) and row["reliance"] == pytest.approx(0.0, abs=1e-6)
    assert row["own_lower_share"] == 0.0 and row["ce_own"] > 1.0  # a random model: a real loss
    assert row["ce_blank"] != pytest.approx(row["ce_own"], abs=1e-4)  # the blank image does reach the loss
    # different answers: the mean over a derangement differs from the mean over the own images
    varied = image_reliance.reliance(nano, _examples(nano, [rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
                                                           for _ in range(3)]), block_size=4)
    assert varied["ce_other"] != pytest.approx(varied["ce_own"], abs=1e-4)
