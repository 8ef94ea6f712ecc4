"""AR -> block-diffusion conversion of Qwen3-VL driving models: datasets, the [prefix | clean | noisy]
layout, losses, stages (`ar`, `adapt`, `distill`) behind `wam-diff-train` (see README.md)."""
