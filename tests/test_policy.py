import numpy as np
import pytest

from wam_diff_core.decoding.config import DecoderConfig, resolve_decoding
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.types import EgoState, Plan


@pytest.fixture(scope="module")
def policy(nano):
    return DrivingPolicy(nano, DecoderConfig(block_size=8, steps=4, max_new_tokens=24), tasks=("planning", "detection"))


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


def test_bad_decoding_settings_and_tasks_raise_value_error_naming_them(nano):
    with pytest.raises(ValueError, match="block_size"):
        DecoderConfig(block_size=0)
    with pytest.raises(ValueError, match="strategy"):
        DecoderConfig(strategy="random")
    with pytest.raises(ValueError, match="tasks"):
        DrivingPolicy(nano, tasks=("qa",))
    with pytest.raises(ValueError, match=r"unknown decoding settings \['stepz'\]"):
        DrivingPolicy.load("nano", stepz=2)


def test_load_lays_the_given_decoding_settings_on_the_checkpoints_own():
    policy = DrivingPolicy.load("nano", block_size=8, steps=2, strategy=None)
    assert (policy.config.block_size, policy.config.steps) == (8, 2)
    own = policy.loaded.settings.decoding
    assert (policy.config.strategy, policy.config.threshold) == (own.strategy, own.threshold)  # None: the checkpoint's
    assert DrivingPolicy.load("nano").config == resolve_decoding(own)
    assert DrivingPolicy(policy.loaded).config == resolve_decoding(own)


def test_resolve_decoding_keeps_the_checkpoints_values_for_unset_ones_and_b1_takes_one_step():
    ckpt = DecoderConfig(block_size=32, steps=8, strategy="low_confidence_static", threshold=0.7, schedule="cosine",
                         number_order=False, forward_only=True)
    unset = dict(block_size=None, steps=None, strategy=None, threshold=None, schedule=None, number_order=None,
                 forward_only=None, max_new_tokens=None, backend=None, cuda_graphs=None, text_layers=None)
    assert resolve_decoding(ckpt, **unset) == ckpt
    assert resolve_decoding(ckpt, steps=2) == DecoderConfig(block_size=32, steps=2, strategy="low_confidence_static",
                                                            threshold=0.7, schedule="cosine", number_order=False,
                                                            forward_only=True)
    assert resolve_decoding(ckpt, block_size=1).steps == 1            # B = 1: one forward per token
    assert resolve_decoding(ckpt, block_size=1, steps=4).steps == 1   # whatever K says
    assert resolve_decoding(ckpt, block_size=4).steps == 4            # at most one step per token of the block
    assert resolve_decoding(DecoderConfig(block_size=1, steps=1), block_size=16).steps == 1  # K stays the AR's own
    assert resolve_decoding(ckpt, block_size=1).forward_only is True  # the rest stays the checkpoint's


def test_an_unset_token_budget_is_the_tasks_own(policy, nano, monkeypatch, camera_image):
    from wam_diff_core import policy as policy_mod
    from wam_diff_core.decoding.result import DecodeResult

    budgets = []

    def fake_generate(runner, batch, cfg, mask_id, eos_id, grammar):
        budgets.append(cfg.max_new_tokens)
        return DecodeResult([[1]] * batch.input_ids.shape[0], [True] * batch.input_ids.shape[0], 1, 1, {"total": 0.0})

    monkeypatch.setattr(policy_mod, "generate", fake_generate)
    unset = DrivingPolicy(nano, DecoderConfig(block_size=8, steps=4), tasks=("planning", "detection"))
    unset.plan([camera_image], EgoState(vx=5.0), "follow lane", tasks=("planning",))
    unset.plan([camera_image], EgoState(vx=5.0), "follow lane")
    unset.ask([camera_image], "Is the left lane free?")
    policy.plan([camera_image], EgoState(vx=5.0), "follow lane")
    assert budgets == [128, 192, 64, 24]


def test_the_shipped_models_name_loads_its_directory_or_an_install_prefixs_or_fails_in_one_line(
        monkeypatch, tmp_path):
    from wam_diff_core.errors import WamDiffError
    from wam_diff_core.model import shipped as policy_mod

    assert policy_mod.resolve_model("nano-s-b32") == str(policy_mod.SHIPPED_MODEL_DIR)
    assert policy_mod.SHIPPED_MODEL_DIR.is_dir()
    assert policy_mod.resolve_model("nano") == "nano"
    monkeypatch.setattr(policy_mod, "SHIPPED_MODEL_DIR", tmp_path / "absent")
    monkeypatch.setattr(policy_mod.sys, "prefix", str(tmp_path / "prefix"))
    installed = tmp_path / "ws" / "install" / "wam_diff_ros"
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"{tmp_path / 'other'}:{installed}")
    with pytest.raises(WamDiffError) as err:
        policy_mod.resolve_model("nano-s-b32")
    message = str(err.value)
    assert "\n" not in message and "nano-s-b32" in message and message.count(str(tmp_path)) == 4
    (installed / "share" / "wam_diff_ros" / "models" / "nano-s-b32").mkdir(parents=True)
    assert policy_mod.resolve_model("nano-s-b32") == str(installed / "share" / "wam_diff_ros" / "models" / "nano-s-b32")


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
        DrivingPolicy(nano, DecoderConfig(cuda_graphs=True))
    with pytest.raises(ValueError, match="flashinfer"):
        DrivingPolicy(nano, DecoderConfig(backend="flashinfer"))


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
        policy = DrivingPolicy(loaded, DecoderConfig(block_size=8, steps=4))
        monkeypatch.setattr(policy, "_decode", fake_decode)
        assert policy.uses_route_target is (expected is not None)
        assert policy.plan([camera_image], EgoState(vx=5.0), "turn left", target=(24.5, 6.25)).valid
        assert parse_route_target(asked[-1]) == expected
        policy.plan([camera_image], EgoState(vx=5.0), "turn left")
        assert parse_route_target(asked[-1]) is None
    with pytest.raises(ValueError, match="route target"):
        DrivingPolicy(routed, DecoderConfig(block_size=8, steps=4)).plan([camera_image], EgoState(vx=5.0), "turn left",
                                                                        target=(float("inf"), 0.0))


def test_the_shipped_models_name_reads_its_wam_diff_json_in_the_closed_loops():
    from wam_diff_core.sim.routes import checkpoint_frame_size, checkpoint_route_target_scenarios

    assert checkpoint_frame_size("nano-s-b32") == (256, 128)
    assert checkpoint_route_target_scenarios("nano-s-b32") == ("roundabout",)
    assert checkpoint_frame_size("constant-velocity") is None
