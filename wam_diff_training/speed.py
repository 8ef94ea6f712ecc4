"""Seconds per optimizer step of the training objective, by block size and step variant (one process).

The rows are interleaved step by step on the same batches, so a shared, noisy machine slows them alike and
the ratios between them stay meaningful. B = 1 uses the AR layout `[prefix | response]`; B > 1 the diffusion
layout `[prefix | clean | noisy]` (twice the response tokens), distilled from `teacher` at its block size when
one is given.

A variant is `float32` or a `+`-joined set of the step's speed switches (each its own model copy and
optimizer, so every variant keeps its own state): `bf16` (train.cpu_bf16 on the CPU, train.bf16 on CUDA),
`compile` (train.compile), `clean` (distill.ar_teacher_clean_only). The first variant is the reference of the
ratios; a compiled variant's first step (its compilation) is reported apart and never timed as a step.
"""
from __future__ import annotations

import contextlib
import copy
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from wam_diff_core.attention.backends import use_backend
from wam_diff_core.model.checkpoint import load

from .collate import collate
from .compiled import compiled_layers
from .data import build_datasets
from .objective import SelectedLogits, diffusion_loss, distill_loss
from .precision import prepare_models, step_autocast
from .trainer import _load_init, param_groups

SWITCHES = ("bf16", "compile", "clean")


@dataclass(frozen=True)
class Variant:
    name: str
    bf16: bool
    compile: bool
    clean: bool


def parse_variants(text: str) -> list[Variant]:
    """`float32,bf16,bf16+compile+clean` -> Variants; an unknown switch is an error naming it."""
    out = []
    for name in (v.strip() for v in text.split(",")):
        parts = set() if name == "float32" else set(name.split("+"))
        bad = parts - set(SWITCHES)
        if not name or bad:
            raise ValueError(f"variant {name!r}: expected 'float32' or a '+'-joined set of {SWITCHES}, "
                             f"unknown {sorted(bad)}")
        out.append(Variant(name, "bf16" in parts, "compile" in parts, "clean" in parts))
    if len({v.name for v in out}) != len(out):
        raise ValueError(f"variants {text!r}: each at most once")
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(init: str, data: list[dict], block_sizes: list[int], steps: int = 10, warmup: int = 2,
            batch_size: int = 8, backend: str = "sdpa", device: str = "cpu", seed: int = 0,
            max_response_tokens: int = 512, variants: Optional[list[Variant]] = None,
            teacher: Optional[str] = None, teacher_block_size: int = 1) -> dict:
    variants = variants or parse_variants("float32")
    dev = torch.device(device)
    loaded = _load_init(init, seed, dev)
    use_backend(loaded.model, backend)
    t_model = None
    if teacher is not None:
        t_model = load(teacher, device=dev).model.eval().requires_grad_(False)
        use_backend(t_model, backend)
    mask_id = loaded.settings.mask_token_id
    ds = build_datasets(data, loaded.processor, 8192, max_response_tokens, "skip")
    pad = loaded.pad_token_id
    items = [ds[i % len(ds)] for i in range((warmup + steps) * batch_size)]
    times: dict[tuple[str, int], list[float]] = {(v.name, B): [] for v in variants for B in block_sizes}
    first: dict[tuple[str, int], float] = {}
    tokens: dict[int, int] = {}
    with contextlib.ExitStack() as compiled:  # every variant's layers eager again after, even on an error
        runs = []
        for v in variants:  # its own copies: a compiled or patched model never serves another variant
            model = copy.deepcopy(loaded.model).train()
            t_copy = copy.deepcopy(t_model) if t_model is not None else None
            prepare_models(dev, v.bf16, model, t_copy)
            compiled.enter_context(compiled_layers(model, t_copy, enabled=v.compile))
            optimizer = torch.optim.AdamW(param_groups(model, 1e-5, 1e-6, 0.0), lr=1e-5)
            runs.append((v, model, t_copy, SelectedLogits(model), optimizer))
        for i in range(warmup + steps):
            chunk = items[i * batch_size:(i + 1) * batch_size]
            for B in block_sizes:
                batch = collate(chunk, pad, with_noisy=B > 1).to(dev)
                tokens[B] = int(batch.input_ids.numel())
                for v, model, t_copy, module, optimizer in runs:
                    gen = torch.Generator(device=dev).manual_seed(i)
                    t0 = time.perf_counter()
                    with step_autocast(dev, v.bf16, v.bf16):
                        if t_copy is not None and B > 1:
                            out = distill_loss(module, model, t_copy, batch, B, teacher_block_size, mask_id, gen,
                                               ratio=0.5, teacher_clean_only=v.clean)
                        else:
                            out = diffusion_loss(module, model, batch, B, mask_id, gen)
                    out.loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    _sync(device)
                    dt = time.perf_counter() - t0
                    first.setdefault((v.name, B), dt)
                    if i >= warmup:
                        times[(v.name, B)].append(dt)
    rows = []
    for B in block_sizes:
        ref = statistics.median(times[(variants[0].name, B)])
        for v in variants:
            med = statistics.median(times[(v.name, B)])
            rows.append({"block_size": B, "variant": v.name, "objective": "distill" if t_model is not None and B > 1
                         else "diffusion" if B > 1 else "ar", "sec_per_step_median": med,
                         "sec_per_step_min": min(times[(v.name, B)]), "first_step_s": first[(v.name, B)],
                         "speedup_vs_first_variant": ref / med, "padded_tokens_per_step": tokens[B]})
    return {"init": init, "teacher": teacher, "teacher_block_size": teacher_block_size if teacher else None,
            "batch_size": batch_size, "steps": steps, "warmup": warmup, "threads": torch.get_num_threads(),
            "device": device, "params": loaded.num_params, "variants": [v.name for v in variants], "rows": rows}


def print_table(result: dict) -> None:
    print(f"{'B':>4} {'objective':>9} {'variant':>22} {'s/step (median)':>16} {'s/step (min)':>13} {'1st step s':>11} "
          f"{'speed-up':>9} {'tokens/step':>12}")
    for r in result["rows"]:
        print(f"{r['block_size']:>4} {r['objective']:>9} {r['variant']:>22} {r['sec_per_step_median']:>16.3f} "
              f"{r['sec_per_step_min']:>13.3f} {r['first_step_s']:>11.2f} {r['speedup_vs_first_variant']:>8.2f}x "
              f"{r['padded_tokens_per_step']:>12}")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    data = [{"path": p} for p in args.data]
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        print(f"wam-diff-train speed: {e}")
        return 2
    result = measure(args.init, data, [int(b) for b in args.block_sizes.split(",")], args.steps, args.warmup,
                     args.batch_size, device=args.device, variants=variants, teacher=args.teacher,
                     teacher_block_size=args.teacher_block_size)
    print_table(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
