"""The policies a whole-plan benchmark compares: `[LABEL=]MODEL[@K | @BxK][:KEY=VALUE ...]` each.

MODEL is what `DrivingPolicy.load` takes (a checkpoint directory, the shipped model's name, a preset); every
entry decodes with its checkpoint's own settings (its wam_diff.json), the command line's decoding options on
top, then its own @K (steps), @BxK (block size and steps) and KEY=VALUE settings (DecoderConfig fields, e.g.
`:text_layers=fast:threshold=0.8`; on / off for switches), `threads=N` (torch CPU threads while it plans) and
`dtype=D` (the weights' dtype, one of `DTYPE_CHOICES`; default the command line's `--dtype`, else the checkpoint's).
The same checkpoint may appear several times at different settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..constants import DTYPE_CHOICES
from ..decoding.config import FIELDS
from ..errors import WamDiffError


class EntryError(WamDiffError, ValueError):
    """An entry that does not spell `[LABEL=]MODEL[@K | @BxK][:KEY=VALUE ...]`, or two entries with one label."""


@dataclass(frozen=True)
class Entry:
    label: str
    model: str
    decoding: dict[str, Any] = field(default_factory=dict)  # DecoderConfig fields on top of the command line's
    threads: Optional[int] = None
    dtype: Optional[str] = None


def _value(key: str, text: str, spec: str) -> Any:
    if text in ("on", "off"):
        return text == "on"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if key in ("threads",):
        raise EntryError(f"entry {spec!r}: {key}={text!r}: expected an integer")
    return text


def _block_steps(text: str, spec: str) -> dict[str, int]:
    """`K` -> steps, `BxK` -> block size and steps."""
    try:
        parts = [int(v) for v in text.split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts, default=0) < 1:
        raise EntryError(f"entry {spec!r}: @{text}: expected @K or @BxK with positive integers")
    return {"steps": parts[0]} if len(parts) == 1 else {"block_size": parts[0], "steps": parts[1]}


def parse_entry(spec: str) -> Entry:
    """`nano-s-b32=models/nano-s-b32@32x8:text_layers=fast` -> Entry; the label defaults to the spec without its
    label part."""
    label, sep, rest = spec.partition("=")
    if not sep or "/" in label or ":" in label or "@" in label:
        label, rest = spec, spec
    head, *settings = rest.split(":")
    model, _, at = head.partition("@")
    if not model or not label:
        raise EntryError(f"entry {spec!r}: no {'model' if label else 'label'}; expected [LABEL=]MODEL[@K | @BxK][:KEY=VALUE ...]")
    decoding: dict[str, Any] = _block_steps(at, spec) if at else {}
    threads = dtype = None
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or (key not in FIELDS and key not in ("threads", "dtype")):
            raise EntryError(f"entry {spec!r}: {item!r}: expected KEY=VALUE with KEY 'threads', 'dtype' or one of "
                             f"{list(FIELDS)}")
        if key == "dtype":
            if value not in DTYPE_CHOICES:
                raise EntryError(f"entry {spec!r}: dtype={value!r}: expected one of {list(DTYPE_CHOICES)}")
            dtype = value
        elif key == "threads":
            threads = _value(key, value, spec)
            if not isinstance(threads, int) or threads < 1:
                raise EntryError(f"entry {spec!r}: threads={value!r}: expected a positive integer")
        else:
            decoding[key] = _value(key, value, spec)
    return Entry(label, model, decoding, threads, dtype)


def parse_entries(specs: list[str]) -> list[Entry]:
    entries = [parse_entry(s) for s in specs]
    labels = [e.label for e in entries]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise EntryError(f"entries labelled {dup} more than once; give each its own LABEL=")
    return entries
