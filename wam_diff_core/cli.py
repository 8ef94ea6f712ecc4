"""`wam-diff` command line: one sub-command per module, imported lazily so start-up stays fast.

Each sub-command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .console import console_main

# name -> (module, one-line help)
COMMANDS = {
    "bench": ("wam_diff_core.bench", "speed, entries interleaved: decoding configurations; --compare: whole plans "
                                        "of checkpoints with L2; --profile: one plan phase by phase; "
                                        "--candidates: what N candidate plans cost"),
    "demo": ("wam_diff_core.demo", "run the main job on the embedded default"),
    "decode": ("wam_diff_core.decode_cli", "decode one prompt (image + ego state) and print the plan"),
    "data": ("wam_diff_core.sim.datagen", "generate planning/detection/QA datasets from the embedded world "
                                          "(--nuscenes DATAROOT: from a nuScenes release)"),
    "dagger": ("wam_diff_core.sim.dagger", "planning data on the states a learned policy reaches, labelled by the expert"),
    "counterfactual": ("wam_diff_core.sim.counterfactual", "planning pairs that differ only in the traffic in view (expert-labelled)"),
    "sensitivity": ("wam_diff_core.sim.sensitivity", "does a planner slow down for the traffic it sees? (counterfactual frames)"),
    "drive": ("wam_diff_core.sim.closed_loop", "closed-loop driving on the embedded route suite"),
    "score": ("wam_diff_core.eval.score_cli", "re-score saved closed-loop results, or an official leaderboard / Bench2Drive result file "
                                            "(--nuscenes SPLIT.json: open-loop L2 and collisions on nuScenes)"),
    "compare-drives": ("wam_diff_core.eval.compare_drives", "closed-loop runs side by side: table, JSON and plot"),
    "expert-probe": ("wam_diff_core.sim.expert_probe", "policies' plans beside the expert's on a route it drives"),
    "evaluate": ("wam_diff_core.evaluate", "detection mAP, QA accuracy per template and planning L2 of models on a "
                                           "validation split: table + JSON"),
}
# (command, flag) -> the module that serves `wam-diff COMMAND FLAG ...` instead of the command's own
VARIANTS = {
    ("data", "--nuscenes"): "wam_diff_core.nuscenes.convert",
    ("score", "--nuscenes"): "wam_diff_core.nuscenes.score",
    ("bench", "--compare"): "wam_diff_core.bench.compare",
    ("bench", "--profile"): "wam_diff_core.bench.profile",
    ("bench", "--candidates"): "wam_diff_core.bench.candidates",
}


def variant(name: str, rest: list[str]) -> str | None:
    """The module of VARIANTS whose flag is among a command's arguments, None when none is."""
    for (command, flag), module in VARIANTS.items():
        if command == name and any(a == flag or a.startswith(flag + "=") for a in rest):
            return module
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wam-diff", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


@console_main("wam-diff", subcommands=True)
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; expected one of {sorted(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module_name = variant(name, rest) or module_name
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"wam-diff {name}: error: not available in this installation ({module_name} missing)", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"wam-diff {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
