"""DrivingPolicy: the one entry point the ROS node, the CARLA agent and the closed loops call.

`plan(images, ego_state, command)` -> Plan (trajectory in the ego frame, optional detections, raw
text, validity, timings; with `candidates=N`, N trajectories drawn from one prefill); `ask(images,
question)` -> Answer. Inputs are validated (ValueError naming the bad value); model text is parsed by
the codec and never raises: a bad answer becomes an invalid Plan with the parse error.
"""
from __future__ import annotations

import gc
import time
from dataclasses import replace
from typing import Optional, Sequence

import numpy as np
import torch

from .codec import ParseError, parse_answer, parse_detections, parse_trajectory
from .constants import DETECTION_SOURCES, TASKS
from .decoding.block_diffusion import generate
from .decoding.candidates import CandidateSampling, CandidatesError, DecodeRows, check_candidates, check_sampling
from .decoding.config import DecoderConfig, resolve_decoding
from .decoding.constraint import planning_constraint
from .errors import WamDiffError
from .model.checkpoint import LoadedModel, load
from .model.precision import DTYPE_AUTO, auto_dtype, parse_dtype
from .model.processor import check_image
from .model.runner import ModelRunner
from .perception import detect
from .prompts import chat_prompt, detection_prompt, planning_prompt, qa_prompt
from .text_confidence import score_detections
from .types import Answer, Candidate, DecodeStats, Detection, EgoState, Plan, check_command, check_route_target

# Token budget per task: a trajectory is 16 numbers (digits tokenize one by one), boxes are longer.
TASK_BUDGET = {"planning": 128, "detection": 192, "qa": 64}
POLICY_TASKS = ("planning", "detection")  # what plan() can answer; QA goes through ask()


def check_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """A non-empty subset of POLICY_TASKS as a tuple; a ValueError names the value otherwise."""
    tasks = tuple(tasks)
    if not tasks or any(t not in POLICY_TASKS for t in tasks):
        raise ValueError(f"tasks {tasks!r}: expected a non-empty subset of {POLICY_TASKS}")
    return tasks


def with_budget(config: DecoderConfig, tasks: Sequence[str]) -> DecoderConfig:
    """`config` with its token budget set: its own max_new_tokens, else the largest TASK_BUDGET of `tasks`."""
    return replace(config, max_new_tokens=config.max_new_tokens or max(TASK_BUDGET[t] for t in tasks))


class PolicySettingsError(WamDiffError, ValueError):
    """A setting this machine or the model's device cannot honour (CUDA graphs off CUDA, a missing backend)."""


def check_device_settings(device: str | torch.device, config: DecoderConfig) -> None:
    """Raise PolicySettingsError (one line) when `device` cannot run `config`: a CUDA device on a machine without
    CUDA, CUDA graphs on a device that is not CUDA (no fallback: a captured path asked for is never replaced by the
    eager one unnoticed), or the FlashInfer backend without what it needs."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PolicySettingsError(f"device {str(device)!r}: CUDA is not available on this machine; expected cpu")
    if config.cuda_graphs and device.type != "cuda":
        raise PolicySettingsError(f"cuda_graphs=True needs a CUDA device, the model is on {device}: set the device "
                                  f"to cuda, or cuda_graphs off")
    if config.backend == "flashinfer":
        from .extensions import attention_backend

        missing = attention_backend("flashinfer").missing()
        if missing:
            raise PolicySettingsError("backend 'flashinfer' needs " + " and ".join(missing))


def check_candidate_settings(candidates: int, config: DecoderConfig) -> None:
    """Raise PolicySettingsError (one line) when `config` cannot draw `candidates` > 1 plans: they decode on the
    eager path (no CUDA graphs, no FlashInfer) with candidate 0 greedy (temperature 0)."""
    if candidates > 1 and (config.cuda_graphs or config.backend == "flashinfer"):
        raise PolicySettingsError(f"candidates={candidates} decode on the eager path: set cuda_graphs off and the "
                                  f"backend to sdpa or flex (got cuda_graphs={config.cuda_graphs}, "
                                  f"backend {config.backend!r})")
    if candidates > 1 and config.temperature > 0:
        raise PolicySettingsError(f"candidates={candidates} need temperature 0 (candidate 0 is the greedy plan, "
                                  f"`sampling` draws the others), got temperature {config.temperature}")


def answer_candidate(index: int, text: str, finished: bool, probs: Optional[Sequence[float]],
                     budget: int) -> Candidate:
    """The Candidate of one planning answer: its trajectory, or None and why (truncated, unparsable); its
    logprob the mean log of its tokens' probabilities (0.0 without any)."""
    logprob = float(np.mean(np.log(np.maximum(probs, 1e-30)))) if probs else 0.0
    if not finished:
        return Candidate(index, None, text, logprob, f"truncated: no end of answer within {budget} tokens")
    parsed = parse_trajectory(text)
    if isinstance(parsed, ParseError):
        return Candidate(index, None, text, logprob, str(parsed))
    return Candidate(index, parsed, text, logprob)


