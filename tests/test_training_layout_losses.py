"""Training layout (block ids, kinds, shifted targets, positions), noise and losses, on hand-checked cases."""
import copy
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from wam_diff_core.attention.backends import use_backend
from wam_diff_core.attention.block_mask import CLEAN, NOISY, PAD, PREFIX, training_layout, visibility
from wam_diff_core.constants import IMAGE_PAD_TOKEN
from wam_diff_training.collate import collate, corrupt, layout, positions, stratified_t
from wam_diff_training.data import BadSample, DataError, DrivingDataset, Example
from wam_diff_training.losses import diffusion_ce, divergence, jsd, top_k_agreement
from wam_diff_training.objective import SelectedLogits, diffusion_loss, distill_loss


def _example(sid, prompt, response, mm=None):
    prompt = torch.tensor(prompt)
    mm = torch.zeros(len(prompt), dtype=torch.int32) if mm is None else torch.tensor(mm, dtype=torch.int32)
    return Example(sid, "qa", prompt, mm, torch.tensor(response), None, None)


def test_layout_block_ids_kinds_and_shifted_targets_on_a_hand_checked_pair():
    # sample 0: prefix 3, response 5; sample 1: prefix 2, response 2 (right-padded)
    batch = collate([_example("a", [11, 12, 13], [21, 22, 23, 24, 25]), _example("b", [31, 32], [41, 42])], pad_id=0)
    lay = layout(batch, 2)
    assert batch.input_ids[0].tolist() == [11, 12, 13, 21, 22, 23, 24, 25, 21, 22, 23, 24, 25]
    assert batch.input_ids[1].tolist() == [31, 32, 41, 42, 41, 42] + [0] * 7
    P_, C_, N_, X_ = PREFIX, CLEAN, NOISY, PAD
    assert lay.kinds[0].tolist() == [P_] * 3 + [C_] * 5 + [N_] * 5
    assert lay.kinds[1].tolist() == [P_] * 2 + [C_] * 2 + [N_] * 2 + [X_] * 7
    # prefix blocks 0, 0, 1; response blocks numbered after them (2, 2, 3, 3, 4) in both copies
    assert lay.block_ids[0].tolist() == [0, 0, 1, 2, 2, 3, 3, 4, 2, 2, 3, 3, 4]
    assert lay.block_ids[1].tolist() == [0, 0, 1, 1, 1, 1] + [-1] * 7
    # response token k: offset 0 in its block -> clean position k-1 (k=0: last prompt position 2);
    # later offsets -> noisy position k-1 (noisy copy starts at 8)
    assert lay.target_pos[0].tolist() == [2, 8, 4, 10, 6]
    assert lay.target_pos[1, :2].tolist() == [1, 4]
    assert lay.valid[1].tolist() == [True, True, False, False, False]
    assert lay.noisy_pos[0].tolist() == [8, 9, 10, 11, 12]
    assert lay.response_block[0].tolist() == [0, 0, 1, 1, 2]


def test_layout_of_one_sample_matches_the_core_training_layout():
    for P, R, B in [(7, 9, 4), (5, 32, 32), (3, 4, 1), (10, 3, 8)]:
        batch = collate([_example("x", list(range(100, 100 + P)), list(range(200, 200 + R)))], pad_id=0)
        lay = layout(batch, B)
        blocks, kinds = training_layout(P, R, B)
        assert lay.block_ids[0].tolist() == blocks.tolist()
        assert lay.kinds[0].tolist() == kinds.tolist()


