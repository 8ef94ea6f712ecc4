"""The speed ladder: AR B = 1 -> B = 32 SDPA eager -> + static FlashInfer -> + CUDA graphs.

    python -m wam_diff_kernels.ladder --model qwen3-vl-2b --device cuda --steps 8,16 --batch-sizes 1,8 --out runs/ladder.json

Rungs, each measured in this one run (ratios between rungs are what the targets are about):
- `ar`: the engine's autoregressive decoder (B = 1), the baseline;
- `sdpa_eager`: the engine's reference block decoder, SDPA attention, eager;
- `static_sdpa`: the capture-ready decoder (wam_diff_kernels.graph_runner), SDPA over the static cache, eager;
- `static_fast`: the same with the fast text layers (`wam_diff_kernels.fast_layers`), eager (runs on a CPU too);
- `flashinfer`: the capture-ready decoder with FlashInfer attention, eager;
- `flashinfer_graphs`: the same, one CUDA graph per block replayed;
- `sdpa_graphs`: the capture-ready decoder with SDPA attention, captured;
- `fast_graphs`: the same with the fast text layers (`wam_diff_kernels.fast_layers`: merged projections, fewer
  operations per layer);
- `compiled_graphs`: the same with the fast layers' two pure parts torch.compiled (compiled in the warm-up).
Fixed K with `low_confidence_static` remasking and EOS ignored, so every rung decodes the same number
of tokens with the same forward count. Greedy tokens of every rung are compared with `sdpa_eager`.
Reported per row: tokens/s, ms/token (per sample), forwards/token, achieved bandwidth (weights + KV
read per forward) against the device's peak, and for the capture-ready rungs the launches of one eager
denoising step (CUDA kernels on a GPU; top-level ATen operations on a CPU). A rung that fails records
its error and the ladder goes on. Prefill is timed apart for both FlashInfer prefill modes (block-sparse, custom mask).

Its H200 tables: results/kernels/h200/. In bfloat16 the token agreement of a rung that
changes the rounding (FlashInfer, compiled layers) says little on a model with near-tied logits (a random
one); `wam_diff_kernels.teacher_forced` is the correctness check for those.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from wam_diff_core.attention.backends import use_backend
from wam_diff_core.bench import PEAK_BANDWIDTH_GBPS, benchmark_prompts, bytes_per_forward
from wam_diff_core.decoding.ar import generate_ar
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig, step_count
from wam_diff_core.model.checkpoint import load
from wam_diff_core.model.processor import PromptBatch
from wam_diff_core.model.runner import ModelRunner

from .availability import missing_for_flashinfer
from .graph_runner import GraphRunner

BLOCK_RUNGS = ("sdpa_eager", "static_sdpa", "static_fast", "flashinfer", "flashinfer_graphs", "sdpa_graphs",
               "fast_graphs", "compiled_graphs")
GRAPH_RUNGS = tuple(r for r in BLOCK_RUNGS if r.endswith("graphs"))
RUNGS = ("ar",) + BLOCK_RUNGS
# the fast path's targets, checked on the numbers of one run
TARGET_SPEEDUP_OVER_SDPA_EAGER = 5.0
TARGET_TOKENS_PER_S_2B_BATCH1_K16 = 1500.0
TARGET_BANDWIDTH_UTIL = 0.60


def positive_ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def subset_of(choices, what: str):
    """An argparse type: a comma-separated, non-empty subset of `choices` (named `what` in the error)."""
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}; expected a subset of {tuple(choices)}")
        return names

    return parse


_rungs = subset_of(RUNGS, "rungs")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model, --device, --dtype, --block-size, as the GPU checks take them."""
    p.add_argument("--model", default="nano", help="preset name or local checkpoint directory")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--block-size", type=int, default=32)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wam_diff_kernels.ladder", description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--steps", type=positive_ints, default=[8, 16])
    p.add_argument("--batch-sizes", type=positive_ints, default=[1, 8])
    p.add_argument("--rungs", type=_rungs, default=list(RUNGS))
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--prompt-len", type=int, default=128, help="prompt length for models without a tokenizer")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per rung after one warm-up; best is kept")
    p.add_argument("--diversify", type=float, default=None,
                   help="re-draw 2-D weights with this std (nano default 0.2: greedy outputs vary, so token "
                        "comparisons mean something)")
    p.add_argument("--out", default="runs/ladder.json")
    return p


prompts = benchmark_prompts


