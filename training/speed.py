"""Seconds per optimizer step of the training objective at several block sizes (one process).

The block sizes are interleaved step by step on the same batches, so a shared, noisy machine slows
them alike and the ratio between them stays meaningful. B = 1 uses the AR layout `[prefix | response]`;
B > 1 the diffusion layout `[prefix | clean | noisy]` (twice the response tokens).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from wam_diff_core.attention.backends import use_backend

from .collate import collate
from .data import build_datasets
from .objective import SelectedLogits, diffusion_loss
from .trainer import _load_init, param_groups


def measure(init: str, data: list[dict], block_sizes: list[int], steps: int = 10, warmup: int = 2,
            batch_size: int = 8, backend: str = "sdpa", device: str = "cpu", seed: int = 0,
            max_response_tokens: int = 512) -> dict:
    loaded = _load_init(init, seed, torch.device(device))
    model = loaded.model.train()
    use_backend(model, backend)
    ds = build_datasets(data, loaded.processor, 8192, max_response_tokens, "skip")
    pad = loaded.pad_token_id
    optimizer = torch.optim.AdamW(param_groups(model, 1e-5, 1e-6, 0.0), lr=1e-5)
    module = SelectedLogits(model)
    items = [ds[i % len(ds)] for i in range((warmup + steps) * batch_size)]
    times: dict[int, list[float]] = {B: [] for B in block_sizes}
    tokens: dict[int, int] = {}
    for i in range(warmup + steps):
        chunk = items[i * batch_size:(i + 1) * batch_size]
        for B in block_sizes:
            batch = collate(chunk, pad, with_noisy=B > 1).to(device)
            tokens[B] = int(batch.input_ids.numel())
            t0 = time.perf_counter()
            out = diffusion_loss(module, model, batch, B, loaded.settings.mask_token_id,
                                 torch.Generator(device=device).manual_seed(i))
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if torch.cuda.is_available() and device.startswith("cuda"):
                torch.cuda.synchronize()
            if i >= warmup:
                times[B].append(time.perf_counter() - t0)
    rows = [{"block_size": B, "sec_per_step_median": statistics.median(times[B]), "sec_per_step_min": min(times[B]),
             "padded_tokens_per_step": tokens[B]} for B in block_sizes]
    return {"init": init, "batch_size": batch_size, "steps": steps, "threads": torch.get_num_threads(),
            "params": loaded.num_params, "rows": rows}


def print_table(result: dict) -> None:
    print(f"{'B':>4} {'s/step (median)':>16} {'s/step (min)':>13} {'tokens/step':>12}")
    for r in result["rows"]:
        print(f"{r['block_size']:>4} {r['sec_per_step_median']:>16.3f} {r['sec_per_step_min']:>13.3f} "
              f"{r['padded_tokens_per_step']:>12}")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    data = [{"path": p} for p in args.data]
    result = measure(args.init, data, [int(b) for b in args.block_sizes.split(",")], args.steps, args.warmup,
                     args.batch_size, device=args.device)
    print_table(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
