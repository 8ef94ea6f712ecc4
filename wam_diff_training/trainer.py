"""One training stage: load, train for a number of optimizer steps, checkpoint, evaluate.

A stage writes into `<out>/<name>/`:
- `model/`: the final Hugging Face checkpoint, `wam_diff.json` with trained_block_size = B;
- `resume/`: the latest resume point while the stage runs (removed once `model/` is written);
- `run_config.json` (the resolved config and the digests of its inputs: data files, their frames, the initial
  checkpoint, the teacher; `wam_diff_training/provenance.py`), `metrics.jsonl` (one line per logged step), `tb/`
  (TensorBoard), `eval.json` (validation),
  `param_digest.rank<r>.txt` (a hash of the final parameters per process), `summary.json` (inputs,
  param_digest, validation metrics).
Resuming reloads weights, optimizer, scheduler and RNG states from `resume/` and continues the data
stream and the per-step noise exactly where they were (both depend only on the seed and the step).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch
from tqdm import tqdm

from wam_diff_core.attention.backends import use_backend
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.checkpoint import LoadedModel, build_preset, load

from .collate import TrainBatch, collate
from .compiled import compiled_layers
from .config import Config, ConfigError
from .data import DataError, DrivingDataset, MixedDataset, MixSampler, build_datasets, spaced_examples
from .distributed import (DistContext, all_reduce_mean, any_flag, barrier, full_model_state, full_optim_state, is_sharded,
                          load_full_optim_state, wrap)
from .evaluate import decoder_config, evaluate, prompt_batch, write_eval
from .objective import SelectedLogits, diffusion_loss, distill_loss
from .perception import OccupancyHead
from .precision import prepare_models, step_autocast
from .provenance import stage_inputs
from .state import MODEL_DIR, STATE_FILE, load_resume, save_model_as, save_resume, set_rng_state

FINAL_DIR = "model"
RESUME_DIR = "resume"
OCCUPANCY_HEAD_FILE = "occupancy_head.pt"


class StageExists(WamDiffError, RuntimeError):
    """The stage directory already holds a run and neither --resume nor --overwrite was given."""


@dataclass
class Stage:
    """name: directory under cfg.out; init: checkpoint directory or preset; teacher: checkpoint (distill)."""

    name: str
    block_size: int
    init: str
    teacher: Optional[str] = None
    teacher_block_size: Optional[int] = None

    @property
    def with_noisy(self) -> bool:
        return self.block_size > 1 or (self.teacher is not None and (self.teacher_block_size or 1) > 1)


def param_groups(model: torch.nn.Module, lr: float, vision_lr: float, weight_decay: float) -> list[dict]:
    """AdamW groups: vision tower vs the rest, each with and without weight decay (none on norms/biases)."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        vision = name.startswith("model.visual.")
        decay = p.ndim >= 2 and "norm" not in name
        groups.setdefault((vision, decay), []).append(p)
    return [
        {"params": ps, "lr": vision_lr if vision else lr, "weight_decay": weight_decay if decay else 0.0,
         "name": f"{'vision' if vision else 'text'}{'' if decay else '_no_decay'}"}
        for (vision, decay), ps in sorted(groups.items())
    ]


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float):
    """LR multiplier: linear warm-up to 1 over `warmup_steps`, then cosine down to `min_ratio`."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def param_digest(state_dict: dict) -> str:
    """sha256 over a state dict's names and float32 values."""
    h = hashlib.sha256()
    for name, p in sorted(state_dict.items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def noise_seed(seed: int, step: int, micro: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 4099 + micro * 131 + rank * 7_919_993) % (2**63 - 1)


class _IndexStream:
    """batch_sampler for a DataLoader: the sampler's micro-batches from `start` on."""

    def __init__(self, sampler: MixSampler, start: int):
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[list[int]]:
        for _, batch in self.sampler.stream(self.start):
            yield batch


def _collate_fn(pad_id: int, with_noisy: bool):
    def fn(items):
        return collate(items, pad_id, with_noisy)
    return fn


class MetricsLog:
    """metrics.jsonl (rank 0), truncated to the resumed step so a resumed run has one line per step."""

    def __init__(self, path: Path, start_step: int, tensorboard: bool):
        self.path = path
        lines = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= start_step:
                        lines.append(line)
                except json.JSONDecodeError:
                    continue
        path.write_text("".join(l + "\n" for l in lines))
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(path.parent / "tb"))
            except ImportError:  # tensorboard is optional (requirements-train.txt pins it)
                self.writer = None

    def write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class StopRequest:
    """SIGTERM (a scheduler's preemption, `kill`) asks the stage to stop after the current step with a
    resume point; the previous handler comes back when the stage ends."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _load_init(init: str, seed: int, device) -> LoadedModel:
    """A checkpoint directory, or a preset built with random weights from `seed`."""
    if Path(init).is_dir():
        return load(init, device=device)
    try:
        return build_preset(init, device=device, seed=seed)
    except ValueError as exc:
        raise ConfigError(f"{init!r} is neither a checkpoint directory nor a model preset ({exc})") from exc


def _on_policy_batch(model, loaded: LoadedModel, batch: TrainBatch, block_size: int, steps: Optional[int],
                     max_new_tokens: int, backend: str, with_noisy: bool, pad_id: int) -> TrainBatch:
    """The batch with each response replaced by the student's own decoded answer (+ EOS)."""
    from wam_diff_core.model.runner import ModelRunner

    runner = ModelRunner(model, backend)
    device = runner.device
    cfg = decoder_config(block_size, steps, "low_confidence_static", 0.9, max_new_tokens, backend)
    res = generate(runner, prompt_batch(batch.examples, pad_id).to(device), cfg, loaded.settings.mask_token_id,
                   loaded.settings.eos_token_id)
    model.train()
    eos = loaded.settings.eos_token_id
    new = [x.with_response(torch.tensor(ids + [eos], dtype=torch.long)) for x, ids in zip(batch.examples, res.token_ids)]
    return collate(new, pad_id, with_noisy).to(device)


