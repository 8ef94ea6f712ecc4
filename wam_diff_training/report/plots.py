"""The report's plots (matplotlib, headless): L2 against horizon per model, quality against
denoising steps, tokens/s against block size."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S  # noqa: E402

HORIZONS_S = [(i + 1) * WAYPOINT_DT_S for i in range(NUM_WAYPOINTS)]


def l2_curve(l2: dict) -> list[float]:
    return [l2[f"l2_{t:.1f}s"] for t in HORIZONS_S]


def plot_l2_vs_horizon(rows: list[dict], path: Path) -> Path | None:
    """rows: {"name", "block_size", "l2": l2_report dict or None}; B = 1 dashed, diffusion solid."""
    drawn = [r for r in rows if r.get("l2")]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in drawn:
        style = "--" if r["block_size"] == 1 else "-"
        ax.plot(HORIZONS_S, l2_curve(r["l2"]), style, marker="o", ms=3, label=f"{r['name']} (B={r['block_size']})")
    ax.set_xlabel("horizon (s)")
    ax.set_ylabel("L2 (m)")
    ax.set_title("Open-loop planning error against horizon")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_steps_sweep(model: str, points: list[dict], path: Path) -> Path | None:
    """points: {"steps", "l2_mean" or None, "invalid_share", "tokens_per_s"} for one model."""
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ks = [p["steps"] for p in points]
    ax.plot(ks, [p["l2_mean"] if p["l2_mean"] is not None else float("nan") for p in points], "o-",
            label="L2 mean (m)")
    ax.plot(ks, [100.0 * p["invalid_share"] for p in points], "s--", label="unparsable plans (%)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("denoising steps K per block")
    ax.set_ylabel("L2 (m) / unparsable (%)")
    ax2 = ax.twinx()
    ax2.plot(ks, [p["tokens_per_s"] for p in points], "^:", color="tab:green", label="tokens/s")
    ax2.set_ylabel("tokens/s (CPU)")
    _joint_legend(ax, ax2)
    ax.set_title(f"Quality against denoising steps: {model}")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_block_sweep(model: str, points: list[dict], path: Path) -> Path | None:
    """points: {"block_size", "tokens_per_s", "forwards_per_token"} for one model."""
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bs = [p["block_size"] for p in points]
    ax.plot(bs, [p["tokens_per_s"] for p in points], "o-", label="tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size B")
    ax.set_ylabel("tokens/s (CPU, batch 1)")
    ax2 = ax.twinx()
    ax2.plot(bs, [p["forwards_per_token"] for p in points], "s--", color="tab:red", label="forwards/token")
    ax2.set_ylabel("forwards per token")
    _joint_legend(ax, ax2)
    ax.set_title(f"Decode speed against block size: {model}")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _joint_legend(ax, ax2) -> None:
    """One legend for the lines of both y axes."""
    lines, labels = ax.get_legend_handles_labels()
    lines2, labels2 = ax2.get_legend_handles_labels()
    ax.legend(lines + lines2, labels + labels2, fontsize=7)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
