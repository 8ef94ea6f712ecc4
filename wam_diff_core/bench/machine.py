"""What a benchmark ran on: CPU model, cores, torch threads, versions and the load average around the run
(a shared machine's load is part of any timing taken on it)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

# CPU features that decide which fast paths a CPU has (bfloat16 matmuls, AMX tiles)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo() -> tuple[str, list[str]]:
    """(model name, flags) from /proc/cpuinfo; platform's processor name and no flags elsewhere."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return platform.processor() or platform.machine(), []
    model, flags = "", []
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = value.split()
    return model or platform.machine(), flags


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, None where the platform has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine(device: torch.device | str = "cpu") -> dict:
    """The machine a run measures: CPU model, logical cores (all, and those this process may use), torch
    threads, the CPU_FLAGS it has, torch and Python versions, and the GPU's name on a CUDA device."""
    model, flags = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    info = {"cpu": model, "cores": os.cpu_count(), "usable_cores": usable,
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "torch": torch.__version__,
            "python": platform.python_version()}
    device = torch.device(device)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def describe(info: dict) -> str:
    """One line: `AMD EPYC, 2 cores, 2 torch threads, torch 2.13.0+cpu`."""
    text = f"{info['cpu']}, {info['usable_cores']} cores, {info['torch_threads']} torch threads, torch {info['torch']}"
    return f"{info['gpu']} ({text})" if "gpu" in info else text


def load_text(before: list[float] | None, after: list[float] | None) -> str:
    """`load 1/5/15 min 0.85/2.00/3.04 before, 1.10/1.90/2.90 after`."""
    fmt = lambda v: "/".join(f"{x:.2f}" for x in v) if v else "n/a"  # noqa: E731
    return f"load 1/5/15 min {fmt(before)} before, {fmt(after)} after"
