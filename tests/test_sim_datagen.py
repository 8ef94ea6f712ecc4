"""`wam-diff data` round trip: what the generator writes is read back by the training loader, images included."""
import json

import numpy as np
import pytest

pytest.importorskip("highway_env", reason="embedded world dependencies (requirements-sim.txt) not installed")

from wam_diff_core.codec import ParseError, parse_detections, parse_trajectory  # noqa: E402
from wam_diff_core.eval.pdm import pdm_score, scene_from_dict  # noqa: E402
from wam_diff_core.prompts import sample_to_chat  # noqa: E402
from wam_diff_core.sim.datagen import (assign_splits, generate, next_action, waiting_keep,  # noqa: E402
                                       with_seed_offsets)
from wam_diff_core.sim.routes import Route  # noqa: E402

# 100 m at ~20 m/s: ~5 s of driving, so frames 0..~1 s have their full 4 s future
ROUTES = [Route("d_a", "highway", 21, 1.0, 110.0, 10.0, {"lanes": 3, "vehicles": 6, "ego_speed": 20.0}),
          Route("d_b", "highway", 22, 1.0, 110.0, 10.0, {"lanes": 3, "vehicles": 6, "ego_speed": 20.0})]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    stats = generate(ROUTES, out, every=5, frame_size=(128, 64), val_fraction=0.5, progress=False)
    return out, stats


def test_split_is_by_seed_per_scenario_and_stable():
    assert sorted(assign_splits(ROUTES, 0.5).values()) == ["train", "val"]
    from wam_diff_core.sim.routes import load_routes

    suite = load_routes()
    a, b = assign_splits(suite, 0.2), assign_splits(list(reversed(suite)), 0.2)
    assert a == b
    val_scenarios = {r.scenario for r in suite if a[r.route_id] == "val"}
    assert val_scenarios == {r.scenario for r in suite}


def test_samples_follow_the_architecture_format_and_every_route_is_in_one_split(dataset):
    out, stats = dataset
    seen_routes = {}
    total = 0
    for split in ("train", "val"):
        samples = json.loads((out / f"{split}.json").read_text())
        total += len(samples)
        for s in samples:
            assert set(s) >= {"id", "datasource", "task", "image", "conversations"}
            assert s["conversations"][0]["value"].startswith("<image>")
            prompt, response = sample_to_chat(s)
            assert response == s["conversations"][1]["value"]
            seen_routes.setdefault(s["meta"]["route_id"], set()).add(split)
    assert all(len(v) == 1 for v in seen_routes.values()) and len(seen_routes) == 2
    assert total == stats["generated_samples"] and stats["samples_per_s"] > 0
    assert set(stats["per_task"]) == {f"{sp}/{t}" for sp in ("train", "val") for t in ("planning", "detection", "qa")}


def test_answers_parse_back_and_planning_future_is_the_expert_path(dataset):
    out, _ = dataset
    samples = json.loads((out / "val.json").read_text()) + json.loads((out / "train.json").read_text())
    plans = [s for s in samples if s["task"] == "planning"]
    dets = [s for s in samples if s["task"] == "detection"]
    assert plans and dets
    for s in plans:
        traj = parse_trajectory(s["conversations"][1]["value"])
        assert not isinstance(traj, ParseError)
        # forward motion at highway speed, monotone in x, first waypoint ~ speed x 0.5 s
        assert np.all(np.diff(traj[:, 0]) > 0)
        assert traj[0, 0] == pytest.approx(s["meta"]["ego"][0] * 0.5, abs=1.5)
    for s in dets:
        boxes = parse_detections(s["conversations"][1]["value"], (128, 64))
        assert not isinstance(boxes, ParseError)
        assert all(0 <= c <= 1000 for b in boxes for c in b.box_norm)


def test_training_loader_reads_the_dataset_with_images(dataset, nano):
    from wam_diff_training.data import DrivingDataset, load_image

    out, _ = dataset
    ds = DrivingDataset(out / "train.json", nano.processor, on_bad_sample="error")
    assert len(ds) == len(json.loads((out / "train.json").read_text()))
    ex = ds.encode(0)
    assert ex.pixel_values is not None and ex.response_ids.numel() > 0
    img = load_image(out / json.loads((out / "train.json").read_text())[0]["image"][0])
    assert img.shape == (64, 128, 3) and img.dtype == np.uint8


