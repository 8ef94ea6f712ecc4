"""One training stage: load, train for a number of optimizer steps, checkpoint, evaluate.

A stage writes into `<out>/<name>/`:
- `model/`: the final Hugging Face checkpoint, `wam_diff.json` with trained_block_size = B;
- `resume/`: the latest resume point while the stage runs (removed once `model/` is written);
- `run_config.json` (the resolved config and the digests of its inputs: data files, their frames, the initial
  checkpoint, the teacher; `training/provenance.py`), `metrics.jsonl` (one line per logged step), `tb/`
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
from .data import DataError, DrivingDataset, MixSampler, build_datasets, spaced_examples
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
    resuming = resume and (resume_dir / STATE_FILE).is_file()
    if not resuming and stage_dir.exists() and any(stage_dir.iterdir()):
        if resume and ctx.is_main:
            print(f"[{stage.name}] no resume point in {stage_dir}; starting the stage over")
        if not (overwrite or resume):
            raise StageExists(f"{stage_dir} is not empty; pass --resume to continue it or --overwrite to start over")
        if ctx.is_main:
            shutil.rmtree(stage_dir)
    barrier(ctx)
    sharded = is_sharded(tc.parallel, ctx)
    if sharded and cfg.distill.on_policy_every > 0 and stage.teacher is not None:
        raise ConfigError("distill.on_policy_every needs whole weights on each process; use train.parallel=ddp")
    if tc.compile and cfg.distill.on_policy_every > 0 and stage.teacher is not None:
        raise ConfigError("train.compile compiles the layers for the training forward; distill.on_policy_every "
                          "decodes with them inside the steps: set one of them off")

    device = ctx.device
    if tc.threads:
        torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    loaded = _load_init(str(resume_dir / MODEL_DIR) if resuming else stage.init, tc.seed, device)
    if loaded.processor is None:
        raise ConfigError(f"{stage.init}: a preset without a tokenizer cannot be trained; use nano or a checkpoint")
    dc = cfg.data
    style = dc.trajectory_format or loaded.settings.trajectory_format
    loaded = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings, trajectory_format=style))
    model = loaded.model
    use_backend(model, tc.backend)
    model.train()
    mask_id = loaded.settings.mask_token_id
    pad_id = loaded.pad_token_id

    teacher = None
    teacher_B = stage.teacher_block_size
    if stage.teacher is not None:
        t_loaded = load(stage.teacher, device=device)
        teacher = t_loaded.model.eval()
        teacher.requires_grad_(False)
        use_backend(teacher, tc.backend)
        teacher_B = teacher_B or t_loaded.settings.trained_block_size
        stage.teacher_block_size = teacher_B  # recorded in run_config.json as used
        if t_loaded.settings.mask_token_id != mask_id:
            raise ConfigError(f"teacher mask token id {t_loaded.settings.mask_token_id} differs from the student's {mask_id}")
        if t_loaded.settings.trajectory_format != style:
            raise ConfigError(f"teacher {stage.teacher} answers planning in the {t_loaded.settings.trajectory_format!r} "
                              f"trajectory style, the student trains on {style!r}")

    prepare_models(device, tc.cpu_bf16, model, teacher)
    pc = cfg.perception
    head = None
    if pc.occupancy_weight > 0:
        if sharded:
            raise ConfigError("perception.occupancy_weight needs train.parallel=ddp (the head is not sharded)")
        head = OccupancyHead(int(model.config.vision_config.out_hidden_size), pc.occupancy_cells).to(device)
    dataset = build_datasets(dc.train, loaded.processor, dc.max_prompt_tokens, dc.max_response_tokens, dc.on_bad_sample,
                             trajectory_format=style, occupancy_cells=pc.occupancy_cells if head is not None else None,
                             route_targets=dc.route_targets)
    scan_skipped = dataset.skipped()
    frame_size, frame_sizes = dataset.planning_frame_size(), dataset.planning_frame_sizes()
    if frame_size is not None:  # recorded in the checkpoint for closed-loop tools
        loaded = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings, frame_size=frame_size))
    elif frame_sizes:
        print(f"note: planning frames of several sizes {frame_sizes}; the checkpoint keeps "
              f"frame_size {loaded.settings.frame_size}", flush=True)
    route_targets = dataset.planning_route_targets()
    if route_targets or not dc.route_targets:  # prompts that state a route target point: its policies give it one;
        # data.route_targets false: trained without, asked without (even if the initial checkpoint had them)
        only = None if isinstance(dc.route_targets, bool) or not route_targets else tuple(dc.route_targets)
        loaded = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings, route_target=bool(route_targets),
                                                                          route_target_scenarios=only))
    sampler = MixSampler(dataset.sizes, dataset.weights, tc.batch_size, tc.seed, dc.epoch_size, ctx.rank, ctx.world)
    steps_total = tc.max_steps or max(1, math.ceil(tc.epochs * sampler.batches_per_epoch / tc.grad_accum))
    warmup = cfg.optim.warmup_steps if cfg.optim.warmup_steps is not None else math.ceil(cfg.optim.warmup_ratio * steps_total)

    oc = cfg.optim
    module = wrap(SelectedLogits(model, head), ctx, tc.parallel)  # before the optimizer: FSDP2 swaps in sharded parameters
    groups = param_groups(model, oc.lr, oc.vision_lr, oc.weight_decay)
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": oc.lr, "weight_decay": 0.0, "name": "occupancy"})
    optimizer = torch.optim.AdamW(groups, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps_total, warmup, oc.min_lr_ratio))
    start_step = 0
    if resuming:
        state = load_resume(resume_dir)
        if head is not None:
            if "occupancy_head" not in state["extra"]:
                raise ConfigError(f"{resume_dir}: the resume point has no occupancy head; it was written without "
                                  "perception.occupancy_weight (start the stage over with --overwrite)")
            head.load_state_dict(state["extra"]["occupancy_head"])
        if sharded:
            load_full_optim_state(module, optimizer, state["optimizer"])
        else:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        start_step = int(state["step"])

    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head is not None else [])
    inputs = None
    if ctx.is_main:
        inputs = stage_inputs([d["path"] if isinstance(d, dict) else d for d in dc.train], dc.val, stage.init, stage.teacher)
        stage_dir.mkdir(parents=True, exist_ok=True)
        (stage_dir / "run_config.json").write_text(json.dumps({"stage": stage.__dict__, "config": cfg.to_dict(),
                                                            "world": ctx.world, "steps": steps_total,
                                                            "inputs": inputs}, indent=2))
    log = MetricsLog(stage_dir / "metrics.jsonl", start_step, tc.tensorboard) if ctx.is_main else None
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=_IndexStream(sampler, start_step * tc.grad_accum),
        collate_fn=_collate_fn(pad_id, stage.with_noisy), num_workers=dc.num_workers,
    )
    batches = iter(loader)
    autocast = step_autocast(device, tc.bf16, tc.cpu_bf16)
    dist_cfg = cfg.distill
    skipped_runtime = 0
    last_good: Optional[TrainBatch] = None
    stop_at = steps_total if tc.stop_after is None else min(steps_total, start_step + tc.stop_after)
    bar = tqdm(total=steps_total, initial=start_step, desc=stage.name, disable=not (ctx.is_main and tc.progress),
               dynamic_ncols=True)
    step = start_step
    t_last, last_log_step = time.perf_counter(), start_step
    stop = StopRequest().__enter__()
    compiled = compiled_layers(model, teacher, enabled=tc.compile)
    compiled.__enter__()
    try:
        while step < stop_at:
            stats_acc: dict[str, float] = {}
            on_policy = teacher is not None and dist_cfg.on_policy_every > 0 and step % dist_cfg.on_policy_every == 0
            for micro in range(tc.grad_accum):
                batch = next(batches)
                scale = 1.0
                if batch is not None:
                    skipped_runtime += len(batch.skipped)
                    if dc.on_bad_sample == "error" and batch.skipped:
                        bad = batch.skipped[0]
                        raise DataError(f"sample {bad.sample_id!r}: {bad.reason}")
                if batch is None or batch.input_ids is None:
                    if last_good is None:
                        raise DataError("a whole micro-batch of bad samples before any good one; check the dataset")
                    batch, scale = last_good, 0.0  # keep every process's forward/backward in step
                else:
                    batch = batch.to(device)
                    last_good = batch
                if on_policy:
                    batch = _on_policy_batch(model, loaded, batch, stage.block_size, dist_cfg.on_policy_steps,
                                             dc.max_response_tokens - 1, tc.backend, stage.with_noisy, pad_id)
                gen = torch.Generator(device=device).manual_seed(noise_seed(tc.seed, step, micro, ctx.rank))
                sync = module.no_sync() if ctx.enabled and micro < tc.grad_accum - 1 else contextlib.nullcontext()
                with sync, autocast:
                    if teacher is None:
                        out = diffusion_loss(module, model, batch, stage.block_size, mask_id, gen, cfg.noise.t_min,
                                             cfg.noise.t_max, occupancy_weight=pc.occupancy_weight,
                                             chain_share=cfg.noise.chain_share)
                    else:
                        out = distill_loss(module, model, teacher, batch, stage.block_size, teacher_B, mask_id, gen,
                                           cfg.noise.t_min, cfg.noise.t_max, 1.0 if on_policy else dist_cfg.ratio,
                                           dist_cfg.divergence, dist_cfg.beta, dist_cfg.temperature, dist_cfg.chunk_size,
                                           occupancy_weight=pc.occupancy_weight, chain_share=cfg.noise.chain_share,
                                           teacher_clean_only=dist_cfg.ar_teacher_clean_only)
                    (out.loss * (scale / tc.grad_accum)).backward()
                for k, v in {"loss": out.loss.detach(), **out.stats}.items():
                    stats_acc[k] = stats_acc.get(k, 0.0) + float(v) / tc.grad_accum
            grad_norm = torch.nn.utils.clip_grad_norm_(params, oc.grad_clip if oc.grad_clip > 0 else float("inf"))
            if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
                grad_norm = grad_norm.full_tensor()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            bar.update(1)
            if step % tc.log_every == 0 or step == stop_at:
                now = time.perf_counter()
                loss_mean = float(all_reduce_mean(torch.tensor(stats_acc["loss"]), ctx))
                row = {"step": step, "epoch": (step * tc.grad_accum) / max(1, sampler.batches_per_epoch),
                       **{f"lr_{g['name']}": g["lr"] for g in optimizer.param_groups if g["name"] in ("text", "vision")},
                       "grad_norm": float(grad_norm), "loss_mean_ranks": loss_mean,
                       "sec_per_step": (now - t_last) / (step - last_log_step),
                       "skipped_scan": sum(scan_skipped.values()), "skipped_runtime": skipped_runtime,
                       "on_policy": on_policy, **stats_acc}
                t_last, last_log_step = now, step
                if log is not None:
                    log.write(row)
                    bar.set_postfix(loss=f"{stats_acc['loss']:.4f}")
            if any_flag(stop.requested, ctx) and step < stop_at:
                stop_at = step  # preempted: save below and leave
                if ctx.is_main:
                    print(f"[{stage.name}] SIGTERM: stopping after step {step}")
            if (step % tc.save_every == 0 or step == stop_at) and step < steps_total:
                model_state = full_model_state(module) if sharded else None  # collectives: every rank
                optim_state = full_optim_state(module, optimizer) if sharded else None
                if ctx.is_main:
                    save_resume(resume_dir, loaded, model, stage.block_size,
                                optim_state if sharded else optimizer.state_dict(), scheduler, step,
                                {"stage": stage.name, **({"occupancy_head": head.state_dict()} if head is not None else {})},
                                model_state)
                barrier(ctx)
    finally:
        compiled.__exit__(None, None, None)
        stop.__exit__()
    bar.close()
    if log is not None:
        log.close()
    if step < steps_total:
        if ctx.is_main:
            print(f"[{stage.name}] stopped after step {step}/{steps_total}; continue with --resume")
        return None

    full_state = full_model_state(module) if sharded else None  # a collective
    digest = None
    if not sharded or ctx.is_main:
        digest = param_digest(full_state if sharded else model.state_dict())
        (stage_dir / f"param_digest.rank{ctx.rank}.txt").write_text(digest + "\n")
    if ctx.is_main:
        save_model_as(loaded, model, stage.block_size, final_dir, full_state)
        if head is not None:  # training only, not part of the model; kept for probes
            torch.save(head.state_dict(), stage_dir / OCCUPANCY_HEAD_FILE)
        shutil.rmtree(resume_dir, ignore_errors=True)
        summary = {"stage": stage.name, "block_size": stage.block_size, "steps": steps_total,
                   "skipped_scan": scan_skipped, "skipped_runtime": skipped_runtime,
                   "planning_frame_sizes": frame_sizes, "planning_route_targets": route_targets,
                   "inputs": inputs, "param_digest": digest}
        if cfg.eval.enabled and dc.val:
            ec = cfg.eval
            val = DrivingDataset(dc.val, loaded.processor, dc.max_prompt_tokens, dc.max_response_tokens, "skip",
                                 trajectory_format=style, route_targets=loaded.settings.prompt_route_targets)
            eval_model = load(final_dir, device=device).model if sharded else model
            use_backend(eval_model, tc.backend)
            metrics = evaluate(eval_model, loaded.processor, loaded.settings, spaced_examples(val, ec.max_samples),
                               stage.block_size, ec.steps, ec.strategy, ec.threshold, ec.max_new_tokens,
                               ec.batch_size, tc.backend)
            metrics["skipped_val"] = val.stats.skipped
            write_eval(stage_dir / "eval.json", metrics)
            summary["eval"] = metrics
        (stage_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    barrier(ctx)
    return final_dir
