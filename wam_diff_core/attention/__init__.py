"""Block-causal attention: visibility rules (block_mask) and registered backends (backends)."""
