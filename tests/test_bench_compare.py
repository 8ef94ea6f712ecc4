"""`wam-diff bench --compare`: whole plans of policies taking turns on the same frames, L2 beside the speed."""
import json
import time

import numpy as np
import pytest
from PIL import Image

from wam_diff_core.bench.compare import compare_plans, summarise
from wam_diff_core.bench.entries import EntryError, parse_entry, parse_entries
from wam_diff_core.bench.frames import Frame, FramesError, route_target_for, spaced, split_frames
from wam_diff_core.cli import main
from wam_diff_core.codec import format_trajectory
from wam_diff_core.constants import IMAGE_PLACEHOLDER, NUM_WAYPOINTS
from wam_diff_core.eval.paired import paired_gap
from wam_diff_core.prompts import planning_prompt
from wam_diff_core.types import DecodeStats, EgoState, Plan

pytestmark = pytest.mark.usefixtures("one_thread")  # spinning threads on a shared 2-core machine


def truth(k: int) -> np.ndarray:
    return np.stack([np.arange(1, NUM_WAYPOINTS + 1) * 2.0 + k, np.full(NUM_WAYPOINTS, 0.1 * k)], axis=1)


def frames(n: int) -> list[Frame]:
    return [Frame(f"f{k}", np.full((16, 32, 3), k, np.uint8), EgoState(vx=5.0), "follow lane", None, "highway", truth(k))
            for k in range(n)]


class FakePolicy:
    """Plans the frame's truth shifted `offset` m forward, after `delay` s; 10 tokens per plan."""

    def __init__(self, delay: float, offset: float):
        self.delay, self.offset = delay, offset

    def plan(self, images, ego, command, target=None):
        time.sleep(self.delay)
        k = int(images[0][0, 0, 0])
        return Plan(trajectory=truth(k) + [self.offset, 0.0], valid=True, stats={"decode": DecodeStats(tokens=10, forwards=3)})


def test_a_policy_twice_as_slow_shows_at_half_the_speed_and_its_l2_gap_is_exact():
    fs = frames(7)
    entries = parse_entries(["slow=a", "fast=b"])
    policies = [FakePolicy(0.04, 1.0), FakePolicy(0.02, 1.5)]
    result = summarise(entries, policies, compare_plans(policies, fs, progress=False), fs)
    slow, fast = result["entries"]
    assert slow["x_plans_per_s"]["median"] == 1.0 and slow["x_tokens_per_s_total"] == 1.0
    assert 1.6 <= fast["x_plans_per_s"]["median"] <= 2.5
    assert 1.6 <= fast["x_tokens_per_s"]["median"] <= 2.5
    assert (slow["l2"]["l2_mean"], fast["l2"]["l2_mean"]) == (pytest.approx(1.0), pytest.approx(1.5))
    assert fast["l2_gap"]["gap"] == pytest.approx(0.5) and fast["l2_gap"]["gap_ci"] == pytest.approx([0.5, 0.5])
    assert fast["tokens_per_plan"] == 10 and fast["forwards_per_plan"] == 3 and fast["valid"] == 7
    assert len(result["frames"]) == 7 and [p["position"] for p in result["frames"][1]["plans"]] == [1, 0]


def test_a_policy_against_itself_has_ratio_one():
    fs = frames(7)
    policies = [FakePolicy(0.02, 0.0), FakePolicy(0.02, 0.0)]
    result = summarise(parse_entries(["a=x", "b=x"]), policies, compare_plans(policies, fs, progress=False), fs)
    assert 0.8 <= result["entries"][1]["x_plans_per_s"]["median"] <= 1.25


def test_paired_gap_of_a_model_ten_percent_worse_everywhere():
    ref = np.array([0.5, 1.0, 2.0, 4.0])
    gap = paired_gap(ref, 1.1 * ref)
    assert gap["gap"] == pytest.approx(0.1) and gap["gap_ci"] == pytest.approx([0.1, 0.1])
    assert gap["diff_m"] == pytest.approx(0.1 * ref.mean()) and gap["plans"] == 4
    with pytest.raises(ValueError, match=r"\(3,\) and \(2,\)"):
        paired_gap(np.ones(3), np.ones(2))