def diversify(model, std: float, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_((torch.randn(p.shape, generator=gen) * std).to(p.dtype))


class Ladder:
    def __init__(self, args, loaded=None):
        self.args = args
        self.device = torch.device(args.device)
        self.loaded = loaded or load(args.model, device=self.device, dtype=getattr(torch, args.dtype))
        std = args.diversify if args.diversify is not None else (0.2 if args.model == "nano" else None)
        if std:
            diversify(self.loaded.model, std)
        self.model = self.loaded.model
        self.runner = ModelRunner(self.model, "sdpa")
        self.settings = self.loaded.settings
        self.graph_runners: dict[str, GraphRunner] = {}

    def _activate(self, rung: str) -> None:
        """Point the model's text attention at the rung's backend (the model is shared by all rungs)."""
        if rung.startswith("flashinfer"):
            from .flashinfer_attention import use_flashinfer

            use_flashinfer(self.model)
            self.runner.backend = "flashinfer"
        else:
            use_backend(self.model, "sdpa")
            self.runner.backend = "sdpa"

    def _decode(self, rung: str, batch: PromptBatch, K: int):
        a, s = self.args, self.settings
        if rung == "ar":
            return generate_ar(self.runner, batch, a.new_tokens, s.eos_token_id, ignore_eos=True, mask_id=s.mask_token_id)
        cfg = DecoderConfig(block_size=a.block_size, steps=K, strategy="low_confidence_static",
                            max_new_tokens=a.new_tokens, ignore_eos=True)
        if rung == "sdpa_eager":
            return generate(self.runner, batch, cfg, s.mask_token_id, s.eos_token_id)
        gr = self.graph_runners.get(rung)
        if gr is None:
            attention = "flashinfer" if rung.startswith("flashinfer") else "sdpa"
            gr = GraphRunner(self.runner, s.mask_token_id, attention, cuda_graphs=rung.endswith("graphs"),
                             fast_layers=rung in ("static_fast", "fast_graphs"),
                             compile_layers=rung == "compiled_graphs")
            self.graph_runners[rung] = gr
        return gr.generate(batch, cfg, s.eos_token_id)

    def measure(self, rung: str, batch: PromptBatch, K: int) -> dict:
        self._activate(rung)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        runs = [self._decode(rung, batch, K) for _ in range(self.args.repeats + 1)]  # first: warm-up (+ capture)
        warm, runs = runs[0], runs[1:]
        decode_s = min(r.timings["denoise"] + r.timings["commit"] for r in runs)
        per_sample = runs[0].tokens / batch.batch_size
        forwards = runs[0].forwards - 1  # the prefill is not a decode forward
        row = {
            "tokens_per_s": runs[0].tokens / decode_s,
            "ms_per_token": 1000.0 * decode_s / per_sample,
            "forwards_per_token": forwards / per_sample,
            "decode_s": decode_s,
            "prefill_ms": 1000.0 * min(r.timings["prefill"] for r in runs),
            "first_run_s": warm.timings["total"],
            "token_ids": runs[0].token_ids,
        }
        gr = self.graph_runners.get(rung)
        if gr is not None:
            run = next(r for b, r in gr.buckets.items()
                       if b.batch == batch.batch_size and b.steps == step_count(self.args.block_size, K))
            row["launches_per_step"] = launches_per_step(run)
        if self.device.type == "cuda":
            cache_tokens = batch.input_ids.shape[1] + self.args.new_tokens / 2
            gbps = bytes_per_forward(self.model, cache_tokens, batch.batch_size) * forwards / decode_s / 1e9
            peak = peak_bandwidth(self.device)
            row.update(achieved_gbps=gbps, bandwidth_util=gbps / peak if peak else None,
                       peak_mem_mb=torch.cuda.max_memory_allocated(self.device) / 2**20)
        return row

    def prefill_modes(self, batch: PromptBatch) -> list[dict]:
        """Prompt prefill time per FlashInfer prefill mode (and SDPA), block size B."""
        out = []
        for mode in ("sdpa", "block_sparse", "custom_mask"):
            try:
                if mode == "sdpa":
                    self._activate("sdpa_eager")
                else:
                    os.environ["WAM_FLASHINFER_PREFILL"] = mode
                    self._activate("flashinfer")
                times = []
                with torch.inference_mode():
                    vision = self.runner.encode_images(batch)
                    for _ in range(self.args.repeats + 1):
                        cache = self.runner.new_cache(batch.batch_size, batch.input_ids.shape[1])
                        _sync(self.device)
                        t = time.perf_counter()
                        self.runner.prefill(batch, cache, self.args.block_size, vision)
                        _sync(self.device)
                        times.append(time.perf_counter() - t)
                out.append({"mode": mode, "batch_size": batch.batch_size, "prefill_ms": 1000.0 * min(times[1:])})
            except Exception as exc:  # one failing mode must not end the ladder
                out.append({"mode": mode, "batch_size": batch.batch_size, "error": f"{type(exc).__name__}: {exc}"})
        os.environ.pop("WAM_FLASHINFER_PREFILL", None)
        return out

    def run(self) -> dict:
        a = self.args
        rows, prefill = [], []
        for bs in a.batch_sizes:
            batch = prompts(self.loaded, bs, a.prompt_len, self.device)
            ar = None
            if "ar" in a.rungs:
                ar = self._row("ar", batch, 1, bs)
                print(_format_row(ar), flush=True)
                rows.append(ar)
                self.checkpoint(rows, prefill)
            for K in a.steps:
                reference = None
                for rung in [r for r in a.rungs if r != "ar"]:
                    row = self._row(rung, batch, K, bs)
                    if rung == "sdpa_eager":
                        reference = row
                    if ar and "tokens_per_s" in ar and "tokens_per_s" in row:
                        row["speedup_vs_ar"] = row["tokens_per_s"] / ar["tokens_per_s"]
                    if reference and "tokens_per_s" in reference and "tokens_per_s" in row:
                        row["speedup_vs_sdpa_eager"] = row["tokens_per_s"] / reference["tokens_per_s"]
                        row["tokens_match_sdpa_eager"] = row["token_ids"] == reference["token_ids"]
                        row["token_agreement"] = token_agreement(row["token_ids"], reference["token_ids"])
                    print(_format_row(row), flush=True)
                    rows.append(row)
                    self.checkpoint(rows, prefill)
            if self.device.type == "cuda" and any(r.startswith("flashinfer") for r in a.rungs):
                prefill.extend(self.prefill_modes(batch))
                self.checkpoint(rows, prefill)
        return self.result(rows, prefill, complete=True)

    def result(self, rows: list[dict], prefill: list[dict], complete: bool) -> dict:
        a = self.args
        result = {
            "model": a.model,
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
            else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
            "dtype": a.dtype,
            "block_size": a.block_size,
            "new_tokens": a.new_tokens,
            "strategy": "low_confidence_static",
            "timing": f"decode phase only, best of {a.repeats} after one warm-up (which includes graph capture)",
            "peak_bandwidth_gbps": peak_bandwidth(self.device),
            "torch": torch.__version__,
            "complete": complete,
            "rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in rows],
            "prefill": prefill,
        }
        result["targets"] = targets(result)
        return result

    def checkpoint(self, rows: list[dict], prefill: list[dict]) -> None:
        """Write what is measured so far (a run cut short by a time limit keeps its rows)."""
        write_json(self.result(rows, prefill, complete=False), self.args.out)

    def _row(self, rung: str, batch: PromptBatch, K: int, bs: int) -> dict:
        B = 1 if rung == "ar" else self.args.block_size
        row = {"rung": rung, "batch_size": bs, "block_size": B, "steps": 1 if rung == "ar" else K}
        if rung.startswith("flashinfer") and missing_for_flashinfer():
            row["error"] = "skipped: " + " and ".join(missing_for_flashinfer()) + " missing"
        elif rung.endswith("graphs") and self.device.type != "cuda":
            row["error"] = "skipped: CUDA graphs need a CUDA device"
        else:
            try:
                row.update(self.measure(rung, batch, K))
            except Exception as exc:  # one failing rung must not end the ladder
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {exc}"
        return row


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def token_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def peak_bandwidth(device: torch.device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BANDWIDTH_GBPS.items() if k in name), None)


