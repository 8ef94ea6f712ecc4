"""Model text <-> typed values: trajectories, 2D boxes, answers.

Parsing never raises on model text: every ``parse_*`` returns the value or a ``ParseError``
whose ``kind`` says what went wrong, so garbage output cannot crash a node or a closed loop.
Formatting is the inverse used to build training targets; it raises on bad input (our data).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from .constants import (
    BOX_SCALE,
    EOS_TOKEN,
    NUM_WAYPOINTS,
    TRAJECTORY_DECIMALS,
    TRAJECTORY_FIXED_INT_DIGITS,
    TRAJECTORY_FORMATS,
)
from .types import Detection

# Physical plausibility: 4 s at 50 m/s is 200 m; anything farther is model garbage.
_MAX_ABS_COORD_M = 200.0

PARSE_ERROR_KINDS = (
    "not_text",  # input was not a str
    "empty",  # nothing left after stripping whitespace and cutting at EOS
    "too_long",  # more characters before EOS than any valid answer (MAX_TRAJECTORY_TEXT_CHARS, MAX_DETECTION_TEXT_CHARS)
    "truncated",  # text ends mid-value (a number like "1." or "-", unclosed JSON)
    "wrong_count",  # not exactly 2 * NUM_WAYPOINTS numbers
    "not_a_number",  # a value that is not a plain ASCII decimal number
    "non_finite",  # NaN or infinity
    "out_of_range",  # a trajectory coordinate beyond 200 m or a box coordinate outside 0..1000
    "bad_json",  # not JSON, or JSON that is not a list
    "missing_key",  # a box object without "bbox_2d" or "label"
    "bad_box",  # a box that is not an object, not 4 coordinates, or has x2 < x1 / y2 < y1
    "bad_label",  # a label that is not a non-empty string
)


@dataclass(frozen=True)
class ParseError:
    """Why model text could not be read: ``kind`` is one of PARSE_ERROR_KINDS, ``message`` names the bad value."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


# Numbers are plain ASCII decimals: [0-9], never \d, which also matches full-width and other Unicode
# digits that float() would read ("１６" is 16.0).
# A complete number: optional sign, digits with an optional fraction (or a bare fraction), optional exponent.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# A proper prefix of a number, i.e. what a decoder stopped in the middle of: "-", "1.", "1.2e", "1.2e-".
_NUMBER_PREFIX = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?|\.(?:[0-9]+(?:[eE][+-]?[0-9]*)?)?)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE | re.ASCII)
_ASCII_SPACE = " \t\n\r\f\v"
_FENCE_OPEN = re.compile(r"^```[A-Za-z]*")


def _clean(text: object, limit: Optional[int] = None, what: str = "answer") -> Union[str, ParseError]:
    """Shared first step: type check, cut at EOS, strip whitespace, reject empty. With `limit`, only the
    first limit + len(EOS_TOKEN) characters are read: text with more than `limit` characters before EOS
    cannot be a valid `what` and is "too_long" at a cost that does not grow with its length."""
    if not isinstance(text, str):
        return ParseError("not_text", f"expected str, got {type(text).__name__}")
    head = text if limit is None else text[: limit + len(EOS_TOKEN)]
    cut = head.split(EOS_TOKEN, 1)[0]
    if limit is not None and len(cut) > limit:
        return ParseError("too_long", f"more than {limit} characters before {EOS_TOKEN!r} ({len(text)} in all), "
                                      f"longer than any {what}")
    cut = cut.strip()
    if not cut:
        return ParseError("empty", f"no text before {EOS_TOKEN!r} in {text[:80]!r}")
    return cut


# ---------------------------------------------------------------------------------------------
# Trajectory: "x1,y1,...,x8,y8", metres, ego frame, two decimals.