@dataclass
class TrainingData:
    """The training mixture and what its scan found: skipped samples, planning frame sizes, route-target use."""

    dataset: MixedDataset
    skipped_scan: dict[str, int]
    frame_size: Optional[tuple[int, int]]  # the one size of every planning frame, None when several or none
    frame_sizes: dict[str, int]  # "WxH" -> planning frames of that size
    route_targets: int  # planning samples whose prompt states a route target point


@dataclass
class Trainee:
    """What the optimizer steps touch: the student (`loaded`, wrapped as `module` for the training forward), its
    teacher, the occupancy head, the optimizer and its LR schedule."""

    loaded: LoadedModel
    module: torch.nn.Module
    teacher: Optional[torch.nn.Module]
    teacher_block_size: Optional[int]
    head: Optional[OccupancyHead]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sharded: bool
    params: list = dataclasses.field(init=False)  # what the gradient clip sees

    def __post_init__(self) -> None:
        self.params = [p for p in self.model.parameters() if p.requires_grad] + \
            (list(self.head.parameters()) if self.head is not None else [])

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model


class MicroBatches:
    """Micro-batches on the device, counting the samples the collate step skipped. A micro-batch of bad samples
    alone stands in as the last good one with weight 0, so every process's forward/backward stays in step."""

    def __init__(self, batches: Iterator[Optional[TrainBatch]], device, on_bad_sample: str):
        self.batches, self.device, self.on_bad_sample = batches, device, on_bad_sample
        self.skipped = 0
        self.last_good: Optional[TrainBatch] = None

    def next(self) -> tuple[TrainBatch, float]:
        """The next micro-batch and its loss weight (1, or 0 for a stand-in)."""
        batch = next(self.batches)
        if batch is not None:
            self.skipped += len(batch.skipped)
            if self.on_bad_sample == "error" and batch.skipped:
                bad = batch.skipped[0]
                raise DataError(f"sample {bad.sample_id!r}: {bad.reason}")
        if batch is None or batch.input_ids is None:
            if self.last_good is None:
                raise DataError("a whole micro-batch of bad samples before any good one; check the dataset")
            return self.last_good, 0.0
        self.last_good = batch.to(self.device)
        return self.last_good, 1.0


