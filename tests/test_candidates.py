"""Candidate plans from one prefill (`DrivingPolicy.plan(..., candidates=N)`, `decoding.candidates`): candidate 0 is
the plan without candidates token for token, the others are seeded draws, the prompt's cache rows are copies of one
prefill, and bad settings are one-line errors."""
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from wam_diff_core import policy as policy_mod
from wam_diff_core.decoding.candidates import (CandidateSampling, CandidatesError, DecodeRows, RowSampler,
                                               check_candidates, check_sampling)
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.remasking import predict
from wam_diff_core.policy import DrivingPolicy, PolicySettingsError, check_candidate_settings
from wam_diff_core.types import EgoState

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module

MODELS = Path(__file__).resolve().parent.parent / "models"
EGO = EgoState(vx=6.0, ax=0.2)


@pytest.fixture(scope="module")
def shipped():
    return DrivingPolicy.load(str(MODELS / "nano-s-b32"))


@pytest.fixture(scope="module")
def shipped_ar():
    return DrivingPolicy.load(str(MODELS / "nano-s-ar"))


@pytest.fixture(scope="module")
def random_policy(nano):
    return DrivingPolicy(nano, DecoderConfig(block_size=8, steps=4, max_new_tokens=24), tasks=("planning", "detection"))


def _recording_generate(monkeypatch):
    """Wrap the policy's decoder; returns the list every DecodeResult lands in."""
    seen, real = [], policy_mod.generate

    def wrapped(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(policy_mod, "generate", wrapped)
    return seen


@pytest.mark.parametrize("method", ["tokens", "order"])
def test_candidate_0_of_the_shipped_checkpoint_is_token_identical_to_the_plan_without_candidates(
        shipped, camera_image, monkeypatch, method):
    seen = _recording_generate(monkeypatch)
    alone = shipped.plan([camera_image], EGO, "turn left", target=(20.0, 5.0))
    plan = shipped.plan([camera_image], EGO, "turn left", target=(20.0, 5.0), candidates=4, sampling=method)
    assert seen[1].token_ids[0] == seen[0].token_ids[0] and len(seen[1].token_ids) == 4
    assert seen[1].token_probs[0] == seen[0].token_probs[0]  # the greedy row's probabilities, bit for bit
    assert plan.candidates[0].text == alone.raw_text["planning"] == plan.raw_text["planning"]
    assert alone.valid and plan.valid and np.array_equal(plan.trajectory, alone.trajectory)
    assert [c.index for c in plan.candidates] == [0, 1, 2, 3] and plan.chosen == 0
    assert alone.candidates[0].logprob == plan.candidates[0].logprob
    assert len({c.text for c in plan.candidates}) >= 2  # the draws are not all the greedy plan


def test_candidate_0_of_the_autoregressive_checkpoint_is_token_identical_too(shipped_ar, camera_image):
    assert shipped_ar.config.block_size == 1
    alone = shipped_ar.plan([camera_image], EGO, "follow lane")
    plan = shipped_ar.plan([camera_image], EGO, "follow lane", candidates=3)
    assert plan.candidates[0].text == alone.raw_text["planning"]
    assert len(plan.candidates) == 3 and len({c.text for c in plan.candidates}) >= 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_candidates_sharing_blocks_start_with_the_greedy_answer_and_candidate_0_stays_token_identical(
        camera_image, monkeypatch, dtype):
    policy = DrivingPolicy.load(str(MODELS / "nano-s-b32"), steps=2, threshold=0.3, dtype=dtype)
    B = policy.config.block_size
    seen = _recording_generate(monkeypatch)
    alone = policy.plan([camera_image], EGO, "follow lane")
    texts = {}
    for shared in (0, 1, 2, 8):
        plan = policy.plan([camera_image], EGO, "follow lane", candidates=6,
                           sampling=CandidateSampling("tokens", 1.0, shared))
        assert seen[-1].token_ids[0] == seen[0].token_ids[0] and seen[-1].token_probs[0] == seen[0].token_probs[0]
        texts[shared] = [c.text for c in plan.candidates]
        assert all(t[:shared * B] == alone.raw_text["planning"][:shared * B] for t in texts[shared])
    assert len(set(texts[1])) >= 2 and len({t[B:] for t in texts[1]}) >= 2  # they branch after the first block
    assert set(texts[8]) == {alone.raw_text["planning"]}  # every block shared: the greedy answer, six times
    with pytest.raises(CandidatesError, match="shared blocks -1: expected an integer >= 0"):
        CandidateSampling("tokens", 1.0, -1)
    with pytest.raises(CandidatesError, match="single step 'yes': expected true or false"):
        CandidateSampling("tokens", single_step="yes")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_step_candidates_commit_each_block_at_once_and_candidate_0_stays_token_identical(
        camera_image, monkeypatch, dtype):
    policy = DrivingPolicy.load(str(MODELS / "nano-s-b32"), steps=2, threshold=0.3, dtype=dtype)
    seen = _recording_generate(monkeypatch)
    alone = policy.plan([camera_image], EGO, "follow lane")
    plan = policy.plan([camera_image], EGO, "follow lane", candidates=6,
                       sampling=CandidateSampling("tokens", 1.0, single_step=True))
    assert seen[1].token_ids[0] == seen[0].token_ids[0] and seen[1].token_probs[0] == seen[0].token_probs[0]
    assert plan.candidates[0].text == alone.raw_text["planning"] and len({c.text for c in plan.candidates}) >= 3
    assert all(c.valid for c in plan.candidates)  # the grammar holds for a block committed at once
    # the greedy row's second steps run alone: fewer rows x tokens than every row taking every step
    rows = []
    real = policy.runner.forward_tokens

    def counting(tokens, *args, **kwargs):
        rows.append(tokens.shape[0])
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(policy.runner, "forward_tokens", counting)
    policy.plan([camera_image], EGO, "follow lane", candidates=6, sampling=CandidateSampling("tokens"))
    every, rows = rows, []
    policy.plan([camera_image], EGO, "follow lane", candidates=6,
                sampling=CandidateSampling("tokens", single_step=True))
    assert len(rows) == len(every) and 1 in rows and 1 not in every and sum(rows) < sum(every)


def test_with_detection_the_detection_row_is_decoded_once_and_both_greedy_rows_are_unchanged(
        random_policy, camera_image, monkeypatch):
    seen = _recording_generate(monkeypatch)
    alone = random_policy.plan([camera_image], EGO, "follow lane")
    plan = random_policy.plan([camera_image], EGO, "follow lane", candidates=5)
    assert len(seen[0].token_ids) == 2 and len(seen[1].token_ids) == 2 + 4  # 2 prompts, then 4 extra planning rows
    assert seen[1].token_ids[:2] == seen[0].token_ids  # padded prompts: both rows as without candidates
    assert plan.raw_text == alone.raw_text and plan.errors == alone.errors
    assert len(plan.candidates) == 5


def test_invalid_answers_stay_candidates_with_their_error(random_policy, camera_image):
    plan = random_policy.plan([camera_image], EGO, "follow lane", candidates=4, sampling="order")
    assert len(plan.candidates) == 4
    assert sum(not c.valid for c in plan.candidates) == 4  # a random model never writes a trajectory
    assert all(c.trajectory is None and c.error for c in plan.candidates)
    assert plan.valid is False and plan.errors["planning"] == plan.candidates[0].error


@pytest.mark.parametrize("method", ["tokens", "order"])
def test_candidates_repeat_with_the_seed_and_change_with_it(shipped, camera_image, method):
    draw = lambda policy: [c.text for c in policy.plan([camera_image], EGO, "turn left", candidates=4,
                                                      sampling=CandidateSampling(method, 1.5)).candidates]
    first, again = draw(shipped), draw(shipped)
    reseeded = DrivingPolicy(shipped.loaded, replace(shipped.config, seed=11))
    other = draw(reseeded)
    assert first == again
    assert other[0] == first[0] and other[1:] != first[1:]


def test_a_candidates_logprob_is_the_mean_log_of_its_token_probabilities(shipped, camera_image, monkeypatch):
    seen = _recording_generate(monkeypatch)
    plan = shipped.plan([camera_image], EGO, "turn left", candidates=3)
    rows = DecodeRows.for_candidates(("planning",), 3, CandidateSampling()).candidate_rows()
    for cand, row in zip(plan.candidates, rows):
        probs = seen[0].token_probs[row]
        assert len(probs) == len(seen[0].token_ids[row]) > 100
        assert cand.logprob == pytest.approx(sum(math.log(p) for p in probs) / len(probs), rel=1e-9)
        assert -5.0 < cand.logprob < 0.0


def test_the_shared_prefill_fills_every_cache_row_with_the_prompts_keys_in_one_forward(nano, nano_runner,
                                                                                     two_prompts, encode_prompts):
    batch = encode_prompts(two_prompts)  # two prompts of different lengths: left padded
    L = batch.input_ids.shape[1]
    alone = nano_runner.new_cache(2, L + 8)
    ref_logits, ref_pos = nano_runner.prefill(batch, alone, 4)
    shared = nano_runner.new_cache(5, L + 8)
    nano_runner.forwards = 0
    logits, pos = nano_runner.prefill(batch, shared, 4, rows=(0, 1, 0, 0, 1))
    assert nano_runner.forwards == 1 and shared.length == L
    for row, prompt in enumerate((0, 1, 0, 0, 1)):
        assert torch.equal(shared.keys[:, row, :, :L], alone.keys[:, prompt, :, :L])
        assert torch.equal(shared.values[:, row, :, :L], alone.values[:, prompt, :, :L])
        assert torch.equal(shared.kinds[row, :L], alone.kinds[prompt, :L])
        assert torch.equal(logits[row], ref_logits[prompt]) and int(pos[row]) == int(ref_pos[prompt])


def test_the_row_sampler_keeps_greedy_rows_greedy_and_order_keeps_every_token_the_argmax():
    logits = torch.randn(4, 6, 50, generator=torch.Generator().manual_seed(0))
    greedy_pred, greedy_conf = predict(logits, 0.0, exclude=7)
    for method in ("tokens", "order"):
        rows = DecodeRows(own=1, of=0, extra=3, sampling=CandidateSampling(method, 2.0))
        pred, conf, rank = RowSampler(rows, "cpu")(logits, exclude=7)
        assert torch.equal(pred[0], greedy_pred[0]) and torch.equal(conf[0], greedy_conf[0])
        assert torch.equal(rank[0], conf[0]) and not bool((pred == 7).any())
        model_prob = torch.softmax(logits.float().index_fill(-1, torch.tensor([7]), float("-inf")), -1)
        assert torch.allclose(conf, model_prob.gather(-1, pred[..., None])[..., 0], atol=1e-6)
        if method == "order":
            assert torch.equal(pred, greedy_pred) and not torch.equal(rank[1:], conf[1:])
        else:
            assert int((pred[1:] != greedy_pred[1:]).sum()) >= 6 and torch.equal(rank, conf)


@pytest.mark.parametrize("value,match", [(0, "candidates 0"), (2.5, "candidates 2.5"), (True, "candidates True")])
def test_a_bad_candidate_count_is_one_line_naming_it(random_policy, camera_image, value, match):
    with pytest.raises(CandidatesError, match=match):
        random_policy.plan([camera_image], EGO, "follow lane", candidates=value)
    assert check_candidates(8) == 8


@pytest.mark.parametrize("sampling,match", [("beam", "method 'beam'"), (CandidateSampling, "sampling <class"),
                                            (3, "sampling 3")])
def test_a_bad_sampling_is_one_line_naming_it(sampling, match):
    with pytest.raises(CandidatesError, match=match):
        check_sampling(sampling)
    for t in (0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(CandidatesError, match=f"temperature {t!r}"):
            CandidateSampling("tokens", t)
    assert check_sampling("order") == CandidateSampling("order", 1.0) and check_sampling(None).method == "tokens"


def test_settings_that_cannot_draw_candidates_are_refused_in_one_line(nano, camera_image):
    for cfg, match in ((DecoderConfig(cuda_graphs=True), "eager path"), (DecoderConfig(temperature=0.5),
                                                                       "temperature 0.5")):
        with pytest.raises(PolicySettingsError, match=match) as err:
            check_candidate_settings(4, cfg)
        assert "\n" not in str(err.value)
        check_candidate_settings(1, cfg)
    policy = DrivingPolicy(nano, DecoderConfig(block_size=8, steps=4, max_new_tokens=24), tasks=("detection",))
    with pytest.raises(CandidatesError, match="ask for none"):
        policy.plan([camera_image], EGO, "follow lane", candidates=2)


def test_the_static_decoder_takes_n_rows_of_one_prompt_as_one_batch(nano, nano_runner, encode_prompts, two_prompts):
    from wam_diff_kernels.graph_runner import GraphRunner

    static = GraphRunner(nano_runner, nano.settings.mask_token_id)
    cfg = DecoderConfig(block_size=8, steps=4, max_new_tokens=20, ignore_eos=True)
    one = static.generate(encode_prompts(two_prompts[:1]), cfg, nano.settings.eos_token_id)
    four = static.generate(encode_prompts(two_prompts[:1] * 4), cfg, nano.settings.eos_token_id)
    assert four.token_ids == one.token_ids * 4 and len(set(one.token_ids[0])) > 2
    assert {b.batch for b in static.buckets} == {1, 4}  # one bucket per row count


def test_endpoint_spread_is_the_mean_distance_between_every_two_last_waypoints():
    from wam_diff_core.bench.candidates import endpoint_spread

    a, b, c = (np.array([[0.0, 0.0], [x, y]]) for x, y in ((10.0, 0.0), (10.0, 3.0), (14.0, 0.0)))
    assert endpoint_spread([a, b, c]) == pytest.approx((3.0 + 4.0 + 5.0) / 3)
    assert endpoint_spread([a]) is None


def test_the_candidates_bench_writes_cost_and_diversity_per_count_and_method(tmp_path, capsys):
    from PIL import Image

    from wam_diff_core.cli import main
    from wam_diff_core.codec import format_trajectory
    from wam_diff_core.constants import IMAGE_PLACEHOLDER
    from wam_diff_core.prompts import planning_prompt

    truth = np.stack([np.arange(1, 9) * 3.0, np.zeros(8)], axis=1)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (128, 256, 3), dtype=np.uint8)).save(tmp_path / "0.png")
    sample = {"id": "s0", "task": "planning", "image": ["0.png"], "meta": {"command": "follow lane"},
              "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{planning_prompt(EGO, 'follow lane')}"},
                                {"from": "gpt", "value": format_trajectory(truth)}]}
    (tmp_path / "val.json").write_text(json.dumps([sample]))
    out = tmp_path / "cost.json"
    assert main(["bench", "--candidates", "1,3", "--model", str(MODELS / "nano-s-b32"), "--data",
                 str(tmp_path / "val.json"), "--samples", "1", "--out", str(out), "--shared-blocks", "0,2"]) == 0
    result = json.loads(out.read_text())
    assert [e["label"] for e in result["entries"]] == ["N=1", "N=3 tokens", "N=3 tokens, 2 shared", "N=3 order",
                                                       "N=3 order, 2 shared"]
    one, tokens, tokens_shared, order, _ = result["entries"]
    assert tokens_shared["shared_blocks"] == 2 and tokens_shared["l2_first_m"] == one["l2_first_m"]
    assert one["x_time_vs_n1"]["median"] == 1.0 and tokens["candidates_drawn"] == 3 and one["candidates_drawn"] == 1
    assert one["l2_first_m"] == tokens["l2_first_m"] == order["l2_first_m"]  # candidate 0: the same plan
    assert tokens["l2_best_m"] <= tokens["l2_first_m"] and tokens["peak_allocated_mb"] > one["peak_allocated_mb"] > 0
    assert "| N=3 order |" in capsys.readouterr().out and out.with_suffix(".md").is_file()
    assert main(["bench", "--candidates", "1,4", "--methods", "beam"]) == 2
    assert "--methods 'beam'" in capsys.readouterr().err
    assert main(["bench", "--candidates", "1,4", "--shared-blocks", "-1"]) == 2
    assert "--shared-blocks '-1': expected comma-separated integers >= 0" in capsys.readouterr().err


def test_bench_entries_cover_every_count_method_shared_blocks_and_single_step_setting():
    from wam_diff_core.bench.candidates import entries, label

    specs = entries([1, 8], ["tokens"], 1.0, (0, 2), (False, True))
    assert [label(n, s) for n, s in specs] == ["N=1", "N=8 tokens", "N=8 tokens, single step", "N=8 tokens, 2 shared",
                                               "N=8 tokens, 2 shared, single step"]
    assert specs[2][1] == CandidateSampling("tokens", 1.0, 0, True)
