"""Closed-loop runner: outcomes, invalid plans, per-route records, summary and re-scoring."""
import json

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.eval.score_cli import rescore  # noqa: E402
from wam_diff_core.sim.closed_loop import drive_suite, run_route, shift_plan  # noqa: E402
from wam_diff_core.sim.policies import ConstantVelocityPolicy, ExpertPlanPolicy, ExpertPolicy, load_policy  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_core.errors import UsageError  # noqa: E402
from wam_diff_core.types import Plan  # noqa: E402

SHORT_HIGHWAY = Route("t_highway", "highway", 11, 1.0, 60.0, 10.0, {"lanes": 3, "vehicles": 8, "ego_speed": 20.0})
LEFT_TURN = Route("t_left", "intersection", 9, 1.0, 90.0, 25.0, {"destination": "o1"})


class GarbagePolicy:
    needs_images = False
    calls = 0

    def plan(self, images, ego, command):
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("model exploded")
        return Plan(trajectory=np.full((8, 2), np.nan), valid=True)


def test_expert_completes_a_short_route_without_infractions():
    rec = run_route(SHORT_HIGHWAY, ExpertPolicy())
    assert rec["status"] == "Completed" and rec["completion"] == 100.0 and rec["score"] == 100.0
    assert rec["infractions"] == [] and rec["invalid_plans"] == 0
    assert rec["efficiency"]["ego_mean_speed"] > 10.0
    assert len(rec["comfort"]["lon_accel"]) == rec["ticks"]


def test_expert_plans_tracked_by_the_controller_turn_left_where_constant_velocity_cannot():
    policy = load_policy("expert-plan")
    assert isinstance(policy, ExpertPlanPolicy) and not policy.drives_itself
    unbound = ExpertPlanPolicy().plan([], None, "turn left")
    assert not unbound.valid and "not bound" in unbound.errors["planning"]
    rec = run_route(LEFT_TURN, policy, replan_every=4)
    assert rec["status"] == "Completed" and rec["score"] == 100.0 and rec["invalid_plans"] == 0


def test_constant_velocity_cannot_turn_left_at_an_intersection():
    rec = run_route(LEFT_TURN, ConstantVelocityPolicy())
    assert rec["status"] != "Completed" and rec["score"] < 100.0


def test_invalid_plans_brake_and_are_counted_never_crash():
    route = Route("t_bad", "highway", 5, 0.5, 200.0, 3.0, {"lanes": 3, "vehicles": 2, "ego_speed": 15.0})
    rec = run_route(route, GarbagePolicy())
    assert rec["invalid_plans"] == rec["ticks"] == 30
    assert rec["status"] == "Failed - timeout"
    # braking all the time: the ego stops within 3 s from 15 m/s at 4 m/s^2 (4 s), so it ends slow
    assert rec["efficiency"]["ego_mean_speed"] < 12.0


def test_shift_plan_retimes_along_the_plan():
    traj = np.stack([np.arange(1, 9) * 5.0, np.zeros(8)], axis=1)
    np.testing.assert_allclose(shift_plan(traj, 0.5), np.stack([np.arange(2, 10) * 5.0, np.zeros(8)], axis=1))


def test_drive_suite_writes_route_json_summary_video_and_rescore_matches(tmp_path):
    summary = drive_suite([SHORT_HIGHWAY], "constant-velocity", tmp_path, workers=1, video_ids=["t_highway"],
                          frame_size=(128, 64), progress=False)
    rec = json.loads((tmp_path / "routes" / "t_highway.json").read_text())
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("driving_score", "success_rate", "abilities", "efficiency", "comfort", "routes"):
        assert key in on_disk
    assert on_disk["driving_score"] == pytest.approx(rec["score"])
    assert summary["videos"] and (tmp_path / "videos").is_dir()
    assert on_disk["frame_size"] == [128, 64] and on_disk["replan_every"] == 1
    assert rescore(tmp_path)["driving_score"] == pytest.approx(on_disk["driving_score"])


def _drive_args(*extra):
    import argparse

    from wam_diff_core.sim import closed_loop

    parser = argparse.ArgumentParser()
    closed_loop.add_arguments(parser)
    return parser.parse_args(["--policy", "p", "--out", "o", *extra])


def test_drive_decoding_options_are_unset_unless_given_and_b1_decodes_with_one_step():
    from wam_diff_core.decoding.config import DecoderConfig, resolve_decoding
    from wam_diff_core.decoding.options import decoding_arguments

    assert decoding_arguments(_drive_args()) == {}
    given = decoding_arguments(_drive_args("--block-size", "1", "--steps", "8", "--schedule", "cosine",
                                           "--number-order", "off", "--forward-only", "on", "--text-layers", "fast"))
    assert given == {"block_size": 1, "steps": 8, "schedule": "cosine", "text_layers": "fast", "number_order": False,
                     "forward_only": True}
    ckpt = DecoderConfig(block_size=32, steps=4, threshold=0.8)
    cfg = resolve_decoding(ckpt, **given)
    assert (cfg.block_size, cfg.steps, cfg.threshold) == (1, 1, 0.8)  # B = 1: one step; the rest: the checkpoint's
    assert resolve_decoding(ckpt, **decoding_arguments(_drive_args("--block-size", "4", "--steps", "8"))).steps == 4