def _prepare_stage_dir(stage: Stage, stage_dir: Path, ctx: DistContext, resume: bool, overwrite: bool) -> bool:
    """Whether the stage resumes from its resume point; an unfinished stage directory without one is cleared
    (with --resume or --overwrite) or refused."""
    resuming = resume and (stage_dir / RESUME_DIR / STATE_FILE).is_file()
    if not resuming and stage_dir.exists() and any(stage_dir.iterdir()):
        if resume and ctx.is_main:
            print(f"[{stage.name}] no resume point in {stage_dir}; starting the stage over")
        if not (overwrite or resume):
            raise StageExists(f"{stage_dir} is not empty; pass --resume to continue it or --overwrite to start over")
        if ctx.is_main:
            shutil.rmtree(stage_dir)
    return resuming


def _check_compatible(cfg: Config, stage: Stage, sharded: bool) -> None:
    """Refuse option pairs that cannot run together, before any model is loaded."""
    on_policy = cfg.distill.on_policy_every > 0 and stage.teacher is not None
    if sharded and on_policy:
        raise ConfigError("distill.on_policy_every needs whole weights on each process; use train.parallel=ddp")
    if cfg.train.compile and on_policy:
        raise ConfigError("train.compile compiles the layers for the training forward; distill.on_policy_every "
                          "decodes with them inside the steps: set one of them off")


def _load_student(cfg: Config, stage: Stage, init: str, device) -> LoadedModel:
    """The student from `init` (the stage's initial checkpoint or its resume point) in training mode, its settings
    with the trajectory style it trains on."""
    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    loaded = _load_init(init, tc.seed, device)
    if loaded.processor is None:
        raise ConfigError(f"{stage.init}: a preset without a tokenizer cannot be trained; use nano or a checkpoint")
    style = cfg.data.trajectory_format or loaded.settings.trajectory_format
    loaded = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings, trajectory_format=style))
    use_backend(loaded.model, tc.backend)
    loaded.model.train()
    return loaded


def _load_teacher(stage: Stage, student: LoadedModel, backend: str,
                  device) -> tuple[Optional[torch.nn.Module], Optional[int]]:
    """The frozen teacher (None without one) and the block size it reads at (default: its trained one, recorded on
    `stage`). It must share the student's mask token and trajectory style."""
    teacher_B = stage.teacher_block_size
    if stage.teacher is None:
        return None, teacher_B
    t_loaded = load(stage.teacher, device=device)
    teacher = t_loaded.model.eval()
    teacher.requires_grad_(False)
    use_backend(teacher, backend)
    teacher_B = teacher_B or t_loaded.settings.trained_block_size
    stage.teacher_block_size = teacher_B  # recorded in run_config.json as used
    mask_id, style = student.settings.mask_token_id, student.settings.trajectory_format
    if t_loaded.settings.mask_token_id != mask_id:
        raise ConfigError(f"teacher mask token id {t_loaded.settings.mask_token_id} differs from the student's {mask_id}")
    if t_loaded.settings.trajectory_format != style:
        raise ConfigError(f"teacher {stage.teacher} answers planning in the {t_loaded.settings.trajectory_format!r} "
                          f"trajectory style, the student trains on {style!r}")
    return teacher, teacher_B


def _occupancy_head(cfg: Config, model: torch.nn.Module, sharded: bool, device) -> Optional[OccupancyHead]:
    """The perception head on the vision features (None when perception.occupancy_weight is 0)."""
    pc = cfg.perception
    if pc.occupancy_weight <= 0:
        return None
    if sharded:
        raise ConfigError("perception.occupancy_weight needs train.parallel=ddp (the head is not sharded)")
    return OccupancyHead(int(model.config.vision_config.out_hidden_size), pc.occupancy_cells).to(device)