# operations that only reshape or alias a tensor (no kernel on a GPU)
VIEW_OPS = frozenset({
    "aten::view", "aten::transpose", "aten::unsqueeze", "aten::expand", "aten::slice", "aten::select", "aten::t",
    "aten::reshape", "aten::as_strided", "aten::_unsafe_view", "aten::alias", "aten::permute", "aten::detach",
    "aten::empty", "aten::empty_like", "aten::squeeze", "aten::split", "aten::chunk", "aten::narrow", "aten::unbind",
    "aten::empty_strided", "aten::unflatten", "aten::lift_fresh", "aten::result_type"})


def launch_count(fn, device: torch.device) -> int:
    """What `fn` launches: on CUDA the kernels (and copies) the profiler sees on the device; on a CPU the
    top-level ATen operations that are not views (each at least one kernel on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        _sync(device)
    if cuda:
        return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())
    return sum(e.name.startswith("aten::") and e.name not in VIEW_OPS for e in prof.events()
               if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


def launches_per_step(run) -> float:
    """Launches of one eager denoising step of a static bucket (`graph_runner._BucketRun`): one plain block,
    divided by its K steps. A captured rung replays the same function."""
    return launch_count(lambda: run._eager(False), run.state.cache.keys.device) / run.bucket.steps


def targets(result: dict) -> dict:
    """The fast path's targets (TARGET_*) evaluated on this run's rows (None where a needed row is missing)."""
    rows = [r for r in result["rows"] if "tokens_per_s" in r]
    pick = lambda rung, bs, K: next((r for r in rows if (r["rung"], r["batch_size"], r["steps"]) == (rung, bs, K)), None)  # noqa: E731
    speedups, peak_2b = [], None
    for r in rows:
        if r["rung"] == "flashinfer_graphs" and "speedup_vs_sdpa_eager" in r:
            speedups.append({"batch_size": r["batch_size"], "steps": r["steps"], "speedup": r["speedup_vs_sdpa_eager"]})
    if result["model"] == "qwen3-vl-2b" and result["block_size"] == 32:
        row = pick("flashinfer_graphs", 1, 16)
        peak_2b = row["tokens_per_s"] if row else None
    best = {}  # the fastest captured rung per (batch, K), whichever attention and layers it uses
    for r in rows:
        key = (r["batch_size"], r["steps"])
        if r["rung"] in GRAPH_RUNGS and "speedup_vs_sdpa_eager" in r and (
                key not in best or r["tokens_per_s"] > best[key]["tokens_per_s"]):
            best[key] = r
    best_graphs = [{"batch_size": bs, "steps": K, "rung": r["rung"], "tokens_per_s": r["tokens_per_s"],
                    "speedup": r["speedup_vs_sdpa_eager"], "tokens_match_sdpa_eager": r.get("tokens_match_sdpa_eager"),
                    "bandwidth_util": r.get("bandwidth_util")} for (bs, K), r in sorted(best.items())]
    utils = [r["bandwidth_util"] for r in rows if r["rung"] == "flashinfer_graphs" and r.get("bandwidth_util")]
    identical = [r.get("tokens_match_sdpa_eager") for r in rows if r["rung"] in BLOCK_RUNGS[1:]]
    return {
        "graphs_flashinfer_over_sdpa_eager": speedups,
        "speedup_target": TARGET_SPEEDUP_OVER_SDPA_EAGER,
        "speedup_met": bool(speedups) and all(s["speedup"] >= TARGET_SPEEDUP_OVER_SDPA_EAGER for s in speedups),
        "qwen3_vl_2b_batch1_B32_K16_tokens_per_s": peak_2b,
        "tokens_per_s_target": TARGET_TOKENS_PER_S_2B_BATCH1_K16 if result["model"] == "qwen3-vl-2b" else None,
        "tokens_per_s_met": None if peak_2b is None else peak_2b >= TARGET_TOKENS_PER_S_2B_BATCH1_K16,
        "best_bandwidth_util": max(utils) if utils else None,
        "bandwidth_target": TARGET_BANDWIDTH_UTIL,
        "all_fast_paths_token_identical": bool(identical) and all(x is True for x in identical),
        "best_graph_rung": best_graphs,
    }


def _format_row(r: dict) -> str:
    head = f"{r['rung']:>18} batch {r['batch_size']:>2} B {r['block_size']:>2} K {r['steps']:>2}"
    if "error" in r:
        return f"{head} | {r['error']}"
    text = (f"{head} | {r['tokens_per_s']:9.1f} tok/s | {r['ms_per_token']:7.2f} ms/tok | "
            f"{r['forwards_per_token']:.3f} fwd/tok")
    if r.get("launches_per_step") is not None:
        text += f" | {r['launches_per_step']:.0f} launches/step"
    if r.get("achieved_gbps") is not None:
        util = f" ({100 * r['bandwidth_util']:.0f} %)" if r.get("bandwidth_util") else ""
        text += f" | {r['achieved_gbps']:.0f} GB/s{util}"
    if "speedup_vs_sdpa_eager" in r:
        text += f" | x{r['speedup_vs_sdpa_eager']:.2f} vs sdpa eager, tokens {'=' if r['tokens_match_sdpa_eager'] else '!='}"
        text += f" ({100 * r['token_agreement']:.0f} % agree)"
    return text


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available on this machine", file=sys.stderr)
        return 2
    result = Ladder(args).run()
    write_json(result, args.out)
    print(json.dumps(result["targets"], indent=2))
    print(f"wrote {args.out}")
    return 0


def write_json(result: dict, path: str) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
