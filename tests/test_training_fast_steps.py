"""The faster training step (train.cpu_bf16, train.compile, distill.ar_teacher_clean_only): each computes
what the plain step computes, within its precision, and the switches reach the step."""
import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from wam_diff_training.cli import main
from wam_diff_training.collate import collate, corrupt, layout, positions, without_noisy
from wam_diff_training.compiled import compiled_layers, text_layers
from wam_diff_training.data import Example
from wam_diff_training.objective import SelectedLogits, diffusion_loss, distill_loss, masked_rows, run_logits
from wam_diff_training.precision import matmul_patch_embed, step_autocast
from wam_diff_core.attention.backends import use_backend
from wam_diff_core.constants import IMAGE_PAD_TOKEN
from tests.test_training_stages import FAST, _metrics, write_dataset


def _examples(nano):
    """An image prompt and two text prompts of different lengths (so rows are padded differently)."""
    image = np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    rows = [(f"<|im_start|>user\n<|vision_start|>{IMAGE_PAD_TOKEN}<|vision_end|>Where next?<|im_end|>\n"
             "<|im_start|>assistant\n", "+001.20,+000.10,+002.40,+000.15,+003.60<|im_end|>", [image]),
            ("<|im_start|>user\nIs the lane free?<|im_end|>\n<|im_start|>assistant\n", "yes<|im_end|>", []),
            ("<|im_start|>user\nWhat is ahead of the ego car on the road?<|im_end|>\n<|im_start|>assistant\n",
             "a truck in the right lane, slowing<|im_end|>", [])]
    out = []
    for i, (p, r, imgs) in enumerate(rows):
        enc = nano.processor.encode([p], [imgs])
        resp = nano.processor.tokenizer(r, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        out.append(Example(f"s{i}", "qa", enc.input_ids[0], enc.mm_token_type_ids[0], resp,
                           enc.pixel_values if imgs else None, enc.image_grid_thw if imgs else None))
    return out


def test_an_ar_teacher_reading_the_clean_copy_alone_gives_the_logits_it_gives_on_the_whole_layout(nano):
    use_backend(nano.model, "sdpa")
    batch = collate(_examples(nano), 0, with_noisy=True)
    cor = corrupt(batch, layout(batch, 4), nano.settings.mask_token_id, torch.Generator().manual_seed(0), 0.6, 1.0)
    row_b, row_k = masked_rows(cor)
    view, ids = without_noisy(batch, cor.input_ids)
    assert not view.with_noisy
    assert ids.shape[1] == int((batch.prefix_len + batch.response_len).max()) < batch.seq_len
    assert torch.equal(ids, cor.input_ids[:, :ids.shape[1]])
    module = SelectedLogits(nano.model)
    with torch.no_grad():
        whole = run_logits(module, nano.model, batch, layout(batch, 1), cor.input_ids, positions(batch, nano.model),
                           row_b, row_k)
        clean = run_logits(module, nano.model, view, layout(view, 1), ids, positions(view, nano.model), row_b, row_k)
    assert whole.shape == clean.shape and whole.shape[0] == len(row_b) > 10
    assert whole.std() > 0.1  # a model with spread logits: the comparison is not between near-equal rows
    assert (whole - clean).abs().max() < 1e-4
    # and the loss: the same with the switch on, for an AR teacher
    with torch.no_grad():
        args = (module, nano.model, nano.model, batch, 4, 1, nano.settings.mask_token_id)
        plain = distill_loss(*args, torch.Generator().manual_seed(1), ratio=0.5)
        short = distill_loss(*args, torch.Generator().manual_seed(1), ratio=0.5, teacher_clean_only=True)
    assert plain.stats["jsd"] > 1e-3
    assert abs(plain.loss.item() - short.loss.item()) < 1e-5
    assert abs(plain.stats["jsd"].item() - short.stats["jsd"].item()) < 1e-5


def test_the_patch_embedding_as_one_matrix_product_equals_the_conv3d_and_odd_convolutions_are_refused(nano):
    model = copy.deepcopy(nano.model)
    embed = model.model.visual.patch_embed
    x = torch.randn(40, embed.proj.weight[0].numel())
    with torch.no_grad():
        conv = embed(x)
        assert matmul_patch_embed(model) == 1
        prod = embed(x)
    assert conv.shape == prod.shape == (40, embed.proj.out_channels)
    assert conv.abs().mean() > 0.01 and (conv - prod).abs().max() < 1e-5 * conv.abs().max()  # summation order
    odd = copy.deepcopy(nano.model)
    p = odd.model.visual.patch_embed.proj
    odd.model.visual.patch_embed.proj = nn.Conv3d(p.in_channels, p.out_channels, p.kernel_size, stride=1)
    with pytest.raises(ValueError, match="not one product per patch"):
        matmul_patch_embed(odd)


def test_cpu_bf16_autocast_runs_products_in_bfloat16_only_when_asked():
    lin = nn.Linear(8, 4)
    x = torch.randn(2, 8)
    cpu = torch.device("cpu")
    with step_autocast(cpu, bf16=True, cpu_bf16=False):
        assert lin(x).dtype == torch.float32  # train.bf16 is about CUDA
    with step_autocast(cpu, bf16=False, cpu_bf16=True):
        assert lin(x).dtype == torch.bfloat16
    assert isinstance(step_autocast(torch.device("cuda"), True, False), torch.autocast)


def test_compiled_layers_give_the_eager_loss_and_gradients_and_are_eager_again_after(nano):
    model = copy.deepcopy(nano.model).train()
    use_backend(model, "sdpa")
    batch = collate(_examples(nano), 0, with_noisy=True)
    module = SelectedLogits(model)

    def step():
        model.zero_grad(set_to_none=True)
        out = diffusion_loss(module, model, batch, 4, nano.settings.mask_token_id, torch.Generator().manual_seed(2),
                             0.3, 1.0)
        out.loss.backward()
        return out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager_grads = step()
    with compiled_layers(model):
        assert all(layer._compiled_call_impl is not None for layer in text_layers(model))
        comp_loss, comp_grads = step()
    assert all(layer._compiled_call_impl is None for layer in text_layers(model))
    assert eager_loss > 1.0 and abs(comp_loss - eager_loss) < 1e-4 * eager_loss
    worst = max(((comp_grads[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)).item() for n, g in eager_grads.items())
    assert set(comp_grads) == set(eager_grads) and worst < 1e-3, worst


def test_a_distillation_stage_with_cpu_bf16_and_the_clean_teacher_trains_and_compile_refuses_on_policy(nano_ckpt, tmp_path,
                                                                                                         capsys):
    data = write_dataset(tmp_path / "data", n=4)
    out = tmp_path / "kd"
    common = ["distill", "--teacher", str(nano_ckpt), "--teacher-block-size", "1", "--student", str(nano_ckpt),
              "--block-size", "4", "--ratio", "0.5", "--data", str(data), "--out", str(out), "--max-steps", "2",
              "--batch-size", "2", "--set", "eval.enabled=false", "--set", "data.max_response_tokens=12", *FAST]
    assert main(common + ["--set", "train.cpu_bf16=true", "--set", "distill.ar_teacher_clean_only=true"]) == 0
    rows = _metrics(out / "distill")
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) and 0.0 < r["jsd"] <= np.log(2) for r in rows)
    config = json.loads((out / "distill" / "run_config.json").read_text())["config"]
    assert config["train"]["cpu_bf16"] is True and config["distill"]["ar_teacher_clean_only"] is True
    capsys.readouterr()
    assert main(common + ["--overwrite", "--set", "train.compile=true", "--on-policy-every", "2"]) != 0
    assert "wam-diff-train distill: error: train.compile" in capsys.readouterr().err


