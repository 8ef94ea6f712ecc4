"""`wam-diff-bag to-dataset`: planning samples from a recorded expert drive carry the labels, frames and prompts of
`wam-diff data` on the same route and seed, and the training reader takes every one of them."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags (requirements-data.txt) not installed")
pytest.importorskip("highway_env", reason="embedded world dependencies not installed")

from wam_diff_core.codec import parse_trajectory  # noqa: E402
from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_ros.bag.record import record  # noqa: E402
from wam_diff_ros.bag.to_dataset import to_dataset  # noqa: E402

# 150 m at 20-23 m/s: about 7 s, so frames 0 .. 2.5 s have 4 s of future and the last 4 s of frames have not
ROUTE = Route("bag_labels", "highway", 7, 0.5, 150.0, 12.0, {"lanes": 3, "vehicles": 4, "ego_speed": 20.0})


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(to-dataset's OUT, its stats, `wam-diff data`'s OUT) for the same route and seed."""
    from wam_diff_core.sim.datagen import generate_route

    root = tmp_path_factory.mktemp("labels")
    record(ROUTE, root / "bag", progress=False)
    stats = to_dataset([root / "bag"], root / "from_bag", progress=False)
    generate_route(ROUTE, root / "data", every=5, tasks=("planning",))
    return root / "from_bag", stats, root / "data"


def _by_time(samples):
    return {s["meta"]["t"]: s for s in samples}


def test_labels_frames_and_prompts_equal_wam_diff_data_on_the_same_route(both):
    from PIL import Image

    bag_out, _, data_out = both
    ours = _by_time(json.loads((bag_out / "train.json").read_text()))
    theirs = _by_time(json.loads((data_out / "parts" / "bag_labels.json").read_text())["samples"])
    assert sorted(ours) == sorted(theirs) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    for t, sample in ours.items():
        label = parse_trajectory(sample["conversations"][1]["value"])
        reference = parse_trajectory(theirs[t]["conversations"][1]["value"])
        assert np.abs(label - reference).max() <= 0.01, t  # within 1 cm (both print 2 decimals)
        assert label[-1, 0] > 70.0  # 4 s at over 17 m/s: the label is the real future, not a stub
        assert np.array_equal(np.asarray(Image.open(bag_out / sample["image"][0])),
                              np.asarray(Image.open(data_out / theirs[t]["image"][0])))
        assert sample["conversations"][0]["value"] == theirs[t]["conversations"][0]["value"]
        assert sample["meta"]["scenario"] == "highway" and sample["meta"]["command"] == "follow lane"


def test_frames_without_four_seconds_of_future_are_skipped_counted_and_leave_no_image(both):
    bag_out, stats, _ = both
    part = stats["per_bag"]["bag"]
    # the drive lasts 6.8 s: frames at 0, 0.5, ..., 6.5 s; those after 2.8 s lack 4 s of future
    assert part["camera_frames"] == 69 and part["frames_taken"] == 14
    assert stats["samples"] == {"train": 6, "val": 0} and stats["skipped"] == {"no 4 s of future": 8}
    assert len(list((bag_out / "images" / "bag").glob("*.png"))) == 6


def test_training_reader_keeps_every_bag_sample(both, nano):
    from wam_diff_training.data import DrivingDataset

    bag_out, _, _ = both
    dataset = DrivingDataset(bag_out / "train.json", nano.processor, on_bad_sample="error", trajectory_format="fixed")
    assert len(dataset) == 6 and dataset.stats.kept == 6
    example = dataset[3]
    assert example.task == "planning" and example.ego.vx == pytest.approx(22.05, abs=0.01)


def test_val_bags_land_in_val_json_and_a_rerun_resumes_from_the_parts(both, tmp_path):
    bag_out, _, _ = both
    bag = bag_out.parent / "bag"
    out = tmp_path / "ds"
    first = to_dataset([], out, val_bags=[bag], progress=False)
    assert first["samples"] == {"train": 0, "val": 6}
    (out / "images" / "bag" / "0000.png").unlink()  # a rerun does not read the bag again: the part is kept
    again = to_dataset([], out, val_bags=[bag], progress=False)
    assert again["samples"] == {"train": 0, "val": 6} and not (out / "images" / "bag" / "0000.png").exists()
    assert all(s["meta"]["split"] == "val" for s in json.loads(Path(out / "val.json").read_text()))


def test_bag_inputs_state_the_centripetal_acceleration_of_a_steady_turn_as_the_world_does():
    """20 m/s turning at 0.2 rad/s: the world's (and `wam-diff data`'s) lateral acceleration is the chord of the
    velocity's turn over 0.1 s, 20 sin(0.02) / 0.1 = 3.9997 m/s^2 (about v x yaw rate), not 0."""
    import math

    from wam_diff_ros.bag.inputs import NodeInputs
    from wam_diff_ros.bag.messages import blank, header
    from wam_diff_ros.bag.typestore import typestore

    store, node = typestore(), NodeInputs()
    for k in range(3):
        msg = blank(store, "nav_msgs/msg/Odometry", header=header(store, k * 100_000_000, "odom"))
        msg.twist.twist.linear.x, msg.twist.twist.angular.z = 20.0, 0.2
        node.on_odometry(msg)
    assert node.ego.ay == pytest.approx(20.0 * math.sin(0.02) / 0.1, rel=1e-9)
    assert node.ego.ax == pytest.approx(20.0 * (1 - math.cos(0.02)) / 0.1, abs=1e-9)
