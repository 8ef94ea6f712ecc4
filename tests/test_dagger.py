"""DAgger data: the expert rollout from a copied world, and labelled drives of a policy."""
import json

import numpy as np
import pytest

pytest.importorskip("highway_env")

from wam_diff_core.codec import parse_trajectory  # noqa: E402
from wam_diff_core.constants import HORIZON_S, NUM_WAYPOINTS  # noqa: E402
from wam_diff_core.sim.dagger import DaggerPolicy, collect, collect_route, trim_waits  # noqa: E402
from wam_diff_core.sim.datagen import assign_splits  # noqa: E402
from wam_diff_core.sim.highway import HighwayWorld, world_to_ego  # noqa: E402
from wam_diff_core.sim.policies import ConstantVelocityPolicy  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402

SHORT = Route("g_short", "highway", 31, 1.0, 50.0, 6.0, {"lanes": 3, "vehicles": 5, "ego_speed": 15.0})


def test_expert_rollout_is_the_experts_future_and_leaves_the_world_alone():
    world = HighwayWorld(SHORT, driver="expert", render=False)
    world.reset()
    for _ in range(5):
        tick0 = world.step()
    before = world.snapshot()
    path, crashed = world.expert_rollout(HORIZON_S)
    assert world.snapshot() == before
    assert path.shape == (40, 2) and not crashed
    actual = np.array([world.step().pose[:2] for _ in range(40)])
    ego_frame = world_to_ego(actual, np.array(tick0.pose[:2]), tick0.pose[2])
    np.testing.assert_allclose(path, ego_frame, atol=1e-9)


def test_expert_rollout_takes_over_a_policy_ego_between_lanes():
    from wam_diff_core.sim.highway import ego_to_world

    world = HighwayWorld(SHORT, driver="policy", render=False)
    y0 = world.reset().pose[1]  # a lane centre; lanes are 4 m apart
    for _ in range(8):  # steer left: the ego ends up off its lane centre
        tick = world.step(0.0, 0.05)
    assert 0.3 < tick.pose[1] - y0 < 3.7
    path, crashed = world.expert_rollout(HORIZON_S)
    assert not crashed
    # the expert drives on at about the current speed (15 m/s) and ends on a lane centre
    assert 40.0 < path[-1, 0] < 90.0
    end_y = ego_to_world(path[-1:], np.array(tick.pose[:2]), tick.pose[2])[0, 1]
    off = (end_y - y0) / 4.0
    assert abs(off - round(off)) * 4.0 < 0.5
    assert world.driver == "policy" and world.ego.__class__.__name__ == "PolicyVehicle"


