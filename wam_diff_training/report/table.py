"""The report's markdown: one row per model (and per closed-loop baseline), then the sweeps."""
from __future__ import annotations

from typing import Optional

COLUMNS = ("model", "B", "K", "L2 1s", "L2 2s", "L2 3s", "L2 4s", "L2 mean", "unparsable", "L2 vs AR (95 %)", "PDMS",
           "DS", "DS held-out", "SR %", "traffic response", "mAP", "QA acc %", "tokens/s", "x AR", "fwd/token", "top-5 vs teacher")


def number_order_text(decoding: dict) -> str:
    """How the report's trajectory digits were committed (reports written before the option: confidence order)."""
    if decoding.get("number_order", False):
        return "trajectory digits most significant first (number order) unless a row says otherwise"
    return "trajectory digits in confidence order"


def _f(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ar_reference(models: list, m: dict, usable) -> Optional[dict]:
    """The AR model a row is compared with: the first B = 1 model for which `usable` holds and of the
    same parameter count as `m` (nano-S AR for nano-S rows), else the first usable B = 1 model."""
    ars = [a for a in models if a.get("block_size") == 1 and usable(a)]
    same = [a for a in ars if a.get("parameters") == m.get("parameters")]
    return (same or ars or [None])[0]


def gap_text(gap: Optional[dict]) -> str:
    """'+5.6 % (-4.7 to +17.8)' from a wam_diff_training.report.l2_gap.gap_to_reference result."""
    if not gap:
        return "-"
    lo, hi = gap["gap_ci"]
    return f"{100 * gap['gap']:+.1f} % ({100 * lo:+.1f} to {100 * hi:+.1f})"


def model_row(r: dict, ar_tokens_per_s: Optional[float], speed: Optional[dict] = None) -> list[str]:
    plan = r.get("open_loop", {}).get("planning") or {}
    scores = plan.get("scores") or {}
    l2 = scores if "l2_mean" in scores else {}
    pdm = (scores.get("pdm") or {}).get("pdms") if scores else None
    det = ((r.get("open_loop", {}).get("detection") or {}).get("scores") or {}).get("map")
    qa = ((r.get("open_loop", {}).get("qa") or {}).get("scores") or {}).get("accuracy")
    cl = r.get("closed_loop") or {}
    tps = (speed or {}).get("tokens_per_s", plan.get("tokens_per_s"))
    fpt = (speed or {}).get("forwards_per_token", plan.get("forwards_per_token"))
    agree = (r.get("agreement") or {}).get("top5")
    invalid = None
    if plan:
        invalid = f"{plan['samples'] - l2.get('samples', 0)}/{plan['samples']}"
    ratio = None if (tps is None or not ar_tokens_per_s) else tps / ar_tokens_per_s
    return [r["name"], str(r.get("block_size", "-")), str(plan.get("steps", "-")),
            _f(l2.get("l2_1.0s")), _f(l2.get("l2_2.0s")), _f(l2.get("l2_3.0s")), _f(l2.get("l2_4.0s")),
            _f(l2.get("l2_mean")), invalid or "-", gap_text(r.get("l2_gap")), _f(pdm if pdm is None else 100.0 * pdm, 1),
            _f(cl.get("driving_score"), 1), _f(cl.get("held_out_driving_score"), 1), _f(cl.get("success_rate"), 1),
            _f(((r.get("sensitivity") or {}).get("all") or {}).get("response")),
            _f(det if det is None else 100.0 * det, 1), _f(qa, 1), _f(tps, 0), _f(ratio, 2),
            _f(fpt, 3), _f(agree, 3)]


def baseline_row(name: str, cl: dict) -> list[str]:
    """A baseline's closed-loop columns, and its open-loop planning ones where it has them."""
    row = ["-"] * len(COLUMNS)
    row[0] = name
    plan = (cl.get("open_loop") or {}).get("planning")
    if plan:
        full = model_row({"name": name, "open_loop": {"planning": plan}}, None)
        for col in ("L2 1s", "L2 2s", "L2 3s", "L2 4s", "L2 mean", "unparsable", "PDMS"):
            row[COLUMNS.index(col)] = full[COLUMNS.index(col)]
    row[COLUMNS.index("DS")] = _f(cl.get("driving_score"), 1)
    row[COLUMNS.index("DS held-out")] = _f(cl.get("held_out_driving_score"), 1)
    row[COLUMNS.index("SR %")] = _f(cl.get("success_rate"), 1)
    return row


def scenario_table(models: list, baselines: dict) -> str:
    """DS per scenario type, one row per model or baseline that has them ('' when none has)."""
    named = [(m["name"], m.get("closed_loop") or {}) for m in models] + list(baselines.items())
    named = [(n, cl) for n, cl in named if cl.get("per_scenario")]
    if not named:
        return ""
    scenarios = sorted({s for _, cl in named for s in cl["per_scenario"]})
    rows = [[n] + [_f(cl["per_scenario"].get(s), 1) for s in scenarios] + [_f(cl.get("driving_score"), 1),
                                                                          str(cl.get("collisions", "-"))]
            for n, cl in named]
    return markdown_table(("model",) + tuple(scenarios) + ("all", "collisions"), rows)


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render(report: dict) -> str:
    """The whole markdown document of a report dict (written by wam_diff_training.report.report.Report.run)."""
    models = report["models"]
    speed = (report.get("speed") or {}).get("models", {})

    def tps(m):
        return (speed.get(m["name"]) or {}).get("tokens_per_s") or (m.get("open_loop", {}).get("planning") or {}).get("tokens_per_s")

    rows = []
    for m in models:
        ref = ar_reference(models, m, tps)
        rows.append(model_row(m, tps(ref) if ref else None, speed.get(m["name"])))
    rows += [baseline_row(name, cl) for name, cl in report.get("baselines", {}).items()]
    out = [f"# Model report\n\nSpec: `{report['spec']}`; machine: {report['machine']}; "
           f"written {report['written']}.\n",
           "Open loop on evenly spaced validation samples, decoded one at a time (batch 1); "
           f"decoding: {report['decoding']['strategy']}, threshold {report['decoding']['threshold']}, "
           f"{number_order_text(report['decoding'])}, "
           "K = denoising steps per block (B = 1: one token per forward). L2 in metres over the plans "
           "that parse; unparsable = plans that did not. L2 vs AR: the relative gap of the mean L2 to the AR model of "
           "the same parameter count on the plans both parse, with its paired bootstrap 95 % interval. PDMS and mAP in %. DS / SR: closed loop on "
           f"{report.get('closed_loop_routes', 'the route suite')}; DS held-out: over the suite's validation-split "
           "routes, which no training data (DAgger's included) drove. Traffic response (`wam-diff sensitivity`): "
           "how much the model's 4 s waypoint comes nearer with the traffic in its frame than without, over the "
           "expert's (1: slows like the expert, 0: ignores the traffic). tokens/s and fwd/token: "
           + (f"one speed pass over {report['speed']['samples']} planning samples at batch 1, the models taking "
              f"turns per sample ({report['speed']['threads']} torch threads)" if report.get("speed") else
              "from the open-loop planning decode") +
           "; x AR: over the B = 1 model with the same parameter count. Top-5: agreement with the model's "
           "teacher on the same corrupted validation sequences.\n",
           markdown_table(COLUMNS, rows)]
    by_scenario = scenario_table(models, report.get("baselines", {}))
    if by_scenario:
        out.append("\n## Closed loop by scenario\n\nDS per scenario type; collisions: routes with a vehicle "
                   "collision.\n\n" + by_scenario)
    for kind, sweep in report.get("sweeps", {}).items():
        if kind == "steps":
            head = ("K", "L2 mean", "unparsable %", "tokens/s", "fwd/token")
            body = [[str(p["steps"]), _f(p["l2_mean"]), _f(100.0 * p["invalid_share"], 1), _f(p["tokens_per_s"], 0),
                     _f(p["forwards_per_token"], 3)] for p in sweep["points"]]
        else:
            head = ("B", "K", "L2 mean", "unparsable %", "tokens/s", "fwd/token")
            body = [[str(p["block_size"]), str(p["steps"]), _f(p["l2_mean"]), _f(100.0 * p["invalid_share"], 1),
                     _f(p["tokens_per_s"], 0), _f(p["forwards_per_token"], 3)] for p in sweep["points"]]
        out.append(f"\n## Sweep over {kind.replace('_', ' ')}: {sweep['model']}\n\n" + markdown_table(head, body))
    if report.get("plots"):
        out.append("\n## Plots\n\n" + "\n".join(f"![{name}]({path})" for name, path in report["plots"].items()))
    return "\n".join(out) + "\n"