def _check_trajectory(trajectory: np.ndarray) -> np.ndarray:
    arr = np.asarray(trajectory, dtype=np.float64)
    if arr.shape != (NUM_WAYPOINTS, 2):
        raise ValueError(f"trajectory must have shape ({NUM_WAYPOINTS}, 2), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"trajectory must be finite, got {arr.tolist()}")
    # "+ 0.0" turns -0.0 into 0.0 so that tiny negatives never print as "-0.00".
    return np.round(arr, TRAJECTORY_DECIMALS) + 0.0


# The fixed style: every number is sign, TRAJECTORY_FIXED_INT_DIGITS digits, ".", the decimals; the
# leading digit is 0 or 1 so that every fixed-style text stays inside the parser's 200 m range.
FIXED_NUMBER_WIDTH = 1 + TRAJECTORY_FIXED_INT_DIGITS + 1 + TRAJECTORY_DECIMALS
FIXED_TRAJECTORY_CHARS = 2 * NUM_WAYPOINTS * (FIXED_NUMBER_WIDTH + 1) - 1
# The longest trajectory text the parser reads before EOS: 32 characters a number, separator and spaces
# included (both styles write at most FIXED_TRAJECTORY_CHARS); anything longer is "too_long" unread.
MAX_TRAJECTORY_TEXT_CHARS = 2 * NUM_WAYPOINTS * 32
_DIGITS = "0123456789"
_FIXED_NUMBER_SLOTS = ("+-", "01") + (_DIGITS,) * (TRAJECTORY_FIXED_INT_DIGITS - 1) + (".",) + (_DIGITS,) * TRAJECTORY_DECIMALS


def fixed_trajectory_slots() -> tuple[str, ...]:
    """The characters allowed at each of the FIXED_TRAJECTORY_CHARS positions of a fixed-style trajectory."""
    number = list(_FIXED_NUMBER_SLOTS)
    return tuple((number + [","]) * (2 * NUM_WAYPOINTS - 1) + number)


def fixed_trajectory_chain_starts(length: int) -> list[int]:
    """For each of `length` answer positions, where the number it belongs to starts: the first character
    (the sign) of its fixed-style number, or the position itself for a separator and for anything after
    the trajectory (EOS). The characters of one number, most significant first, form a chain."""
    starts = []
    for p in range(length):
        slot = p % (FIXED_NUMBER_WIDTH + 1)
        in_number = p < FIXED_TRAJECTORY_CHARS and slot < FIXED_NUMBER_WIDTH
        starts.append(p - slot if in_number else p)
    return starts


def format_trajectory(trajectory: np.ndarray, style: str = "official") -> str:
    """(NUM_WAYPOINTS, 2) metres in the ego frame -> "x1,y1,...,x8,y8" with two decimals, no spaces.

    style "official": numbers as short as they print ("12.34,-0.5" is "12.34,-0.50"); style "fixed": every
    number FIXED_NUMBER_WIDTH characters ("+012.34,-000.50"), |value| < 200 m. Both parse with
    parse_trajectory. Raises ValueError for a wrong shape, non-finite values, an unknown style, or a fixed
    value outside the style's range.
    """
    if style not in TRAJECTORY_FORMATS:
        raise ValueError(f"trajectory style {style!r} not in {TRAJECTORY_FORMATS}")
    arr = _check_trajectory(trajectory)
    if style == "official":
        return ",".join(f"{v:.{TRAJECTORY_DECIMALS}f}" for v in arr.reshape(-1))
    limit = 2 * 10 ** (TRAJECTORY_FIXED_INT_DIGITS - 1)
    worst = float(np.abs(arr).max())
    if worst >= limit:
        raise ValueError(f"fixed trajectory style holds |value| < {limit} m, got {worst:.2f} m")
    return ",".join(f"{v:+0{FIXED_NUMBER_WIDTH}.{TRAJECTORY_DECIMALS}f}" for v in arr.reshape(-1))


def _parse_number(token: str, index: int, is_last: bool) -> Union[float, ParseError]:
    token = token.strip(_ASCII_SPACE)
    if _NUMBER.fullmatch(token):
        value = float(token)
        if not math.isfinite(value):  # e.g. "1e999"
            return ParseError("non_finite", f"value {index + 1} {token!r} overflows to {value}")
        return value
    if _NON_FINITE.fullmatch(token):
        return ParseError("non_finite", f"value {index + 1} is {token!r}")
    if is_last and _NUMBER_PREFIX.fullmatch(token):
        return ParseError("truncated", f"text ends mid-number at value {index + 1}: {token!r}")
    return ParseError("not_a_number", f"value {index + 1} is {token[:40]!r}, expected a decimal number")


def parse_trajectory(text: str) -> Union[np.ndarray, ParseError]:
    """Model text "x1,y1,...,x8,y8" -> (NUM_WAYPOINTS, 2) float32 metres, or a ParseError.

    Surrounding whitespace and everything from EOS_TOKEN on are ignored; exactly
    2 * NUM_WAYPOINTS plain ASCII decimal numbers are required, each with |value| <= 200 m, in at most
    MAX_TRAJECTORY_TEXT_CHARS characters before EOS. Reading stops as soon as the text cannot be valid
    (too long, a non-ASCII character, a bad value, more numbers than the format has), so rejecting any
    text costs at most the work of a valid one.
    """
    cleaned = _clean(text, MAX_TRAJECTORY_TEXT_CHARS, "trajectory")
    if isinstance(cleaned, ParseError):
        return cleaned
    if not cleaned.isascii():
        at = next(i for i, c in enumerate(cleaned) if not c.isascii())
        return ParseError("not_a_number", f"value {cleaned.count(',', 0, at) + 1} holds {cleaned[at]!r} "
                                          f"(U+{ord(cleaned[at]):04X}); numbers are plain ASCII decimals")
    expected = 2 * NUM_WAYPOINTS
    tokens = cleaned.split(",", expected)  # a part beyond `expected` holds everything after the last number
    values: list[float] = []
    for i, token in enumerate(tokens[:expected]):
        value = _parse_number(token, i, is_last=i == len(tokens) - 1)
        if isinstance(value, ParseError):
            return value
        values.append(value)
    if len(tokens) > expected:
        rest = tokens[expected]
        if "," not in rest:  # a decoder stopped inside one more value still reads as truncated
            extra = _parse_number(rest, expected, is_last=True)
            if isinstance(extra, ParseError) and extra.kind == "truncated":
                return extra
        return ParseError("wrong_count", f"more than {expected} numbers: value {expected + 1} is {rest[:40]!r}")
    if len(values) != expected:
        return ParseError("wrong_count", f"got {len(values)} numbers, expected {expected}")
    arr = np.asarray(values, dtype=np.float64).reshape(NUM_WAYPOINTS, 2)
    worst = float(np.abs(arr).max())
    if worst > _MAX_ABS_COORD_M:
        return ParseError("out_of_range", f"coordinate {worst:.2f} m exceeds {_MAX_ABS_COORD_M:.0f} m")
    return arr.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# 2D boxes: Qwen3-VL grounding JSON, coordinates on the 0..BOX_SCALE scale.


def _check_image_size(image_size: Sequence[float]) -> tuple[float, float]:
    try:
        width, height = (float(v) for v in image_size)
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be (width, height), got {image_size!r}") from None
    if not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
        raise ValueError(f"image_size must be positive (width, height) pixels, got {image_size!r}")
    return width, height


def boxes_px_to_norm(box_px: Sequence[float], image_size: Sequence[float]) -> tuple[float, float, float, float]:
    """(x1, y1, x2, y2) pixels -> the 0..BOX_SCALE scale of an image of (width, height) pixels."""
    width, height = _check_image_size(image_size)
    x1, y1, x2, y2 = (float(v) for v in box_px)
    return (x1 / width * BOX_SCALE, y1 / height * BOX_SCALE, x2 / width * BOX_SCALE, y2 / height * BOX_SCALE)


def boxes_norm_to_px(box_norm: Sequence[float], image_size: Sequence[float]) -> tuple[float, float, float, float]:
    """(x1, y1, x2, y2) on the 0..BOX_SCALE scale -> pixels of an image of (width, height) pixels."""
    width, height = _check_image_size(image_size)
    x1, y1, x2, y2 = (float(v) for v in box_norm)
    return (x1 / BOX_SCALE * width, y1 / BOX_SCALE * height, x2 / BOX_SCALE * width, y2 / BOX_SCALE * height)


def format_detections(detections: Sequence[Detection]) -> str:
    """Detections -> compact grounding JSON '[{"bbox_2d":[x1,y1,x2,y2],"label":"car"},...]'.

    Uses ``box_norm``, rounded to integers and clipped to 0..BOX_SCALE. Raises ValueError
    for a non-finite box or an empty label.
    """
    items = []
    for det in detections:
        if not isinstance(det.label, str) or not det.label.strip():
            raise ValueError(f"detection label must be a non-empty string, got {det.label!r}")
        if len(det.box_norm) != 4 or not all(math.isfinite(float(v)) for v in det.box_norm):
            raise ValueError(f"detection box_norm must be 4 finite numbers, got {det.box_norm!r}")
        box = [min(max(int(round(float(v))), 0), BOX_SCALE) for v in det.box_norm]
        items.append({"bbox_2d": box, "label": det.label.strip()})
    return json.dumps(items, separators=(",", ":"), ensure_ascii=False)


# The longest box answer the parser reads before EOS: about 1,400 boxes of '{"bbox_2d":[x1,y1,x2,y2],"label":"car"}'.
MAX_DETECTION_TEXT_CHARS = 64 * 1024


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _brief(value: object) -> str:
    """A short description of a JSON value for a message: never the repr of a long or deeply nested one."""
    if isinstance(value, str):
        return repr(value[:40])
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'object'} of {len(value)}"
    return repr(value)[:40]


