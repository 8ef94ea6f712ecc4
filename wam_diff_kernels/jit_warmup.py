"""Build FlashInfer's JIT kernels before anything is timed, one process per kernel module, in parallel.

    python -m wam_diff_kernels.jit_warmup --head-dims 64,128 [--dtype bfloat16] [--jobs 5]

FlashInfer compiles a kernel module with nvcc on its first use and caches it on disk
(~/.cache/flashinfer). The backend here uses two modules per (head size, dtype): batch prefill (the
paged block steps and the block-sparse prompt prefill) and single prefill (the partial last prompt
block and the masked correctness paths). Built one after another inside the first timed run, they
cost minutes and stall whatever is measured; built here, each module's files compile side by side
(each process runs its own ninja with `--jobs` nvcc processes, the modules in parallel).

Each child makes the same calls the backend makes (same wrappers, same arguments), so it builds
exactly the modules the backend will load. Prints one line per module with its build time and writes
nothing else; exits non-zero when a module failed to build (its error is printed).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

from .ladder import positive_ints

KINDS = ("batch_prefill", "single_prefill")
KV_HEADS = 2  # the group size does not select a module; two kv heads keep the warm-up calls tiny


def build(kind: str, head_dim: int, dtype: torch.dtype, device: str = "cuda") -> None:
    """One tiny call of `kind` at this head size: loads (and on first use compiles) its module."""
    from . import flashinfer_attention as fa
    from .static_cache import StaticKVCache

    fi = fa.require_flashinfer()
    heads, dev = 2 * KV_HEADS, torch.device(device)
    if kind == "batch_prefill":
        cache = StaticKVCache(1, 2, KV_HEADS, head_dim, 64, dtype, dev)
        for graph_mode in (False, True):
            step = fa.PagedStep(fi, cache, heads, 8, [0, 1], use_cuda_graph=graph_mode)
            step.plan([8, 16])
            q = torch.randn(2, heads, 8, head_dim, dtype=dtype, device=dev)
            step.run(q, cache.keys[0], cache.values[0])
        q, k, v = (torch.randn(32, h, head_dim, dtype=dtype, device=dev) for h in (heads, KV_HEADS, KV_HEADS))
        fa._block_sparse_prefill(fi, q, k, v, 16, head_dim ** -0.5)
    else:
        q, k, v = (torch.randn(24, h, head_dim, dtype=dtype, device=dev) for h in (heads, KV_HEADS, KV_HEADS))
        fi.single_prefill_with_kv_cache(q, k, v, causal=True, sm_scale=head_dim ** -0.5, backend=fa.kernel_backend())
    if dev.type == "cuda":
        torch.cuda.synchronize()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wam_diff_kernels.jit_warmup", description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", type=positive_ints, default=[64, 128])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--kinds", default=",".join(KINDS), help=f"subset of {KINDS}")
    p.add_argument("--jobs", type=int, default=None, help="nvcc processes per module (MAX_JOBS); default cores / modules")
    p.add_argument("--child", nargs=2, metavar=("KIND", "HEAD_DIM"), help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("wam_diff_kernels.jit_warmup: CUDA is not available on this machine; nothing to build", file=sys.stderr)
        return 2
    from .availability import missing_for_flashinfer

    if missing_for_flashinfer():
        print("wam_diff_kernels.jit_warmup: missing " + " and ".join(missing_for_flashinfer()), file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    if args.child:
        build(args.child[0], int(args.child[1]), dtype)
        return 0
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        print(f"wam_diff_kernels.jit_warmup: unknown kinds {bad}; expected a subset of {KINDS}", file=sys.stderr)
        return 2
    jobs = [(k, d) for d in args.head_dims for k in kinds]
    env = dict(os.environ)
    env["MAX_JOBS"] = str(args.jobs or max(1, (os.cpu_count() or 1) // len(jobs) + 1))
    start = time.perf_counter()
    logs = {job: tempfile.TemporaryFile(mode="w+") for job in jobs}  # files, not pipes: no child blocks on output
    procs = {(k, d): subprocess.Popen([sys.executable, "-m", "wam_diff_kernels.jit_warmup", "--dtype", args.dtype,
                                       "--child", k, str(d)], env=env, stdout=logs[(k, d)],
                                      stderr=subprocess.STDOUT, text=True) for k, d in jobs}
    failed = 0
    while procs:
        for job in [j for j, proc in procs.items() if proc.poll() is not None]:
            proc = procs.pop(job)
            status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"{job[0]:>15} head_dim {job[1]:>3} {args.dtype}: {status} at {time.perf_counter() - start:6.1f} s",
                  flush=True)
            if proc.returncode != 0:
                failed += 1
                logs[job].seek(0)
                print(logs[job].read()[-4000:], flush=True)
        time.sleep(0.2)
    print(f"jit warm-up: {len(jobs) - failed}/{len(jobs)} modules in {time.perf_counter() - start:.1f} s "
          f"(MAX_JOBS={env['MAX_JOBS']} each)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
