"""Where one plan's time goes: perf_counter spans around the calls `DrivingPolicy.plan` makes, installed on one
policy for the span of a `with` block and removed after it (the hot path carries nothing when not profiled).

Spans: prompt encoding (of which the image conversion, `image_processor`), the planning grammar's set-up, the
vision encoder, the prefill, every forward of the decoder (with the response block it runs: the largest block
id of its queries, so a finished block's fused commit counts with the block it is prepended to), the LM head,
the grammar's masking of each step, detokenisation and parsing. `phases(spans, total)` turns one plan's spans
into a breakdown; the decoder's time outside its forwards, LM head and masking is its remasking and bookkeeping.
Reading a forward's block id reads a tensor on the host: on a GPU that adds a sync per forward, so profile on
the CPU (or read only the phases, not the absolute GPU time).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Optional


class _Timed:
    """A callable object (the image processor) timed when called; its attributes are the wrapped object's."""

    def __init__(self, inner, wrap: Callable):
        self._inner, self._call = inner, wrap(inner.__call__)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Spans:
    """(name, start, end, block) records of the calls made while installed."""

    def __init__(self):
        self.records: list[tuple[str, float, float, Optional[int]]] = []

    def wrap(self, name: str, fn: Callable, block_of: Callable | None = None) -> Callable:
        """`fn` recording a span `name` per call (with `block_of(*args)` as its block when given)."""
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.records.append((name, start, time.perf_counter(), block_of(*args, **kwargs) if block_of else None))
            return out

        return timed

    def clear(self) -> None:
        self.records = []


def _forward_block(tokens, q_block, *args, **kwargs) -> int:
    return int(q_block.max())


@contextlib.contextmanager
def installed(policy, spans: Spans) -> Iterator[Spans]:
    """Time the calls of `policy.plan` into `spans` inside the block; everything is put back after it."""
    from .. import policy as policy_module
    from ..decoding.constraint import TokenConstraint

    runner, processor = policy.runner, policy.processor
    methods = [(runner, "encode_images", None), (runner, "prefill", None), (runner, "forward_tokens", _forward_block),
               (runner, "logits", None), (processor, "encode", None), (processor, "decode", None)]
    functions = ("planning_constraint", "parse_trajectory", "generate")
    saved = {name: getattr(policy_module, name) for name in functions}
    image_processor, apply = processor.image_processor, TokenConstraint.apply
    try:
        for obj, name, block_of in methods:
            setattr(obj, name, spans.wrap(name, getattr(obj, name), block_of))
        processor.image_processor = _Timed(image_processor, lambda fn: spans.wrap("image_processor", fn))
        TokenConstraint.apply = spans.wrap("grammar mask", apply)  # a frozen dataclass: timed on its class
        for name in functions:
            setattr(policy_module, name, spans.wrap(name, saved[name]))
        yield spans
    finally:
        for obj, name, _ in methods:
            obj.__dict__.pop(name, None)  # the instance attribute hid the class's method
        processor.image_processor = image_processor
        TokenConstraint.apply = apply
        for name, fn in saved.items():
            setattr(policy_module, name, fn)


def _total(records, name: str) -> float:
    return sum(end - start for n, start, end, _ in records if n == name)


def _blocks(records, decode_end: float) -> list[dict]:
    """Per response block in decoding order: its forwards (steps), wall time from its first forward (the first
    block: from the prefill's end) to the next block's, and its forward, LM head and masking time."""
    prefill_end = max(end for n, _, end, _ in records if n == "prefill")
    forwards = sorted((r for r in records if r[0] == "forward_tokens" and r[1] >= prefill_end), key=lambda r: r[1])
    order = list(dict.fromkeys(r[3] for r in forwards))
    starts = [prefill_end] + [next(r[1] for r in forwards if r[3] == b) for b in order[1:]] + [decode_end]
    out = []
    for j, block in enumerate(order):
        lo, hi = starts[j], starts[j + 1]
        inside = [r for r in records if lo <= r[1] < hi]
        fwd = [r for r in inside if r[0] == "forward_tokens"]
        out.append({"block": j, "steps": len(fwd), "ms": 1000 * (hi - lo),
                    "forward_ms": 1000 * sum(r[2] - r[1] for r in fwd),
                    "lm_head_ms": 1000 * _total(inside, "logits"), "mask_ms": 1000 * _total(inside, "grammar mask")})
    return out


def phases(records, total_s: float) -> dict:
    """One plan's breakdown (ms) from its spans and its wall time `total_s`: the phases of the plan in order,
    and `blocks` (`_blocks`)."""
    decode_end = max(end for n, _, end, _ in records if n == "generate")
    encode, image = _total(records, "encode"), _total(records, "image_processor")
    decode = _total(records, "generate")
    vision, prefill = _total(records, "encode_images"), _total(records, "prefill")
    blocks = _blocks(records, decode_end)
    loop = sum(b["ms"] for b in blocks) / 1000
    named = {"image conversion": image, "prompt tokens": encode - image, "grammar set-up": _total(records, "planning_constraint"),
             "vision encoder": vision, "prefill": prefill,
             "decoder forwards": sum(b["forward_ms"] for b in blocks) / 1000,
             "LM head": sum(b["lm_head_ms"] for b in blocks) / 1000,
             "grammar masking": sum(b["mask_ms"] for b in blocks) / 1000}
    named["remasking, bookkeeping"] = loop - named["decoder forwards"] - named["LM head"] - named["grammar masking"]
    named["decoder set-up, result"] = decode - vision - prefill - loop
    named["detokenise"] = _total(records, "decode")
    named["parse"] = _total(records, "parse_trajectory")
    named["rest of plan()"] = total_s - sum(named.values())
    return {"ms": {k: 1000 * v for k, v in named.items()}, "total_ms": 1000 * total_s, "blocks": blocks}
