"""Driving-QA answers scored per question template.

One accuracy over all questions hides which questions a model can answer: a count read off the frame,
a distance, a yes/no about a lane, the next action. Each template gets its exact-match and its accuracy
(`eval.qa.answer_correct`: exact, or numeric within tolerance, or the same yes/no), and beside them the
accuracy of always giving that template's most common reference answer: a model at that number has
learned the answer's prior, not the frame.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from .eval.qa import answer_correct, exact_match, first_number, normalize


def _pct(n: int, total: int) -> float | None:
    return 100.0 * n / total if total else None


def template_scores(preds: Sequence[str], refs: Sequence[str]) -> dict:
    """{"samples", "exact" %, "accuracy" %, "numeric": every reference holds a number, "majority_answer",
    "majority_accuracy" %: always answering the most common reference} of one template's answers."""
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} references")
    n = len(refs)
    exact = sum(exact_match(p, r) for p, r in zip(preds, refs))
    ok = sum(answer_correct(p, r) for p, r in zip(preds, refs))
    common = Counter(normalize(r) for r in refs).most_common(1)
    majority = next(r for r in refs if normalize(r) == common[0][0]) if common else None
    majority_ok = sum(answer_correct(majority, r) for r in refs) if majority is not None else 0
    return {"samples": n, "exact": _pct(exact, n), "accuracy": _pct(ok, n),
            "numeric": bool(refs) and all(first_number(r) is not None for r in refs),
            "majority_answer": majority, "majority_accuracy": _pct(majority_ok, n)}


def qa_scores(templates: Sequence[str], preds: Sequence[str], refs: Sequence[str]) -> dict:
    """Overall exact / accuracy % and `template_scores` per template (sample i asked templates[i])."""
    if not len(templates) == len(preds) == len(refs):
        raise ValueError(f"{len(templates)} templates, {len(preds)} predictions, {len(refs)} references")
    groups: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for t, p, r in zip(templates, preds, refs):
        groups[t][0].append(p)
        groups[t][1].append(r)
    n = len(refs)
    return {"samples": n,
            "exact": _pct(sum(exact_match(p, r) for p, r in zip(preds, refs)), n),
            "accuracy": _pct(sum(answer_correct(p, r) for p, r in zip(preds, refs)), n),
            "per_template": {t: template_scores(*groups[t]) for t in sorted(groups)}}