def test_dagger_policy_labels_every_plan_and_beta_one_drives_the_expert(tmp_path):
    dag = DaggerPolicy(ConstantVelocityPolicy(), SHORT, tmp_path, beta=1.0)
    from wam_diff_core.sim.closed_loop import run_route

    rec = run_route(SHORT, dag, frame_size=(128, 64), replan_every=4)
    assert rec["status"] == "Completed"
    assert dag.expert_steps == len(dag.samples) == -(-rec["ticks"] // 4)
    for s in dag.samples:
        traj = parse_trajectory(s["conversations"][1]["value"])
        assert traj.shape == (NUM_WAYPOINTS, 2)
        assert traj[0, 0] > 0.0 and (tmp_path / s["image"][0]).is_file()
        assert s["meta"]["source"] == "dagger" and s["task"] == "planning"
    with pytest.raises(ValueError, match="beta 1.5"):
        DaggerPolicy(ConstantVelocityPolicy(), SHORT, tmp_path, beta=1.5)


def test_collect_drives_training_routes_only_and_writes_a_dataset(tmp_path, monkeypatch):
    routes = [Route(f"g_{i}", "highway", 40 + i, 1.0, 40.0, 5.0, {"lanes": 3, "vehicles": 4, "ego_speed": 15.0})
              for i in range(5)]
    held_out = [r.route_id for r in routes if assign_splits(routes, 0.2)[r.route_id] == "val"]
    assert len(held_out) == 1
    import wam_diff_core.sim.policies as policies

    monkeypatch.setattr(policies, "_CACHED", {})
    monkeypatch.setattr(policies, "load_policy",
                        lambda spec, device="cpu", decoding=None, candidates=None: ConstantVelocityPolicy())
    stats = collect(routes, "cv", tmp_path, seed_offsets=(7,), frame_size=(128, 64), progress=False)
    driven = set(stats["statuses"])
    assert driven == {f"{r.route_id}_s7" for r in routes if r.route_id not in held_out}
    assert stats["held_out_routes"] == held_out
    train = json.loads((tmp_path / "train.json").read_text())
    assert len(train) == stats["samples"]["train"] > 0 and stats["samples"]["val"] == 0
    assert stats["drives"]["num_routes"] == 4
    # a rerun resumes from the parts: nothing is driven again
    again = collect(routes, "cv", tmp_path, seed_offsets=(7,), frame_size=(128, 64), progress=False)
    assert again["generated_samples"] == 0 and again["samples"] == stats["samples"]


def _part(speeds, completed=False, crashed=False, dt=0.4):
    samples = [{"id": f"s{i}", "task": "planning", "meta": {"t": round(i * dt, 3), "ego": [v, 0.0, 0.0, 0.0, 0.0]}}
               for i, v in enumerate(speeds)]
    return {"samples": samples[::-1], "completed": completed, "crashed": crashed}  # any order in, time order out


def test_trim_waits_keeps_a_stuck_end_short_and_a_wait_at_both_ends():
    # 10 moving samples, a 20-sample (8 s) wait the ego drives off from, 5 moving, then stuck to the end
    speeds = [5.0] * 10 + [0.0] * 20 + [4.0] * 5 + [0.0] * 25
    kept, dropped = trim_waits(_part(speeds), wait_keep_s=2.0, wait_lead_s=1.2)
    ids = [int(s["id"][1:]) for s in kept]
    wait = [i for i in ids if 10 <= i < 30]
    stuck = [i for i in ids if i >= 35]
    # the wait (t 4.0 .. 11.6) keeps t <= 4.0 + 2.0 and t >= 12.0 - 1.2: 6 + 3 samples
    assert wait == [10, 11, 12, 13, 14, 15, 27, 28, 29]
    # the stuck end (t 14.0 ..) keeps its first min(3, 2) s: 6 samples
    assert stuck == [35, 36, 37, 38, 39, 40]
    assert [i for i in ids if i < 10 or 30 <= i < 35] == list(range(10)) + list(range(30, 35))
    assert dropped == len(speeds) - len(kept) == 11 + 19
    # a drive that completed (or crashed) was not stuck: a stretch at its end stays whole, as in `wam-diff data`
    kept_done, _ = trim_waits(_part(speeds, completed=True), wait_keep_s=2.0, wait_lead_s=1.2)
    assert len([s for s in kept_done if int(s["id"][1:]) >= 35]) == 25
    with pytest.raises(ValueError, match="wait_keep_s -1"):
        trim_waits(_part(speeds), wait_keep_s=-1.0)


def test_keep_departures_keeps_the_labels_that_drive_off_from_a_stuck_stretch():
    from wam_diff_core.codec import format_trajectory
    from wam_diff_core.sim.dagger import label_departs

    t = np.arange(1, NUM_WAYPOINTS + 1)[:, None] * 0.5
    stand, creep, go = np.zeros((NUM_WAYPOINTS, 2)), np.hstack([0.1 * t, 0 * t]), np.hstack([2.0 * t ** 2, 0 * t])
    part = _part([5.0] * 4 + [0.0] * 20)  # stuck from sample 4 to the end
    for i, sample in enumerate(sorted(part["samples"], key=lambda x: x["meta"]["t"])):
        label = go if i in (15, 20) else creep if i == 18 else stand
        sample["conversations"] = [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": format_trajectory(label)}]
    assert [label_departs({"conversations": [{}, {"value": format_trajectory(x)}]}) for x in (stand, creep, go)] == \
        [False, False, True]  # creeping at 0.1 m/s: the controller holds its stop
    plain, _ = trim_waits(part, wait_keep_s=1.0)
    kept, dropped = trim_waits(part, wait_keep_s=1.0, keep_departures=True)
    ids = lambda xs: [int(x["id"][1:]) for x in xs]  # noqa: E731
    assert ids(plain) == [0, 1, 2, 3, 4, 5, 6]  # the stuck end's first 1 s (0.4 s apart)
    assert ids(kept) == [0, 1, 2, 3, 4, 5, 6, 15, 20] and dropped == 24 - 9


def test_collect_trims_at_merge_without_driving_again(tmp_path, monkeypatch):
    """--wait-keep-s applies when train.json is merged: the parts keep every sample, so a rerun with the
    setting re-merges the same drives (none driven again) and drops the stationary stretch."""
    route = Route("g_stop", "emergency_brake", 52, 1.0, 40.0, 8.0, {"lanes": 2, "vehicles": 2, "ego_speed": 12.0})
    import wam_diff_core.sim.policies as policies

    class Stop:  # plans to stand still: the drive ends stuck
        needs_images, drives_itself = True, False

        def plan(self, images, ego, command):
            from wam_diff_core.types import Plan
            return Plan(trajectory=np.zeros((NUM_WAYPOINTS, 2)), valid=True)

    monkeypatch.setattr(policies, "_CACHED", {})
    monkeypatch.setattr(policies, "load_policy", lambda spec, device="cpu", decoding=None, candidates=None: Stop())
    whole = collect([route], "stop", tmp_path, seed_offsets=(0,), val_fraction=0.0, frame_size=(128, 64),
                    progress=False)
    trimmed = collect([route], "stop", tmp_path, seed_offsets=(0,), val_fraction=0.0, frame_size=(128, 64),
                      progress=False, wait_keep_s=1.0)
    assert trimmed["generated_samples"] == 0 and trimmed["wait_keep_s"] == 1.0
    n_whole, n_trim = whole["samples"]["train"], trimmed["samples"]["train"]
    assert n_trim == len(json.loads((tmp_path / "train.json").read_text()))
    assert sum(trimmed["waiting_ticks_dropped"].values()) == n_whole - n_trim > 0
    part = json.loads((tmp_path / "parts" / "g_stop.json").read_text())
    assert len(part["samples"]) == n_whole  # the part on disk is untouched


def test_collect_route_part_counts(tmp_path):
    res = collect_route(SHORT, ConstantVelocityPolicy(), tmp_path, frame_size=(128, 64), every=5)
    part = json.loads((tmp_path / "parts" / "g_short.json").read_text())
    assert res["num_samples"] == len(part["samples"]) == -(-part["ticks"] // 5)
    assert part["expert_steps"] == 0


def test_tracked_expert_plans_complete_a_roundabout(tmp_path):
    """The expert's rollouts, tracked by the controller (beta = 1), exit the ring where the route does:
    the twin's expert starts from the route's remaining lanes, and at the exit fork takes the route's
    branch (a stale route head or the ring lane at the fork kept it circling: route deviation)."""
    from wam_diff_core.sim.closed_loop import run_route
    from wam_diff_core.sim.routes import load_routes

    route = load_routes(ids=["roundabout_00"])[0]
    dag = DaggerPolicy(ConstantVelocityPolicy(), route, tmp_path, beta=1.0)
    rec = run_route(route, dag, frame_size=(128, 64), replan_every=4)
    assert rec["status"] == "Completed", rec["infractions"]
    assert rec["completion"] == 100.0