def _training_data(cfg: Config, loaded: LoadedModel, occupancy: bool) -> TrainingData:
    dc = cfg.data
    dataset = build_datasets(dc.train, loaded.processor, dc.max_prompt_tokens, dc.max_response_tokens, dc.on_bad_sample,
                             trajectory_format=loaded.settings.trajectory_format,
                             occupancy_cells=cfg.perception.occupancy_cells if occupancy else None,
                             route_targets=dc.route_targets)
    return TrainingData(dataset, dataset.skipped(), dataset.planning_frame_size(), dataset.planning_frame_sizes(),
                        dataset.planning_route_targets())


def _with_data_settings(loaded: LoadedModel, data: TrainingData, route_targets_cfg) -> LoadedModel:
    """The student's settings with what its training data decides: the planning frame size (recorded in the
    checkpoint for closed-loop tools) and whether (and on which route types) its prompts state a route target."""
    settings = loaded.settings
    if data.frame_size is not None:
        settings = dataclasses.replace(settings, frame_size=data.frame_size)
    elif data.frame_sizes:
        print(f"note: planning frames of several sizes {data.frame_sizes}; the checkpoint keeps "
              f"frame_size {settings.frame_size}", flush=True)
    if data.route_targets or not route_targets_cfg:  # prompts that state a route target point: its policies give it
        # one; data.route_targets false: trained without, asked without (even if the initial checkpoint had them)
        only = None if isinstance(route_targets_cfg, bool) or not data.route_targets else tuple(route_targets_cfg)
        settings = dataclasses.replace(settings, route_target=bool(data.route_targets), route_target_scenarios=only)
    return dataclasses.replace(loaded, settings=settings)


def _optimizer(cfg: Config, model: torch.nn.Module, head: Optional[OccupancyHead]) -> torch.optim.AdamW:
    oc = cfg.optim
    groups = param_groups(model, oc.lr, oc.vision_lr, oc.weight_decay)
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": oc.lr, "weight_decay": 0.0, "name": "occupancy"})
    return torch.optim.AdamW(groups, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps)


def _restore(resume_dir: Path, t: Trainee) -> int:
    """Optimizer, scheduler, RNG and head states from the resume point (the weights came with the student);
    returns the step it was written at."""
    state = load_resume(resume_dir)
    if t.head is not None:
        if "occupancy_head" not in state["extra"]:
            raise ConfigError(f"{resume_dir}: the resume point has no occupancy head; it was written without "
                              "perception.occupancy_weight (start the stage over with --overwrite)")
        t.head.load_state_dict(state["extra"]["occupancy_head"])
    if t.sharded:
        load_full_optim_state(t.module, t.optimizer, state["optimizer"])
    else:
        t.optimizer.load_state_dict(state["optimizer"])
    t.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return int(state["step"])


def _write_run_config(stage_dir: Path, cfg: Config, stage: Stage, ctx: DistContext, steps_total: int) -> dict:
    """run_config.json: the resolved config and the digests of the stage's inputs (returned)."""
    dc = cfg.data
    inputs = stage_inputs([d["path"] if isinstance(d, dict) else d for d in dc.train], dc.val, stage.init, stage.teacher)
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "run_config.json").write_text(json.dumps({"stage": stage.__dict__, "config": cfg.to_dict(),
                                                        "world": ctx.world, "steps": steps_total,
                                                        "inputs": inputs}, indent=2))
    return inputs


