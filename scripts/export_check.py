"""Compare an exported (compact dtype) checkpoint with the one it came from on the same planning samples:
`python scripts/export_check.py SRC DST SPLIT [--samples 64] [--out DIR]` prints L2, unparsable answers and how
many answers are identical, both decoded with the exported checkpoint's decoding defaults, and writes the
comparison as JSON (what the model card quotes)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from training.report.open_loop import evaluate_task, load_split
from wam_diff_core.model.checkpoint import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("split", help="planning split JSON (val.json of `wam-diff data`)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--out", default="runs/export_check")
    args = ap.parse_args()
    out = Path(args.out)
    rows, texts = {}, {}
    examples = d = None
    for tag, path in (("dst", args.dst), ("src", args.src)):
        loaded = load_model(path)
        examples = examples or load_split(args.split, loaded, "planning", args.samples)
        d = d or loaded.settings.decoding  # both decode at the exported checkpoint's operating point
        res = evaluate_task(loaded, args.split, "planning", args.samples, d.block_size, d.steps, d.strategy,
                            d.threshold, out, tag, progress=False, examples=examples)
        rows[tag] = {"path": path, "dtype": str(next(loaded.model.parameters()).dtype), "block_size": d.block_size,
                     "steps": d.steps, "l2_mean": (res["scores"] or {}).get("l2_mean"),
                     "unparsable": (res["scores"] or {}).get("invalid", 0)}
        texts[tag] = [json.loads(line)["text"] for line in open(res["predictions"])]
    same = sum(a == b for a, b in zip(texts["src"], texts["dst"]))
    result = {**rows, "samples": len(texts["src"]), "identical_answers": same}
    (out / "export_check.json").write_text(json.dumps(result, indent=2))
    print(f"src L2 {rows['src']['l2_mean']:.3f} unparsable {rows['src']['unparsable']} | "
          f"dst L2 {rows['dst']['l2_mean']:.3f} unparsable {rows['dst']['unparsable']} | "
          f"identical answers {same}/{len(texts['src'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