def test_expert_planning_answers_score_well_under_pdms(dataset):
    out, _ = dataset
    samples = {s["id"]: s for s in json.loads((out / "val.json").read_text())}
    scenes = [json.loads(line) for line in (out / "scenes_val.jsonl").read_text().splitlines()]
    assert scenes
    scores = [pdm_score(parse_trajectory(samples[sc["id"]]["conversations"][1]["value"]), scene_from_dict(sc))
              for sc in scenes]
    assert np.mean([r.nc for r in scores]) == 1.0 and np.mean([r.dac for r in scores]) == 1.0


def test_next_action_from_future():
    straight = np.stack([np.arange(1, 9) * 10.0, np.zeros(8)], axis=1)
    assert next_action(straight, 20.0, "follow lane") == "keep lane"
    left = straight.copy()
    left[:, 1] = np.linspace(0.3, 3.5, 8)
    left[-2:, 1] = 3.5
    assert next_action(left, 20.0, "follow lane") == "change lane left"
    assert next_action(np.zeros((8, 2)), 0.0, "follow lane") == "stay stopped"


def test_waiting_frames_stuck_runs_keep_only_the_start_of_their_final_stop():
    t = np.arange(0, 20.0, 0.5)                  # 40 ticks, 0.5 s apart
    v = np.where(t < 5.0, 8.0, 0.0)              # stops at 5 s and never moves again
    keep = waiting_keep(v, t, completed=False, stuck_keep_s=3.0)
    assert keep[t < 5.0].all()
    assert keep[(t >= 5.0) & (t <= 8.0)].all() and not keep[t > 8.0].any()
    assert waiting_keep(v, t, completed=True, stuck_keep_s=3.0).all()   # a completed run loses nothing
    assert waiting_keep(np.full(8, 3.0), t[:8], completed=False).all()  # ends moving: nothing to cut


def test_waiting_frames_long_waits_keep_their_first_seconds_and_the_start():
    t = np.arange(0, 30.0, 0.5)
    v = np.where((t >= 4.0) & (t < 24.0), 0.0, 6.0)  # a 20 s wait, then drives off at 24 s
    assert waiting_keep(v, t, completed=False).all()  # balancing is off by default
    keep = waiting_keep(v, t, completed=False, wait_keep_s=2.0, lead_s=4.0)
    dropped = t[~keep]
    assert dropped.min() == 6.5 and dropped.max() == 19.5 and len(dropped) == 27
    assert keep[t >= 20.0].all() and keep[t < 6.5].all()
    # a short lead keeps only the wait's first tick and its last second: every stopped frame but one starts soon
    keep = waiting_keep(v, t, completed=False, wait_keep_s=0.0, lead_s=1.0)
    assert t[~keep].min() == 4.5 and t[~keep].max() == 22.5 and keep[(t >= 23.0)].all()


def test_seed_offsets_copy_routes_with_new_traffic_seeds_and_keep_their_split(tmp_path):
    routes, base = with_seed_offsets(ROUTES, [0, 1000])
    assert [r.route_id for r in routes] == ["d_a", "d_b", "d_a_s1000", "d_b_s1000"]
    assert [r.seed for r in routes] == [21, 22, 1021, 1022]
    assert routes[2].options == ROUTES[0].options and base["d_b_s1000"] == "d_b"
    with pytest.raises(ValueError, match="seed offsets"):
        with_seed_offsets(ROUTES, [0, 0])
    short = [Route(r.route_id, r.scenario, r.seed, r.density, 40.0, 3.0, r.options) for r in ROUTES]
    stats = generate(short, tmp_path, every=10, frame_size=(64, 32), val_fraction=0.5, tasks=("planning",),
                     progress=False, seed_offsets=(0, 1000))
    parts = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "parts").glob("*.json")}
    assert sorted(parts) == ["d_a", "d_a_s1000", "d_b", "d_b_s1000"]
    for rid, part in parts.items():
        assert part["split"] == parts[rid.split("_s")[0]]["split"]
    assert stats["routes"] == 4
