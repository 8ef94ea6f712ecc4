import numpy as np
import pytest

from wam_diff_core.policy import DrivingPolicy, PolicyConfig
from wam_diff_core.types import EgoState, Plan


@pytest.fixture(scope="module")
def policy(nano):
    return DrivingPolicy(nano, PolicyConfig(block_size=8, steps=4, max_new_tokens=24, tasks=("planning", "detection")))


def test_plan_on_garbage_model_text_is_invalid_with_a_reason_and_timings(policy, camera_image):
    plan = policy.plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert isinstance(plan, Plan)
    assert plan.valid is False and plan.trajectory is None
    assert set(plan.errors) == {"planning", "detection"}  # a random model never writes a valid answer
    assert set(plan.raw_text) == {"planning", "detection"}
    for phase in ("vision", "prefill", "denoise", "total"):
        assert plan.timings[phase] > 0
    stats = plan.stats["decode"]
    assert stats.forwards >= 1 + 3  # prefill + at least one step per block of 8 over 24 tokens


@pytest.mark.parametrize(
    "images,match",
    [
        ([], "non-empty"),
        ([np.zeros((64, 64, 3), np.float32)], "uint8"),
        ([np.zeros((64, 64), np.uint8)], r"\(H, W, 3\)"),
        ([np.zeros((0, 64, 3), np.uint8)], "empty"),
        ("not an image", "non-empty list"),
    ],
)
def test_bad_images_raise_value_error_naming_the_problem(policy, images, match):
    with pytest.raises(ValueError, match=match):
        policy.plan(images, EgoState(vx=1.0), "follow lane")


def test_nan_in_ego_state_and_unknown_command_raise_value_error(policy, camera_image):
    with pytest.raises(ValueError, match="vx"):
        EgoState(vx=float("nan"))
    with pytest.raises(ValueError, match="fly"):
        policy.plan([camera_image], EgoState(vx=1.0), "fly")
    with pytest.raises(ValueError, match="EgoState"):
        policy.plan([camera_image], {"vx": 1.0}, "follow lane")


def test_ask_returns_an_answer_object_with_the_question(policy, camera_image):
    answer = policy.ask([camera_image], "Is the left lane free?")
    assert answer.question == "Is the left lane free?"
    assert answer.timings["ask_total"] > 0
    with pytest.raises(ValueError, match="question"):
        policy.ask([camera_image], "   ")


def test_policy_config_rejects_bad_values():
    with pytest.raises(ValueError, match="block_size"):
        PolicyConfig(block_size=0)
    with pytest.raises(ValueError, match="tasks"):
        PolicyConfig(tasks=("qa",))
    with pytest.raises(ValueError, match="strategy"):
        PolicyConfig(strategy="random")


def test_load_takes_a_config_or_overrides_on_the_checkpoints_own_defaults():
    policy = DrivingPolicy.load("nano", overrides={"block_size": 8, "steps": 2})
    assert (policy.config.block_size, policy.config.steps) == (8, 2)
    assert policy.config.threshold == policy.loaded.settings.decoding.threshold  # the rest: the checkpoint's
    own = DrivingPolicy.load("nano").config
    assert own == PolicyConfig.from_settings(policy.loaded.settings)
    with pytest.raises(ValueError, match="config or overrides"):
        DrivingPolicy.load("nano", config=PolicyConfig(), overrides={"steps": 2})


def test_policy_config_keeps_the_steps_a_block_takes():
    assert PolicyConfig(block_size=1, steps=4).steps == 1   # B = 1: one forward per token
    assert PolicyConfig(block_size=4, steps=8).steps == 4   # at most one step per token of the block
    assert PolicyConfig(block_size=32, steps=4).steps == 4
    assert PolicyConfig(block_size=1, steps=4) == PolicyConfig(block_size=1, steps=1)


def test_plan_parses_a_well_formed_answer_into_the_trajectory_and_boxes(policy, camera_image, monkeypatch):
    from wam_diff_core.decoding.result import DecodeResult

    traj = "1.00,0.00,2.00,0.10,3.00,0.20,4.00,0.30,5.00,0.40,6.00,0.50,7.00,0.60,8.00,0.70"
    boxes = '[{"bbox_2d": [0, 0, 500, 1000], "label": "car"}]'

    def fake_decode(prompts, images, cfg, tasks, ego=None):
        return DecodeResult([[1], [1]], [True, True], 2, 3, {"total": 0.1}), [traj, boxes]

    monkeypatch.setattr(policy, "_decode", fake_decode)
    plan = policy.plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert plan.valid and plan.errors == {}
    assert plan.trajectory.shape == (8, 2)
    assert plan.trajectory[7].tolist() == pytest.approx([8.0, 0.7], abs=1e-6)
    (det,) = plan.detections
    h, w = camera_image.shape[:2]
    assert det.box_px == pytest.approx((0.0, 0.0, w / 2, h))


def test_gpu_only_settings_on_a_cpu_model_name_what_is_missing(nano):
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        DrivingPolicy(nano, PolicyConfig(cuda_graphs=True))
    with pytest.raises(ValueError, match="flashinfer"):
        DrivingPolicy(nano, PolicyConfig(backend="flashinfer"))


def test_plan_states_the_route_target_only_to_a_checkpoint_that_learned_it(nano, camera_image, monkeypatch):
    import dataclasses

    from wam_diff_core.prompts import parse_route_target

    asked = []

    def fake_decode(prompts, images, cfg, tasks, ego=None):
        from wam_diff_core.decoding.result import DecodeResult

        asked.append(prompts[0])
        return DecodeResult([[1]], [True], 1, 1, {"total": 0.0}), ["1.00,0.00,2.00,0.00,3.00,0.00,4.00,0.00,"
                                                                   "5.00,0.00,6.00,0.00,7.00,0.00,8.00,0.00"]

    routed = dataclasses.replace(nano, settings=dataclasses.replace(nano.settings, route_target=True))
    for loaded, expected in ((routed, (24.5, 6.25)), (nano, None)):
        policy = DrivingPolicy(loaded, PolicyConfig(block_size=8, steps=4))
        monkeypatch.setattr(policy, "_decode", fake_decode)
        assert policy.uses_route_target is (expected is not None)
        assert policy.plan([camera_image], EgoState(vx=5.0), "turn left", target=(24.5, 6.25)).valid
        assert parse_route_target(asked[-1]) == expected
        policy.plan([camera_image], EgoState(vx=5.0), "turn left")
        assert parse_route_target(asked[-1]) is None
    with pytest.raises(ValueError, match="route target"):
        DrivingPolicy(routed, PolicyConfig(block_size=8, steps=4)).plan([camera_image], EgoState(vx=5.0), "turn left",
                                                                        target=(float("inf"), 0.0))
