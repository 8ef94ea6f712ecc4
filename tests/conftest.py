"""Shared fixtures: one nano model for the whole session (its tokenizer takes seconds to train)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from wam_diff_core.model.checkpoint import build_preset

torch.set_num_threads(2)


def diversify(model, std: float = 0.2, seed: int = 0) -> None:
    """Random init with a larger spread, so a random model's greedy outputs vary token to token
    (the default 0.02 init collapses to one repeated token, which would make decoding tests weak)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


@pytest.fixture(scope="session")
def nano():
    loaded = build_preset("nano", seed=0)
    diversify(loaded.model)
    return loaded


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread for a module that asks for it: on a shared 2-core machine, spinning worker threads make
    nano ~10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def nano_ckpt(nano, tmp_path_factory):
    """A freshly initialised nano model (default init, not the decoding tests' wide one), saved once."""
    from transformers import Qwen3VLForConditionalGeneration

    from wam_diff_core.model.checkpoint import LoadedModel, save_model

    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration._from_config(nano.model.config)
    path = tmp_path_factory.mktemp("nano") / "init"
    save_model(LoadedModel(model.eval(), nano.processor, nano.settings, "nano"), path)
    return path


@pytest.fixture(scope="session")
def camera_image():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (128, 256, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def two_prompts():
    """(chat prompt, image count): a planning prompt with one camera image and a QA prompt with none, so
    batched together the second is left-padded."""
    from wam_diff_core.prompts import chat_prompt, planning_prompt, qa_prompt
    from wam_diff_core.types import EgoState

    return [(chat_prompt(planning_prompt(EgoState(vx=6.5, ax=0.3), "turn left"), 1), 1),
            (chat_prompt(qa_prompt("Is the left lane free?"), 0), 0)]


@pytest.fixture(scope="session")
def encode_prompts(nano, camera_image):
    """Encode [(chat prompt, image count)] with nano's processor (each image the shared camera image)."""
    return lambda items: nano.processor.encode([p for p, _ in items], [[camera_image] * n for _, n in items])


@pytest.fixture(scope="module")
def nano_runner(nano):
    """An SDPA ModelRunner over the shared nano model."""
    from wam_diff_core.model.runner import ModelRunner

    return ModelRunner(nano.model, "sdpa")