def test_visibility_of_the_layout_clean_never_sees_noisy_and_noisy_sees_earlier_clean_blocks():
    batch = collate([_example("a", [11, 12, 13], [21, 22, 23, 24, 25])], pad_id=0)
    lay = layout(batch, 2)
    vis = visibility(lay.block_ids, lay.kinds, lay.block_ids, lay.kinds)[0]
    noisy = lay.kinds[0] == NOISY
    clean = lay.kinds[0] == CLEAN
    assert not vis[clean][:, noisy].any()  # the reference's fault: clean queries seeing noisy keys
    # noisy token k=2 (block 1, position 10) sees: prefix 0..2, clean block 0 (3, 4), noisy block 1 (10, 11)
    assert vis[10].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 10, 11]
    # clean token k=2 (position 5) sees prefix + clean blocks <= 1
    assert vis[5].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 6]
    # prefix position 0 (block 0) sees its own block only: prompt blocks are bidirectional inside
    assert vis[0].nonzero().flatten().tolist() == [0, 1]
    # the logit predicting token k never sees its clean copy or any later clean token; of the noisy
    # copy it sees only token k's own block (masked there when it counts)
    for k in range(5):
        pos = lay.target_pos[0, k].item()
        seen = vis[pos].nonzero().flatten().tolist()
        assert all(s < 3 + k for s in seen if 3 <= s < 8)
        assert all((s - 8) // 2 == k // 2 for s in seen if s >= 8)


def test_positions_noisy_copy_reuses_clean_positions_and_image_tokens_get_mrope(nano):
    pad = nano.processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD_TOKEN)
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    enc = nano.processor.encode([f"<|vision_start|>{IMAGE_PAD_TOKEN}<|vision_end|>hi"], [[image]])
    ex = Example("img", "qa", enc.input_ids[0], enc.mm_token_type_ids[0], torch.tensor([50, 51, 52]),
                 enc.pixel_values, enc.image_grid_thw)
    batch = collate([ex, _example("txt", [60, 61], [70, 71, 72, 73])], pad_id=0)
    pos = positions(batch, nano.model)
    P0 = len(enc.input_ids[0])
    assert (enc.input_ids[0] == pad).sum().item() == 4  # 64x64 image -> 2x2 merged tokens
    ref, _ = nano.model.model.get_rope_index(enc.input_ids, enc.mm_token_type_ids, image_grid_thw=enc.image_grid_thw)
    assert torch.equal(pos[:, 0, :P0], ref[:, 0])
    base = ref.max().item() + 1
    assert pos[0, 0, P0:P0 + 3].tolist() == [base, base + 1, base + 2]
    assert torch.equal(pos[:, 0, P0:P0 + 3], pos[:, 0, P0 + 3:P0 + 6])
    assert pos[:, 1, :10].tolist() == [[0, 1, 2, 3, 4, 5, 2, 3, 4, 5]] * 3
    assert (pos[:, 1, 10:] == 0).all()


def test_stratified_noise_puts_one_level_in_each_stratum_per_sample():
    gen = torch.Generator().manual_seed(0)
    t = stratified_t(torch.tensor([4, 2]), 4, gen, 0.0, 1.0)
    assert sorted((t[0] * 4).floor().long().tolist()) == [0, 1, 2, 3]
    assert sorted((t[1, :2] * 2).floor().long().tolist()) == [0, 1]


def test_corrupt_masks_only_the_noisy_copy_and_force_t_one_masks_every_response_token():
    batch = collate([_example("a", [11, 12, 13], [21, 22, 23, 24, 25]), _example("b", [31, 32], [41, 42])], pad_id=0)
    lay = layout(batch, 2)
    cor = corrupt(batch, lay, mask_id=7, force_t=1.0)
    assert cor.masked.tolist() == lay.valid.tolist()
    assert cor.input_ids[0].tolist() == [11, 12, 13, 21, 22, 23, 24, 25] + [7] * 5
    assert cor.input_ids[1].tolist() == [31, 32, 41, 42, 7, 7] + [0] * 7
    many = collate([_example(str(i), [1, 2], list(range(10, 74))) for i in range(64)], pad_id=0)
    lay = layout(many, 8)
    cor = corrupt(many, lay, 7, torch.Generator().manual_seed(1), t_min=0.0, t_max=1.0)
    # masked share per block tracks its t (law of large numbers over 64 x 8 blocks)
    share = cor.masked.float().view(64, 8, 8).mean(-1)
    t = cor.t.view(64, 8, 8)[..., 0]
    assert abs(share.mean().item() - 0.5) < 0.05
    assert torch.corrcoef(torch.stack([share.flatten(), t.flatten()]))[0, 1].item() > 0.8


