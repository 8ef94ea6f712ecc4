"""Process group set-up under `torchrun` (gloo on CPU, nccl on GPU) and model wrapping.

Without torchrun's environment (WORLD_SIZE unset or 1) everything is a single process and the helpers
are no-ops. DDP wraps the module a step calls (`objective.SelectedLogits`) so gradient all-reduce hooks
fire; FSDP2 (`fully_shard`) shards each decoder layer and the rest for models too large to replicate;
its checkpoints are gathered into full state dicts on rank 0, so they are ordinary HF directories.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def pick_device(pref: str, local_rank: int = 0) -> torch.device:
    if pref == "auto":
        pref = "cuda" if torch.cuda.is_available() else "cpu"
    if pref == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device is cuda but no CUDA device is available")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(pref)


def init_distributed(device_pref: str = "auto") -> DistContext:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_pref, local_rank)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(rank, world, local_rank, device)


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def all_reduce_mean(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if not ctx.enabled:
        return value
    out = value.detach().clone().float()
    dist.all_reduce(out)
    return out / ctx.world


def any_flag(flag: bool, ctx: DistContext) -> bool:
    """True on every process when any process raised the flag (a one-integer all-reduce)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([int(flag)], device=ctx.device if ctx.device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def wrap(module: torch.nn.Module, ctx: DistContext, parallel: str = "ddp") -> torch.nn.Module:
    """DDP (or FSDP2) around the step module; the bare module in a single process."""
    if not ctx.enabled:
        return module
    if parallel == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        for layer in module.model.model.language_model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)  # the rest: embeddings, vision tower, norm, LM head
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # text-only batches leave the vision tower unused: let DDP find such parameters every step
    return DDP(module, device_ids=ids, find_unused_parameters=True)


def cleanup(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def is_sharded(parallel: str, ctx: DistContext) -> bool:
    return ctx.enabled and parallel == "fsdp2"


def full_model_state(module: torch.nn.Module, prefix: str = "model.") -> dict:
    """Full (unsharded) weights of an FSDP2 module on rank 0 (empty elsewhere), HF parameter names.
    A collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}


def full_optim_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full optimizer state (rank 0) of an FSDP2 module. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optim_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, optim_state_dict=state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
