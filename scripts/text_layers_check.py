"""The fast text layers on the eager decode path, on a planning split: are the plans the same, and how much
faster? One model, one runner, each sample decoded with the model's own layers and with `kernels.fast_layers`
in turn (alternating which goes first), as the policy decodes (dynamic remasking, the trajectory grammar, the
kinematic envelope).

    .venv/bin/python scripts/text_layers_check.py --model models/nano-s-b32 --data runs/fast/data_v1/val.json \\
        --samples 400 --out kernels/results/cpu_v33/text_layers_eager.json

Prints and writes: plans compared, plans identical, ms per plan per kind (decoder calls only) and the ratio.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.l2_gap import STRATEGY, THRESHOLD  # noqa: E402
from training.report.open_loop import decoder_config, load_split, prompt_batch  # noqa: E402
from wam_diff_core.decoding.block_diffusion import generate  # noqa: E402
from wam_diff_core.decoding.constraint import planning_constraint  # noqa: E402
from wam_diff_core.model.settings import TEXT_LAYERS, steps_for_block  # noqa: E402
from wam_diff_core.model.runner import ModelRunner  # noqa: E402
from wam_diff_core.policy import TASK_BUDGET  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--data", required=True, help="planning validation split (wam-diff data val.json)")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", default="fast", choices=[k for k in TEXT_LAYERS if k != "model"])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.samples < 1:
        raise SystemExit(f"--samples must be >= 1, got {args.samples}")
    from wam_diff_core.model.checkpoint import load_model

    loaded = load_model(args.model)
    s, proc = loaded.settings, loaded.processor
    B = s.trained_block_size
    base = decoder_config(B, steps_for_block(B, args.steps), STRATEGY, THRESHOLD, TASK_BUDGET["planning"], True, True,
                          s.decoding.forward_only)
    examples = load_split(args.data, loaded, "planning", args.samples)
    runner = ModelRunner(loaded.model, "sdpa")
    kinds = ("model", args.layers)
    with runner.text_layers(args.layers):  # built once, off the clock
        pass
    seconds, same = dict.fromkeys(kinds, 0.0), 0
    for i, x in enumerate(tqdm(examples, desc="plans", unit="plan")):
        batch = prompt_batch([x], loaded.pad_token_id)
        texts = {}
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            cfg = dataclasses.replace(base, text_layers=kind)
            t0 = time.perf_counter()
            grammar = planning_constraint(proc.tokenizer, s, [x.task], cfg.answer_positions, runner.vocab_size,
                                          runner.device, [x.ego], cfg.forward_only)
            res = generate(runner, batch, cfg, s.mask_token_id, s.eos_token_id, grammar)
            seconds[kind] += time.perf_counter() - t0
            texts[kind] = proc.decode(res.token_ids[0])
        same += texts["model"] == texts[args.layers]
    n = len(examples)
    result = {"model": args.model, "data": args.data, "plans": n, "identical_plans": same,
              "block_size": B, "steps": base.steps, "strategy": STRATEGY, "threads": torch.get_num_threads(),
              "ms_per_plan": {k: 1000 * v / n for k, v in seconds.items()},
              "speedup": seconds["model"] / seconds[args.layers]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{n} plans, {same} identical; ms per plan: model {result['ms_per_plan']['model']:.1f}, "
          f"{args.layers} {result['ms_per_plan'][args.layers]:.1f} ({result['speedup']:.2f}x); {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
