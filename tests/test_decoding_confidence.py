"""Each decoder reports the probability every answer token had at its commit (DecodeResult.token_probs)."""
import pytest
import torch

from wam_diff_core.decoding import block_diffusion
from wam_diff_core.decoding.ar import generate_ar
from wam_diff_core.decoding.block_diffusion import generate
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.result import decode_result

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one CPU thread for the module


@pytest.fixture(scope="module")
def padded(two_prompts, encode_prompts):
    batch = encode_prompts(two_prompts)
    assert not bool(batch.attention_mask.all())
    return batch


def _decode(nano, runner, batch, eos=None, **kw):
    cfg = DecoderConfig(**{"max_new_tokens": 16, "ignore_eos": True, **kw})
    return generate(runner, batch, cfg, nano.settings.mask_token_id,
                    nano.settings.eos_token_id if eos is None else eos)


def test_the_ar_decoder_and_the_block_decoder_at_b1_report_the_same_token_probabilities(nano, nano_runner, padded):
    ar = generate_ar(nano_runner, padded, 16, nano.settings.eos_token_id, ignore_eos=True,
                     mask_id=nano.settings.mask_token_id)
    block = _decode(nano, nano_runner, padded, block_size=1, steps=1)
    assert ar.token_ids == block.token_ids
    assert [len(p) for p in ar.token_probs] == [len(t) for t in ar.token_ids] == [16, 16]
    assert torch.allclose(torch.tensor(ar.token_probs), torch.tensor(block.token_probs), atol=1e-6)
    probs = torch.tensor(ar.token_probs)
    assert float(probs.min()) > 0.0 and float(probs.max()) <= 1.0
    assert float(probs.std()) > 0.01  # not a constant: the comparison can fail


def test_block_decoder_probabilities_are_the_softmax_of_each_token_at_the_step_it_was_committed(
        nano, nano_runner, padded, monkeypatch):
    steps = []  # (logits, committed) of every denoising step, in order
    real_predict, real_commit = block_diffusion.predict, block_diffusion.commit_mask

    def predict(logits, *a, **kw):
        steps.append([logits.float().clone()])
        return real_predict(logits, *a, **kw)

    def commit_mask(*a, **kw):
        commit = real_commit(*a, **kw)
        steps[-1].append(commit.clone())
        return commit

    monkeypatch.setattr(block_diffusion, "predict", predict)
    monkeypatch.setattr(block_diffusion, "commit_mask", commit_mask)
    B, K = 8, 4
    res = _decode(nano, nano_runner, padded, block_size=B, steps=K, strategy="low_confidence_dynamic", threshold=0.3)
    tokens = torch.tensor(res.token_ids)
    expected = torch.full(tokens.shape, float("nan"))
    for s, (logits, commit) in enumerate(steps):
        j = s // K  # the answer's block of this step (every block takes K steps with ignore_eos and 16 tokens)
        logits = logits.clone()  # a normal tensor (the recorded one is an inference tensor)
        logits[..., nano.settings.mask_token_id] = float("-inf")  # the decoder never picks its mask token
        softmax = logits.softmax(-1)
        chosen = softmax.gather(-1, tokens[:, j * B:(j + 1) * B, None])[..., 0]
        block = expected[:, j * B:(j + 1) * B]
        block[commit] = chosen[commit]
    assert len(steps) == 2 * K and not bool(expected.isnan().any())  # every token committed exactly once
    assert torch.allclose(torch.tensor(res.token_probs), expected, atol=1e-6)
    committed_late = torch.stack([c for _, c in steps[1:K]]).any(0)  # positions of block 0 committed after step 0
    assert bool(committed_late.any())  # so the kept value is not always the first step's


def test_probabilities_stop_with_the_answer_at_eos(nano, nano_runner, padded):
    free = _decode(nano, nano_runner, padded, block_size=4, steps=4, strategy="low_confidence_static")
    eos = free.token_ids[0][6]
    cut = free.token_ids[0].index(eos)
    res = _decode(nano, nano_runner, padded, eos=eos, block_size=4, steps=4, strategy="low_confidence_static",
                  ignore_eos=False)
    assert res.finished[0] and len(res.token_probs[0]) == len(res.token_ids[0]) == cut
    assert res.token_probs[0] == free.token_probs[0][:cut]


def test_the_static_decoder_reports_the_eager_decoders_probabilities(nano, nano_runner, padded):
    from wam_diff_kernels.graph_runner import GraphRunner

    cfg = DecoderConfig(block_size=8, steps=4, strategy="low_confidence_dynamic", threshold=0.5, max_new_tokens=16,
                        ignore_eos=True)
    ref = generate(nano_runner, padded, cfg, nano.settings.mask_token_id, nano.settings.eos_token_id)
    ours = GraphRunner(nano_runner, nano.settings.mask_token_id).generate(padded, cfg, nano.settings.eos_token_id)
    assert ours.token_ids == ref.token_ids
    assert torch.allclose(torch.tensor(ours.token_probs), torch.tensor(ref.token_probs), atol=1e-5)


def test_decode_result_cuts_ids_and_probabilities_at_eos_in_one_transfer():
    out = torch.tensor([[5, 6, 2, 7], [8, 9, 10, 11]])
    probs = torch.tensor([[0.5, 0.25, 0.9, 0.1], [1.0, 0.75, 0.5, 0.125]])
    res = decode_result(out, probs, eos_id=2, max_new_tokens=4, ignore_eos=False, forwards=3, timings={})
    assert res.token_ids == [[5, 6], [8, 9, 10, 11]] and res.finished == [True, False]
    assert res.token_probs == [[0.5, 0.25], [1.0, 0.75, 0.5, 0.125]] and res.tokens == 3 + 4
