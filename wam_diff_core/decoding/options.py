"""The command-line options of every command that runs a learned policy (`wam-diff decode`, `demo`, `drive`,
`dagger`, `sensitivity`): --device, --dtype and the decoding settings.

Every decoding option defaults to None, "unset": the checkpoint's own (the "decoding" section of its
wam_diff.json), or for what a checkpoint does not state (budget, backend, CUDA graphs, text layers, envelope)
the DecoderConfig default. --dtype unset: the checkpoint's own on a GPU, float32 on a CPU. `decoding_arguments(args)`
gives the options that were set as `DrivingPolicy.load` keywords: DecoderConfig fields (`resolve_decoding`), and
`dtype` when given.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..constants import ATTENTION_BACKENDS, DTYPE_CHOICES, SCHEDULES, STRATEGIES, TEXT_LAYERS

ON_OFF = ("on", "off")
# the options' dests are DecoderConfig fields: these are given as on / off, the others taken as they are
_SWITCHES = ("number_order", "forward_only", "kinematic_envelope", "cuda_graphs")
_VALUES = ("block_size", "steps", "strategy", "threshold", "schedule", "max_new_tokens", "backend", "text_layers")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype, and the decoding options (each unset by default: the checkpoint's own)."""
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:N (default: cpu)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                        help="weights' dtype (default: the checkpoint's own on a GPU, float32 on a CPU; auto: bfloat16 "
                             "for B > 1 on a CPU with native bf16)")
    g = parser.add_argument_group("decoding", "default: the checkpoint's own (its wam_diff.json)")
    g.add_argument("--block-size", type=int, default=None, help="B: tokens denoised in parallel (1 = autoregressive)")
    g.add_argument("--steps", type=int, default=None, help="K: denoising steps per block (at most B; B = 1 takes one)")
    g.add_argument("--strategy", choices=STRATEGIES, default=None, help="remasking strategy")
    g.add_argument("--threshold", type=float, default=None, help="confidence threshold of low_confidence_dynamic")
    g.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="positions each denoising step commits (wam_diff_core/decoding/remasking.py)")
    g.add_argument("--number-order", choices=ON_OFF, default=None,
                   help="commit each trajectory number's digits most significant first")
    g.add_argument("--forward-only", choices=ON_OFF, default=None,
                   help="the kinematic envelope also keeps plans from stepping back along the ego's heading")
    g.add_argument("--kinematic-envelope", choices=ON_OFF, default=None,
                   help="decode plans inside the kinematic envelope (default: on; wam_diff_core/decoding/envelope.py)")
    g.add_argument("--max-new-tokens", type=int, default=None,
                   help="token budget per answer (default: the policy's per task, wam_diff_core.policy.TASK_BUDGET)")
    g.add_argument("--backend", choices=ATTENTION_BACKENDS, default=None, help="attention backend (default: sdpa)")
    g.add_argument("--cuda-graphs", choices=ON_OFF, default=None,
                   help="capture the block decode step as a CUDA graph (GPU only; default: off)")
    g.add_argument("--text-layers", choices=TEXT_LAYERS, default=None,
                   help="the model's own text layers, or wam_diff_kernels.fast_layers' (merged projections, the same plans; "
                        "'compiled': torch.compiled; default: model)")


def decoding_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line as `DrivingPolicy.load` keywords: DecoderConfig fields, and `dtype`
    (unset ones left out)."""
    out = {k: getattr(args, k) for k in _VALUES if getattr(args, k) is not None}
    out.update({k: getattr(args, k) == "on" for k in _SWITCHES if getattr(args, k) is not None})
    if getattr(args, "dtype", None) is not None:
        out["dtype"] = args.dtype
    return out
