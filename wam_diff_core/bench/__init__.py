"""`wam-diff bench`: speed measured with its entries interleaved, so the ratios between them hold still on a
shared machine.

- `wam-diff bench`: decoding configurations of one model (`decode`);
- `wam-diff bench --compare MODEL_A MODEL_B ...`: whole plans of checkpoints on the same frames, planning L2
  beside the speed (`compare`);
- `wam-diff bench --profile MODEL ...`: where one plan's time goes, phase by phase (`profile`).
"""
from __future__ import annotations

from .decode import PEAK_BANDWIDTH_GBPS, add_arguments, benchmark_prompts, bytes_per_forward, run

__all__ = ["PEAK_BANDWIDTH_GBPS", "add_arguments", "benchmark_prompts", "bytes_per_forward", "run"]