def _parse_box(item: object, index: int, width: float, height: float) -> Union[Detection, ParseError]:
    where = f"box {index + 1}"
    if not isinstance(item, dict):
        return ParseError("bad_box", f"{where} is {type(item).__name__}, expected an object")
    for key in ("bbox_2d", "label"):
        if key not in item:
            return ParseError("missing_key", f"{where} has no {key!r} (keys: {[k[:20] for k in sorted(item)[:6]]})")
    coords, label = item["bbox_2d"], item["label"]
    if not isinstance(label, str) or not label.strip():
        return ParseError("bad_label", f"{where} label is {_brief(label)}, expected a non-empty string")
    if not isinstance(coords, list) or len(coords) != 4:
        return ParseError("bad_box", f"{where} bbox_2d is {_brief(coords)}, expected [x1, y1, x2, y2]")
    for c in coords:
        if not _is_number(c):
            return ParseError("not_a_number", f"{where} coordinate {_brief(c)} is not a number")
        if isinstance(c, float) and not math.isfinite(c):  # json accepts NaN and Infinity
            return ParseError("non_finite", f"{where} coordinate is {c}")
        if not 0 <= c <= BOX_SCALE:
            return ParseError("out_of_range", f"{where} coordinate {c} outside 0..{BOX_SCALE}")
    x1, y1, x2, y2 = (float(c) for c in coords)
    if x2 < x1 or y2 < y1:
        return ParseError("bad_box", f"{where} corners {coords} have x2 < x1 or y2 < y1")
    box_norm = (x1, y1, x2, y2)
    box_px = (x1 / BOX_SCALE * width, y1 / BOX_SCALE * height, x2 / BOX_SCALE * width, y2 / BOX_SCALE * height)
    return Detection(label=label.strip(), box_px=box_px, box_norm=box_norm)


