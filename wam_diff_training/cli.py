"""`wam-diff-train`: the conversion stages behind one command (YAML config + command-line overrides).

  wam-diff-train ar      --config wam_diff_training/configs/nano_ar.yaml [--init nano] [--out runs/x]
  wam-diff-train adapt   --config ... --init runs/x/ar/model --block-sizes 4,8,16,32
  wam-diff-train distill --config ... --teacher CKPT --teacher-block-size 16 --student CKPT --block-size 32
  wam-diff-train plot    --out runs/x            (loss curve of every stage: PNG + JSON)
  wam-diff-train eval    --model CKPT --data VAL.json --steps 8     (decode + score a split)
  wam-diff-train speed   --init CKPT --data D --block-sizes 1,32 [--variants float32,bf16+compile+clean]
                         [--teacher CKPT]   (seconds per optimizer step)
  wam-diff-train recipe  wam_diff_training/recipes/nano_s.yaml [--resume]  (a model card's commands, timed)
  wam-diff-train average A B [C ...] --out DST [--weights 0.5,0.5]   (parameter average of one lineage)
  wam-diff-train provenance RUN_A RUN_B     (which recorded input or step output differs between two runs)
  wam-diff-train report  --spec wam_diff_training/configs/report.yaml --out runs/report [--resume] [--no-closed-loop]
                         (evaluate models: markdown table, plots, JSON)
  wam-diff-train l2-gap | speed-pass | balance-waits | bending-samples | box-head ...   (see COMMANDS; each with --help)

Any config key can be set with `--set section.key=value` (repeatable); the named flags are shortcuts.
Runs under `torchrun --nproc_per_node N -m wam_diff_training.cli ...` as well (DDP; gloo on CPU).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Optional

import yaml

from wam_diff_core.console import console_main
from wam_diff_core.constants import SCHEDULES

from .config import Config, ConfigError, load_config, set_key, validate

STAGES = ("ar", "adapt", "distill")
# sub-commands in modules of their own, each exposing add_arguments(parser) and run(args) -> int (as `wam-diff`'s);
# imported only when named, so the stages start without them. name -> (module, one-line help)
COMMANDS = {
    "report": ("wam_diff_training.report.report", "evaluate models and write a markdown table, plots and JSON"),
    "l2-gap": ("wam_diff_training.report.l2_gap_cli", "planning L2 of several models on the same plans, paired intervals"),
    "speed-pass": ("wam_diff_training.report.speed_pass", "planning tokens/s of several decodings taking turns per sample"),
    "balance-waits": ("wam_diff_training.balance_waits", "junction waits rebalanced: DIR/train_balanced.json beside each file"),
    "bending-samples": ("wam_diff_training.bending_samples", "the planning samples whose target bends: DIR/train_bending.json"),
    "box-head": ("wam_diff_training.box_head", "train a checkpoint's box head on its frozen vision features"),
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (wam_diff_training/configs/*.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. optim.lr=1e-4 (repeatable)")
    p.add_argument("--out", help="output directory (config: out)")
    p.add_argument("--data", action="append", metavar="PATH[:WEIGHT]",
                   help="training dataset (repeatable; replaces data.train)")
    p.add_argument("--val", help="validation dataset (config: data.val)")
    p.add_argument("--max-steps", type=int, help="optimizer steps per stage (config: train.max_steps)")
    p.add_argument("--epochs", type=float, help="epochs per stage (config: train.epochs)")
    p.add_argument("--batch-size", type=int, help="micro-batch per process (config: train.batch_size)")
    p.add_argument("--lr", type=float, help="peak learning rate (config: optim.lr)")
    p.add_argument("--seed", type=int, help="config: train.seed")
    p.add_argument("--device", help="auto | cpu | cuda (config: train.device)")
    p.add_argument("--stop-after", type=int, help="stop this invocation after N steps, keeping a resume point")
    p.add_argument("--resume", action="store_true", help="continue from the stage's resume point; skip finished stages")
    p.add_argument("--overwrite", action="store_true", help="delete an existing stage directory and start over")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wam-diff-train", description="AR -> block-diffusion conversion stages")
    sub = parser.add_subparsers(dest="stage", required=True)
    ar = sub.add_parser("ar", help="train / fine-tune the B = 1 (autoregressive) model")
    _common(ar)
    ar.add_argument("--init", help="checkpoint directory or preset (config: model)")
    adapt = sub.add_parser("adapt", help="progressive block adaptation, one stage per block size")
    _common(adapt)
    adapt.add_argument("--init", help="the B = 1 (or previous) checkpoint (config: model)")
    adapt.add_argument("--block-sizes", help="comma-separated chain, e.g. 4,8,16,32 (config: block_sizes)")
    distill = sub.add_parser("distill", help="block-wise or model-wise distillation into a student")
    _common(distill)
    distill.add_argument("--teacher", help="teacher checkpoint (config: distill.teacher)")
    distill.add_argument("--teacher-block-size", type=int, help="default: the teacher's trained block size")
    distill.add_argument("--student", help="student initial checkpoint (config: model)")
    distill.add_argument("--block-size", type=int, help="student block size (config: block_size)")
    distill.add_argument("--ratio", type=float, help="loss = (1 - r) CE + r divergence (config: distill.ratio)")
    distill.add_argument("--on-policy-every", type=int, help="student generates the responses every N steps")
    plot = sub.add_parser("plot", help="loss curve of every stage under --out")
    plot.add_argument("--out", required=True)
    ev = sub.add_parser("eval", help="decode a validation split with a checkpoint; JSON metrics")
    ev.add_argument("--model", required=True, help="checkpoint directory")
    ev.add_argument("--data", required=True, help="validation dataset")
    ev.add_argument("--block-size", type=int, help="default: the checkpoint's trained block size")
    ev.add_argument("--steps", type=int, help="denoising steps K per block (default B)")
    ev.add_argument("--strategy", default="low_confidence_dynamic")
    ev.add_argument("--threshold", type=float, default=0.9)
    ev.add_argument("--max-samples", type=int, default=64)
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--json", help="write the metrics here")
    ex = sub.add_parser("export", help="rewrite a checkpoint in a compact dtype for shipping")
    ex.add_argument("src", help="checkpoint directory")
    ex.add_argument("dst", help="output directory (written atomically)")
    ex.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32")
    ex.add_argument("--steps", type=int, default=None, help="set the default denoising steps per block")
    ex.add_argument("--route-target", choices=("on", "off"), default=None,
                    help="whether the exported checkpoint's policies state route target points (default: as trained)")
    ex.add_argument("--schedule", choices=SCHEDULES, default=None,
                    help="set the default commit schedule per denoising step (default: kept)")
    ex.add_argument("--name", default=None, help="the model's name in its wam_diff.json (default: kept)")
    ex.add_argument("--version", default=None, help="the model's version in its wam_diff.json (default: kept)")
    ex.add_argument("--forward-only", choices=("on", "off"), default=None,
                    help="set whether the kinematic envelope keeps plans from stepping back (default: kept)")
    speed = sub.add_parser("speed", help="seconds per optimizer step by block size and step variant (table + JSON)")
    speed.add_argument("--init", default="nano", help="checkpoint directory or preset")
    speed.add_argument("--data", action="append", required=True, help="dataset file (repeatable)")
    speed.add_argument("--block-sizes", default="1,32")
    speed.add_argument("--steps", type=int, default=10)
    speed.add_argument("--warmup", type=int, default=2)
    speed.add_argument("--batch-size", type=int, default=8)
    speed.add_argument("--device", default="cpu")
    speed.add_argument("--threads", type=int)
    speed.add_argument("--variants", default="float32",
                       help="comma-separated: float32, or '+'-joined switches bf16, compile, clean (wam_diff_training/speed.py)")
    speed.add_argument("--teacher", help="distil B > 1 from this checkpoint (the distillation step)")
    speed.add_argument("--teacher-block-size", type=int, default=1)
    speed.add_argument("--json", help="write the result here")
    avg = sub.add_parser("average", help="weighted parameter average of checkpoints of one lineage (a model soup)")
    avg.add_argument("sources", nargs="+", help="checkpoint directories (two or more)")
    avg.add_argument("--out", required=True, help="output directory (written atomically)")
    avg.add_argument("--weights", help="comma-separated, one per source, normalised to sum 1 (default: uniform)")
    recipe = sub.add_parser("recipe", help="run a recipe's commands in order; wall times to OUT/recipe.json")
    recipe.add_argument("file", help="recipe YAML (wam_diff_training/recipes/*.yaml)")
    recipe.add_argument("--resume", action="store_true", help="skip steps whose 'done' path exists")
    recipe.add_argument("--only", help="comma-separated step names to run (the others are skipped)")
    prov = sub.add_parser("provenance", help="compare the digests two runs record (recipe.json, a stage's summary)")
    prov.add_argument("a", help="recipe.json, summary.json / run_config.json, or the directory holding one")
    prov.add_argument("b", help="the same for the other run")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def run_command(name: str, rest: list[str]) -> int:
    """One of COMMANDS: its module parses `rest` and runs."""
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"wam-diff-train {name}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(rest)) or 0)


def _data_entry(text: str) -> dict:
    """`path` or `path:weight`."""
    path, sep, weight = text.rpartition(":")
    if sep:
        try:
            return {"path": path, "weight": float(weight)}
        except ValueError:
            pass
    return {"path": text}


def config_from_args(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    cfg = load_config(args.config, overrides)
    simple = {"out": "out", "val": "data.val", "max_steps": "train.max_steps", "epochs": "train.epochs",
              "batch_size": "train.batch_size", "lr": "optim.lr", "seed": "train.seed", "device": "train.device",
              "stop_after": "train.stop_after", "init": "model", "student": "model", "block_size": "block_size",
              "teacher": "distill.teacher", "teacher_block_size": "distill.teacher_block_size",
              "ratio": "distill.ratio", "on_policy_every": "distill.on_policy_every", "block_sizes": "block_sizes"}
    extra = [f"{key}={getattr(args, name)}" for name, key in simple.items() if getattr(args, name, None) is not None]
    if args.data:
        cfg.data.train = [_data_entry(d) for d in args.data]
    if args.no_progress:
        extra.append("train.progress=false")
    for item in extra:
        key, text = item.split("=", 1)
        set_key(cfg, key, yaml.safe_load(text) if key not in ("out", "model", "data.val", "distill.teacher") else text)
    validate(cfg)
    return cfg


def stages_for(cfg: Config, command: str):
    from .trainer import Stage

    if command == "ar":
        return [Stage("ar", 1, cfg.model)]
    if command == "adapt":
        return [Stage(f"block{int(b)}", int(b), "") for b in cfg.block_sizes]
    if cfg.distill.teacher is None:
        raise ConfigError("distill needs --teacher (config: distill.teacher)")
    return [Stage("distill", cfg.block_size, cfg.model, cfg.distill.teacher, cfg.distill.teacher_block_size)]


def run(args: argparse.Namespace) -> int:
    if args.stage == "plot":
        from .plot import plot_run

        print(plot_run(Path(args.out)))
        return 0
    if args.stage == "eval":
        return run_eval(args)
    if args.stage == "export":
        from .export import export

        route_target = None if args.route_target is None else args.route_target == "on"
        forward = None if args.forward_only is None else args.forward_only == "on"
        out = export(args.src, args.dst, args.dtype, args.steps, route_target, args.schedule, forward,
                     name=args.name, version=args.version)
        print(f"exported: {out}")
        return 0
    if args.stage == "average":
        from .average import average, parse_weights

        print(f"averaged: {average(args.sources, args.out, parse_weights(args.weights, len(args.sources)))}")
        return 0
    if args.stage == "provenance":
        from .provenance import main as compare_runs

        return compare_runs(args.a, args.b)
    if args.stage == "recipe":
        from .recipe import main as run_recipe

        return run_recipe(args.file, args.resume, args.only)
    if args.stage == "speed":
        from .speed import run as run_speed

        return run_speed(args)
    cfg = config_from_args(args)
    if not cfg.data.train:
        raise ConfigError("no training data: give --data PATH or data.train in the config")
    _require_datasets([d["path"] if isinstance(d, dict) else d for d in cfg.data.train] + [cfg.data.val])
    from .distributed import cleanup, init_distributed
    from .trainer import run_stage

    ctx = init_distributed(cfg.train.device)
    try:
        init = cfg.model
        for stage in stages_for(cfg, args.stage):
            if args.stage == "adapt":
                stage.init = init
            final = run_stage(cfg, stage, ctx, resume=args.resume, overwrite=args.overwrite)
            if final is None:
                return 0  # stopped early on purpose (stop_after); --resume continues
            init = str(final)
            if ctx.is_main:
                print(f"[{stage.name}] checkpoint: {final}")
    finally:
        cleanup(ctx)
    return 0


def _require_datasets(paths: list) -> None:
    """Name a missing dataset file before any model is built or loaded."""
    from .data import require_dataset_file

    for path in paths:
        if path is not None:
            require_dataset_file(path)


def run_eval(args: argparse.Namespace) -> int:
    import json

    from wam_diff_core.model.checkpoint import load_model

    from .data import DrivingDataset, spaced_examples
    from .evaluate import evaluate

    _require_datasets([args.data])
    loaded = load_model(args.model)
    B = args.block_size or loaded.settings.trained_block_size
    val = DrivingDataset(args.data, loaded.processor, 1 << 16, 1 << 16, "skip",
                         trajectory_format=loaded.settings.trajectory_format, route_targets=loaded.settings.prompt_route_targets)
    metrics = evaluate(loaded.model, loaded.processor, loaded.settings, spaced_examples(val, args.max_samples), B,
                       args.steps, args.strategy, args.threshold, args.max_new_tokens)
    text = json.dumps(metrics, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


@console_main("wam-diff-train", subcommands=True)
def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
