"""Validation after a stage: decode the split with the core block decoder, score against the targets.

Metrics: token accuracy (share of target tokens, EOS included, reproduced at their position), exact
match share, planning L2 (metres, over planning samples whose output parses), parse failures, and
decode speed (tokens/s, forwards per token) at the stage's block size.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from wam_diff_core.codec import ParseError, parse_trajectory
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig, step_count
from wam_diff_core.decoding.constraint import planning_constraint
from wam_diff_core.eval.l2 import l2_report
from wam_diff_core.model.checkpoint import pad_token_id
from wam_diff_core.model.processor import PromptBatch
from wam_diff_core.model.runner import ModelRunner

from .data import Example


def prompt_batch(examples: Sequence[Example], pad_id: int) -> PromptBatch:
    """Left-padded prompts of encoded examples (the decoder's input form)."""
    width = max(len(x.prompt_ids) for x in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.bool)
    mm = torch.zeros((len(examples), width), dtype=torch.int32)
    for i, x in enumerate(examples):
        n = len(x.prompt_ids)
        ids[i, width - n:] = x.prompt_ids
        attn[i, width - n:] = True
        mm[i, width - n:] = x.mm_token_type_ids
    pix = [x.pixel_values for x in examples if x.pixel_values is not None]
    grids = [x.image_grid_thw for x in examples if x.image_grid_thw is not None]
    return PromptBatch(ids, attn, mm, torch.cat(pix) if pix else None, torch.cat(grids) if grids else None)


def decoder_config(block_size: int, steps: Optional[int], strategy: str, threshold: float, max_new_tokens: int,
                   backend: str = "sdpa", number_order: bool = True, kinematic_envelope: bool = True,
                   forward_only: bool = False) -> DecoderConfig:
    """B = 1 decodes one token per forward; otherwise `steps` denoising steps per block (None: one per token)."""
    return DecoderConfig(block_size=block_size, steps=step_count(block_size, steps or block_size), strategy=strategy,
                         threshold=threshold, max_new_tokens=max_new_tokens, backend=backend,
                         number_order=number_order, kinematic_envelope=kinematic_envelope, forward_only=forward_only)


def evaluate(model, processor, settings, examples: Sequence[Example], block_size: int, steps: Optional[int] = None,
             strategy: str = "low_confidence_static", threshold: float = 0.9, max_new_tokens: int = 128,
             batch_size: int = 8, backend: str = "sdpa") -> dict:
    """Decode every example's prompt and compare with its response. Returns a JSON-ready dict."""
    was_training = model.training
    runner = ModelRunner(model, backend)
    device = runner.device
    eos = settings.eos_token_id
    cfg = decoder_config(block_size, steps, strategy, threshold, max_new_tokens, backend)
    pad_id = pad_token_id(processor, settings)
    correct = total = exact = produced = 0
    fpt_sum = 0.0
    seconds = 0.0
    preds, gts, parse_failures, planning = [], [], 0, 0
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start:start + batch_size])
        batch = prompt_batch(chunk, pad_id).to(device)
        t0 = time.perf_counter()
        grammar = planning_constraint(processor.tokenizer, settings, [x.task for x in chunk],
                                      cfg.answer_positions, runner.vocab_size, device,
                                      [x.ego for x in chunk] if cfg.kinematic_envelope else None, cfg.forward_only)
        res = generate(runner, batch, cfg, settings.mask_token_id, eos, grammar)
        seconds += time.perf_counter() - t0
        produced += res.tokens
        fpt_sum += res.forwards_per_token * len(chunk)
        for x, answer, finished in zip(chunk, res.token_ids, res.finished):
            target = x.response_ids.tolist()
            got = answer + ([eos] if finished else [])
            hits = sum(int(a == b) for a, b in zip(got, target))
            correct += hits
            total += len(target)
            exact += int(got == target)
            if x.task == "planning":
                planning += 1
                text = processor.decode(answer)
                pred, gt = parse_trajectory(text), parse_trajectory(processor.decode(target[:-1]))
                if isinstance(pred, ParseError) or isinstance(gt, ParseError):
                    parse_failures += 1
                else:
                    preds.append(pred)
                    gts.append(gt)
    if was_training:
        model.train()
    out = {
        "block_size": block_size,
        "steps": cfg.steps,
        "strategy": cfg.strategy,
        "samples": len(examples),
        "token_accuracy": correct / max(1, total),
        "exact_match": exact / max(1, len(examples)),
        "tokens_per_s": produced / max(1e-9, seconds),
        "forwards_per_token": fpt_sum / max(1, len(examples)),
        "decode_seconds": seconds,
        "planning_samples": planning,
        "planning_parse_failures": parse_failures,
    }
    if preds:
        out["planning_l2"] = l2_report(np.stack(preds), np.stack(gts))
    return out


def write_eval(path: Path, metrics: dict) -> None:
    Path(path).write_text(json.dumps(metrics, indent=2))