def _detection_body(text: str) -> Union[tuple[str, int], ParseError]:
    """The JSON of a box answer and the offset in `text` where it starts: cut at EOS, stripped of whitespace
    and of a ```json fence (an unclosed one too: valid JSON never ends in a backtick)."""
    cleaned = _clean(text, MAX_DETECTION_TEXT_CHARS, "box list")
    if isinstance(cleaned, ParseError):
        return cleaned
    body, start = cleaned, len(text) - len(text.lstrip())
    if body.startswith("```"):
        opening = _FENCE_OPEN.match(body).end()
        inner = body[opening:].split("```", 1)[0]
        start += opening + len(inner) - len(inner.lstrip())
        body = inner.strip().rstrip("`").strip()
        if not body:
            return ParseError("empty", "code fence with nothing inside")
    return body, start


def parse_detections(text: str, image_size: Sequence[float]) -> Union[list[Detection], ParseError]:
    """Grounding JSON (optionally in ```json fences) -> detections with box_norm and box_px, or a ParseError.

    ``image_size`` is (width, height) in pixels; box_px = box_norm / BOX_SCALE * size. An empty
    list is a valid answer; text with more than MAX_DETECTION_TEXT_CHARS characters before EOS is
    "too_long" unread. Raises ValueError only for a bad ``image_size`` (a caller bug), never for any text.
    Scores are the default 1.0: the text alone says nothing of the model's confidence
    (`text_confidence.score_detections` sets them from the decoder's token probabilities).
    """
    width, height = _check_image_size(image_size)
    found = _detection_body(text)
    if isinstance(found, ParseError):
        return found
    body = found[0]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        ran_out = err.pos >= len(body) or err.msg.startswith("Unterminated string")
        kind = "truncated" if ran_out else "bad_json"
        return ParseError(kind, f"{err.msg} at char {err.pos} of {body[:60]!r}")
    except (ValueError, RecursionError) as err:  # e.g. huge integers, absurd nesting
        return ParseError("bad_json", f"{type(err).__name__}: {str(err)[:80]}")
    if not isinstance(data, list):
        return ParseError("bad_json", f"expected a JSON list of boxes, got {type(data).__name__}")
    detections = []
    for i, item in enumerate(data):
        det = _parse_box(item, i, width, height)
        if isinstance(det, ParseError):
            return det
        detections.append(det)
    return detections