def test_step_variants_parse_and_unknown_switches_are_refused():
    from wam_diff_training.speed import parse_variants
    vs = parse_variants("float32,bf16+clean,compile")
    assert [(v.name, v.bf16, v.compile, v.clean) for v in vs] == [
        ("float32", False, False, False), ("bf16+clean", True, False, True), ("compile", False, True, False)]
    with pytest.raises(ValueError, match="unknown \\['fp8'\\]"):
        parse_variants("float32,bf16+fp8")
    with pytest.raises(ValueError, match="at most once"):
        parse_variants("bf16,bf16")


def test_the_speed_table_times_each_variant_of_the_distillation_step_on_the_same_batches(nano_ckpt, tmp_path):
    from wam_diff_training.speed import measure, parse_variants
    data = write_dataset(tmp_path / "data", n=4)
    torch.set_num_threads(1)
    result = measure(str(nano_ckpt), [{"path": str(data)}], [1, 4], steps=2, warmup=1, batch_size=2,
                     variants=parse_variants("float32,bf16+clean"), teacher=str(nano_ckpt), max_response_tokens=12)
    rows = {(r["block_size"], r["variant"]): r for r in result["rows"]}
    assert set(rows) == {(1, "float32"), (1, "bf16+clean"), (4, "float32"), (4, "bf16+clean")}
    assert rows[(4, "float32")]["objective"] == "distill" and rows[(1, "float32")]["objective"] == "ar"
    assert rows[(1, "float32")]["speedup_vs_first_variant"] == 1.0
    assert all(r["sec_per_step_median"] > 0 and r["speedup_vs_first_variant"] > 0 for r in rows.values())
    assert rows[(4, "float32")]["padded_tokens_per_step"] > rows[(1, "float32")]["padded_tokens_per_step"]