def _micro_loss(cfg: Config, stage: Stage, t: Trainee, batch: TrainBatch, gen: torch.Generator, on_policy: bool):
    """The diffusion loss, or the distillation loss against the teacher, of one micro-batch."""
    mask_id, noise, dist, pc = t.loaded.settings.mask_token_id, cfg.noise, cfg.distill, cfg.perception
    if t.teacher is None:
        return diffusion_loss(t.module, t.model, batch, stage.block_size, mask_id, gen, noise.t_min, noise.t_max,
                              occupancy_weight=pc.occupancy_weight, chain_share=noise.chain_share)
    return distill_loss(t.module, t.model, t.teacher, batch, stage.block_size, t.teacher_block_size, mask_id, gen,
                        noise.t_min, noise.t_max, 1.0 if on_policy else dist.ratio, dist.divergence, dist.beta,
                        dist.temperature, dist.chunk_size, occupancy_weight=pc.occupancy_weight,
                        chain_share=noise.chain_share, teacher_clean_only=dist.ar_teacher_clean_only)


def _accumulate_grads(cfg: Config, stage: Stage, ctx: DistContext, t: Trainee, batches: MicroBatches, step: int,
                      on_policy: bool, autocast) -> dict[str, float]:
    """One optimizer step's micro-batches: forward and backward (loss / grad_accum); their mean stats."""
    tc, dc = cfg.train, cfg.data
    stats: dict[str, float] = {}
    for micro in range(tc.grad_accum):
        batch, scale = batches.next()
        if on_policy:
            batch = _on_policy_batch(t.model, t.loaded, batch, stage.block_size, cfg.distill.on_policy_steps,
                                     dc.max_response_tokens - 1, tc.backend, stage.with_noisy, t.loaded.pad_token_id)
        gen = torch.Generator(device=ctx.device).manual_seed(noise_seed(tc.seed, step, micro, ctx.rank))
        sync = t.module.no_sync() if ctx.enabled and micro < tc.grad_accum - 1 else contextlib.nullcontext()
        with sync, autocast:
            out = _micro_loss(cfg, stage, t, batch, gen, on_policy)
            (out.loss * (scale / tc.grad_accum)).backward()
        for k, v in {"loss": out.loss.detach(), **out.stats}.items():
            stats[k] = stats.get(k, 0.0) + float(v) / tc.grad_accum
    return stats