# JSON lexemes: a string, a structural character, or a run of anything else (a number, true, false, null).
_JSON_LEXEME = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^\s\[\]{}:,"]+')


def _json_key(lexeme: str) -> Optional[str]:
    try:
        key = json.loads(lexeme)
    except ValueError:
        return None
    return key if isinstance(key, str) else None


def detection_spans(text: str) -> list[list[tuple[int, int]]]:
    """Where each box of a box answer was written: for every box `parse_detections(text)` returns, in its
    order, the character spans [start, end) in `text` of its label (inside the quotes) and of its four
    coordinates. Meant for text `parse_detections` reads; [] when there is no box list to read."""
    found = _detection_body(text)
    if isinstance(found, ParseError):
        return []
    body, start = found
    boxes: list[list[tuple[int, int]]] = []
    depth, key, expect_key, in_coords = 0, None, False, False
    for m in _JSON_LEXEME.finditer(body):
        lexeme, where = m.group(), (start + m.start(), start + m.end())
        if lexeme in ("[", "{"):
            depth += 1
            if depth == 2 and lexeme == "{":
                boxes.append([])
                expect_key = True
            if depth == 3:
                in_coords = lexeme == "[" and key == "bbox_2d"
        elif lexeme in ("]", "}"):
            depth -= 1
            in_coords = in_coords and depth >= 3
        elif depth == 2 and boxes:
            if lexeme in (",", ":"):
                expect_key = lexeme == ","
            elif expect_key:
                key = _json_key(lexeme)
            elif key == "label" and lexeme.startswith('"'):
                boxes[-1].append((where[0] + 1, where[1] - 1))
        elif depth == 3 and in_coords and lexeme != ",":
            boxes[-1].append(where)
    return boxes


# ---------------------------------------------------------------------------------------------
# QA: free text.


def parse_answer(text: str) -> Union[str, ParseError]:
    """Model text -> the answer stripped of whitespace and cut at EOS_TOKEN, or ParseError "empty"/"not_text"."""
    return _clean(text)
