"""`wam-diff bench`: decode speed of AR (B = 1) against block diffusion, configurations interleaved.

Fixed steps with `low_confidence_static` remasking (random weights would make dynamic remasking
commit one token per step), EOS ignored, so every configuration decodes the same number of tokens.
Each round decodes once with every configuration (order rotated or shuffled per round, `interleave`);
a configuration's speed-up is the median over rounds of its tokens/s over the AR row's in the same round,
with the spread of those ratios. Prints a table and writes JSON with the machine and its load. On CUDA it
also reports achieved memory bandwidth against the device's peak (weights + KV cache read per forward),
the gpt-fast habit.
"""
from __future__ import annotations

import json
import resource
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..constants import ATTENTION_BACKENDS, SHIPPED_MODEL, TEXT_LAYERS
from ..decoding.ar import generate_ar
from ..decoding.block_diffusion import generate
from ..decoding.config import DecoderConfig
from ..errors import UsageError
from ..model.checkpoint import load
from ..model.kv_cache import cache_geometry
from ..model.processor import PromptBatch
from ..model.runner import ModelRunner
from ..prompts import chat_prompt, planning_prompt
from ..types import EgoState
from .interleave import ORDERS, interleaved, round_ratios, spread
from .machine import describe, load_average, load_text, machine

# Peak HBM bandwidth (GB/s) of devices we know, matched by substring of the CUDA device name.
PEAK_BANDWIDTH_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100": 2000.0, "A100": 2039.0, "L40S": 864.0, "4090": 1008.0}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=SHIPPED_MODEL,
                        help="the shipped model (default), a preset name or a local checkpoint directory")
    parser.add_argument("--block-sizes", default="1,4,8,16,32")
    parser.add_argument("--steps", default="4,8,16,32", help="denoising steps K per block")
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16", "float16"])
    parser.add_argument("--backend", default="sdpa", choices=ATTENTION_BACKENDS)
    parser.add_argument("--cuda-graphs", default="off", choices=["on", "off"])
    parser.add_argument("--text-layers", default="model", choices=TEXT_LAYERS,
                        help="B > 1 rows: the model's text layers, or wam_diff_kernels.fast_layers' (plain or compiled)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt length for models without a tokenizer")
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds; each decodes once with every configuration (after one warm-up round)")
    parser.add_argument("--order", default="rotate", choices=ORDERS,
                        help="order within a round: rotated by one per round, or shuffled with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of --order shuffle")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    parser.add_argument("--out", default="runs/bench.json")


