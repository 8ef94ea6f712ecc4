"""Why detection fails: the numbers beside a `wam-diff evaluate` run, written as one JSON.

    .venv/bin/python scripts/detection_diagnosis.py --evaluate runs/evaluate_shipped \\
        --data runs/nano_s/data_all --recipe wam_diff_training/recipes/nano_s.yaml \\
        --model models/nano-s-b32 --out results/ablations/detection_diagnosis/diagnosis.json

Reads (nothing is decoded here):
- the training mix: for each training step of the recipe, its optimizer steps, batch and dataset weights, so the
  detection (and QA) samples and answer tokens each model saw, and the detection samples the trainer skips for a
  response over data.max_response_tokens;
- the frame, the box scale and the vision patches: pixels per box unit, pixels per merged visual token, the size
  of a car's box, and the IoU a box keeps when its centre is off by a few pixels;
- the answers of the evaluate run: where the first JSON error of each unparsable detection answer falls (token
  index, block of 32, position in the block), boxes whose corners are swapped (x2 < x1 or y2 < y1), boxes per
  answer, and for the planning answers nothing (they are under the trajectory grammar).
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from wam_diff_core.codec import BOX_SCALE, ParseError, parse_detections
from wam_diff_core.evaluate_detection import iou_matrix
from wam_diff_core.model.processor import VLProcessor
from wam_diff_core.policy import TASK_BUDGET
from wam_diff_core.text_confidence import token_ends
from wam_diff_training.config import load_config

BOX_RE = re.compile(r'"bbox_2d":\[(\d+),(\d+),(\d+),(\d+)\]')
STAGE_COMMANDS = ("ar", "adapt", "distill")


def _split(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def response_tokens(tokenizer, samples: list[dict]) -> dict[str, list[int]]:
    """Task -> answer lengths in tokens (EOS included); planning in the fixed style is one token a character."""
    out: dict[str, list[int]] = {}
    for s in samples:
        text = s["conversations"][1]["value"]
        n = 128 if s["task"] == "planning" else len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
        out.setdefault(s["task"], []).append(n)
    return out


def training_mix(recipe: Path, tokens: dict[str, list[int]], max_response: int) -> dict:
    """Per training step of the recipe: steps x batch draws, the share of detection / QA draws (MixSampler draws
    datasets in proportion to their weights alone), and the share of answer tokens."""
    mean_tokens = {t: float(np.mean([n for n in v if n <= max_response])) for t, v in tokens.items()}
    rows = []
    for step in yaml.safe_load(recipe.read_text())["steps"]:
        argv = shlex.split(step["run"])
        if argv[0] != "wam-diff-train" or argv[1] not in STAGE_COMMANDS:
            continue
        cfg = load_config(argv[argv.index("--config") + 1])
        steps = int(argv[argv.index("--max-steps") + 1])
        chain = len(cfg.block_sizes) if argv[1] == "adapt" else 1
        weights = Counter()
        for entry in cfg.data.train:
            weights[entry.get("task", "planning")] += float(entry.get("weight", 1.0))
        total = sum(weights.values())
        tok_total = sum(w * mean_tokens[t] for t, w in weights.items())
        draws = steps * chain * cfg.train.batch_size * cfg.train.grad_accum
        rows.append({"step": step["name"], "kind": argv[1], "optimizer_steps": steps * chain, "draws": draws,
                     "detection_share": weights["detection"] / total, "qa_share": weights["qa"] / total,
                     "detection_draws": draws * weights["detection"] / total,
                     "detection_token_share": weights["detection"] * mean_tokens["detection"] / tok_total})
    return {"mean_answer_tokens": mean_tokens, "steps": rows}


def lineage(rows: list[dict], names: list[str]) -> dict:
    picked = [r for r in rows if r["step"] in names]
    draws = sum(r["draws"] for r in picked)
    det = sum(r["detection_draws"] for r in picked)
    return {"steps": names, "optimizer_steps": sum(r["optimizer_steps"] for r in picked), "draws": draws,
            "detection_draws": det, "detection_share": det / draws}


def geometry(model: Path, boxes: np.ndarray, frame: tuple[int, int]) -> dict:
    """Box units, pixels and visual tokens of the frame; the IoU of a median car box shifted by a few pixels."""
    pre = json.loads((model / "preprocessor_config.json").read_text())
    token_px = pre["patch_size"] * pre["merge_size"]
    w, h = frame
    px = boxes / BOX_SCALE * np.array([w, h, w, h])
    size = np.median(px[:, 2:] - px[:, :2], axis=0)
    base = np.array([[0.0, 0.0, size[0], size[1]]])
    shifts = {}
    for axis, name in ((0, "x"), (1, "y")):
        for d in (1, 2, 3, 5, 8):
            moved = base.copy()
            moved[0, [axis, axis + 2]] += d
            shifts[f"{name}+{d}px"] = float(iou_matrix(base, moved)[0, 0])
    return {"frame_px": [w, h], "patch_px": pre["patch_size"], "merged_token_px": token_px,
            "visual_tokens": [w // token_px, h // token_px], "box_units_per_px": [BOX_SCALE / w, BOX_SCALE / h],
            "median_car_box_px": size.round(2).tolist(), "car_share_of_a_token_area": float(size.prod() / token_px**2),
            "iou_of_median_car_box_shifted": shifts}


def json_error_positions(tokenizer, rows: list[dict], block: int) -> dict:
    """Where the first JSON error of each unparsable answer sits, in tokens: its index, block and position in it;
    the commonest answer lengths (tokens, EOS included; "cut": no EOS within the budget); boxes read."""
    where, kinds, swapped, boxes, per_answer, lengths = [], Counter(), 0, 0, [], Counter()
    for row in rows:
        text = row["text"]
        lengths[len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 if row["finished"] else "cut"] += 1
        found = BOX_RE.findall(text)
        per_answer.append(len(found))
        for x1, y1, x2, y2 in found:
            boxes += 1
            swapped += int(int(x2) < int(x1) or int(y2) < int(y1))
        parsed = parse_detections(text, (BOX_SCALE, BOX_SCALE))
        if not isinstance(parsed, ParseError):
            continue
        kinds[parsed.kind] += 1
        try:
            json.loads(text)
            continue  # valid JSON, a bad box
        except json.JSONDecodeError as err:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            ends = token_ends(tokenizer, ids)
            index = next((i for i, e in enumerate(ends) if e > err.pos), len(ids))
            where.append(index)
    idx = np.array(where)
    return {"answers": len(rows), "answer_tokens_commonest": {str(k): v for k, v in lengths.most_common(5)},
            "parse_errors": dict(kinds.most_common()), "json_errors": len(where),
            "first_error_token_p50": float(np.median(idx)) if len(idx) else None,
            "first_error_block": dict(Counter(int(i) // block for i in where).most_common()),
            "first_error_position_in_block": dict(Counter(int(i) % block for i in where).most_common(8)),
            "boxes_read": boxes, "boxes_with_swapped_corners_share": swapped / boxes if boxes else None,
            "boxes_per_answer_mean": float(np.mean(per_answer)) if per_answer else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evaluate", required=True, type=Path, help="a `wam-diff evaluate` output directory")
    ap.add_argument("--data", required=True, type=Path, help="the detection/QA data directory (train.json, val.json)")
    ap.add_argument("--recipe", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path, help="a checkpoint: its tokenizer and vision patches")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    tok = VLProcessor.from_pretrained(args.model).tokenizer
    train, val = _split(args.data / "train.json"), _split(args.data / "val.json")
    max_response = load_config("wam_diff_training/configs/nano_s.yaml").data.max_response_tokens
    train_tokens, val_tokens = response_tokens(tok, train), response_tokens(tok, val)
    mix = training_mix(args.recipe, train_tokens, max_response)
    ar = ["ar", "ar_dagger1", "ar_dagger3", "ar_final"]
    b32 = ["ar", "adapt", "distill", "distill_dagger1", "distill_dagger2", "distill_final1", "distill_final2",
           "distill_final3"]
    det_val = [s for s in val if s["task"] == "detection"]
    boxes = np.array([[float(v) for v in b] for s in det_val for b in BOX_RE.findall(s["conversations"][1]["value"])])
    frame = tuple(det_val[0]["meta"]["frame_size"])
    lengths = {name: {"train_detection_over_max_response": int(np.sum(np.array(t["detection"]) > max_response)),
                      "train_detection": len(t["detection"])} for name, t in (("train", train_tokens),)}
    budget = TASK_BUDGET["detection"]
    vd = np.array(val_tokens["detection"])
    answers = {}
    report = json.loads((args.evaluate / "evaluate.json").read_text())
    for m in report["models"]:
        slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(m["model"]).name)
        rows = [json.loads(line) for line in (args.evaluate / "predictions" / f"{slug}_detection.jsonl").read_text().splitlines()]
        answers[m["model"]] = json_error_positions(tok, rows, args.block)
    out = {"training_mix": mix, "ar_lineage": lineage(mix["steps"], ar), "b32_lineage": lineage(mix["steps"], b32),
           "detection_samples": {"train": len(train_tokens["detection"]), "val": len(vd),
                                 "train_skipped_over_max_response_tokens": lengths["train"]["train_detection_over_max_response"],
                                 "max_response_tokens": max_response},
           "answer_length_vs_budget": {"budget": budget, "val_reference_tokens_mean": float(vd.mean()),
                                       "val_reference_tokens_p90": float(np.percentile(vd, 90)),
                                       "val_reference_tokens_max": int(vd.max()),
                                       "val_references_over_budget": int((vd > budget).sum()),
                                       "tokens_per_box": float(np.polyfit(
                                           [len(BOX_RE.findall(s["conversations"][1]["value"])) for s in det_val], vd, 1)[0]),
                                       "boxes_per_frame_mean": float(len(boxes) / len(det_val))},
           "geometry": geometry(args.model, boxes, frame), "answers": answers}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
