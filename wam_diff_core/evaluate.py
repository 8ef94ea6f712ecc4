"""`wam-diff evaluate`: how good a model's detections, answers and plans are, in minutes.

    wam-diff evaluate --model nano-s-b32 --model models/nano-s-ar --data runs/nano_s/data_all/val.json \\
        --tasks detection,qa,planning --samples 200 --out runs/evaluate

Each model answers the same validation samples (`evaluate_data`: evenly spread, QA templates alike) at its
checkpoint's own decoding settings (its wam_diff.json; a decoding option given here lays on top, unset means
the checkpoint's own) with the policy's budget per task (`policy.TASK_BUDGET`), the planning rows under the
checkpoint's trajectory grammar and kinematic envelope as the policy plans. Scores: detection COCO mAP@[.5:.95],
AP50, AP75, per-class AP and recall at 10 boxes (boxes scored by their tokens' probabilities,
`text_confidence`), with the per-box account of `evaluate_detection.box_breakdown`; QA exact and accuracy per
question template with each template's majority-answer baseline (`evaluate_qa`); planning L2 per horizon and the
share of plans that do not parse. Writes OUT/evaluate.json, OUT/evaluate.md (the table it prints) and, per model
and task, OUT/predictions/<model>_<task>.jsonl (`{"id", "text", "finished"}`, what `wam-diff score --dataset ...
--predictions` reads).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from tqdm import tqdm

from .codec import ParseError, parse_answer, parse_detections, parse_trajectory
from .constants import DETECTION_SOURCES, SHIPPED_MODEL, TASKS
from .decoding.block_diffusion import generate
from .decoding.config import DecoderConfig
from .decoding.constraint import planning_constraint
from .decoding.options import add_decoding_arguments, decoding_arguments
from .errors import UsageError
from .eval.l2 import l2_report
from .evaluate_data import EvalSample, load_task, read_split
from .evaluate_detection import detection_scores
from .evaluate_qa import qa_scores
from .evaluate_report import markdown
from .policy import TASK_BUDGET, DrivingPolicy, with_budget
from .text_confidence import score_detections


@dataclass
class Answer:
    """One decoded answer: its text (up to EOS), token ids, their commit probabilities, whether EOS came."""

    text: str
    ids: list[int]
    probs: Optional[list[float]]
    finished: bool


def _images(sample: EvalSample) -> list[np.ndarray]:
    from PIL import Image

    out = []
    for path in sample.images:
        if not path.is_file():
            raise UsageError(f"sample {sample.sample_id!r}: image {path} not found")
        with Image.open(path) as img:
            out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    return out


def decode_batch(policy: DrivingPolicy, samples: Sequence[EvalSample], cfg: DecoderConfig) -> list[Answer]:
    """Answer a batch of samples of one task in one decoder call, as `DrivingPolicy` decodes: planning rows under
    the checkpoint's trajectory grammar, inside the kinematic envelope of their own ego state when `cfg` asks."""
    settings, runner = policy.loaded.settings, policy.runner
    batch = policy.processor.encode([s.prompt for s in samples], [_images(s) for s in samples]).to(policy.device)
    tasks = [s.task for s in samples]
    egos = [s.ego for s in samples] if cfg.kinematic_envelope else None
    grammar = planning_constraint(policy.processor.tokenizer, settings, tasks, cfg.answer_positions, runner.vocab_size,
                                  policy.device, egos, cfg.forward_only)
    res = generate(runner, batch, cfg, settings.mask_token_id, settings.eos_token_id, grammar)
    probs = res.token_probs or [None] * len(samples)
    return [Answer(policy.processor.decode(ids), list(ids), p, bool(done))
            for ids, p, done in zip(res.token_ids, probs, res.finished)]


def decode_task(policy: DrivingPolicy, samples: Sequence[EvalSample], cfg: DecoderConfig, batch_size: int,
                bar: Optional[tqdm] = None) -> tuple[list[Answer], float]:
    """Every sample's answer, `batch_size` at a time, and the decoder's wall seconds."""
    answers, seconds = [], 0.0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        t0 = time.perf_counter()
        answers += decode_batch(policy, chunk, cfg)
        seconds += time.perf_counter() - t0
        if bar is not None:
            bar.update(len(chunk))
    return answers, seconds


def _lengths(values: Sequence[int], budget: int) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "p50": float(np.median(v)), "p90": float(np.percentile(v, 90)),
            "max": int(v.max()), "over_budget_share": float((v > budget).mean())}


def _truth(sample: EvalSample):
    height, width = _images(sample)[0].shape[:2]
    truth = parse_detections(sample.reference, (width, height))
    if isinstance(truth, ParseError):
        raise UsageError(f"sample {sample.sample_id!r}: its reference boxes do not parse ({truth})")
    return truth