def test_drive_shows_a_progress_bar_over_the_routes_on_stderr_unless_told_not_to(tmp_path, capsys):
    from wam_diff_core.cli import main

    args = ["drive", "--policy", "constant-velocity", "--ids", "highway_00", "--frame-size", "64x32"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert "1/1" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert "1/1" not in capsys.readouterr().err


def test_drive_cli_runs_each_route_once_per_traffic_seed_offset(tmp_path, capsys):
    from wam_diff_core.cli import main

    out = tmp_path / "drive"
    assert main(["drive", "--policy", "constant-velocity", "--out", str(out), "--ids", "highway_00", "--limit", "1",
                 "--seed-offsets", "0,50000", "--frame-size", "64x32"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["routes"]) == ["highway_00", "highway_00_s50000"] and summary["num_routes"] == 2
    seeds = {json.loads(p.read_text())["seed"] for p in (out / "routes").glob("*.json")}
    assert len(seeds) == 2  # the copy drives other traffic
    assert main(["drive", "--policy", "constant-velocity", "--out", str(out), "--ids", "highway_00",
                 "--seed-offsets", "0,0"]) == 2
    assert "wam-diff drive: error: --seed-offsets" in capsys.readouterr().err


def test_closed_loop_commands_render_the_frames_the_policy_was_trained_on(tmp_path, capsys):
    from wam_diff_core.constants import FRAME_SIZE
    from wam_diff_core.model.settings import WamDiffSettings
    from wam_diff_core.sim.routes import resolve_frame_size

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    WamDiffSettings(mask_token_id=7, eos_token_id=2, frame_size=(96, 48)).save(ckpt)
    assert resolve_frame_size(None, str(ckpt)) == (96, 48)        # the checkpoint's frames
    assert resolve_frame_size(None, "constant-velocity") == FRAME_SIZE
    assert resolve_frame_size(None, "nano") == FRAME_SIZE          # a preset records none
    assert resolve_frame_size("96x48", str(ckpt)) == (96, 48) and "differs" not in capsys.readouterr().out
    assert resolve_frame_size("384x192", str(ckpt)) == (384, 192)  # as asked, with a note
    assert "384x192 differs from the 96x48 frames" in capsys.readouterr().out
    with pytest.raises(UsageError, match="expected WxH"):
        resolve_frame_size("wide", str(ckpt))
    (ckpt / "wam_diff.json").write_text('{"mask_token_id": 7, "eos_token_id": 2, "frame_size": [96]}')
    with pytest.raises(UsageError, match="frame_size"):
        resolve_frame_size(None, str(ckpt))


def test_worker_threads_splits_the_cores_between_spawned_workers(monkeypatch):
    import os

    from wam_diff_core.sim.jobs import worker_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with worker_threads(4):
        assert os.environ["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in os.environ
    with worker_threads(1):
        assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting wins
    with worker_threads(4):
        assert os.environ["OMP_NUM_THREADS"] == "3"


class SlowStraightPolicy:
    """Plans a straight line at 20 m/s after sleeping `delay_s` (wall time); records the ticks it was asked at."""

    needs_images = False

    def __init__(self, delay_s: float):
        self.delay_s, self.calls = delay_s, 0

    def plan(self, images, ego, command):
        import time

        self.calls += 1
        time.sleep(self.delay_s)
        t = np.arange(1, 9) * 0.5
        return Plan(trajectory=np.stack([20.0 * t, np.zeros(8)], axis=1), valid=True)


def test_latency_ticks_round_wall_time_up_to_whole_ticks():
    from wam_diff_core.sim.closed_loop import latency_ticks

    assert [latency_ticks(s, 0.1) for s in (0.0, 0.0001, 0.1, 0.1001, 0.95, 1.0)] == [0, 1, 1, 2, 10, 10]


def test_realtime_plans_arrive_after_their_decode_time_and_the_next_is_asked_for_then():
    lockstep, slow = SlowStraightPolicy(0.0), SlowStraightPolicy(0.25)
    a = run_route(SHORT_HIGHWAY, lockstep, replan_every=1)
    b = run_route(SHORT_HIGHWAY, slow, replan_every=1, realtime=True)
    assert "realtime" not in a and a["plans"] == a["ticks"]  # lockstep: a plan every tick
    # 0.25 s of decoding = 3 ticks: one plan per 3 ticks after the first (taken as ready at the start)
    assert b["realtime"]["latency_ticks_max"] == 3 and b["realtime"]["latency_ticks_mean"] > 2.5
    assert b["plans"] == pytest.approx(1 + b["ticks"] / 3, abs=1.5)
    assert b["status"] == "Completed" and b["invalid_plans"] == 0
    # never stale: the ego keeps driving at the planned speed while plans are in flight
    assert b["efficiency"]["ego_mean_speed"] == pytest.approx(a["efficiency"]["ego_mean_speed"], rel=0.05)
    # a staleness limit under the plans' age: the controller brakes between arrivals and the ego falls behind
    c = run_route(SHORT_HIGHWAY, SlowStraightPolicy(0.25), replan_every=1, realtime=True, stale_after_s=0.2)
    assert c["efficiency"]["ego_mean_speed"] < 0.8 * b["efficiency"]["ego_mean_speed"]
