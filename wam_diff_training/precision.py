"""Mixed precision of a training step: bfloat16 autocast on CUDA (`train.bf16`, the default there) and, with
`train.cpu_bf16`, on the CPU too, where AMX / AVX-512 BF16 cores run bfloat16 matrix products several times
faster than float32 (measured on this project's 2-core CPU: the nano's [3408, 256] x [256, 768] product
4.0 -> 0.44 ms). Weights, optimizer state and the losses stay float32; only autocast's ops run in bfloat16.

A vision patch embedding is a Conv3d whose kernel equals its stride, so it is one matrix product over the
flattened patches; oneDNN's bfloat16 Conv3d backward on the CPU is slow (about 85 ms a step at batch 8, the
product form about 2 ms), so under CPU autocast the embedding runs as that product (`matmul_patch_embed`).
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch import nn
from torch.nn import functional as F


def step_autocast(device: torch.device, bf16: bool, cpu_bf16: bool):
    """The autocast context of a step: bfloat16 on CUDA with `bf16`, on the CPU with `cpu_bf16`; else none."""
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if device.type == "cpu" and cpu_bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def prepare_models(device: torch.device, cpu_bf16: bool, *models) -> None:
    """What CPU autocast needs of the step's models (None entries skipped): their patch embeddings as products."""
    if device.type == "cpu" and cpu_bf16:
        for model in models:
            if model is not None:
                matmul_patch_embed(model)


def _patch_embed_as_matmul(self, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self.proj.weight  # (D, C, T, P, P): one output per patch, the kernel covering the patch
    x = hidden_states.reshape(-1, weight[0].numel()).to(weight.dtype)
    return F.linear(x, weight.reshape(weight.shape[0], -1), self.proj.bias)


def matmul_patch_embed(model: nn.Module) -> int:
    """Run every vision patch embedding of `model` (a Conv3d with kernel == stride over one patch) as a matrix
    product over the flattened patches: the same function, summed in another order. Returns how many."""
    count = 0
    for module in model.modules():
        proj = getattr(module, "proj", None)
        if type(module).__name__.endswith("PatchEmbed") and isinstance(proj, nn.Conv3d):
            if tuple(proj.kernel_size) != tuple(proj.stride) or proj.padding != (0, 0, 0) or proj.groups != 1:
                raise ValueError(f"{type(module).__name__}: a Conv3d with kernel {proj.kernel_size}, stride "
                                 f"{proj.stride}, padding {proj.padding}, groups {proj.groups} is not one product "
                                 "per patch")
            module.forward = types.MethodType(_patch_embed_as_matmul, module)
            count += 1
    return count