def score_detection(policy: DrivingPolicy, samples: Sequence[EvalSample], answers: Sequence[Answer], budget: int) -> dict:
    """COCO metrics and the per-box account (`evaluate_detection.detection_scores`) of text answers, with answer
    and reference lengths in tokens (EOS included) against the budget."""
    tok = policy.processor.tokenizer
    preds, ref_tokens = [], []
    for s, a in zip(samples, answers):
        height, width = _images(s)[0].shape[:2]
        parsed = parse_detections(a.text, (width, height))
        preds.append(parsed if isinstance(parsed, ParseError) else score_detections(parsed, a.text, a.ids, a.probs, tok))
        ref_tokens.append(len(tok(s.reference, add_special_tokens=False)["input_ids"]) + 1)
    out = detection_scores(preds, [_truth(s) for s in samples])
    out["answer_tokens"] = _lengths([len(a.ids) + int(a.finished) for a in answers], budget)
    out["reference_tokens"] = _lengths(ref_tokens, budget)
    return out


def head_detections(policy: DrivingPolicy, samples: Sequence[EvalSample], batch_size: int,
                    bar: Optional[tqdm] = None) -> tuple[list, float]:
    """Every sample's detections from the checkpoint's box head (one vision encode per `batch_size` samples),
    and the seconds it took."""
    preds, seconds = [], 0.0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        images = [_images(s) for s in chunk]
        t0 = time.perf_counter()
        preds += policy.head_boxes([s.prompt for s in chunk], images)
        seconds += time.perf_counter() - t0
        if bar is not None:
            bar.update(len(chunk))
    return preds, seconds


def score_qa(samples: Sequence[EvalSample], answers: Sequence[Answer]) -> dict:
    texts = [p if isinstance(p := parse_answer(a.text), str) else "" for a in answers]
    return qa_scores([s.template for s in samples], texts, [s.reference for s in samples])


def score_planning(samples: Sequence[EvalSample], answers: Sequence[Answer]) -> dict:
    """L2 per horizon over the plans that parse, and the share (and kinds) of those that do not."""
    kinds, preds, refs = Counter(), [], []
    for s, a in zip(samples, answers):
        plan, ref = parse_trajectory(a.text), parse_trajectory(s.reference)
        if isinstance(ref, ParseError):
            raise UsageError(f"sample {s.sample_id!r}: its reference plan does not parse ({ref})")
        if isinstance(plan, ParseError):
            kinds[plan.kind] += 1
        else:
            preds.append(plan)
            refs.append(ref)
    out = {"samples": len(samples), "unparsable": sum(kinds.values()),
           "unparsable_share": sum(kinds.values()) / len(samples), "parse_errors": dict(kinds.most_common())}
    if preds:
        l2 = l2_report(np.stack(preds), np.stack(refs))
        out["parsed"] = l2.pop("samples")
        out.update(l2)
    return out


def evaluate_task(policy: DrivingPolicy, task: str, samples: Sequence[EvalSample], batch_size: int,
                  bar: Optional[tqdm] = None) -> tuple[dict, list[Answer]]:
    """One task of one model: decode (detections: or read from the box head), score, and how long it took."""
    if task == "detection" and policy.detections == "head":
        preds, seconds = head_detections(policy, samples, batch_size, bar)
        answers = [Answer(json.dumps([{"bbox_2d": [round(v, 1) for v in d.box_px], "label": d.label,
                                       "score": round(d.score, 4)} for d in p]), [], None, True) for p in preds]
        return {**detection_scores(preds, [_truth(s) for s in samples]), "source": "head", "samples": len(samples),
                "unfinished": 0, "decode_seconds": seconds, "ms_per_frame": 1000 * seconds / len(samples)}, answers
    cfg = with_budget(policy.config, (task,))
    answers, seconds = decode_task(policy, samples, cfg, batch_size, bar)
    if task == "detection":
        scores = score_detection(policy, samples, answers, cfg.max_new_tokens)
    elif task == "qa":
        scores = score_qa(samples, answers)
    else:
        scores = score_planning(samples, answers)
    tokens = sum(len(a.ids) + int(a.finished) for a in answers)
    return {**scores, "samples": len(samples), "budget": cfg.max_new_tokens,
            "unfinished": sum(not a.finished for a in answers),
            "decode_seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9)}, answers


def write_predictions(path: Path, samples: Sequence[EvalSample], answers: Sequence[Answer]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": s.sample_id, "text": a.text, "finished": a.finished}) + "\n"
                            for s, a in zip(samples, answers)))


