"""Driving-QA accuracy: normalised exact match, plus a numeric match with tolerance.

Numeric answers (a distance "about 23 m", a count "2") match when the first number in the
prediction is within tolerance of the first number in the reference: counts exactly, distances
within max(DIST_ABS_TOL_M, DIST_REL_TOL x reference).
"""
from __future__ import annotations

import re
import string
from typing import Optional, Sequence

DIST_ABS_TOL_M = 2.0
DIST_REL_TOL = 0.10
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_WORD_NUMBERS = {"zero": 0, "no": 0, "none": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                 "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_DISTANCE_UNITS = re.compile(r"\b(m|meters?|metres?)\b")


def normalize(text: str) -> str:
    """Lower-case, strip punctuation and articles, collapse spaces."""
    t = text.lower().strip()
    t = t.translate(str.maketrans("", "", string.punctuation.replace(".", "").replace("-", "")))
    t = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", t)
    t = re.sub(r"\b(a|an|the)\b", " ", t)
    return " ".join(t.split())


def first_number(text: str) -> Optional[float]:
    """First number in the text, digits or a small number word; None if there is none."""
    m = _NUMBER.search(text)
    if m:
        return float(m.group())
    for w in normalize(text).split():
        if w in _WORD_NUMBERS:
            return float(_WORD_NUMBERS[w])
    return None


def exact_match(pred: str, ref: str) -> bool:
    return normalize(pred) == normalize(ref)


def numeric_match(pred: str, ref: str) -> Optional[bool]:
    """True/False when the reference holds a number, None when it does not (not a numeric question)."""
    r = first_number(ref)
    if r is None:
        return None
    p = first_number(pred)
    if p is None:
        return False
    if _DISTANCE_UNITS.search(ref.lower()):
        return abs(p - r) <= max(DIST_ABS_TOL_M, DIST_REL_TOL * abs(r))
    return abs(p - r) < 1e-9


def answer_correct(pred: str, ref: str) -> bool:
    """Exact match, or numeric match for numeric references, or a yes/no reference matched by the first word."""
    if exact_match(pred, ref):
        return True
    num = numeric_match(pred, ref)
    if num is not None:
        return num
    r, p = normalize(ref).split(), normalize(pred).split()
    if r and r[0] in ("yes", "no") and p:
        return p[0] == r[0]
    return False


def qa_accuracy(preds: Sequence[str], refs: Sequence[str]) -> dict:
    """{"exact": %, "accuracy": % (exact or numeric/yes-no match), "samples": N}."""
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions for {len(refs)} references")
    if not refs:
        return {"exact": None, "accuracy": None, "samples": 0}
    exact = sum(exact_match(p, r) for p, r in zip(preds, refs))
    ok = sum(answer_correct(p, r) for p, r in zip(preds, refs))
    return {"exact": 100.0 * exact / len(refs), "accuracy": 100.0 * ok / len(refs), "samples": len(refs)}