@pytest.mark.parametrize("spec, label, model, decoding, threads", [
    ("models/nano-s-b32", "models/nano-s-b32", "models/nano-s-b32", {}, None),
    ("b32=models/nano-s-b32@8", "b32", "models/nano-s-b32", {"steps": 8}, None),
    ("x=nano@16x4:text_layers=fast:threshold=0.8:threads=1", "x", "nano",
     {"block_size": 16, "steps": 4, "text_layers": "fast", "threshold": 0.8}, 1),
    ("models/m:number_order=off", "models/m:number_order=off", "models/m", {"number_order": False}, None),
])
def test_entries_spell_label_model_steps_and_settings(spec, label, model, decoding, threads):
    e = parse_entry(spec)
    assert (e.label, e.model, e.decoding, e.threads) == (label, model, decoding, threads)


def test_an_entry_may_load_its_weights_in_its_own_dtype():
    assert parse_entry("b=models/m@2:dtype=bfloat16").dtype == "bfloat16"
    assert parse_entry("models/m").dtype is None


@pytest.mark.parametrize("spec, message", [("m@x4", "@x4"), ("m:speed=2", "'speed=2'"), ("m:threads=0", "threads='0'"),
                                           ("=m", "no label"), ("a=", "no model"),
                                           ("m:dtype=fp8", "dtype='fp8'")])
def test_bad_entries_are_named(spec, message):
    with pytest.raises(EntryError, match=message):
        parse_entry(spec)


def test_two_entries_with_one_label_are_refused():
    with pytest.raises(EntryError, match="'a'"):
        parse_entries(["a=m1", "a=m2"])


def test_spaced_indices_cover_the_split_evenly():
    assert spaced(10, 4) == [0, 3, 6, 9] and spaced(3, 5) == [0, 1, 2]


def test_route_target_only_where_the_checkpoint_learned_it():
    f = Frame("f", np.zeros((2, 2, 3), np.uint8), EgoState(vx=0.0), "follow lane", (25.0, 1.0), "highway", truth(0))
    assert route_target_for(f, False, None) is None
    assert route_target_for(f, True, None) == (25.0, 1.0)
    assert route_target_for(f, True, ("roundabout",)) is None


def write_split(root, n: int) -> str:
    samples = []
    for k in range(n):
        Image.fromarray(np.full((64, 128, 3), 40 * k, np.uint8)).save(root / f"{k}.png")
        samples.append({"id": f"s{k}", "task": "planning", "image": [f"{k}.png"], "meta": {"command": "follow lane"},
                        "conversations": [{"from": "human", "value": f"{IMAGE_PLACEHOLDER}\n{planning_prompt(EgoState(vx=8.0), 'follow lane')}"},
                                          {"from": "gpt", "value": format_trajectory(truth(k))}]})
    samples.append({"id": "q", "task": "qa", "image": ["0.png"], "conversations": []})
    path = root / "val.json"
    path.write_text(json.dumps(samples))
    return str(path)


def test_split_frames_read_image_ego_command_and_truth(tmp_path):
    fs = split_frames(write_split(tmp_path, 3), 2)
    assert [f.id for f in fs] == ["s0", "s2"]
    assert fs[1].image.shape == (64, 128, 3) and int(fs[1].image[0, 0, 0]) == 80
    assert fs[1].ego.vx == 8.0 and fs[1].command == "follow lane"
    np.testing.assert_allclose(fs[1].truth, truth(2), atol=1e-5)


def test_a_missing_split_is_one_line(tmp_path, capsys):
    assert main(["bench", "--compare", "nano", "--data", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wam-diff bench: error: --data") and len(err.strip().splitlines()) == 1
    with pytest.raises(FramesError):
        split_frames(tmp_path / "none.json", 1)


def test_compare_cli_writes_entries_machine_load_and_frames(nano_ckpt, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = main(["bench", "--compare", f"a={nano_ckpt}@8x2", f"b={nano_ckpt}@8x2:threads=1", "--data",
               write_split(tmp_path, 2), "--samples", "2", "--max-new-tokens", "16", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"frames_source", "samples", "machine", "load_before", "load_after", "entries", "frames"}
    assert set(result["machine"]) >= {"cpu", "cores", "torch_threads", "torch"}
    a, b = result["entries"]
    assert set(a) >= {"label", "decoding", "plans", "valid", "ms_per_plan", "plans_per_s", "tokens_per_s", "l2",
                      "x_plans_per_s", "x_tokens_per_s", "x_tokens_per_s_total", "l2_gap"}
    assert (a["decoding"]["block_size"], a["decoding"]["steps"], b["threads"], a["plans"]) == (8, 2, 1, 2)
    assert len(result["frames"]) == 2 and (tmp_path / "cmp.md").is_file()
    assert "| a | 8 | 2 |" in capsys.readouterr().out