def _check_images(images) -> list[np.ndarray]:
    if isinstance(images, np.ndarray):
        images = [images]
    if not isinstance(images, (list, tuple)) or not images:
        raise ValueError(f"images must be a non-empty list of (H, W, 3) uint8 arrays, got {type(images).__name__}")
    return [check_image(img, f"images[{i}]") for i, img in enumerate(images)]


def check_detection_source(requested: str) -> str:
    if requested not in DETECTION_SOURCES:
        raise PolicySettingsError(f"detection source {requested!r}: expected one of {list(DETECTION_SOURCES)}")
    return requested


def detection_source(loaded: LoadedModel, requested: str = "auto") -> str:
    """"head" or "text": where `requested` (one of DETECTION_SOURCES) sends a policy's detections for this
    checkpoint; a PolicySettingsError for an unknown source or "head" on a checkpoint without one."""
    check_detection_source(requested)
    if requested == "head" and loaded.box_head is None:
        raise PolicySettingsError(f"detection source 'head': model {loaded.name!r} has no box head "
                                  f"(box_head.json / box_head.safetensors; `wam-diff-train box-head` trains one)")
    if requested == "auto":
        return "head" if loaded.box_head is not None else "text"
    return requested


class DrivingPolicy:
    """`config`: the DecoderConfig it decodes with (default: the checkpoint's own, its wam_diff.json);
    `tasks`: what plan() answers unless told otherwise (a subset of POLICY_TASKS); `detections`: where its
    detections come from (DETECTION_SOURCES: "auto" = the checkpoint's box head when it has one, else the
    text answer)."""

    def __init__(self, loaded: LoadedModel, config: DecoderConfig | None = None,
                 tasks: Sequence[str] = ("planning",), detections: str = "auto"):
        if loaded.processor is None:
            raise ValueError(f"model {loaded.name!r} has no tokenizer/processor; a policy needs a full checkpoint")
        self.config = config or resolve_decoding(loaded.settings.decoding)
        self.tasks = check_tasks(tasks)
        self.detections = detection_source(loaded, detections)
        self.loaded = loaded
        device = next(loaded.model.parameters()).device
        check_device_settings(device, self.config)
        self.device = device
        self.runner = ModelRunner(loaded.model, self.config.backend)

    @classmethod
    def load(cls, model: str, device: str = "cpu", tasks: Sequence[str] = ("planning",),
             dtype: str | torch.dtype | None = None, detections: str = "auto", **decoding) -> "DrivingPolicy":
        """A preset name ("nano"), a local checkpoint directory or the shipped model's name (`model.shipped.resolve_model`),
        its weights in `dtype` ("float32", "bfloat16", "float16"; None: the checkpoint's own on a GPU, float32 on a
        CPU; "auto": bfloat16 for block decoding on a CPU with native bf16, `model.precision`), decoding with the
        checkpoint's own settings (its wam_diff.json) and `decoding` (DecoderConfig fields; None = unset, the
        checkpoint's) on top (`resolve_decoding`); `detections` as the constructor's. Settings are checked before
        the weights load."""
        auto = dtype == DTYPE_AUTO
        parse_dtype(None if auto else dtype)
        check_tasks(tasks)
        check_detection_source(detections)
        check_device_settings(device, resolve_decoding(DecoderConfig(), **decoding))
        loaded = load(model, device=device, dtype=None if auto else dtype)
        config = resolve_decoding(loaded.settings.decoding, **decoding)
        if auto:
            loaded.model.to(auto_dtype(device, config.block_size, next(loaded.model.parameters()).dtype))
        return cls(loaded, config, tasks, detections)

    @property
    def processor(self):
        return self.loaded.processor

    @property
    def trained_frame_size(self) -> Optional[tuple[int, int]]:
        """(W, H) of the camera frames the checkpoint learned to plan from (its wam_diff.json), None if unrecorded."""
        return self.loaded.settings.frame_size

    def _decode(self, prompts: list[str], images: list[np.ndarray], cfg: DecoderConfig, tasks: Sequence[str],
                ego: Optional[EgoState] = None, rows: Optional[DecodeRows] = None):
        """Decode one answer per prompt, or per row of `rows` (candidates); row i answers tasks[i] (planning rows
        under the checkpoint's trajectory grammar when it has one, and inside the kinematic envelope from `ego`
        when the config asks for it)."""
        batch = self.processor.encode(prompts, [images] * len(prompts)).to(self.device)
        settings = self.loaded.settings
        tasks = list(tasks) if rows is None else rows.tasks(tasks)
        egos = [ego if t == "planning" else None for t in tasks] if cfg.kinematic_envelope and ego is not None else None
        grammar = planning_constraint(self.processor.tokenizer, settings, tasks, cfg.answer_positions,
                                      self.runner.vocab_size, self.device, egos, cfg.forward_only)
        extra = {} if rows is None else {"rows": rows}
        result = generate(self.runner, batch, cfg, settings.mask_token_id, settings.eos_token_id, grammar, **extra)
        texts = [self.processor.decode(ids) for ids in result.token_ids]
        return result, texts

    @property
    def uses_route_target(self) -> bool:
        """Whether the checkpoint learned planning prompts with a route target point (its wam_diff.json)."""
        return self.loaded.settings.route_target

    def plan(self, images, ego_state: EgoState, command: str, tasks: Sequence[str] | None = None,
             target: Optional[tuple[float, float]] = None, candidates: int = 1,
             sampling: CandidateSampling | str | None = None) -> Plan:
        """Plan from camera images (list of (H, W, 3) uint8 RGB), ego state, navigation command and, when the
        caller has one, the route target point (x, y) m in the ego frame; a checkpoint that never learned route
        targets (`uses_route_target` False) is asked without it, as it was trained.

        `candidates` N > 1: one vision encode and one prefill, then N planning answers decoded as one batch
        (`decoding.candidates`): candidate 0 the greedy plan (token for token the plan without candidates), the
        others drawn by `sampling` (a CandidateSampling or a method name; default "tokens" at temperature 1);
        a detection answer, when asked for, once, in the same batch. `plan.candidates` holds them all (the
        invalid ones with their error); the plan carries candidate 0 (`chosen` 0) until a scorer picks another."""
        images = _check_images(images)
        if not isinstance(ego_state, EgoState):
            raise ValueError(f"ego_state must be an EgoState, got {type(ego_state).__name__}")
        command = check_command(command)
        target = check_route_target(target) if self.uses_route_target else None
        tasks = check_tasks(tasks or self.tasks)
        n, sampling = check_candidates(candidates), check_sampling(sampling)
        check_candidate_settings(n, self.config)
        if n > 1 and "planning" not in tasks:
            raise CandidatesError(f"candidates={n} are planning answers; tasks {tasks} ask for none")
        start = time.perf_counter()
        from_head = "detection" in tasks and self.detections == "head"
        decoded = tuple(t for t in tasks if not (from_head and t == "detection"))
        result, texts, rows, cfg = (self._answer(images, ego_state, command, target, decoded, n, sampling)
                                    if decoded else (None, [], None, self.config))
        plan = Plan(trajectory=None, valid=False, raw_text=dict(zip(decoded, texts)))
        timings = dict(result.timings) if result is not None else {}
        if from_head:
            t0 = time.perf_counter()
            plan.detections = self.head_boxes([chat_prompt(detection_prompt(), len(images))], [images],
                                              encode=not decoded)[0]
            timings["box_head"] = time.perf_counter() - t0
        probs = (result.token_probs if result is not None else None) or [None] * len(texts)
        for row, task in enumerate(decoded):
            if task == "detection":
                self._detections(plan, images[0], row, texts[row], result, cfg.max_new_tokens)
                continue
            plan_rows = rows.candidate_rows() if rows is not None else [row]
            plan.candidates = [answer_candidate(k, texts[r], result.finished[r], probs[r], cfg.max_new_tokens)
                               for k, r in enumerate(plan_rows)]
            plan.trajectory, plan.valid = plan.candidates[0].trajectory, plan.candidates[0].valid
            if plan.candidates[0].error is not None:
                plan.errors["planning"] = plan.candidates[0].error
        plan.timings = {**timings, "plan_total": time.perf_counter() - start}
        if result is not None:
            plan.stats["decode"] = DecodeStats(tokens=result.tokens, forwards=result.forwards,
                                               timings=dict(result.timings))
        return plan

    def _answer(self, images: list[np.ndarray], ego_state: EgoState, command: str, target, tasks: tuple[str, ...],
                n: int, sampling):
        """Decode the text answers of `tasks` (one prompt each; N planning candidates when n > 1): (result,
        texts, rows or None, the DecoderConfig with the tasks' budget)."""
        text_for = {"planning": planning_prompt(ego_state, command, target), "detection": detection_prompt()}
        prompts = [chat_prompt(text_for[t], len(images)) for t in tasks]
        cfg = with_budget(self.config, tasks)
        rows = DecodeRows.for_candidates(tasks, n, sampling, cfg.seed) if n > 1 else None
        extra = {} if rows is None else {"rows": rows}  # one answer per prompt: the call it always was
        result, texts = self._decode(prompts, images, cfg, tasks, ego_state, **extra)
        return result, texts, rows, cfg

    def head_boxes(self, prompts: Sequence[str], images: Sequence[Sequence[np.ndarray]], encode: bool = True
                   ) -> list[list[Detection]]:
        """The box head's detections of each prompt's first image (pixels of that image), from one vision encode of
        the batch; `encode=False` reads the encoder output of the last decode instead (which encoded `images`)."""
        if encode:
            self.runner.encode_images(self.processor.encode(list(prompts), [list(i) for i in images]).to(self.device))
        vision, grid = self.runner.last_vision
        patch = self.loaded.model.config.vision_config.patch_size
        first = np.cumsum([0] + [len(i) for i in images[:-1]])  # each prompt's first image in the batch
        return [detect(self.loaded.box_head, vision, grid, self.processor.merge_size, patch,
                       (i[0].shape[1], i[0].shape[0]), int(k)) for i, k in zip(images, first)]

    def _detections(self, plan: Plan, image: np.ndarray, row: int, text: str, result, budget: int) -> None:
        """Parse row `row`'s detection answer into `plan.detections`, or its error into `plan.errors`."""
        if not result.finished[row]:
            plan.errors["detection"] = f"truncated: no end of answer within {budget} tokens"
            return
        height, width = image.shape[:2]
        parsed = parse_detections(text, (width, height))
        if isinstance(parsed, ParseError):
            plan.errors["detection"] = str(parsed)
            return
        probs = result.token_probs[row] if result.token_probs is not None else None
        plan.detections = score_detections(parsed, text, result.token_ids[row], probs, self.processor.tokenizer)

    def ask(self, images, question: str) -> Answer:
        """Answer a driving question about the camera images."""
        images = _check_images(images)
        prompt = chat_prompt(qa_prompt(question), len(images))
        start = time.perf_counter()
        cfg = with_budget(self.config, ("qa",))
        result, texts = self._decode([prompt], images, cfg, ("qa",))
        parsed = parse_answer(texts[0])
        text = "" if isinstance(parsed, ParseError) else parsed
        return Answer(question=question, text=text, raw_text=texts[0],
                      timings={**result.timings, "ask_total": time.perf_counter() - start})

    def close(self) -> None:
        """Free the model (a lifecycle node calls this on deactivate/cleanup)."""
        self.runner = None
        self.loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


__all__ = ["DrivingPolicy", "POLICY_TASKS", "PolicySettingsError", "check_device_settings", "TASK_BUDGET", "TASKS", "check_tasks", "with_budget",
           "answer_candidate", "check_candidate_settings"]
