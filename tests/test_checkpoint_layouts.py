"""Checkpoint directories as transformers 4.5x and 5.x write them (one file or shards, bf16 on disk) load with their
weights, tokenizer and image processor intact, in the dtype asked for.

The directories are written by transformers' own classes: `save_pretrained` of the model, of Qwen3VLProcessor
(5.x: `processor_config.json` holding the image and video processors, no `preprocessor_config.json`) or, for 4.5x,
of each sub-processor in turn as 4.5x's `ProcessorMixin.save_pretrained` did by default (legacy serialization:
`preprocessor_config.json` with "processor_class", `video_preprocessor_config.json`, the tokenizer's files with a
Qwen2Tokenizer `tokenizer_config.json`, vocab.json and merges.txt; config.json naming its dtype "torch_dtype")."""
import copy
import json

import numpy as np
import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.model.checkpoint import CheckpointError, LoadedModel, load_model
from wam_diff_core.model.precision import DtypeError, resolve_dtype, stored_dtype
from wam_diff_core.model.presets import NANO_VOCAB_SIZE, Preset, TextArch, VisionArch, build_config
from wam_diff_core.model.runner import ModelRunner

LAYOUTS = ("transformers-5", "transformers-4.5x")
TINY = Preset("tiny", TextArch(NANO_VOCAB_SIZE, 64, 128, 2, 2, 1, 32, 5e5, (6, 5, 5), True, 4096),
              VisionArch(1, 32, 64, 2, 64, 256, (0,)), own_tokenizer=True)
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>go 12.5<|im_end|>\n<|im_start|>assistant\n"
SHARD = "150KB"  # the tiny model's bf16 weights (~0.25 MB) in a few shards


