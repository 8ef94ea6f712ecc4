"""Prompt text for each task and the Qwen chat form the model consumes (text only; no tokenization).

Every task prompt is a module-level template below, so training data, the policy and the
evaluation all ask the model the same question.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from .constants import (
    BOX_SCALE,
    EOS_TOKEN,
    HORIZON_S,
    IM_START_TOKEN,
    IMAGE_PAD_TOKEN,
    IMAGE_PLACEHOLDER,
    NUM_WAYPOINTS,
    TRAJECTORY_DECIMALS,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
    WAYPOINT_DT_S,
)
from .types import EgoState, check_command, check_route_target

# Decimals of the ego state in the planning prompt (the same precision as the waypoints).
_EGO_DECIMALS = 2

PLANNING_TEMPLATE = (
    "You are the driver of the ego vehicle. "
    "Ego state: velocity vx={vx} m/s, vy={vy} m/s; acceleration ax={ax} m/s^2, ay={ay} m/s^2. "
    "Navigation command: {command}.{route}\n"
    "Plan the next {horizon:g} s. Output {n} waypoints x,y in metres in the ego frame "
    "(x forward, y left), one every {dt:g} s, as x1,y1,x2,y2,...,x{n},y{n} "
    "with {decimals} decimals and no spaces."
)

# The route target sentence, present when the caller has a route target point (ROUTE_TARGET_AHEAD_M along the
# route); without one the planning prompt is, character for character, the one models
# trained without route targets learned.
ROUTE_TARGET_TEMPLATE = " Route target point: x={x} m, y={y} m."

DETECTION_PROMPT = (
    "Detect every vehicle in view. Output a JSON list of "
    '{"bbox_2d": [x1, y1, x2, y2], "label": "car"} objects with coordinates on a '
    f"0..{BOX_SCALE} scale relative to the image; output [] if there is none."
)

QA_TEMPLATE = "{question}\nAnswer briefly."

# One image in the chat form; the Qwen3-VL processor later expands the single pad token.
IMAGE_TOKENS = VISION_START_TOKEN + IMAGE_PAD_TOKEN + VISION_END_TOKEN

_SAMPLE_KEYS = ("id", "datasource", "task", "image", "conversations")


def _num(value: float) -> str:
    # "+ 0.0" keeps tiny negatives from printing as "-0.00".
    return f"{round(float(value), _EGO_DECIMALS) + 0.0:.{_EGO_DECIMALS}f}"


def planning_prompt(ego: EgoState, command: str, target: Optional[tuple[float, float]] = None) -> str:
    """Planning question: ego velocity (m/s) and acceleration (m/s^2) with two decimals, the
    navigation command, the route target point (x, y metres in the ego frame, two decimals) when given,
    and the trajectory output format. Raises ValueError for an unknown command or a bad target."""
    if not isinstance(ego, EgoState):
        raise ValueError(f"ego must be an EgoState, got {type(ego).__name__}")
    target = check_route_target(target)
    route = "" if target is None else ROUTE_TARGET_TEMPLATE.format(x=_num(target[0]), y=_num(target[1]))
    return PLANNING_TEMPLATE.format(
        vx=_num(ego.vx),
        vy=_num(ego.vy),
        ax=_num(ego.ax),
        ay=_num(ego.ay),
        command=check_command(command),
        route=route,
        horizon=HORIZON_S,
        n=NUM_WAYPOINTS,
        dt=WAYPOINT_DT_S,
        decimals=TRAJECTORY_DECIMALS,
    )


_NUMBER_RE = r"[-+]?\d+(?:\.\d+)?"
# The ego-state part of PLANNING_TEMPLATE as a pattern: each {field} a signed decimal.
_EGO_RE = re.compile(re.sub(r"\\\{(\w+)\\\}", lambda m: f"(?P<{m.group(1)}>{_NUMBER_RE})",
                            re.escape(PLANNING_TEMPLATE[:PLANNING_TEMPLATE.index(" Navigation")])))


def parse_planning_ego(text: str) -> Optional[EgoState]:
    """The ego state a planning prompt (`planning_prompt`, alone or inside a chat prompt) states, or None when
    `text` holds no planning question; at the prompt's precision."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    match = _EGO_RE.search(text)
    if match is None:
        return None
    return EgoState(**{k: float(v) for k, v in match.groupdict().items()})


