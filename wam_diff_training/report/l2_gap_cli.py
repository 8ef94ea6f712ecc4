"""`wam-diff-train l2-gap`: planning L2 of several models on the same validation plans, with paired bootstrap
confidence intervals.

The report scores 64 plans per model; whether a B = 32 model's L2 is "within 5 % of AR" needs to know how far
that number moves with the plans drawn. This decodes the same `--samples` evenly spaced planning samples with
every model and resamples the plans (paired: one draw of plans for all models) to give each model's mean L2 and
its relative gap to the first model, with 95 % intervals (`wam_diff_training.report.l2_gap`). A gap is "within" the bound
when the whole interval lies below it, "outside" when the whole interval lies above it, else "undecided".

Each model decodes as every entry point does (`resolve_decoding`): its checkpoint's own settings (the "decoding"
section of its wam_diff.json), the decoding options given on the command line on top (`--steps`, `--strategy`,
`--forward-only`, ...; unset: the checkpoint's own), and the model spec's own suffixes on top of those: @K (K
denoising steps per block), @BxK (block size B and K) and :SCHEDULE (`linear` or `cosine`: how many positions
each denoising step commits, `wam_diff_core/decoding/remasking.py`). B = 1 takes one step per token whatever K.
The shipped models' files say K = 4 with the forward-only bound, so they need no option:

    wam-diff-train l2-gap --data runs/nano_s/data_plan/val.json --samples 1640 --out runs/l2_gap \\
        nano-s-ar=models/nano-s-ar nano-s-b32=models/nano-s-b32 "nano-s-b32 K8=models/nano-s-b32@8" \\
        "nano-s-b32 cosine=models/nano-s-b32:cosine"

Writes OUT/l2_gap.json, OUT/l2_gap.md (the table), OUT/l2_gap.png (L2 against horizon, 95 % bands) and the
predictions (OUT/predictions/<label>_planning.jsonl, reused with --resume: refused where decoded with another B,
K, schedule or forward-only bound than asked) with each decode's clock beside them (<label>_planning.decode.json:
those settings, tokens, seconds; tokens/s is each model's own pass, one after the other, not the interleaved
speed pass of `wam-diff-train speed-pass`). With --by-group also OUT/l2_by_group.{json,md}: each
model's mean L2 and along-track bias at 4 s per kind of plan (intersection, roundabout, road plans below / above
20 m/s; `wam_diff_training.report.groups`) on the same plans. Each model's row of l2_gap.json records the settings it
was decoded with ("decoding"); the top-level "decoding" holds the options given on the command line.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from wam_diff_core.constants import NUM_WAYPOINTS, SCHEDULES, WAYPOINT_DT_S
from wam_diff_core.decoding.config import DecoderConfig, resolve_decoding
from wam_diff_core.decoding.options import add_decoding_arguments, decoding_arguments
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.checkpoint import LoadedModel, load_model
from wam_diff_core.policy import TASK_BUDGET

from . import groups as plan_groups
from .l2_gap import BOUND, DRAWS, TAIL, compare, errors_by_id, ground_truth, plans_by_id
from .open_loop import decode_examples, load_split, write_predictions
from .outputs import write_outputs
from .spec import slugify


class ModelSpecError(WamDiffError, ValueError):
    """A model argument that cannot be served: malformed, a missing checkpoint, a label given twice, saved
    predictions decoded otherwise than asked, or no plan that every model parses."""


def parse_model(spec: str) -> tuple[str, str, Optional[int], Optional[int]]:
    """LABEL=CHECKPOINT_DIR[@K | @BxK] -> (label, path, block size B, steps K), B and K None where the spec
    names none (unset: the command line's, else the checkpoint's own)."""
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise ModelSpecError(f"{spec!r}: expected LABEL=CHECKPOINT_DIR[@K | @BxK]")
    block, steps = None, None
    head, at, tail = path.rpartition("@")
    if at and not Path(path).is_dir():
        parts = tail.split("x")
        if len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise ModelSpecError(f"{spec!r}: after '@' expected K or BxK (positive integers, e.g. 8 or 16x4), "
                                 f"got {tail!r}")
        path, steps = head, int(parts[-1])
        block = int(parts[0]) if len(parts) == 2 else None
    if not Path(path).is_dir():
        raise ModelSpecError(f"{spec!r}: checkpoint directory {path} not found")
    return label, path, block, steps


def split_schedule(spec: str) -> tuple[str, Optional[str]]:
    """SPEC[:SCHEDULE] -> (SPEC, schedule); None (unset) when the spec names none."""
    head, colon, tail = spec.rpartition(":")
    if colon and tail in SCHEDULES:
        return head, tail
    return spec, None


def model_decoding(loaded: LoadedModel, user: dict[str, Any], block_size: Optional[int] = None,
                   steps: Optional[int] = None, schedule: Optional[str] = None) -> DecoderConfig:
    """The planning decoding of one model spec: the checkpoint's own settings (its wam_diff.json), the command
    line's `user` options (DecoderConfig fields, `decoding_arguments`) on top, the spec's own B, K and schedule
    (None: unset) on top of those; the planning token budget unless the command line gives one."""
    own = {k: v for k, v in (("block_size", block_size), ("steps", steps), ("schedule", schedule)) if v is not None}
    return resolve_decoding(loaded.settings.decoding, **{"max_new_tokens": TASK_BUDGET["planning"], **user, **own})


def settings_of(cfg: DecoderConfig) -> dict[str, Any]:
    """The settings a decode ran with, for its row: the wam_diff.json decoding keys and the envelope."""
    return cfg.to_checkpoint() | {"kinematic_envelope": cfg.kinematic_envelope}


def markdown(result: dict) -> str:
    lines = [f"{result['plans']} planning samples of {result['data']} (paired across models; 95 % bootstrap "
             f"intervals, {DRAWS} draws); reference: {result['reference']}; bound: +{100 * result['bound']:.0f} %", "",
             "| model | B | K | L2 1s | L2 2s | L2 3s | L2 4s | L2 mean | 95 % | gap to reference | 95 % | within bound "
             f"| tokens/s | median per-plan difference | worst {100 * TAIL:.0f} % of plans' share of it |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    per_s = round(1.0 / WAYPOINT_DT_S)
    whole_seconds = [per_s * t - 1 for t in (1, 2, 3, 4)]  # the waypoints at 1, 2, 3 and 4 s
    for m in result["models"]:
        h = m["per_horizon"]
        cols = [f"{h[i]:.2f}" for i in whole_seconds]
        lo, hi = m["l2_mean_ci"]
        glo, ghi = m["gap_ci"]
        ref = m["label"] == result["reference"]
        tps = "-" if m.get("tokens_per_s") is None else f"{m['tokens_per_s']:.0f}"
        lines.append(f"| {m['label']} | {m['block_size']} | {m.get('steps') or '-'} | {' | '.join(cols)} | "
                     f"{m['l2_mean']:.2f} | {lo:.2f}-{hi:.2f} | "
                     + ("- | - | - |" if ref else f"{100 * m['gap']:+.1f} % | {100 * glo:+.1f} to {100 * ghi:+.1f} % | "
                                                   f"{m['verdict']} |") + f" {tps} | "
                     + ("- | - |" if ref else f"{m['median_diff']:+.2f} m | {share_text(m['tail_share'])} |"))
    others = [m for m in result["models"] if m["label"] != result["reference"]]
    if others:
        lines += ["", "Paired difference to the reference by horizon (m, model minus reference; 95 % interval):", "",
                  "| model | 1s | 2s | 3s | 4s |", "| --- | --- | --- | --- | --- |"]
        for m in others:
            d, ci = m["per_horizon_diff"], m["per_horizon_diff_ci"]
            cells = [f"{d[i]:+.2f} ({ci[i][0]:+.2f} to {ci[i][1]:+.2f})" for i in whole_seconds]
            lines.append(f"| {m['label']} | {' | '.join(cells)} |")
    worst = [m for m in result["models"] if m["label"] != result["reference"] and m.get("worst")]
    if worst:
        lines += ["", "Largest per-plan differences (mean L2 over the horizon, m):", "",
                  "| model | plan | reference | model |", "| --- | --- | --- | --- |"]
        lines += [f"| {m['label']} | {w['id']} | {w['reference']:.2f} | {w['model']:.2f} |" for m in worst for w in m["worst"]]
    return "\n".join(lines) + "\n"


def share_text(share: Optional[float]) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in result["models"]:
        ci = np.asarray(m["per_horizon_ci"])
        ax.plot(t, m["per_horizon"], marker="o", label=f"{m['label']} (B = {m['block_size']})")
        ax.fill_between(t, ci[:, 0], ci[:, 1], alpha=0.2)
    ax.set_xlabel("horizon (s)")
    ax.set_ylabel("L2 (m)")
    ax.set_title(f"planning L2 on {result['plans']} validation plans (95 % bands)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+",
                   help="LABEL=CHECKPOINT_DIR[@K | @BxK][:SCHEDULE] (its own decoding, on top of the options), "
                        "the first the reference")
    p.add_argument("--data", required=True, help="planning validation split (wam-diff data val.json)")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--bound", type=float, default=BOUND, help="relative gap bound (0.05: within 5 %%)")
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true", help="reuse predictions already in OUT/predictions")
    p.add_argument("--by-group", action="store_true",
                   help="also write OUT/l2_by_group.{json,md}: L2 and along-track bias per kind of plan")
    add_decoding_arguments(p)  # each unset: the checkpoint's own; a model's @K, @BxK, :SCHEDULE on top


def _decode_one(args: argparse.Namespace, out: Path, label: str, path: str, block: Optional[int],
                steps: Optional[int], schedule: Optional[str]) -> tuple[dict, Path]:
    """Decode (or, with --resume, reuse) one model's plans: (its row of the result so far, its predictions file).
    Refuses a resumed file decoded another way than asked."""
    user = decoding_arguments(args)
    loaded = load_model(path, device=args.device, dtype=user.pop("dtype", None))
    cfg = model_decoding(loaded, user, block, steps, schedule)
    pred_path = out / "predictions" / f"{slugify(label)}_planning.jsonl"
    clock_path = pred_path.with_suffix(".decode.json")
    if not (args.resume and pred_path.is_file()):
        examples = load_split(Path(args.data), loaded, "planning", args.samples)
        decoded = decode_examples(loaded, examples, cfg, desc=label)
        write_predictions(pred_path, decoded)
        clock = {"block_size": cfg.block_size, "steps": cfg.steps, "schedule": cfg.schedule,
                 "forward_only": cfg.forward_only, "tokens": decoded.tokens, "seconds": decoded.seconds,
                 "tokens_per_s": decoded.tokens_per_s, "forwards_per_token": decoded.forwards_per_token}
        clock_path.write_text(json.dumps(clock, indent=2) + "\n")
    clock = json.loads(clock_path.read_text()) if clock_path.is_file() else {}
    asked = (cfg.block_size, cfg.steps, cfg.schedule, cfg.forward_only)
    # a clock without schedule or forward_only predates them: linear, no forward-only bound
    found = (clock.get("block_size", cfg.block_size), clock.get("steps", cfg.steps), clock.get("schedule", "linear"),
             clock.get("forward_only", False))
    if found != asked:
        raise ModelSpecError(f"{label}: {pred_path} was decoded with B = {found[0]}, K = {found[1]}, schedule "
                             f"{found[2]}, forward only {found[3]}, asked for B = {asked[0]}, K = {asked[1]}, "
                             f"schedule {asked[2]}, forward only {asked[3]}; use another label or --out")
    return ({"label": label, "path": path, "block_size": cfg.block_size, "steps": cfg.steps,
             "schedule": cfg.schedule, "decoding": settings_of(cfg), "tokens_per_s": clock.get("tokens_per_s")},
            pred_path)


def run(args: argparse.Namespace) -> int:
    models = []
    for spec in args.models:
        spec, schedule = split_schedule(spec)
        models.append((*parse_model(spec), schedule))
    if len({m[0] for m in models}) != len(models):
        raise ModelSpecError("model labels must differ")
    out, split = Path(args.out), Path(args.data)
    truth = ground_truth(split)
    rows, errors = [], []
    for model in models:
        row, pred_path = _decode_one(args, out, *model)
        errs, invalid = errors_by_id(truth, pred_path)
        rows.append(row | {"invalid": len(invalid), "predictions": str(pred_path)})
        errors.append(errs)
    ids = sorted(set.intersection(*(set(e) for e in errors)))
    if not ids:
        raise ModelSpecError("no plan parses for every model")
    stats = compare([np.stack([e[i] for i in ids]) for e in errors], args.bound, ids=ids)
    result = {"data": str(split), "plans": len(ids), "reference": models[0][0], "bound": args.bound,
              "decoding": decoding_arguments(args),  # the options given; each model's own in its row
              "models": [r | s for r, s in zip(rows, stats)]}
    write_outputs(out, "l2_gap", result, markdown(result), plot)
    if args.by_group:
        write_by_group(out, split, truth, rows, ids)
    return 0


def write_by_group(out: Path, split: Path, truth: dict, rows: list[dict], ids: list[str]) -> None:
    kinds = plan_groups.groups_of_split(split)
    tables = {r["label"]: plan_groups.by_group(truth, plans_by_id(Path(r["predictions"]))[0], kinds, ids)
              for r in rows}
    write_outputs(out, "l2_by_group", {"data": str(split), "plans": len(ids), "groups": tables},
                  plan_groups.markdown(tables))