def benchmark_prompts(loaded, batch_size: int, prompt_len: int, device) -> PromptBatch:
    """The benchmark's prompts: a planning prompt with one 224x224 image, or random ids for models without a tokenizer."""
    if loaded.processor is not None:
        image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        text = chat_prompt(planning_prompt(EgoState(vx=8.0, ax=0.2), "follow lane"), 1)
        return loaded.processor.encode([text] * batch_size, [[image]] * batch_size).to(device)
    vocab = min(loaded.model.config.text_config.vocab_size, 150000)
    ids = torch.randint(0, vocab, (batch_size, prompt_len), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(ids, dtype=torch.bool)
    return PromptBatch(ids, ones, torch.zeros_like(ids, dtype=torch.int32), None, None).to(device)


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (KiB on Linux)


def bytes_per_forward(model, cache_tokens: float, batch: int) -> float:
    """Bytes a decode forward must read at least: text weights once, plus the KV cache of the batch."""
    params = [p for n, p in model.named_parameters() if "visual" not in n]
    weights = sum(p.numel() * p.element_size() for p in params)
    layers, kv_heads, head_dim = cache_geometry(model)
    return weights + 2 * layers * kv_heads * head_dim * cache_tokens * batch * params[0].element_size()


def decode_once(runner, loaded, batch: PromptBatch, block_size: int, steps: int, args, fuse: bool = True) -> dict:
    """One decode of `batch` at (B, K): decode-phase seconds (denoising + commits; vision and prefill apart),
    tokens, forwards (the prefill's not counted) and the phase times."""
    settings = loaded.settings
    if block_size == 1:
        res = generate_ar(runner, batch, args.new_tokens, settings.eos_token_id, ignore_eos=True,
                          mask_id=settings.mask_token_id)
    else:
        cfg = DecoderConfig(block_size=block_size, steps=steps, strategy="low_confidence_static",
                            max_new_tokens=args.new_tokens, ignore_eos=True, fuse_commit=fuse, backend=args.backend,
                            cuda_graphs=args.cuda_graphs == "on" and fuse,
                            text_layers=args.text_layers if fuse else "model")
        res = generate(runner, batch, cfg, settings.mask_token_id, settings.eos_token_id)
    seconds = res.timings["denoise"] + res.timings["commit"]
    return {"seconds": seconds, "tokens": res.tokens, "tokens_per_s": res.tokens / seconds,
            "forwards": res.forwards - 1, "prefill_s": res.timings["prefill"], "vision_s": res.timings["vision"],
            "total_s": res.timings["total"]}


def configurations(batch_sizes: list[int], block_sizes: list[int], steps_list: list[int]) -> list[tuple[int, int, int]]:
    """(batch, B, K) per row: AR (B = K = 1) first for every batch size, then each B > 1 at each K <= B."""
    return [(bs, 1, 1) for bs in batch_sizes] + [
        (bs, B, K) for bs in batch_sizes for B in block_sizes if B > 1 for K in steps_list if K <= B]


def _row(config: tuple[int, int, int], got: list[dict], ratios: list[float], batch_tokens: int) -> dict:
    bs, B, K = config
    seconds = spread([g["seconds"] for g in got])
    tokens_per_sample = got[0]["tokens"] / bs
    return {"block_size": B, "steps": K, "batch_size": bs, "tokens": got[0]["tokens"],
            "tokens_per_s": float(np.median([g["tokens_per_s"] for g in got])),
            "ms_per_token": 1000.0 * seconds["median"] / tokens_per_sample,
            "forwards": got[0]["forwards"], "forwards_per_token": got[0]["forwards"] / tokens_per_sample,
            "prefill_ms": 1000.0 * float(np.median([g["prefill_s"] for g in got])),
            "vision_ms": 1000.0 * float(np.median([g["vision_s"] for g in got])),
            "decode_s": seconds, "speedup_vs_ar": float(np.median(ratios)), "speedup_spread": spread(ratios),
            "prompt_tokens": batch_tokens}


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: expected at least 1 round")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    loaded = load(args.model, device=device, dtype=dtype)
    runner = ModelRunner(loaded.model, args.backend)
    configs = configurations(_int_list(args.batch_sizes), _int_list(args.block_sizes), _int_list(args.steps))
    batches = {bs: benchmark_prompts(loaded, bs, args.prompt_len, device) for bs, _, _ in configs}
    timers = [lambda r, c=c: decode_once(runner, loaded, batches[c[0]], c[1], c[2], args) for c in configs]
    load_before = load_average()
    for timer in tqdm(timers, desc="warm-up", unit="config", leave=False):
        timer(-1)
    bar = tqdm(total=args.repeats, desc="bench", unit="round")
    load_rounds = []
    rounds = interleaved(timers, args.repeats, args.order, args.seed,
                         on_round=lambda r: (bar.update(), load_rounds.append((load_average() or [None])[0])))
    bar.close()
    load_after = load_average()
    result = _result(args, loaded, configs, rounds, runner, batches, device, dtype)
    result.update({"load_before": load_before, "load_after": load_after, "load_1min_per_round": load_rounds})
    print(format_table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


def _result(args, loaded, configs, rounds, runner, batches, device, dtype) -> dict:
    refs = [configs.index((bs, 1, 1)) for bs, _, _ in configs]  # each row's AR row (same batch size)
    peak_bw = next((v for k, v in PEAK_BANDWIDTH_GBPS.items()
                    if device.type == "cuda" and k in torch.cuda.get_device_name(device)), None)
    rows = []
    for i, config in enumerate(configs):
        bs, B, K = config
        ratios = round_ratios(rounds, "tokens_per_s", reference=refs[i])[i]
        row = _row(config, [got[i] for got in rounds], ratios, int(batches[bs].input_ids.shape[1]))
        # forwards are deterministic: one unfused decode gives the commit-forward count
        row["forwards_per_token_unfused"] = row["forwards_per_token"] if B == 1 else (
            decode_once(runner, loaded, batches[bs], B, K, args, fuse=False)["forwards"] / (row["tokens"] / bs))
        row["peak_mem_mb"] = _peak_mem_mb(device)
        if device.type == "cuda":
            cache_tokens = row["prompt_tokens"] + args.new_tokens // 2
            gbps = bytes_per_forward(loaded.model, cache_tokens, bs) * row["forwards"] / row["decode_s"]["median"] / 1e9
            row["achieved_gbps"] = gbps
            row["bandwidth_util"] = gbps / peak_bw if peak_bw else None
        rows.append(row)
    return {
        "model": args.model, "params": loaded.num_params, "machine": machine(device),
        "device": str(device), "dtype": str(dtype).replace("torch.", ""), "backend": args.backend,
        "cuda_graphs": args.cuda_graphs, "text_layers": args.text_layers, "new_tokens": args.new_tokens,
        "strategy": "low_confidence_static",
        "timing": (f"decode phase only (prefill and vision apart); {args.repeats} rounds after a warm-up round, "
                   f"each decoding once with every configuration ({args.order} order); speed-up: median over rounds "
                   f"of the per-round tokens/s ratio to the AR row of the same batch size"),
        "rounds": args.repeats, "order": args.order, "seed": args.seed, "peak_bandwidth_gbps": peak_bw, "rows": rows,
    }


def format_table(result: dict) -> str:
    head = (f"{result['model']} ({result['params'] / 1e6:.1f} M params) on {result['device']}, {result['dtype']}, "
            f"{result['new_tokens']} new tokens, {result['rounds']} interleaved rounds\n{describe(result['machine'])}")
    if "load_before" in result:
        head += f"; {load_text(result['load_before'], result['load_after'])}"
    cols = ["batch", "B", "K", "tok/s", "ms/tok", "fwd/tok", "unfused", "speedup", "min-max", "IQR", "peak MB"]
    lines = [head, " | ".join(f"{c:>8}" for c in cols)]
    for r in result["rows"]:
        s = r["speedup_spread"]
        vals = [r["batch_size"], r["block_size"], r["steps"], f"{r['tokens_per_s']:.1f}", f"{r['ms_per_token']:.2f}",
                f"{r['forwards_per_token']:.3f}", f"{r['forwards_per_token_unfused']:.3f}", f"{r['speedup_vs_ar']:.2f}x",
                f"{s['min']:.2f}-{s['max']:.2f}", f"{s['iqr']:.2f}", f"{r['peak_mem_mb']:.0f}"]
        if "achieved_gbps" in r:
            vals.append(f"{r['achieved_gbps']:.0f} GB/s")
        lines.append(" | ".join(f"{v:>8}" for v in vals))
    return "\n".join(lines)
