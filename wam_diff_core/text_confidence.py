"""How sure the model was of a piece of its answer: the probabilities of the tokens that wrote it.

A decoder reports the probability each answer token had when it was committed
(`DecodeResult.token_probs`). A span of the answer text (a box's label, one of its coordinates) was
written by the tokens whose characters overlap it. The confidence of a set of spans is the geometric
mean of the probabilities of those tokens, each counted once: 1 when the model was sure of every one,
about the typical token's probability otherwise, and, unlike a product, not lower for a box whose
coordinates happen to have more digits. A box's score (docs/architecture.md, "Detection scores") is the
confidence of its label and its four coordinates.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import Optional, Sequence

from .codec import detection_spans
from .types import Detection

# Probabilities are clamped to [MIN_PROB, 1] before the logarithm, so a token whose probability
# underflowed to 0 (or a NaN from a broken model) gives a tiny score instead of a math error.
MIN_PROB = 1e-30


def token_ends(tokenizer, ids: Sequence[int]) -> list[int]:
    """Character offset where each token's text ends in `tokenizer.decode(ids)` (special tokens kept): the
    length of each prefix's decode, one batched call; nondecreasing and at most the whole text's length."""
    if not ids:
        return []
    ids = list(ids)
    texts = tokenizer.batch_decode([ids[: i + 1] for i in range(len(ids))], skip_special_tokens=False)
    total, last, ends = len(texts[-1]), 0, []
    for text in texts:  # a prefix that ends inside a multi-byte character may decode longer than it stays
        last = min(max(last, len(text)), total)
        ends.append(last)
    return ends


def _clamped(p: float) -> float:
    return MIN_PROB if not p > MIN_PROB else min(float(p), 1.0)  # NaN -> MIN_PROB


def span_confidence(ends: Sequence[int], probs: Sequence[float], spans: Sequence[tuple[int, int]]) -> Optional[float]:
    """Geometric mean, in [MIN_PROB, 1], of the probabilities of the tokens whose text overlaps any of the
    character spans [start, end); token i wrote characters [ends[i - 1], ends[i]). None when no token does."""
    picked = set()
    for start, end in spans:
        i = bisect.bisect_right(ends, start)  # the first token ending after `start`
        while i < len(ends) and (ends[i - 1] if i else 0) < end:
            if ends[i] > (ends[i - 1] if i else 0):  # a token that wrote nothing did not write this span
                picked.add(i)
            i += 1
    if not picked:
        return None
    return math.exp(sum(math.log(_clamped(probs[i])) for i in picked) / len(picked))


def score_detections(detections: Sequence[Detection], text: str, ids: Sequence[int],
                     probs: Optional[Sequence[float]], tokenizer) -> list[Detection]:
    """`detections` parsed from `text` (= tokenizer.decode(ids)) with each score set to the confidence of its
    label and coordinate tokens. Without probabilities (a decoder that reports none) the scores stay as
    parsed (1.0)."""
    spans = detection_spans(text)
    if probs is None or len(probs) != len(ids) or len(spans) != len(detections):
        return list(detections)
    ends = token_ends(tokenizer, ids)
    scored = []
    for det, box_spans in zip(detections, spans):
        score = span_confidence(ends, probs, box_spans)
        scored.append(det if score is None else replace(det, score=score))
    return scored
