"""Prompt builders and the Qwen chat form."""
import pytest

from wam_diff_core.constants import (
    EOS_TOKEN,
    IM_START_TOKEN,
    IMAGE_PAD_TOKEN,
    NAV_COMMANDS,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
)
from wam_diff_core.prompts import (
    DETECTION_PROMPT,
    IMAGE_TOKENS,
    chat_prompt,
    detection_prompt,
    planning_prompt,
    qa_prompt,
    sample_to_chat,
)
from wam_diff_core.types import EgoState

SLOT = VISION_START_TOKEN + IMAGE_PAD_TOKEN + VISION_END_TOKEN


def test_planning_prompt_contains_ego_numbers_rounded_to_two_decimals_with_units():
    text = planning_prompt(EgoState(vx=12.345, vy=-0.004, ax=-1.236, ay=0.5), "Turn Left ")
    assert "vx=12.35 m/s" in text  # 12.345 is stored as 12.3450000000000006 -> rounds up
    assert "vy=0.00 m/s" in text  # no "-0.00"
    assert "ax=-1.24 m/s^2" in text
    assert "ay=0.50 m/s^2" in text
    assert "Navigation command: turn left." in text
    assert "8 waypoints" in text and "every 0.5 s" in text and "next 4 s" in text
    assert "x1,y1,x2,y2,...,x8,y8" in text and "2 decimals" in text


def test_planning_prompt_differs_per_command():
    ego = EgoState(vx=5.0)
    texts = {planning_prompt(ego, c) for c in NAV_COMMANDS}
    assert len(texts) == len(NAV_COMMANDS)


def test_planning_prompt_rejects_unknown_command_and_non_ego():
    with pytest.raises(ValueError, match="fly"):
        planning_prompt(EgoState(vx=1.0), "fly")
    with pytest.raises(ValueError, match="EgoState"):
        planning_prompt({"vx": 1.0}, "follow lane")


def test_detection_prompt_asks_for_bbox_2d_on_0_1000_scale():
    text = detection_prompt()
    assert text == DETECTION_PROMPT
    assert '"bbox_2d"' in text and "0..1000" in text and "vehicle" in text


def test_qa_prompt_keeps_question_and_rejects_blank():
    assert qa_prompt("  Why brake here? ").startswith("Why brake here?\n")
    for bad in ("", "   ", None):
        with pytest.raises(ValueError, match="question"):
            qa_prompt(bad)


def test_chat_prompt_exact_string_for_one_image():
    assert chat_prompt("Drive.", 1) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\nDrive.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert IMAGE_TOKENS == SLOT


def test_chat_prompt_zero_and_three_images():
    assert chat_prompt("Q", 0) == f"{IM_START_TOKEN}user\nQ{EOS_TOKEN}\n{IM_START_TOKEN}assistant\n"
    assert chat_prompt("Q", 3).count(IMAGE_PAD_TOKEN) == 3
    with pytest.raises(ValueError, match="num_images"):
        chat_prompt("Q", -1)


def _sample(human, images=("front.jpg", "back.jpg"), **overrides):
    sample = {
        "id": "s42",
        "datasource": "navsim",
        "task": "planning",
        "image": list(images),
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": "1.00,0.00"}],
    }
    sample.update(overrides)
    return sample


def test_sample_to_chat_replaces_two_markers_in_place():
    prompt, response = sample_to_chat(_sample("Front <image> back <image>\nPlan."))
    assert prompt == (
        f"{IM_START_TOKEN}user\nFront {SLOT} back {SLOT}\nPlan.{EOS_TOKEN}\n{IM_START_TOKEN}assistant\n"
    )
    assert response == "1.00,0.00"


def test_sample_to_chat_without_markers_puts_images_first():
    prompt, _ = sample_to_chat(_sample("Plan."))
    assert prompt == chat_prompt("Plan.", 2)
    assert prompt.index(SLOT) < prompt.index("Plan.")


def test_sample_to_chat_text_only_sample():
    prompt, _ = sample_to_chat(_sample("Why?", images=()))
    assert prompt == chat_prompt("Why?", 0) and IMAGE_PAD_TOKEN not in prompt


@pytest.mark.parametrize(
    "sample, match",
    [
        (_sample("<image> only one"), "s42.*1 '<image>' markers.*2 images"),
        (_sample("<image><image><image>"), "s42.*3 '<image>' markers.*2 images"),
        (_sample("<image>", images=()), "s42.*1 '<image>' markers.*0 images"),
        ({k: v for k, v in _sample("x").items() if k != "conversations"}, "s42.*missing keys.*conversations"),
        (_sample("x", image="front.jpg"), "s42.*list of path strings"),
        (
            _sample("x", conversations=[{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}]),
            "s42.*turn 0 must be.*human",
        ),
        (_sample("x", conversations=[{"from": "human", "value": "a"}, {"from": "gpt"}]), "s42.*turn 1"),
        (
            _sample("x", conversations=[{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}] * 2),
            "s42.*multi-turn.*not supported.*got 4 turns",
        ),
        (_sample("x", conversations=[{"from": "human", "value": "a"}, {"from": "gpt", "value": " "}]), "s42.*empty"),
    ],
)
def test_sample_to_chat_malformed_raises_naming_id_and_problem(sample, match):
    with pytest.raises(ValueError, match=match):
        sample_to_chat(sample)


def test_policy_prompt_is_token_for_token_the_training_prompt_of_a_generated_sample():
    # datagen writes "<image>\n" + planning_prompt(...); the policy builds chat_prompt(planning_prompt(...), 1)
    from wam_diff_core.constants import IMAGE_PLACEHOLDER
    from wam_diff_core.prompts import chat_prompt, detection_prompt, planning_prompt, sample_to_chat
    from wam_diff_core.types import EgoState

    ego = EgoState(vx=25.79, vy=0.0, ax=0.4, ay=-3.57)
    for text in (planning_prompt(ego, "follow lane"), detection_prompt()):
        sample = {"id": "x", "datasource": "t", "task": "planning", "image": ["a.png"],
                  "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{text}"},
                                    {"from": "gpt", "value": "1"}]}
        assert sample_to_chat(sample)[0] == chat_prompt(text, 1)


def test_route_target_sentence_is_added_parsed_and_removed_to_the_old_prompt():
    from wam_diff_core.prompts import parse_route_target, without_route_target

    ego = EgoState(vx=4.5)
    plain = planning_prompt(ego, "turn left")
    with_target = planning_prompt(ego, "turn left", (24.456, -3.0))
    assert "Route target point: x=24.46 m, y=-3.00 m." in with_target
    assert with_target.index("turn left.") < with_target.index("Route target point") < with_target.index("Plan the next")
    assert parse_route_target(with_target) == (24.46, -3.0)
    assert parse_route_target(plain) is None
    # the prompt without a target is the one every earlier model learned, character for character
    assert planning_prompt(ego, "turn left", None) == plain
    assert without_route_target(chat_prompt(with_target, 1)) == chat_prompt(plain, 1)
    assert without_route_target(plain) == plain


@pytest.mark.parametrize("bad", [(1.0,), (float("nan"), 0.0), ("a", 1.0), 3.0])
def test_route_target_rejects_bad_values_naming_them(bad):
    with pytest.raises(ValueError, match="route target"):
        planning_prompt(EgoState(vx=1.0), "follow lane", bad)
