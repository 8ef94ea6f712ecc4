import json
import shutil
from pathlib import Path

import pytest
import torch

from wam_diff_core.constants import WAM_DIFF_CONFIG_NAME
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.checkpoint import CheckpointError, build_preset, load, load_model, save_model
from wam_diff_core.model.presets import build_config, get_preset, QWEN_SPECIAL_IDS
from wam_diff_core.model.runner import ModelRunner
from wam_diff_core.model.settings import WamDiffSettings


@pytest.fixture(scope="module")
def saved(nano, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "nano"
    save_model(nano, path)
    return path


def _copy(saved, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(saved, dst)
    return dst


def test_nano_preset_has_five_to_ten_million_parameters_and_its_mask_token(nano):
    assert 5e6 <= nano.num_params <= 10e6
    tok = nano.processor.tokenizer
    assert tok.convert_ids_to_tokens(nano.settings.mask_token_id) == "<|mask|>"
    assert tok.convert_ids_to_tokens(nano.settings.eos_token_id) == "<|im_end|>"


def test_save_load_round_trip_keeps_weights_settings_and_decoded_tokens(nano, saved, camera_image):
    loaded = load_model(saved)
    for (name, a), (_, b) in zip(nano.model.state_dict().items(), loaded.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.settings == nano.settings
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>go<|im_end|>\n<|im_start|>assistant\n"
    cfg = DecoderConfig(block_size=4, steps=2, max_new_tokens=16, ignore_eos=True)
    outs = []
    for lm in (nano, loaded):
        batch = lm.processor.encode([prompt], [[camera_image]])
        outs.append(generate(ModelRunner(lm.model), batch, cfg, lm.settings.mask_token_id, lm.settings.eos_token_id).token_ids)
    assert outs[0] == outs[1]


def test_missing_config_names_the_file(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_model(path)


def test_corrupt_safetensors_names_the_file(saved, tmp_path):
    path = _copy(saved, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1000])
    with pytest.raises(CheckpointError, match=r"corrupt checkpoint file .*model\.safetensors"):
        load_model(path)


def test_pickle_only_checkpoint_is_refused(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: pickle checkpoints are refused"):
        load_model(path)


def test_corrupt_settings_file_names_it(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / WAM_DIFF_CONFIG_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match=WAM_DIFF_CONFIG_NAME):
        load_model(path)


def test_missing_directory_and_unknown_preset_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found: .*no-such-model"):
        load(str(tmp_path / "no-such-model"))


def test_stock_checkpoint_without_settings_is_an_ar_model_with_the_mask_token_added(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / WAM_DIFF_CONFIG_NAME).unlink()
    loaded = load_model(path)
    assert loaded.settings.trained_block_size == 1
    assert loaded.settings.mask_token_id == loaded.processor.mask_token_id


def test_settings_reject_an_unknown_strategy(tmp_path):
    bad = WamDiffSettings(mask_token_id=7, eos_token_id=2).to_json().replace("low_confidence_dynamic", "fancy")
    (tmp_path / WAM_DIFF_CONFIG_NAME).write_text(bad)
    with pytest.raises(ValueError, match="fancy"):
        WamDiffSettings.load(tmp_path / WAM_DIFF_CONFIG_NAME)


@pytest.mark.parametrize("name,params_b", [("qwen3-vl-2b", 2.0), ("qwen3-vl-8b", 8.0)])
def test_real_architecture_presets_have_the_published_sizes(name, params_b):
    config = build_config(get_preset(name), QWEN_SPECIAL_IDS)
    with torch.device("meta"):
        from transformers import Qwen3VLForConditionalGeneration

        model = Qwen3VLForConditionalGeneration._from_config(config)
    n = sum(p.numel() for p in model.parameters()) / 1e9
    assert abs(n - params_b) / params_b < 0.15, n
    assert config.text_config.vocab_size == 151936


def test_nano_l_preset_is_the_15_to_25_million_parameter_teacher_with_the_nano_tokenizer(nano):
    teacher = build_preset("nano-l")
    assert 15e6 <= teacher.num_params <= 25e6
    assert teacher.processor.tokenizer.get_vocab() == nano.processor.tokenizer.get_vocab()


def test_a_mistyped_path_is_reported_as_a_missing_directory_not_an_unknown_preset(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found: .*models/nano-s-b23"):
        load(str(tmp_path / "models" / "nano-s-b23"))
    with pytest.raises(CheckpointError, match="neither a checkpoint directory nor a preset"):
        load("nanoo")


def test_save_model_with_an_explicit_state_dict_writes_those_weights(nano, tmp_path):
    state = {k: v.clone() for k, v in nano.model.state_dict().items()}
    state["model.language_model.norm.weight"] = state["model.language_model.norm.weight"] + 1.0
    path = save_model(nano, tmp_path / "explicit", state_dict=state)
    loaded = load_model(path)
    assert torch.equal(loaded.model.model.language_model.norm.weight, state["model.language_model.norm.weight"])
    assert not (tmp_path / ".explicit.old").exists()


def test_save_model_writes_extra_files_inside_the_atomic_directory(nano, tmp_path):
    path = save_model(nano, tmp_path / "with_record", extra_files={"record.json": '{"a": 1}\n'})
    assert json.loads((path / "record.json").read_text()) == {"a": 1}
    # a record that cannot be written leaves no model behind (nor a half-written temporary directory)
    with pytest.raises(FileNotFoundError):
        save_model(nano, tmp_path / "broken", extra_files={"missing_dir/record.json": "{}"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["with_record"]


def test_decoding_defaults_follow_the_trained_block_size_and_drive_the_policy(tmp_path):
    from wam_diff_core.decoding.config import resolve_decoding
    from wam_diff_core.model.checkpoint import build_preset, load_model, save_model
    from wam_diff_core.policy import DrivingPolicy

    loaded = build_preset("nano")
    ar = loaded.settings.for_block_size(1)
    assert (ar.trained_block_size, ar.decoding.block_size, ar.decoding.steps) == (1, 1, 1)
    b16 = loaded.settings.for_block_size(16)
    assert (b16.trained_block_size, b16.decoding.block_size) == (16, 16)
    assert b16.decoding.steps == loaded.settings.decoding.steps and b16.decoding.threshold == loaded.settings.decoding.threshold
    save_model(type(loaded)(loaded.model, loaded.processor, ar, loaded.name), tmp_path / "ar")
    policy = DrivingPolicy(load_model(tmp_path / "ar"))
    assert (policy.config.block_size, policy.config.steps) == (1, 1)
    assert resolve_decoding(b16.decoding, steps=2) == DecoderConfig(block_size=16, steps=2,
                                                                    strategy=b16.decoding.strategy,
                                                                    threshold=b16.decoding.threshold)
    assert resolve_decoding(ar.decoding, steps=4).steps == 1  # K alone on an AR checkpoint: still one per token


SHIPPED = Path(__file__).resolve().parent.parent / "models"


@pytest.mark.parametrize("name", ["nano-s-b32", "nano-s-ar"])
def test_the_shipped_models_settings_load_and_save_byte_for_byte(name, tmp_path):
    text = (SHIPPED / name / WAM_DIFF_CONFIG_NAME).read_text()
    settings = WamDiffSettings.load(SHIPPED / name / WAM_DIFF_CONFIG_NAME)
    assert (settings.name, settings.version) == (name, "1.0.0")
    assert settings.to_json() == text
    settings.save(tmp_path)
    assert (tmp_path / WAM_DIFF_CONFIG_NAME).read_bytes() == (SHIPPED / name / WAM_DIFF_CONFIG_NAME).read_bytes()
    assert list(json.loads(text)["decoding"]) == ["block_size", "steps", "strategy", "threshold", "number_order",
                                                 "schedule", "forward_only"]


def test_settings_without_a_name_load_and_save_as_they_were(tmp_path):
    raw = json.loads((SHIPPED / "nano-s-b32" / WAM_DIFF_CONFIG_NAME).read_text())
    del raw["name"], raw["version"]
    text = json.dumps(raw, indent=2)
    (tmp_path / WAM_DIFF_CONFIG_NAME).write_text(text)
    settings = WamDiffSettings.load(tmp_path / WAM_DIFF_CONFIG_NAME)
    assert settings.name is None and settings.to_json() == text


@pytest.mark.parametrize("where,key", [("top", "colour"), ("decoding", "max_new_tokens"), ("decoding", "stepz")])
def test_settings_name_an_unknown_key(tmp_path, where, key):
    raw = json.loads(WamDiffSettings(mask_token_id=7, eos_token_id=2).to_json())
    (raw if where == "top" else raw["decoding"])[key] = 1
    (tmp_path / WAM_DIFF_CONFIG_NAME).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"{WAM_DIFF_CONFIG_NAME}.*unknown keys \['{key}'\]"):
        WamDiffSettings.load(tmp_path / WAM_DIFF_CONFIG_NAME)


def test_settings_keep_a_frame_size_and_name_a_bad_one(tmp_path):
    s = WamDiffSettings(mask_token_id=7, eos_token_id=2, frame_size=[256, 128])
    assert s.frame_size == (256, 128)
    s.save(tmp_path)
    assert WamDiffSettings.load(tmp_path / WAM_DIFF_CONFIG_NAME).frame_size == (256, 128)
    assert WamDiffSettings(mask_token_id=7, eos_token_id=2).frame_size is None  # older files: not recorded
    for bad in ([256], [256, 0], [256.5, 128], "256x128"):
        raw = json.loads(s.to_json())
        raw["frame_size"] = bad
        (tmp_path / WAM_DIFF_CONFIG_NAME).write_text(json.dumps(raw))
        with pytest.raises(ValueError, match="frame_size"):
            WamDiffSettings.load(tmp_path / WAM_DIFF_CONFIG_NAME)


def test_shipped_models_record_the_frames_they_were_trained_on():
    from wam_diff_core.constants import FRAME_SIZE

    root = Path(__file__).resolve().parent.parent / "models"
    for name in ("nano-s-b32", "nano-s-ar"):
        assert WamDiffSettings.load(root / name / WAM_DIFF_CONFIG_NAME).frame_size == FRAME_SIZE
