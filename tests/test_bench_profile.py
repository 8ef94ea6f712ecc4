"""`wam-diff bench --profile`: a plan's phases add up to the plan, blocks carry their steps, nothing stays patched."""
import json

import numpy as np
import pytest

from wam_diff_core import policy as policy_module
from wam_diff_core.bench.frames import Frame
from wam_diff_core.bench.phases import Spans, installed
from wam_diff_core.bench.profile import profile_timer, summarise_phases
from wam_diff_core.cli import main
from wam_diff_core.decoding.config import DecoderConfig
from wam_diff_core.decoding.constraint import TokenConstraint
from wam_diff_core.policy import DrivingPolicy
from wam_diff_core.types import EgoState

from test_bench_compare import truth, write_split

pytestmark = pytest.mark.usefixtures("one_thread")  # spinning threads on a shared 2-core machine


@pytest.fixture(scope="module")
def policy(nano):
    cfg = DecoderConfig(block_size=8, steps=2, strategy="low_confidence_static", max_new_tokens=16, ignore_eos=True)
    return DrivingPolicy(nano, cfg)


def frame() -> Frame:
    return Frame("f", np.full((64, 128, 3), 90, np.uint8), EgoState(vx=6.0), "follow lane", None, None, truth(0))


def test_phases_add_up_to_the_plan_and_blocks_take_their_steps(policy):
    got = profile_timer(policy, [frame()])(0)
    ph = got["phases"]
    assert sum(ph["ms"].values()) == pytest.approx(ph["total_ms"])
    assert ph["ms"]["vision encoder"] > 0 and ph["ms"]["prefill"] > 0 and ph["ms"]["image conversion"] > 0
    assert [b["steps"] for b in ph["blocks"]] == [2, 2]  # 16 tokens = 2 blocks of 8, K = 2 forwards each
    assert sum(b["ms"] for b in ph["blocks"]) <= ph["total_ms"]


def test_the_probes_are_gone_after_the_block(policy):
    originals = (policy_module.generate, policy_module.planning_constraint, TokenConstraint.apply,
                 policy.processor.image_processor)
    with installed(policy, Spans()):
        assert "forward_tokens" in policy.runner.__dict__ and policy_module.generate is not originals[0]
    assert "forward_tokens" not in policy.runner.__dict__ and "encode" not in policy.processor.__dict__
    assert (policy_module.generate, policy_module.planning_constraint, TokenConstraint.apply,
            policy.processor.image_processor) == originals


def test_blocks_beyond_the_row_limit_are_summarised_in_one_row():
    plan = {"valid": True, "tokens": 12, "phases": {"ms": {"prefill": 1.0}, "total_ms": 2.0,
                                                    "blocks": [{"steps": 1, "ms": 1.0, "forward_ms": 0.5, "lm_head_ms": 0.1,
                                                                "mask_ms": 0.1}] * 12}}
    s = summarise_phases([plan, plan])
    assert s["blocks"] == [{"block": "each of 12", "steps": 1.0, "ms": 1.0, "forward_ms": 0.5, "lm_head_ms": 0.1,
                            "mask_ms": 0.1}]
    assert s["phases"] == [{"phase": "prefill", "ms_median": 1.0, "ms_mean": 1.0, "share": 0.5}]


def test_profile_cli_writes_phases_blocks_and_operators(nano_ckpt, tmp_path):
    out = tmp_path / "prof.json"
    rc = main(["bench", "--profile", f"p={nano_ckpt}@8x2", "--data", write_split(tmp_path, 1), "--samples", "1",
               "--max-new-tokens", "16", "--strategy", "low_confidence_static", "--ops", "3", "--ops-plans", "1",
               "--out", str(out)])
    assert rc == 0
    entry = json.loads(out.read_text())["entries"][0]
    assert [p["phase"] for p in entry["phases"]][:5] == ["image conversion", "prompt tokens", "grammar set-up",
                                                           "vision encoder", "prefill"]
    assert sum(p["share"] for p in entry["phases"]) == pytest.approx(1.0)
    assert len(entry["ops"]) == 3 and all(o["self_ms_per_plan"] > 0 for o in entry["ops"])
    assert (tmp_path / "prof.md").read_text().count("| p ms (p50) | share |") == 1
