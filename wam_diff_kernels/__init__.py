"""GPU fast paths for the block-diffusion decoder (optional; `wam_diff_core` works without them).

- `static_cache`: a KV cache of static shape per bucket whose length lives in a device tensor;
- `remask_ops`: one on-device remasking step (confidence, argmax, threshold commit, at least one);
- `graph_runner`: the capture-ready decode path (fixed K steps, at most one host sync per block),
  captured as one CUDA graph per (batch, B) bucket on CUDA, run eagerly on a CPU;
- `flashinfer_attention`: the FlashInfer attention backend (GPU only, imported lazily);
- `ladder`: the speed ladder (AR -> B = 32 SDPA eager -> + FlashInfer -> + CUDA graphs);
- `teacher_forced`: bf16 variants' steps along a float32 decode (the correctness check of a kernel change);
- `availability`: what this machine has for them (CUDA, flashinfer, triton); looks without importing;
- `plugin`: registers the FlashInfer backend, the fast text layers and the static decoder with the core's
  extension registry (`wam_diff_core.extensions`).

The core finds the plugin through the entry point `wam_diff_core.extensions` of the installed package; a
checkout used from PYTHONPATH (no entry points) registers it here, on import. Importing this package
never imports flashinfer or touches CUDA.
"""
from wam_diff_core import extensions

from .availability import cuda_available, flashinfer_installed, missing_for_flashinfer, require_flashinfer, triton_installed
from .plugin import register

extensions.register(register)

__all__ = ["cuda_available", "flashinfer_installed", "triton_installed", "missing_for_flashinfer", "require_flashinfer",
           "register"]
