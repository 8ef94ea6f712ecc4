"""Loss curve of a run: every stage's metrics.jsonl under one output directory, one PNG and one JSON."""
from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def _stage_order(name: str) -> tuple:
    if name == "ar":
        return (0, 0)
    if name.startswith("block") and name[5:].isdigit():
        return (1, int(name[5:]))
    return (2, name)


def plot_run(out: Path, key: str = "loss", smooth: int = 10) -> Path:
    """Write `<out>/loss_curve.png` and `<out>/loss_curve.json` (stages in chain order, steps concatenated;
    each stage raw and as a trailing mean over `smooth` steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = sorted((p.parent.name for p in Path(out).glob("*/metrics.jsonl")), key=_stage_order)
    if not stages:
        raise FileNotFoundError(f"no */metrics.jsonl under {out}")
    curves, offset = {}, 0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in stages:
        rows = [r for r in read_metrics(Path(out) / name / "metrics.jsonl") if key in r]
        steps = [offset + r["step"] for r in rows]
        values = [r[key] for r in rows]
        curves[name] = {"step": steps, key: values}
        line, = ax.plot(steps, values, alpha=0.3, linewidth=0.8)
        w = max(1, min(smooth, len(values)))
        mean = [sum(values[max(0, i - w + 1):i + 1]) / len(values[max(0, i - w + 1):i + 1]) for i in range(len(values))]
        ax.plot(steps, mean, color=line.get_color(), label=f"{name} (mean of {w})")
        offset = steps[-1] if steps else offset
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step (stages concatenated)")
    ax.set_ylabel(key)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = Path(out) / f"{key}_curve.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    (Path(out) / f"{key}_curve.json").write_text(json.dumps(curves))
    return png
