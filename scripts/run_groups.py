"""Groups of training runs compared on one metric, with an exact permutation test against the first group.

Reads the l2_gap.json of `scripts/l2_gap.py` (every run scored on the same plans) and groups its models by label;
each later group is tested against the first (`training.report.permutation`: mean difference, exact one- and
two-sided p over all splits of the pooled runs). Writes OUT/run_groups.json, OUT/run_groups.md (the table) and
OUT/run_groups.png (each run's value, one column per group), and prints the table.

    .venv/bin/python scripts/run_groups.py runs/ab_v36/l2/l2_gap.json --out runs/ab_v36/groups \\
        "float32=F23,F24,F25,F26,F27,F28" "compile=C23,C24,C25,C26"
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.report.outputs import write_outputs  # noqa: E402
from training.report.permutation import exact_test, group_stats  # noqa: E402

METRICS = ("l2_mean",)  # per-model numbers of l2_gap.json a group can be compared on


def parse_group(spec: str, known: dict) -> tuple[str, list[str]]:
    """NAME=LABEL,LABEL,... -> (name, labels), every label one of l2_gap.json's models."""
    name, sep, rest = spec.partition("=")
    labels = [s.strip() for s in rest.split(",") if s.strip()]
    if not sep or not name or not labels:
        raise SystemExit(f"{spec!r}: expected NAME=LABEL[,LABEL...]")
    missing = [label for label in labels if label not in known]
    if missing:
        raise SystemExit(f"{spec!r}: no model labelled {', '.join(map(repr, missing))} in the results "
                         f"(there: {', '.join(known)})")
    return name, labels


def compare_groups(models: dict, groups: list[tuple[str, list[str]]], metric: str) -> dict:
    """models: label -> metric value; groups: (name, labels), the first the reference."""
    out = {"metric": metric, "reference": groups[0][0], "groups": []}
    ref = [models[label] for label in groups[0][1]]
    for i, (name, labels) in enumerate(groups):
        values = [models[label] for label in labels]
        row = {"name": name, "values": dict(zip(labels, values))} | group_stats(values)
        if i:
            row["test"] = exact_test(ref, values)
        out["groups"].append(row)
    return out


def markdown(result: dict) -> str:
    lines = [f"{result['metric']} per group of runs; each later group against {result['reference']} (exact "
             "permutation test over all splits of the pooled runs)", "",
             "| group | runs | mean | min - max | sd | difference | p (one-sided, above) | p (two-sided) | values |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for g in result["groups"]:
        t = g.get("test")
        sd = "-" if g["sd"] is None else f"{g['sd']:.3f}"
        test = "- | - | -" if t is None else (f"{t['difference']:+.3f} | {t['p_one_sided']:.3f} | "
                                              f"{t['p_two_sided']:.3f}")
        runs = ", ".join(f"{k} {v:.2f}" for k, v in g["values"].items())
        lines.append(f"| {g['name']} | {g['runs']} | "
                     f"{g['mean']:.3f} | {g['min']:.2f} - {g['max']:.2f} | {sd} | {test} | {runs} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(result["groups"]), 4))
    for x, g in enumerate(result["groups"]):
        for label, v in g["values"].items():
            ax.plot(x, v, "o", color=f"C{x}")
            ax.annotate(label, (x, v), textcoords="offset points", xytext=(6, -3), fontsize=7)
        ax.hlines(g["mean"], x - 0.25, x + 0.25, color=f"C{x}")
    ax.set_xticks(range(len(result["groups"])), [g["name"] for g in result["groups"]])
    ax.set_xlim(-0.6, len(result["groups"]) - 0.2)
    ax.set_ylabel(result["metric"])
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="l2_gap.json of scripts/l2_gap.py")
    p.add_argument("groups", nargs="+", help="NAME=LABEL[,LABEL...], the first the reference")
    p.add_argument("--metric", choices=METRICS, default=METRICS[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    path = Path(args.results)
    if not path.is_file():
        raise SystemExit(f"{path}: not found (expected the l2_gap.json of scripts/l2_gap.py)")
    try:
        models = {m["label"]: float(m[args.metric]) for m in json.loads(path.read_text())["models"]}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not an l2_gap.json with a {args.metric!r} per model ({e})") from e
    if len(args.groups) < 2:
        raise SystemExit(f"need at least two groups, got {len(args.groups)}")
    groups = [parse_group(spec, models) for spec in args.groups]
    result = {"results": str(path)} | compare_groups(models, groups, args.metric)
    write_outputs(Path(args.out), "run_groups", result, markdown(result), plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