def model_slugs(models: Sequence[str]) -> list[str]:
    """File-name tags of the models: each one's directory name, numbered where two share it."""
    names = ["".join(c if c.isalnum() or c in "-_" else "_" for c in Path(m).name or m) for m in models]
    return [f"{n}-{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def evaluate_model(model: str, data: dict[str, Path], tasks: Sequence[str], limit: int, out: Path,
                   batch_size: int = 8, device: str = "cpu", progress: bool = True, slug: Optional[str] = None,
                   detections: str = "auto", **decoding) -> dict:
    """Every task of `tasks` for one model (a shipped name, preset or checkpoint directory) on `limit` samples of
    its split in `data`; predictions written as OUT/predictions/<slug>_<task>.jsonl. Returns the model's JSON-ready
    result."""
    policy = DrivingPolicy.load(model, device=device, detections=detections, **decoding)
    settings = policy.loaded.settings
    samples = {t: load_task(data[t], t, limit, settings.prompt_route_targets) for t in tasks}
    result = {"model": model, "name": policy.loaded.name, "decoding": asdict(policy.config),
              "detections": policy.detections,
              "parameters": policy.loaded.num_params, "tasks": {}}
    slug = slug or model_slugs([model])[0]
    with tqdm(total=sum(len(s) for s in samples.values()), desc=slug, unit="sample", disable=not progress) as bar:
        for task in tasks:
            scores, answers = evaluate_task(policy, task, samples[task], batch_size, bar)
            result["tasks"][task] = {"data": str(data[task]), **scores}
            write_predictions(out / "predictions" / f"{slug}_{task}.jsonl", samples[task], answers)
    policy.close()
    return result


def parse_data(values: Sequence[str], tasks: Sequence[str]) -> dict[str, Path]:
    """--data values (PATH for every task, TASK=PATH for one) -> task -> split file, for each task asked."""
    common, per_task = None, {}
    for v in values:
        task, sep, path = v.partition("=")
        if sep and task in TASKS:
            per_task[task] = Path(path)
        elif sep and task and "/" not in task:
            raise UsageError(f"--data {v!r}: {task!r} is not a task; expected PATH or TASK=PATH with TASK in {TASKS}")
        else:
            common = Path(v)
    missing = [t for t in tasks if t not in per_task and common is None]
    if missing:
        raise UsageError(f"no --data for {missing}: give a split holding them (PATH) or TASK=PATH")
    return {t: per_task.get(t, common) for t in tasks}


def parse_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks or any(t not in TASKS for t in tasks) or len(set(tasks)) != len(tasks):
        raise UsageError(f"--tasks {text!r}: expected a comma-separated subset of {TASKS}")
    return tasks


def add_arguments(parser) -> None:
    parser.add_argument("--model", action="append", default=None,
                        help=f"a shipped name, preset or checkpoint directory; repeat to compare models on the same "
                             f"samples (default: {SHIPPED_MODEL})")
    parser.add_argument("--data", action="append", required=True, metavar="[TASK=]PATH",
                        help="a split written by `wam-diff data` (e.g. runs/nano_s/data_all/val.json) for every task, "
                             "or TASK=PATH for one task; repeatable")
    parser.add_argument("--tasks", default="detection,qa,planning", help=f"comma-separated subset of {TASKS}")
    parser.add_argument("--samples", type=int, default=200, help="samples per task (default 200; all when fewer)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per decoder call (default 8)")
    parser.add_argument("--out", required=True, help="output directory: evaluate.json, evaluate.md, predictions/")
    parser.add_argument("--detections", choices=DETECTION_SOURCES, default="auto",
                        help="where detections come from: the checkpoint's box head, its text answer, or auto (the head "
                             "when the checkpoint has one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_decoding_arguments(parser)


def run(args) -> int:
    tasks = parse_tasks(args.tasks)
    if args.samples < 1 or args.batch_size < 1:
        raise UsageError(f"--samples {args.samples} / --batch-size {args.batch_size}: expected integers >= 1")
    data = parse_data(args.data, tasks)
    for path in set(data.values()):
        read_split(path)  # a missing or unreadable split is one line before any model loads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    decoding = decoding_arguments(args)
    models = args.model or [SHIPPED_MODEL]
    results = [evaluate_model(m, data, tasks, args.samples, out, args.batch_size, args.device, not args.no_progress,
                              slug, args.detections, **decoding) for m, slug in zip(models, model_slugs(models))]
    report = {"tasks": tasks, "samples_per_task": args.samples, "budgets": {t: TASK_BUDGET[t] for t in tasks},
              "decoding_options": decoding, "models": results}
    (out / "evaluate.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out / "evaluate.md").write_text(text)
    print(text)
    print(f"written: {out / 'evaluate.json'}, {out / 'evaluate.md'}")
    return 0
