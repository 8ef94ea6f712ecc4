"""Data shipped with the package: the closed-loop route suite (routes_v1.json, read by wam_diff_core.sim.routes)."""
