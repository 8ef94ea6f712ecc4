"""Teacher-forced agreement of the capture-ready decoder's variants with a float32 reference.

    python -m wam_diff_kernels.teacher_forced --model models/nano-s-b32 --device cuda --variants sdpa,flashinfer,compiled

Greedy tokens of two decodes are a poor correctness check when a model's logits are near ties (random
weights): one flipped argmax changes the context of every later step, and the decodes part for good.
On an H200 (results/kernels/h200/) the random nano's bf16 decode agreed with SDPA's on 17-27 % of its
tokens both with FlashInfer attention and with torch.compiled layers (same attention), so token
agreement there could not tell a wrong kernel from rounding.

Here every variant follows the reference's trajectory: at each denoising step the variant's own logits
are recorded, but the block it continues from is the one the reference committed (the remasking step
is replaced by a replay of the reference's). Per variant, over the positions still masked at each step
(the ones whose argmax decides a commit):
- top-1 agreement with the float32 reference;
- the reference's top-1/top-2 logit margin at the positions where they disagree (rounding flips only
  near-ties; a wrong kernel flips decisive ones);
- max |logit - reference| relative to the reference's max |logit|.
A variant is run eagerly (the replay is Python); whether a CUDA graph replays the eager block exactly
is checked by tests/test_kernels_gpu.py.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from wam_diff_core.attention.backends import use_backend
from wam_diff_core.bench import benchmark_prompts
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.checkpoint import load
from wam_diff_core.model.processor import PromptBatch
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.prompts import chat_prompt, planning_prompt, qa_prompt
from wam_diff_core.types import EgoState

from . import graph_runner as graph_runner_module
from .graph_runner import GraphRunner
from .ladder import add_model_arguments, diversify, positive_ints, subset_of, token_agreement, write_json
from .remask_ops import remask_step

# variant -> (attention, fast layers, compiled layers, FlashInfer plans made in CUDA-graph mode)
VARIANTS = {
    "sdpa": ("sdpa", False, False, False),
    "fast": ("sdpa", True, False, False),
    "compiled": ("sdpa", True, True, False),
    "flashinfer": ("flashinfer", False, False, False),
    "flashinfer_graph_plan": ("flashinfer", False, False, True),
    "flashinfer_fast": ("flashinfer", True, False, False),
}
NANO_DIVERSIFY_STD = 0.2  # the ladder's re-draw of the random nano preset


@dataclass
class StepLog:
    """What one denoising step saw and did: logits (batch, B, vocab) as float32, masked before the step,
    and the block after it."""

    logits: list[torch.Tensor] = field(default_factory=list)
    masked: list[torch.Tensor] = field(default_factory=list)
    after: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@contextlib.contextmanager
def recording(log: StepLog, replay: Optional[StepLog] = None) -> Iterator[None]:
    """Patch the capture-ready decoder's remasking step: record every step's logits; with `replay`,
    continue from the replayed run's block instead of this run's own commit."""
    original = graph_runner_module.remask_step

    def step(logits, x, masked, *args, **kwargs):
        i = len(log.logits)
        log.logits.append(logits.float().clone())
        log.masked.append(masked.clone())
        if replay is None:
            out = remask_step(logits, x, masked, *args, **kwargs)
        else:
            if i >= len(replay.after):
                raise RuntimeError(f"step {i} has no reference step to follow ({len(replay.after)} recorded)")
            out = tuple(t.clone() for t in replay.after[i])
        log.after.append(tuple(t.clone() for t in out))
        return out

    graph_runner_module.remask_step = step
    try:
        yield
    finally:
        graph_runner_module.remask_step = original


def compare(ref: StepLog, var: StepLog) -> dict:
    """Agreement of a variant's logits with the reference's over the positions masked at each step."""
    if len(ref.logits) != len(var.logits):
        raise ValueError(f"the variant ran {len(var.logits)} steps, the reference {len(ref.logits)}")
    agree = total = 0
    flip_margins: list[float] = []
    margins: list[torch.Tensor] = []
    rel_err = 0.0
    for r, v, m in zip(ref.logits, var.logits, ref.masked):
        v = v.to(r.device)
        top2 = r.topk(2, dim=-1).values
        margin = (top2[..., 0] - top2[..., 1])[m]
        same = (r.argmax(-1) == v.argmax(-1))[m]
        agree += int(same.sum())
        total += int(m.sum())
        flip_margins += margin[~same].tolist()
        margins.append(margin)
        rel_err = max(rel_err, ((v - r).abs().max() / r.abs().max()).item())
    all_margins = torch.cat(margins) if margins else torch.zeros(0)
    return {
        "steps": len(ref.logits),
        "positions": total,
        "top1_agreement": agree / total if total else None,
        "flips": total - agree,
        "max_margin_at_flip": max(flip_margins) if flip_margins else 0.0,
        "median_reference_margin": all_margins.median().item() if all_margins.numel() else None,
        "reference_margins_below_0.05": float((all_margins < 0.05).float().mean()) if all_margins.numel() else None,
        "max_relative_logit_error": rel_err,
    }


def variant_runner(runner: ModelRunner, mask_id: int, variant: str, batch: PromptBatch,
                  cfg: DecoderConfig) -> GraphRunner:
    attention, fast, compiled, graph_plan = VARIANTS[variant]
    gr = GraphRunner(runner, mask_id, attention, cuda_graphs=False, fast_layers=fast, compile_layers=compiled)
    if graph_plan:  # eager steps over plans made as a captured graph's are (FlashInfer's CUDA-graph mode)
        from .flashinfer_attention import StepPlanner

        b, prompt_len = batch.input_ids.shape
        run = gr.bucket_for(b, cfg, prompt_len + (cfg.num_blocks + 1) * cfg.block_size)
        run.planner = StepPlanner(runner.model, run.state.cache, cfg.block_size, use_cuda_graph=True)
    return gr


def decode_logged(runner: ModelRunner, mask_id: int, eos_id: int, variant: str, batch: PromptBatch,
                  cfg: DecoderConfig, replay: Optional[StepLog] = None) -> tuple[StepLog, list[list[int]]]:
    """One eager decode of the capture-ready decoder, every step logged (and with `replay`, forced)."""
    log = StepLog()
    try:
        gr = variant_runner(runner, mask_id, variant, batch, cfg)
        with recording(log, replay):
            result = gr.generate(batch, cfg, eos_id)
    finally:  # the runner goes back to SDPA, ready for the next variant
        use_backend(runner.model, "sdpa")
        runner.backend = "sdpa"
    return log, result.token_ids


def padded_prompts(loaded, device) -> PromptBatch:
    """A planning prompt with one camera image and a QA prompt with none (so the batch is left-padded),
    or the benchmark's random ids for a model without a processor."""
    if loaded.processor is None:
        return benchmark_prompts(loaded, 2, 128, device)
    image = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    texts = [chat_prompt(planning_prompt(EgoState(vx=6.5, ax=0.3), "turn left"), 1),
             chat_prompt(qa_prompt("Is the left lane free?"), 0)]
    return loaded.processor.encode(texts, [[image], []]).to(device)


