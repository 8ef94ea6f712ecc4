"""The markdown of a `wam-diff evaluate` result: one column per model, one row per number.

COCO numbers are printed as percentages (mAP 36.3, as the COCO leaderboards print them), QA accuracies
in %, planning L2 in metres.
"""
from __future__ import annotations

from typing import Callable, Optional

from .evaluate_detection import FATES


def _fmt(value, scale: float = 1.0, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and scale == 1.0:
        return str(value)
    return f"{value * scale:.{digits}f}"


def _row(label: str, models: list[dict], get: Callable[[dict], Optional[object]], scale: float = 1.0,
         digits: int = 1) -> str:
    cells = []
    for m in models:
        try:
            cells.append(_fmt(get(m), scale, digits))
        except (KeyError, TypeError):
            cells.append("-")
    return f"| {label} | " + " | ".join(cells) + " |"


def _text_row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def _header(models: list[dict]) -> list[str]:
    names = [m["name"] or m["model"] for m in models]
    return ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(models)]


def _detection_rows(models: list[dict]) -> list[str]:
    d = lambda m: m["tasks"]["detection"]  # noqa: E731
    labels = sorted({k for m in models if "detection" in m["tasks"] for k in d(m).get("per_class", {})})
    rows = [_text_row("detections from", [m.get("detections", "text") for m in models]),
            _row("detection mAP@[.5:.95]", models, lambda m: d(m)["map"], 100.0),
            _row("detection AP50", models, lambda m: d(m)["ap50"], 100.0),
            _row("detection AP75", models, lambda m: d(m)["ap75"], 100.0)]
    rows += [_row(f"detection AP {k}", models, lambda m, k=k: d(m)["per_class"][k], 100.0) for k in labels]
    rows += [_row("detection recall@10 (AR@10, IoU .5:.95)", models, lambda m: d(m)["recall_10"], 100.0),
             _row("detection recall@10 at IoU 0.5", models, lambda m: d(m)["recall_10_iou50"], 100.0),
             _row("detection answers that parse (%)", models, lambda m: d(m)["breakdown"]["parsed_share"], 100.0),
             _row("detection answers cut at the budget", models, lambda m: d(m)["unfinished"]),
             _row("detection ms per frame (box head)", models, lambda m: d(m)["ms_per_frame"]),
             _row("detection boxes per frame: exact count (%)", models,
                  lambda m: d(m)["breakdown"]["count"]["exact_share"], 100.0)]
    return rows


def _qa_rows(models: list[dict]) -> list[str]:
    q = lambda m: m["tasks"]["qa"]  # noqa: E731
    names = sorted({k for m in models if "qa" in m["tasks"] for k in q(m)["per_template"]})
    rows = [_row("QA accuracy (%)", models, lambda m: q(m)["accuracy"]),
            _row("QA exact match (%)", models, lambda m: q(m)["exact"])]
    for k in names:
        rows.append(_row(f"QA {k} accuracy (%)", models, lambda m, k=k: q(m)["per_template"][k]["accuracy"]))
        rows.append(_row(f"QA {k}: majority answer's accuracy (%)", models,
                         lambda m, k=k: q(m)["per_template"][k]["majority_accuracy"]))
    return rows


def _planning_rows(models: list[dict]) -> list[str]:
    p = lambda m: m["tasks"]["planning"]  # noqa: E731
    return [_row("planning L2 mean (m)", models, lambda m: p(m)["l2_mean"], digits=3),
            _row("planning L2 at 4 s (m)", models, lambda m: p(m)["l2_4.0s"], digits=3),
            _row("planning unparsable (%)", models, lambda m: p(m)["unparsable_share"], 100.0)]


def _fate_rows(models: list[dict]) -> list[str]:
    f = lambda m: m["tasks"]["detection"]["breakdown"]  # noqa: E731
    rows = [_row(f"{k.replace('_', ' ')} (%)", models, lambda m, k=k: f(m)["gt_fate_share"][k], 100.0) for k in FATES]
    centre = [f(m)["centre_error_px"] if "detection" in m["tasks"] else {} for m in models]
    rows += [_row("matched IoU p50", models, lambda m: f(m)["matched_iou"]["p50"], digits=2),
             _text_row("matched centre error p50 x / y (px)",
                       [f"{_fmt(c.get('dx_p50'))} / {_fmt(c.get('dy_p50'))}" for c in centre]),
             _row("predicted boxes that match nothing (%)", models, lambda m: f(m)["false_positive_share"], 100.0),
             _row("boxes per frame: mean error (predicted - true)", models, lambda m: f(m)["count"]["mean_error"],
                  digits=2)]
    return rows


def markdown(report: dict) -> str:
    """The result of `evaluate.run` as markdown: a summary table, then where the ground-truth boxes went."""
    models = report["models"]
    tasks = report["tasks"]
    lines = ["# wam-diff evaluate", "",
             f"{report['samples_per_task']} samples per task (fewer where the split holds fewer); each model at its "
             f"checkpoint's own decoding" + (f" with {report['decoding_options']}" if report["decoding_options"] else "")
             + "; token budgets " + ", ".join(f"{t} {b}" for t, b in report["budgets"].items()) + ".", ""]
    lines += _header(models)
    lines.append(_text_row("block size B / steps K",
                           [f"{m['decoding']['block_size']} / {m['decoding']['steps']}" for m in models]))
    for task, rows in (("detection", _detection_rows), ("qa", _qa_rows), ("planning", _planning_rows)):
        if task in tasks:
            lines += rows(models)
            lines.append(_row(f"{task} samples", models, lambda m, t=task: m["tasks"][t]["samples"]))
            lines.append(_row(f"{task} tokens/s", models, lambda m, t=task: m["tasks"][t]["tokens_per_s"], digits=0))
    if "detection" in tasks:
        lines += ["", "## Detection: where the ground-truth boxes went", "",
                  "Each true box matched one-to-one to the answer's boxes, highest IoU first: found tight (IoU >= "
                  "0.75), found loose (0.5 .. 0.75), poorly localised (0.1 .. 0.5), missed (no box overlaps it by "
                  "IoU 0.1), answer unparsed (the frame's answer does not parse).", ""]
        lines += _header(models) + _fate_rows(models)
    return "\n".join(lines) + "\n"