@pytest.fixture(scope="module")
def tiny(nano):
    """A tiny Qwen3-VL with nano's tokenizer and image processor, weights rounded to bf16 (as saved)."""
    cfg, text = nano.model.config, nano.model.config.text_config
    ids = {"pad_token_id": text.pad_token_id, "eos_token_id": text.eos_token_id,
           **{k: getattr(cfg, k) for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id",
                                           "video_token_id")}}
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration._from_config(build_config(TINY, ids)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
    return LoadedModel(model.to(torch.bfloat16), nano.processor, nano.settings, "tiny")


def _save_5x(tiny, path, monkeypatch):
    # Qwen3VLProcessor checks its video processor's class through the auto mapping, which needs torchvision
    monkeypatch.setattr(Qwen3VLProcessor, "check_argument_for_proper_class", lambda self, name, arg: None)
    processor = Qwen3VLProcessor(image_processor=tiny.processor.image_processor, tokenizer=tiny.processor.tokenizer,
                                 video_processor=Qwen3VLVideoProcessor())
    processor.save_pretrained(str(path))


def _tokenizer_config_4_5x(tokenizer) -> dict:
    added = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                      "single_word": t.single_word, "special": t.special}
             for i, t in tokenizer.added_tokens_decoder.items()}
    specials = [t.content for t in tokenizer.added_tokens_decoder.values()
                if t.content not in (tokenizer.eos_token, tokenizer.pad_token)]
    return {"add_prefix_space": False, "added_tokens_decoder": added, "additional_special_tokens": specials,
            "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": tokenizer.eos_token,
            "errors": "replace", "extra_special_tokens": {}, "model_max_length": 4096,
            "pad_token": tokenizer.pad_token, "processor_class": "Qwen3VLProcessor", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def _save_4_5x(tiny, path):
    tokenizer, image_processor = tiny.processor.tokenizer, tiny.processor.image_processor
    tokenizer.save_pretrained(str(path))
    model = json.loads((path / "tokenizer.json").read_text())["model"]
    (path / "vocab.json").write_text(json.dumps(model["vocab"]))
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in model["merges"]) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config_4_5x(tokenizer), indent=2))
    image_processor.save_pretrained(str(path))
    settings = json.loads((path / "preprocessor_config.json").read_text())
    size = settings["size"]
    settings.update(processor_class="Qwen3VLProcessor", image_processor_type="Qwen2VLImageProcessorFast",
                    min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])
    (path / "preprocessor_config.json").write_text(json.dumps(settings, indent=2))
    Qwen3VLVideoProcessor().save_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    for section in (config, config["text_config"], config["vision_config"]):
        if "dtype" in section:
            section["torch_dtype"] = section.pop("dtype")
    config["transformers_version"] = "4.55.4"
    (path / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    """(layout, sharded) -> a directory written that way, bf16 on disk."""
    out = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for layout in LAYOUTS:
            for sharded in (False, True):
                path = tmp_path_factory.mktemp(f"{layout}-{'sharded' if sharded else 'single'}")
                tiny.model.save_pretrained(str(path), max_shard_size=SHARD if sharded else "1GB")
                _save_5x(tiny, path, monkeypatch) if layout == "transformers-5" else _save_4_5x(tiny, path)
                out[layout, sharded] = path
    return out


def _decode(loaded, camera_image) -> list[list[int]]:
    cfg = DecoderConfig(block_size=4, steps=2, max_new_tokens=12, ignore_eos=True)
    batch = loaded.processor.encode([PROMPT], [[camera_image]])
    return generate(ModelRunner(loaded.model), batch, cfg, loaded.settings.mask_token_id,
                    loaded.settings.eos_token_id).token_ids


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_bf16_checkpoint_of_each_layout_loads_as_float32_on_the_cpu_with_its_weights_and_tokens(
        tiny, saved, camera_image, layout, sharded):
    path = saved[layout, sharded]
    names = {f.name for f in path.iterdir()}
    assert ("preprocessor_config.json" in names) == (layout == "transformers-4.5x")
    assert ("processor_config.json" in names) == (layout == "transformers-5")
    assert ("model.safetensors.index.json" in names) == sharded
    assert len([n for n in names if n.endswith(".safetensors")]) >= (3 if sharded else 1)
    loaded = load_model(path)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    want = {k: v.float() for k, v in tiny.model.state_dict().items()}
    got = loaded.model.state_dict()
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    a = tiny.processor.encode([PROMPT], [[camera_image]])
    b = loaded.processor.encode([PROMPT], [[camera_image]])
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.pixel_values, b.pixel_values)
    assert loaded.processor.mask_token_id == tiny.processor.mask_token_id == 7
    reference = LoadedModel(copy.deepcopy(tiny.model).float(), tiny.processor, tiny.settings, "tiny")
    tokens = _decode(loaded, camera_image)
    assert tokens == _decode(reference, camera_image) and len(set(tokens[0])) > 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_bf16_checkpoint_loaded_as_bfloat16_keeps_bf16_weights_in_half_the_memory(tiny, saved, camera_image,
                                                                                   layout):
    path = saved[layout, True]
    loaded = load_model(path, dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    numel = sum(p.numel() for p in loaded.model.parameters())
    assert _param_bytes(loaded.model) == 2 * numel
    assert _param_bytes(load_model(path).model) == 4 * numel
    got, want = loaded.model.state_dict(), tiny.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert _decode(loaded, camera_image) == _decode(tiny, camera_image)


def test_float16_and_torch_dtypes_are_taken_as_asked(saved):
    path = saved["transformers-5", False]
    assert {p.dtype for p in load_model(path, dtype="float16").model.parameters()} == {torch.float16}
    assert {p.dtype for p in load_model(path, dtype=torch.bfloat16).model.parameters()} == {torch.bfloat16}


def test_unset_dtype_is_the_checkpoints_own_on_a_gpu_and_float32_on_a_cpu(saved, tmp_path):
    for (layout, sharded), path in saved.items():
        files = sorted(path.glob("*.safetensors"))
        assert stored_dtype(path, files) == torch.bfloat16, (layout, sharded)
    # a config.json stating no dtype: the first floating-point tensor says
    path = saved["transformers-5", True]
    bare = tmp_path / "bare"
    bare.mkdir()
    config = json.loads((path / "config.json").read_text())
    for section in (config, config["text_config"], config["vision_config"]):
        section.pop("dtype", None)
    (bare / "config.json").write_text(json.dumps(config))
    assert stored_dtype(bare, sorted(path.glob("*.safetensors"))) == torch.bfloat16
    assert resolve_dtype(None, "cuda", torch.bfloat16) == torch.bfloat16
    assert resolve_dtype(None, "cuda:1", None) == torch.float32
    assert resolve_dtype(None, "cpu", torch.bfloat16) == torch.float32
    assert resolve_dtype("float16", "cpu", torch.bfloat16) == torch.float16


def test_a_bad_dtype_is_one_line_naming_it_and_the_names_expected(saved):
    with pytest.raises(DtypeError) as err:
        load_model(saved["transformers-5", False], dtype="fp8")
    message = str(err.value)
    assert "\n" not in message and "'fp8'" in message and "float32, bfloat16, float16" in message


def test_without_any_image_processor_file_the_error_names_both_places(saved, tmp_path):
    path = tmp_path / "ckpt"
    path.mkdir()
    for f in saved["transformers-5", False].iterdir():
        if f.name != "processor_config.json":
            (path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(CheckpointError, match=r"missing checkpoint file: .*preprocessor_config\.json \(or "
                                              r"processor_config\.json with an 'image_processor' section"):
        load_model(path)
    (path / "processor_config.json").write_text(json.dumps({"image_processor": [1, 2]}))
    with pytest.raises(CheckpointError, match=r"corrupt checkpoint file .*processor_config\.json: 'image_processor'"):
        load_model(path)