_TARGET_RE = re.compile(re.escape(ROUTE_TARGET_TEMPLATE).replace(r"\{x\}", f"(?P<x>{_NUMBER_RE})")
                        .replace(r"\{y\}", f"(?P<y>{_NUMBER_RE})"))


def parse_route_target(text: str) -> Optional[tuple[float, float]]:
    """The route target point a planning prompt states, or None when it states none; at the prompt's precision."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    match = _TARGET_RE.search(text)
    return None if match is None else (float(match["x"]), float(match["y"]))


def without_route_target(text: str) -> str:
    """`text` with its route target sentence removed: the planning prompt a checkpoint that never learned route
    targets was trained on (the same characters as `planning_prompt` without a target)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    return _TARGET_RE.sub("", text)


def detection_prompt() -> str:
    """Detection question: vehicles in view as grounding JSON boxes on the 0..1000 scale."""
    return DETECTION_PROMPT


def qa_prompt(question: str) -> str:
    """Driving question -> prompt text. Raises ValueError for a non-string or blank question."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    return QA_TEMPLATE.format(question=question.strip())


def _chat(user_content: str) -> str:
    return f"{IM_START_TOKEN}user\n{user_content}{EOS_TOKEN}\n{IM_START_TOKEN}assistant\n"


def chat_prompt(user_text: str, num_images: int) -> str:
    """Qwen chat form: one user turn holding ``num_images`` image slots, each followed by a newline
    as in the datasets' ``<image>\n`` convention (so a policy prompt is token for token the prompt the
    model was trained on), then ``user_text``, followed by the opening of the assistant turn.
    Raises ValueError for bad arguments."""
    if not isinstance(user_text, str):
        raise ValueError(f"user_text must be a string, got {type(user_text).__name__}")
    if not isinstance(num_images, int) or isinstance(num_images, bool) or num_images < 0:
        raise ValueError(f"num_images must be an int >= 0, got {num_images!r}")
    return _chat((IMAGE_TOKENS + "\n") * num_images + user_text)


def sample_to_chat(sample: dict[str, Any]) -> tuple[str, str]:
    """Dataset sample (docs/architecture.md, datasets) -> (prompt in chat form, response text).

    Each ``<image>`` marker in the human turn becomes one image slot in place; with no marker
    the images go first. The response is the gpt turn as stored (no EOS_TOKEN appended).
    Raises ValueError naming the sample id and the problem for a malformed sample; only one
    human turn followed by one gpt turn is supported for now.
    """
    if not isinstance(sample, dict):
        raise ValueError(f"sample must be a dict, got {type(sample).__name__}")
    sid = sample.get("id", "<no id>")
    missing = [k for k in _SAMPLE_KEYS if k not in sample]
    if missing:
        raise ValueError(f"sample {sid!r}: missing keys {missing}; expected {list(_SAMPLE_KEYS)}")
    images, turns = sample["image"], sample["conversations"]
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise ValueError(f"sample {sid!r}: 'image' must be a list of path strings, got {images!r}")
    if not isinstance(turns, list) or len(turns) != 2:
        count = len(turns) if isinstance(turns, list) else type(turns).__name__
        raise ValueError(
            f"sample {sid!r}: expected exactly one human turn followed by one gpt turn "
            f"(multi-turn conversations are not supported yet), got {count} turns"
        )
    for i, (turn, role) in enumerate(zip(turns, ("human", "gpt"))):
        if not isinstance(turn, dict) or turn.get("from") != role or not isinstance(turn.get("value"), str):
            raise ValueError(
                f"sample {sid!r}: turn {i} must be {{'from': {role!r}, 'value': <str>}}, got {str(turn)[:120]}"
            )
    human, response = turns[0]["value"], turns[1]["value"]
    if not response.strip():
        raise ValueError(f"sample {sid!r}: gpt turn is empty")
    if IMAGE_PLACEHOLDER in response:
        raise ValueError(f"sample {sid!r}: {IMAGE_PLACEHOLDER!r} in the gpt turn; images belong in the human turn")
    markers = human.count(IMAGE_PLACEHOLDER)
    if markers == 0:
        return chat_prompt(human, len(images)), response
    if markers != len(images):
        raise ValueError(
            f"sample {sid!r}: {markers} {IMAGE_PLACEHOLDER!r} markers in the human turn "
            f"but {len(images)} images; they must match"
        )
    return _chat(human.replace(IMAGE_PLACEHOLDER, IMAGE_TOKENS)), response