def _ar_reference_ce(model, batch, examples):
    """Next-token cross-entropy of the stock model (stock causal SDPA attention, HF forward), response only."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("sdpa")
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.cat([ex.prompt_ids, ex.response_ids])[None]
            mm = torch.cat([ex.mm_token_type_ids, torch.zeros(len(ex.response_ids), dtype=torch.int32)])[None]
            kw = {}
            if ex.pixel_values is not None:
                kw = dict(pixel_values=ex.pixel_values, image_grid_thw=ex.image_grid_thw)
            logits = ref(input_ids=ids, mm_token_type_ids=mm, **kw).logits[0]
            P = len(ex.prompt_ids)
            ce = F.cross_entropy(logits[P - 1:-1].float(), ex.response_ids, reduction="sum")
            total += ce.item()
            count += len(ex.response_ids)
    return total / count


def test_block_size_one_all_masked_diffusion_loss_equals_the_ar_next_token_cross_entropy(nano):
    image = np.random.default_rng(1).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    prompts = [f"<|im_start|>user\n<|vision_start|>{IMAGE_PAD_TOKEN}<|vision_end|>Where next?<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nIs the lane free?<|im_end|>\n<|im_start|>assistant\n"]
    responses = ["1.00,0.00,2.10,0.05<|im_end|>", "yes, the left lane is free<|im_end|>"]
    examples = []
    for p, r, imgs in zip(prompts, responses, [[image], []]):
        enc = nano.processor.encode([p], [imgs])
        resp = nano.processor.tokenizer(r, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        examples.append(Example(p[:8], "qa", enc.input_ids[0], enc.mm_token_type_ids[0], resp, enc.pixel_values,
                                enc.image_grid_thw))
    expected = _ar_reference_ce(nano.model, None, examples)
    use_backend(nano.model, "sdpa")
    module = SelectedLogits(nano.model)
    mask_id = nano.settings.mask_token_id
    with torch.no_grad():
        noisy = diffusion_loss(module, nano.model, collate(examples, 0, with_noisy=True), 1, mask_id, force_t=1.0)
        ar = diffusion_loss(module, nano.model, collate(examples, 0, with_noisy=False), 1, mask_id)
    assert expected > 1.0  # a random model: the comparison is not between near-zero numbers
    assert abs(noisy.loss.item() - expected) < 1e-5, (noisy.loss.item(), expected)
    assert abs(ar.loss.item() - expected) < 1e-5
    # at B = 4 the same data gives a different (diffusion) loss: the check above is not vacuous
    with torch.no_grad():
        b4 = diffusion_loss(module, nano.model, collate(examples, 0), 4, mask_id, force_t=1.0)
    assert abs(b4.loss.item() - expected) > 1e-3


def test_diffusion_ce_weights_each_masked_token_by_one_over_its_noise_level_on_a_hand_computed_pair():
    # row 0: uniform over 3 tokens, target 1: CE = ln 3; row 1: softmax (3/5, 1/5, 1/5), target 0: CE = ln(5/3)
    logits = torch.tensor([[0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0]])
    targets = torch.tensor([1, 0])
    t = torch.tensor([0.5, 0.25])
    loss = diffusion_ce(logits, targets, t, normalizer=4)
    # (ln 3 / 0.5 + ln(5/3) / 0.25) / 4 = 0.5 ln 3 + ln(5/3) = 1.060132; unweighted it would be ln 5 / 4 = 0.402359
    assert loss.item() == pytest.approx(0.5 * math.log(3.0) + math.log(5.0 / 3.0), abs=1e-6)
    assert loss.item() == pytest.approx(1.060132, abs=1e-6)
    # t = 1 everywhere and normalizer = N: the mean cross-entropy (ln 3 + ln(5/3)) / 2 = ln 5 / 2
    assert diffusion_ce(logits, targets, torch.ones(2), 2).item() == pytest.approx(math.log(5.0) / 2, abs=1e-6)


def test_distillation_from_itself_at_the_same_block_size_has_zero_jsd_and_full_top5_agreement(nano):
    use_backend(nano.model, "sdpa")
    batch = collate([_example("a", [11, 12, 13], list(range(40, 52))), _example("b", [31, 32], [41, 42, 43])], pad_id=0)
    module = SelectedLogits(nano.model)
    with torch.no_grad():
        same = distill_loss(module, nano.model, nano.model, batch, 4, 4, 7, torch.Generator().manual_seed(0))
        other = distill_loss(module, nano.model, nano.model, batch, 4, 1, 7, torch.Generator().manual_seed(0))
    assert same.stats["jsd"].item() < 1e-6
    assert same.stats["top5"].item() == 1.0
    assert other.stats["jsd"].item() > 1e-4  # the teacher's own block size changes what it sees


def test_jsd_is_symmetric_zero_for_equal_inputs_and_at_most_ln2():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(37, 1000, generator=gen) * 3
    b = torch.randn(37, 1000, generator=gen) * 3
    assert torch.allclose(jsd(a, b, reduction="none"), jsd(b, a, reduction="none"), atol=1e-6)
    assert jsd(a, a).item() < 1e-6
    # disjoint one-hot-like distributions reach the bound ln 2
    x = torch.full((4, 10), -1e4)
    y = x.clone()
    x[:, 0] = 0.0
    y[:, 1] = 0.0
    assert abs(jsd(x, y).item() - math.log(2)) < 1e-5
    assert (jsd(a * 10, b * 10, reduction="none") <= math.log(2) + 1e-6).all()
    assert jsd(a, b).item() > 0.01


def test_jsd_in_chunks_equals_one_chunk_and_gradients_flow():
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(50, 300, generator=gen, requires_grad=True)
    b = torch.randn(50, 300, generator=gen)
    one = jsd(a, b, chunk_size=1000)
    chunked = jsd(a, b, chunk_size=7)
    assert abs(one.item() - chunked.item()) < 1e-6
    (g_one,) = torch.autograd.grad(one, a)
    (g_chunked,) = torch.autograd.grad(chunked, a)
    assert torch.allclose(g_one, g_chunked, atol=1e-7)
    assert g_one.abs().sum().item() > 0


def test_forward_and_reverse_kl_match_their_definitions():
    p_logits = torch.tensor([[0.0, 1.0, 2.0]])
    q_logits = torch.tensor([[2.0, 0.0, 0.0]])
    p, q = p_logits.softmax(-1)[0], q_logits.softmax(-1)[0]
    fwd = (q * (q / p).log()).sum().item()  # KL(teacher || student)
    rev = (p * (p / q).log()).sum().item()
    assert abs(divergence(p_logits, q_logits, "forward_kl").item() - fwd) < 1e-6
    assert abs(divergence(p_logits, q_logits, "reverse_kl").item() - rev) < 1e-6
    assert abs(fwd - rev) > 0.1


def test_top5_agreement_counts_shared_tokens_of_the_two_top5_sets():
    s = torch.tensor([[9.0, 8, 7, 6, 5, 0, 0, 0], [9.0, 8, 7, 6, 5, 0, 0, 0]])
    t = torch.tensor([[5.0, 6, 7, 8, 9, 0, 0, 0], [9.0, 8, 0, 0, 0, 7, 6, 5]])
    assert top_k_agreement(s, t).item() == pytest.approx((5 / 5 + 2 / 5) / 2)


def _write_dataset(tmp_path, samples, name="train.json"):
    path = tmp_path / name
    path.write_text(json.dumps(samples))
    return path


def _sample(sid, human, answer, images=()):
    return {"id": sid, "datasource": "test", "task": "qa", "image": list(images),
            "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": answer}]}


def test_bad_samples_are_skipped_and_counted_or_stop_with_an_error_naming_the_sample(nano, tmp_path):
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"not a png at all")
    samples = [
        _sample("good", "<image> Where?", "here", ["ok.png"]),
        _sample("missing-image", "<image> Where?", "here", ["nope.png"]),
        _sample("unreadable-image", "<image> Where?", "here", ["broken.png"]),
        {**_sample("empty-conversation", "x", "y"), "conversations": []},
        _sample("too-long", "Say a lot", "word " * 200),
        _sample("good-text", "Ping?", "pong"),
    ]
    path = _write_dataset(tmp_path, samples)
    ds = DrivingDataset(path, nano.processor, max_response_tokens=64, on_bad_sample="skip")
    assert len(ds) == 2
    assert [sid for sid, _ in ds.skipped_ids] == ["missing-image", "unreadable-image", "empty-conversation", "too-long"]
    assert ds.stats.total == 6 and ds.stats.kept == 2
    assert sum(ds.stats.skipped.values()) == 4
    with pytest.raises(DataError, match="missing-image"):
        DrivingDataset(path, nano.processor, max_response_tokens=64, on_bad_sample="error")
    # a file that disappears after the scan comes back as a BadSample, which the collate drops and counts
    (tmp_path / "ok.png").unlink()
    items = [ds[0], ds[1]]
    assert isinstance(items[0], BadSample) and items[0].sample_id == "good"
    batch = collate(items, pad_id=0)
    assert batch.sample_ids == ["good-text"] and [b.sample_id for b in batch.skipped] == ["good"]


def test_chain_corruption_masks_each_number_from_a_random_digit_on_and_keeps_separators():
    from wam_diff_core.codec import FIXED_NUMBER_WIDTH, FIXED_TRAJECTORY_CHARS

    response = list(range(300, 300 + FIXED_TRAJECTORY_CHARS + 1))  # a fixed trajectory + EOS: 128 tokens
    fixed = Example("p", "planning", torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.int32),
                    torch.tensor(response), None, None, chained=True)
    free = _example("q", [1, 2], list(range(400, 440)))
    batch = collate([fixed, free], pad_id=0)
    w = FIXED_NUMBER_WIDTH
    assert batch.chain_start[0, :w + 3].tolist() == [0] * w + [w, w + 1, w + 1]  # number, comma, next number
    assert batch.chain_start[1, :40].tolist() == list(range(40))
    lay = layout(batch, 32)
    cor = corrupt(batch, lay, 99, torch.Generator().manual_seed(0), chain_share=1.0)
    m = cor.masked[0, :FIXED_TRAJECTORY_CHARS + 1]
    numbers = m.view(-1, FIXED_NUMBER_WIDTH + 1)  # 16 numbers, each + its comma (the last one's: EOS)
    digits, seps = numbers[:, :FIXED_NUMBER_WIDTH], numbers[:, FIXED_NUMBER_WIDTH]
    assert not seps.any() and not m[FIXED_TRAJECTORY_CHARS]  # separators and EOS stay visible
    assert (digits.int()[:, 1:] >= digits.int()[:, :-1]).all()  # masked from some digit on: a suffix
    cuts = (~digits).sum(1)
    assert len(set(cuts.tolist())) > 3  # the cut varies from number to number
    # t: each block's masked share; the input holds the mask id exactly where masked
    share = m.view(4, 32).float().mean(1)
    assert torch.allclose(cor.t[0, :128].view(4, 32)[:, 0], share.clamp(min=1 / 32))
    assert ((cor.input_ids[0, lay.noisy_pos[0, :128]] == 99) == m).all()
    # the untrained-for row keeps the uniform corruption, drawn exactly as with chain_share 0
    plain = corrupt(batch, lay, 99, torch.Generator().manual_seed(0))
    assert cor.masked[1].equal(plain.masked[1]) and cor.t[1].equal(plain.t[1])
    # chain_share 0 draws nothing more: the same masks as before the option existed
    assert corrupt(batch, lay, 99, torch.Generator().manual_seed(0), chain_share=0.0).masked.equal(plain.masked)


def test_a_dataset_entry_keeps_only_the_scenarios_it_names(nano, tmp_path):
    """`scenarios:` on a data entry selects samples by meta.scenario; a name the file lacks is an error naming both."""
    from wam_diff_training.data import build_datasets

    samples = [{**_sample(f"s{i}", "Ping?", "pong"), "meta": {"scenario": scen}}
               for i, scen in enumerate(["highway", "roundabout", "highway", "cut_in"])]
    samples.append(_sample("no-meta", "Ping?", "pong"))
    path = _write_dataset(tmp_path, samples)
    mixed = build_datasets([{"path": str(path), "scenarios": ["highway", "cut_in"]}], nano.processor, 4096, 64, "skip")
    assert [ex.sample_id for ex in (mixed.datasets[0][i] for i in range(len(mixed.datasets[0])))] == ["s0", "s2", "s3"]
    assert len(DrivingDataset(path, nano.processor, scenarios="roundabout")) == 1
    assert len(DrivingDataset(path, nano.processor)) == 5
    with pytest.raises(DataError, match=r"no sample of scenario\(s\) \['intersection'\]; the file has \['cut_in', 'highway', 'roundabout'\]"):
        DrivingDataset(path, nano.processor, scenarios=["highway", "intersection"])
    with pytest.raises(DataError, match="scenarios must be a non-empty list"):
        DrivingDataset(path, nano.processor, scenarios=[])


def test_a_dataset_entry_keeps_only_plans_at_its_minimum_speed(nano, tmp_path):
    """`min_speed_mps:` keeps the samples whose ego forward speed (meta.ego[0]) is at least the bound, with
    `scenarios:` too; a bound no sample reaches, a bad bound and an unknown entry key are errors naming them."""
    from wam_diff_training.data import build_datasets

    speeds = [25.0, 19.99, 20.0, 8.0]
    samples = [{**_sample(f"s{i}", "Ping?", "pong"), "meta": {"scenario": scen, "ego": [v, 0.0, 0.0, 0.0, 0.0]}}
               for i, (scen, v) in enumerate(zip(["highway", "highway", "cut_in", "roundabout"], speeds))]
    samples.append(_sample("no-meta", "Ping?", "pong"))
    path = _write_dataset(tmp_path, samples)
    mixed = build_datasets([{"path": str(path), "min_speed_mps": 20}], nano.processor, 4096, 64, "skip")
    assert [mixed.datasets[0][i].sample_id for i in range(len(mixed.datasets[0]))] == ["s0", "s2"]
    both = DrivingDataset(path, nano.processor, scenarios=["highway"], min_speed_mps=0)
    assert [both[i].sample_id for i in range(len(both))] == ["s0", "s1"]
    with pytest.raises(DataError, match=r"no sample at min_speed_mps 30; the fastest is 25.00 m/s"):
        DrivingDataset(path, nano.processor, min_speed_mps=30)
    for bad in (-1.0, "20", True, float("nan")):
        with pytest.raises(DataError, match="min_speed_mps must be a number of m/s >= 0"):
            DrivingDataset(path, nano.processor, min_speed_mps=bad)
    with pytest.raises(DataError, match=r"unknown key\(s\) \['min_speed'\]"):
        build_datasets([{"path": str(path), "min_speed": 20}], nano.processor, 4096, 64, "skip")
