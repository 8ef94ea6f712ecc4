"""Open-loop evaluation of one model: decode evenly spaced validation samples one at a time (the
planner's batch of one), keep the texts and the decode clock, score them with the project's metrics.

Predictions are written as `{"id", "text"}` JSONL, the form `wam-diff score --predictions` reads, so
every number in the report can be recomputed from files.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig, step_count
from wam_diff_core.decoding.constraint import planning_constraint
from wam_diff_core.eval.score_cli import score_open_loop
from wam_diff_core.model.checkpoint import LoadedModel
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.policy import TASK_BUDGET

from ..data import DrivingDataset, Example, spaced_examples
from ..evaluate import decoder_config as evaluate_decoder_config
from ..evaluate import prompt_batch


def decoder_config(block_size: int, steps: int, strategy: str, threshold: float, max_new_tokens: int,
                   number_order: bool = True, kinematic_envelope: bool = True, forward_only: bool = False) -> DecoderConfig:
    """B = 1 decodes one token per forward; otherwise at most `steps` denoising steps per block."""
    return evaluate_decoder_config(block_size, step_count(block_size, steps), strategy, threshold, max_new_tokens,
                                   number_order=number_order, kinematic_envelope=kinematic_envelope,
                                   forward_only=forward_only)


@dataclass
class Decoded:
    predictions: list[dict]  # {"id", "text", "finished"}
    tokens: int  # answer tokens produced, EOS included
    forwards: int
    seconds: float  # wall time of the decoder calls (vision + prefill + denoising)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(1e-9, self.seconds)

    @property
    def forwards_per_token(self) -> float:
        return self.forwards / max(1, self.tokens)


def load_split(path: str | Path, loaded: LoadedModel, task: str, limit: int) -> list[Example]:
    """`limit` evenly spaced usable samples of `task` in a split file (skips counted by the dataset)."""
    ds = DrivingDataset(path, loaded.processor, 1 << 16, 1 << 16, "skip", tasks=[task],
                        trajectory_format=loaded.settings.trajectory_format, route_targets=loaded.settings.prompt_route_targets)
    if len(ds) == 0:
        raise ValueError(f"{path}: no usable {task!r} samples (skipped: {ds.stats.skipped})")
    return spaced_examples(ds, limit)


def decode_examples(loaded: LoadedModel, examples: Sequence[Example], cfg: DecoderConfig, desc: str = "",
                    progress: bool = True) -> Decoded:
    """Decode each example alone (batch 1) with the block decoder; time only the decoder calls."""
    runner = ModelRunner(loaded.model, cfg.backend)
    settings, processor = loaded.settings, loaded.processor
    pad_id = loaded.pad_token_id
    preds, tokens, forwards, seconds = [], 0, 0, 0.0
    for x in tqdm(examples, desc=desc, unit="sample", disable=not progress, leave=False):
        batch = prompt_batch([x], pad_id).to(runner.device)
        t0 = time.perf_counter()
        grammar = planning_constraint(processor.tokenizer, settings, [x.task], cfg.answer_positions,
                                      runner.vocab_size, runner.device, [x.ego] if cfg.kinematic_envelope else None,
                                      cfg.forward_only)
        res = generate(runner, batch, cfg, settings.mask_token_id, settings.eos_token_id, grammar)
        seconds += time.perf_counter() - t0
        tokens += res.tokens
        forwards += res.forwards
        preds.append({"id": x.sample_id, "text": processor.decode(res.token_ids[0]), "finished": res.finished[0]})
    return Decoded(preds, tokens, forwards, seconds)


def decode_in_turns(runs: Sequence[tuple[LoadedModel, DecoderConfig, Sequence[Example]]]) -> list[Decoded]:
    """Each (model, decoder config, examples) of `runs` decodes its examples (the same samples for every run, each
    encoded as its model is asked them), taking turns example by example (so load on the machine falls on all of
    them alike): their summed clocks, one per run (no predictions kept)."""
    counts = {len(examples) for _, _, examples in runs}
    if len(counts) > 1:
        raise ValueError(f"runs hold different numbers of examples {sorted(counts)}; expected the same samples")
    totals = [Decoded([], 0, 0, 0.0) for _ in runs]
    for i in range(counts.pop() if counts else 0):
        for (loaded, cfg, examples), acc in zip(runs, totals):
            one = decode_examples(loaded, [examples[i]], cfg, progress=False)
            acc.tokens += one.tokens
            acc.forwards += one.forwards
            acc.seconds += one.seconds
    return totals


def write_predictions(path: Path, decoded: Decoded) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": p["id"], "text": p["text"]}) + "\n" for p in decoded.predictions))


def evaluate_task(loaded: LoadedModel, split: str, task: str, limit: int, block_size: int, steps: int,
                  strategy: str, threshold: float, out_dir: Path, tag: str, progress: bool = True,
                  examples: Optional[list[Example]] = None, max_new_tokens: Optional[int] = None,
                  number_order: bool = True) -> dict:
    """Decode + score one task of one split; writes OUT/predictions/<tag>_<task>.jsonl."""
    examples = examples if examples is not None else load_split(split, loaded, task, limit)
    cfg = decoder_config(block_size, steps, strategy, threshold, max_new_tokens or TASK_BUDGET[task], number_order,
                         forward_only=loaded.settings.decoding.forward_only)
    decoded = decode_examples(loaded, examples, cfg, desc=f"{tag} {task}", progress=progress)
    pred_path = out_dir / "predictions" / f"{tag}_{task}.jsonl"
    write_predictions(pred_path, decoded)
    scores = score_open_loop(Path(split), pred_path)
    return {
        "task": task, "samples": len(examples), "block_size": cfg.block_size, "steps": cfg.steps,
        "strategy": cfg.strategy, "threshold": cfg.threshold, "number_order": cfg.number_order,
        "unfinished": sum(not p["finished"] for p in decoded.predictions),
        "tokens": decoded.tokens, "seconds": decoded.seconds, "tokens_per_s": decoded.tokens_per_s,
        "forwards_per_token": decoded.forwards_per_token, "scores": scores.get(task), "predictions": str(pred_path),
    }


def constant_velocity_planning(split: str, examples: Sequence[Example], out_dir: Path) -> dict:
    """The constant-velocity baseline on the models' planning samples: each plan keeps the sample's ego
    velocity (meta.ego vx, vy) for the horizon, scored like a model's predictions (L2, PDMS). Writes
    OUT/predictions/baseline_constant-velocity_planning.jsonl."""
    from wam_diff_core.codec import format_trajectory
    from wam_diff_core.constants import NUM_WAYPOINTS, WAYPOINT_DT_S

    samples = {s["id"]: s for s in json.loads(Path(split).read_text())}
    t = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
    preds = []
    for x in examples:
        ego = (samples.get(x.sample_id) or {}).get("meta", {}).get("ego")
        if not ego or len(ego) < 2:
            raise ValueError(f"{split}: sample {x.sample_id!r} has no meta.ego [vx, vy, ...] for the constant-velocity baseline")
        preds.append({"id": x.sample_id, "text": format_trajectory(np.stack([ego[0] * t, ego[1] * t], axis=1)),
                      "finished": True})
    pred_path = out_dir / "predictions" / "baseline_constant-velocity_planning.jsonl"
    write_predictions(pred_path, Decoded(preds, 0, 0, 0.0))
    return {"task": "planning", "samples": len(preds), "scores": score_open_loop(Path(split), pred_path).get("planning"),
            "predictions": str(pred_path)}