def run(loaded, batch: PromptBatch, device: torch.device, dtype: torch.dtype, variants: list[str], block_size: int,
        steps: list[int], new_tokens: int, progress: Callable[[str], None] = print) -> dict:
    """The float32 SDPA reference and each variant in `dtype`, per K; results per (K, variant)."""
    ref_model = copy.deepcopy(loaded.model).to(device=device, dtype=torch.float32)
    var_model = copy.deepcopy(loaded.model).to(device=device, dtype=dtype)
    s = loaded.settings
    ref_runner, var_runner = ModelRunner(ref_model, "sdpa"), ModelRunner(var_model, "sdpa")  # one layer stack each
    rows = []
    for K in steps:
        cfg = DecoderConfig(block_size=block_size, steps=K, strategy="low_confidence_static",
                            max_new_tokens=new_tokens, ignore_eos=True)
        ref, ref_tokens = decode_logged(ref_runner, s.mask_token_id, s.eos_token_id, "sdpa", batch, cfg)
        for variant in variants:
            row = {"K": K, "variant": variant, "dtype": str(dtype).replace("torch.", "")}
            try:
                var, _ = decode_logged(var_runner, s.mask_token_id, s.eos_token_id, variant, batch, cfg, replay=ref)
                row.update(compare(ref, var))
                free, free_tokens = decode_logged(var_runner, s.mask_token_id, s.eos_token_id, variant, batch, cfg)
                row["free_running_token_agreement"] = token_agreement(free_tokens, ref_tokens)
            except Exception as exc:  # one failing variant must not end the check
                row["error"] = f"{type(exc).__name__}: {exc}"
            progress(_format(row))
            rows.append(row)
    return {"rows": rows}


def _format(row: dict) -> str:
    if "error" in row:
        return f"K={row['K']:<3} {row['variant']:<22} ERROR {row['error']}"
    return (f"K={row['K']:<3} {row['variant']:<22} top-1 {row['top1_agreement']:.4f} ({row['flips']} flips of "
            f"{row['positions']}), max margin at a flip {row['max_margin_at_flip']:.3f}, median margin "
            f"{row['median_reference_margin']:.3f}, max rel. logit error {row['max_relative_logit_error']:.4f}, "
            f"free-running tokens {row['free_running_token_agreement']:.3f}")


_variants = subset_of(VARIANTS, "variants")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wam_diff_kernels.teacher_forced", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--variants", type=_variants, default=list(VARIANTS))
    p.add_argument("--steps", type=positive_ints, default=[8])
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--diversify", type=float, default=None,
                   help=f"re-draw 2-D weights with this std (nano preset default {NANO_DIVERSIFY_STD}, as the ladder)")
    p.add_argument("--out", default="runs/teacher_forced.json")
    p.add_argument("--append", action="store_true", help="add the rows to those already in --out (same model)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    before = None
    if args.append and Path(args.out).exists():  # checked before any decoding
        before = json.loads(Path(args.out).read_text())
        if before.get("model") != args.model:
            raise SystemExit(f"--append: {args.out} holds model {before.get('model')!r}, not {args.model!r}")
    device = torch.device(args.device)
    loaded = load(args.model, device="cpu", dtype=torch.float32)
    std = args.diversify if args.diversify is not None else (NANO_DIVERSIFY_STD if args.model == "nano" else None)
    if std:
        diversify(loaded.model, std)
    batch = padded_prompts(loaded, device)
    result = run(loaded, batch, device, getattr(torch, args.dtype), args.variants, args.block_size, args.steps,
                 args.new_tokens)
    result.update(model=args.model, device=str(device), block_size=args.block_size, prompts=batch.batch_size,
                  new_tokens=args.new_tokens, reference="float32, capture-ready decoder, SDPA, eager",
                  strategy="low_confidence_static")
    if before is not None:
        result["rows"] = before["rows"] + result["rows"]
    write_json(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
