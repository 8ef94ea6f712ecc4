"""Model reports: `wam-diff-train report` (report.py), its spec (spec.py), tables, plots and L2 gaps."""
from .report import Report, held_out_score, scenario_scores

__all__ = ["Report", "held_out_score", "scenario_scores"]