def _optimizer_step(t: Trainee, grad_clip: float) -> torch.Tensor:
    """Clip (0: no clip, the norm still measured), step the optimizer and the schedule; the gradient norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(t.params, grad_clip if grad_clip > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    t.optimizer.step()
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _metrics_row(step: int, epoch: float, t: Trainee, grad_norm, loss_mean: float, sec_per_step: float,
                 skipped_scan: int, skipped_runtime: int, on_policy: bool, stats: dict) -> dict:
    """One metrics.jsonl line."""
    return {"step": step, "epoch": epoch,
            **{f"lr_{g['name']}": g["lr"] for g in t.optimizer.param_groups if g["name"] in ("text", "vision")},
            "grad_norm": float(grad_norm), "loss_mean_ranks": loss_mean, "sec_per_step": sec_per_step,
            "skipped_scan": skipped_scan, "skipped_runtime": skipped_runtime, "on_policy": on_policy, **stats}


def _save_resume_point(t: Trainee, stage: Stage, ctx: DistContext, resume_dir: Path, step: int) -> None:
    model_state = full_model_state(t.module) if t.sharded else None  # collectives: every rank
    optim_state = full_optim_state(t.module, t.optimizer) if t.sharded else None
    if ctx.is_main:
        save_resume(resume_dir, t.loaded, t.model, stage.block_size,
                    optim_state if t.sharded else t.optimizer.state_dict(), t.scheduler, step,
                    {"stage": stage.name, **({"occupancy_head": t.head.state_dict()} if t.head is not None else {})},
                    model_state)
    barrier(ctx)


def _train_steps(cfg: Config, stage: Stage, ctx: DistContext, t: Trainee, batches: MicroBatches, start_step: int,
                 steps_total: int, batches_per_epoch: int, skipped_scan: int, log: Optional[MetricsLog]) -> int:
    """Optimizer steps from `start_step` to the stage's end, or fewer (train.stop_after, SIGTERM) with a resume point
    under `resume/` every train.save_every steps and at the stop; returns the step reached."""
    tc, dist_cfg = cfg.train, cfg.distill
    autocast = step_autocast(ctx.device, tc.bf16, tc.cpu_bf16)
    stop_at = steps_total if tc.stop_after is None else min(steps_total, start_step + tc.stop_after)
    bar = tqdm(total=steps_total, initial=start_step, desc=stage.name, disable=not (ctx.is_main and tc.progress),
               dynamic_ncols=True)
    step = start_step
    t_last, last_log_step = time.perf_counter(), start_step
    with StopRequest() as stop, compiled_layers(t.model, t.teacher, enabled=tc.compile):
        while step < stop_at:
            on_policy = t.teacher is not None and dist_cfg.on_policy_every > 0 and step % dist_cfg.on_policy_every == 0
            stats = _accumulate_grads(cfg, stage, ctx, t, batches, step, on_policy, autocast)
            grad_norm = _optimizer_step(t, cfg.optim.grad_clip)
            step += 1
            bar.update(1)
            if step % tc.log_every == 0 or step == stop_at:
                now = time.perf_counter()
                loss_mean = float(all_reduce_mean(torch.tensor(stats["loss"]), ctx))
                row = _metrics_row(step, (step * tc.grad_accum) / max(1, batches_per_epoch), t, grad_norm, loss_mean,
                                   (now - t_last) / (step - last_log_step), skipped_scan, batches.skipped, on_policy,
                                   stats)
                t_last, last_log_step = now, step
                if log is not None:
                    log.write(row)
                    bar.set_postfix(loss=f"{stats['loss']:.4f}")
            if any_flag(stop.requested, ctx) and step < stop_at:
                stop_at = step  # preempted: save below and leave
                if ctx.is_main:
                    print(f"[{stage.name}] SIGTERM: stopping after step {step}")
            if (step % tc.save_every == 0 or step == stop_at) and step < steps_total:
                _save_resume_point(t, stage, ctx, Path(cfg.out) / stage.name / RESUME_DIR, step)
    bar.close()
    return step


def _validate(cfg: Config, stage: Stage, t: Trainee, final_dir: Path, device) -> dict:
    """eval.json's metrics: the final model decoding evenly spaced samples of data.val."""
    dc, ec, tc = cfg.data, cfg.eval, cfg.train
    loaded = t.loaded
    val = DrivingDataset(dc.val, loaded.processor, dc.max_prompt_tokens, dc.max_response_tokens, "skip",
                         trajectory_format=loaded.settings.trajectory_format,
                         route_targets=loaded.settings.prompt_route_targets)
    eval_model = load(final_dir, device=device).model if t.sharded else t.model
    use_backend(eval_model, tc.backend)
    metrics = evaluate(eval_model, loaded.processor, loaded.settings, spaced_examples(val, ec.max_samples),
                       stage.block_size, ec.steps, ec.strategy, ec.threshold, ec.max_new_tokens, ec.batch_size,
                       tc.backend)
    metrics["skipped_val"] = val.stats.skipped
    return metrics


def _finish_stage(cfg: Config, stage: Stage, ctx: DistContext, t: Trainee, summary: dict) -> Path:
    """The final checkpoint, parameter digests, eval.json and summary.json (`summary` plus the digest and the
    validation metrics); the resume point goes."""
    stage_dir = Path(cfg.out) / stage.name
    final_dir = stage_dir / FINAL_DIR
    full_state = full_model_state(t.module) if t.sharded else None  # a collective
    digest = None
    if not t.sharded or ctx.is_main:
        digest = param_digest(full_state if t.sharded else t.model.state_dict())
        (stage_dir / f"param_digest.rank{ctx.rank}.txt").write_text(digest + "\n")
    if ctx.is_main:
        save_model_as(t.loaded, t.model, stage.block_size, final_dir, full_state)
        if t.head is not None:  # training only, not part of the model; kept for probes
            torch.save(t.head.state_dict(), stage_dir / OCCUPANCY_HEAD_FILE)
        shutil.rmtree(stage_dir / RESUME_DIR, ignore_errors=True)
        summary = {**summary, "param_digest": digest}
        if cfg.eval.enabled and cfg.data.val:
            summary["eval"] = _validate(cfg, stage, t, final_dir, ctx.device)
            write_eval(stage_dir / "eval.json", summary["eval"])
        (stage_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    barrier(ctx)
    return final_dir


def run_stage(cfg: Config, stage: Stage, ctx: DistContext, resume: bool = False, overwrite: bool = False) -> Optional[Path]:
    """Train one stage. Returns the final checkpoint directory, or None when stopped early (`stop_after`)."""
    tc = cfg.train
    stage_dir = Path(cfg.out) / stage.name
    final_dir, resume_dir = stage_dir / FINAL_DIR, stage_dir / RESUME_DIR
    if (final_dir / "config.json").is_file() and not overwrite:
        if resume:
            if ctx.is_main:
                print(f"[{stage.name}] done already: {final_dir}")
            return final_dir
        raise StageExists(f"{stage_dir} holds a finished stage; pass --resume to reuse it or --overwrite to retrain")
    resuming = _prepare_stage_dir(stage, stage_dir, ctx, resume, overwrite)
    barrier(ctx)
    sharded = is_sharded(tc.parallel, ctx)
    _check_compatible(cfg, stage, sharded)

    device = ctx.device
    loaded = _load_student(cfg, stage, str(resume_dir / MODEL_DIR) if resuming else stage.init, device)
    teacher, teacher_B = _load_teacher(stage, loaded, tc.backend, device)
    prepare_models(device, tc.cpu_bf16, loaded.model, teacher)
    head = _occupancy_head(cfg, loaded.model, sharded, device)
    data = _training_data(cfg, loaded, head is not None)
    loaded = _with_data_settings(loaded, data, cfg.data.route_targets)
    sampler = MixSampler(data.dataset.sizes, data.dataset.weights, tc.batch_size, tc.seed, cfg.data.epoch_size,
                         ctx.rank, ctx.world)
    steps_total = tc.max_steps or max(1, math.ceil(tc.epochs * sampler.batches_per_epoch / tc.grad_accum))
    oc = cfg.optim
    warmup = oc.warmup_steps if oc.warmup_steps is not None else math.ceil(oc.warmup_ratio * steps_total)

    # wrapped before the optimizer is built: FSDP2 swaps in sharded parameters
    module = wrap(SelectedLogits(loaded.model, head), ctx, tc.parallel)
    optimizer = _optimizer(cfg, loaded.model, head)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps_total, warmup, oc.min_lr_ratio))
    t = Trainee(loaded, module, teacher, teacher_B, head, optimizer, scheduler, sharded)
    start_step = _restore(resume_dir, t) if resuming else 0
    inputs = _write_run_config(stage_dir, cfg, stage, ctx, steps_total) if ctx.is_main else None
    log = MetricsLog(stage_dir / "metrics.jsonl", start_step, tc.tensorboard) if ctx.is_main else None
    loader = torch.utils.data.DataLoader(
        data.dataset, batch_sampler=_IndexStream(sampler, start_step * tc.grad_accum),
        collate_fn=_collate_fn(loaded.pad_token_id, stage.with_noisy), num_workers=cfg.data.num_workers,
    )
    batches = MicroBatches(iter(loader), device, cfg.data.on_bad_sample)
    step = _train_steps(cfg, stage, ctx, t, batches, start_step, steps_total, sampler.batches_per_epoch,
                        sum(data.skipped_scan.values()), log)
    if log is not None:
        log.close()
    if step < steps_total:
        if ctx.is_main:
            print(f"[{stage.name}] stopped after step {step}/{steps_total}; continue with --resume")
        return None
    return _finish_stage(cfg, stage, ctx, t, {
        "stage": stage.name, "block_size": stage.block_size, "steps": steps_total, "skipped_scan": data.skipped_scan,
        "skipped_runtime": batches.skipped, "planning_frame_sizes": data.frame_sizes,
        "planning_route_targets": data.route_targets, "inputs": inputs})
