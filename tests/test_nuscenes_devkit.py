"""The official nuScenes devkit (installed without its numpy < 2 pin, requirements-nuscenes.txt) works under numpy 2
for every part the converter uses: NuScenes(version, dataroot) on a dataset written in the schema, the reverse
indexes, get_sample_data with BoxVisibility, Box corners, view_points, box_in_image, transform_matrix, pyquaternion
rotations, box_velocity, and the official scene splits."""
import math

import numpy as np
import pytest

pytest.importorskip("nuscenes", reason="needs the nuScenes devkit (requirements-nuscenes.txt)")

from nuscenes.nuscenes import NuScenes  # noqa: E402
from nuscenes.utils.data_classes import Box  # noqa: E402
from nuscenes.utils.geometry_utils import BoxVisibility, box_in_image, transform_matrix, view_points  # noqa: E402
from nuscenes.utils.splits import create_splits_scenes  # noqa: E402
from pyquaternion import Quaternion  # noqa: E402

from wam_diff_core.nuscenes import fixture, reader  # noqa: E402
from wam_diff_core.nuscenes.geometry import yaw_of, yaw_quaternion  # noqa: E402

K = np.array(fixture.INTRINSIC)


@pytest.fixture(scope="module")
def nusc(tmp_path_factory):
    root = tmp_path_factory.mktemp("nuscenes")
    fixture.write_fixture(root, scenes=(fixture.SCENES[2],))
    return NuScenes(version="v1.0-mini", dataroot=str(root), verbose=False), fixture.table_counts(root)


def test_numpy_is_2_here():
    assert int(np.__version__.split(".")[0]) >= 2


def test_nuscenes_class_loads_every_table_of_the_fixture(nusc):
    ns, counts = nusc
    assert set(counts) == set(ns.table_names) and len(counts) == 13
    for table, n in counts.items():
        assert len(getattr(ns, table)) == n > 0
    assert counts["sample"] == 28 and counts["sample_data"] == 136  # 13.5 s at 10 Hz, every 5th a keyframe
    assert all(s["data"].keys() == {"CAM_FRONT"} for s in ns.sample)
    assert sum(len(s["anns"]) for s in ns.sample) == counts["sample_annotation"]


def test_get_sample_data_boxes_are_in_the_camera_frame_and_visible(nusc):
    ns, _ = nusc
    boxes_seen = 0
    for sample in ns.sample:
        path, boxes, intrinsic = ns.get_sample_data(sample["data"]["CAM_FRONT"], box_vis_level=BoxVisibility.ANY)
        assert path.endswith(".jpg") and np.allclose(intrinsic, K)
        for box in boxes:
            corners = box.corners()
            assert corners.shape == (3, 8) and np.all(corners[2] > 0.1)  # in front of the camera
            assert box_in_image(box, intrinsic, fixture.IMAGE_SIZE, vis_level=BoxVisibility.ANY)
            boxes_seen += 1
    assert boxes_seen >= 20


def test_view_points_projects_a_known_point():
    uv = view_points(np.array([[1.0], [2.0], [10.0]]), K, normalize=True)
    assert uv[:, 0] == pytest.approx([316.6 * 0.1 + 204.1, 316.6 * 0.2 + 122.9, 1.0])


def test_box_in_image_levels_on_boxes_inside_across_and_behind():
    inside = Box([0.0, 0.0, 10.0], [2.0, 4.0, 1.5], Quaternion(axis=[0, 1, 0], angle=0.3))
    across = Box([7.0, 0.0, 10.0], [2.0, 4.0, 1.5], Quaternion())  # straddles the right edge at u = 400
    behind = Box([0.0, 0.0, -10.0], [2.0, 4.0, 1.5], Quaternion())
    size = fixture.IMAGE_SIZE
    assert box_in_image(inside, K, size, BoxVisibility.ALL) and box_in_image(inside, K, size, BoxVisibility.ANY)
    assert not box_in_image(across, K, size, BoxVisibility.ALL) and box_in_image(across, K, size, BoxVisibility.ANY)
    assert not box_in_image(behind, K, size, BoxVisibility.ANY) and box_in_image(behind, K, size, BoxVisibility.NONE)


def test_camera_rotation_and_yaw_quaternions_agree_with_pyquaternion():
    assert np.allclose(Quaternion(fixture.CAMERA_ROTATION).rotation_matrix, np.array(fixture.CAMERA_AXES))
    for yaw in (-3.0, -1.2, 0.0, 0.7, 2.9):
        q = Quaternion(yaw_quaternion(yaw))
        assert q.yaw_pitch_roll[0] == pytest.approx(yaw) and yaw_of(q.elements) == pytest.approx(yaw)


def test_transform_matrix_and_its_inverse_compose_to_identity():
    q, t = Quaternion(axis=[0, 0, 1], angle=0.4), np.array([3.0, -2.0, 1.0])
    m = transform_matrix(t, q) @ transform_matrix(t, q, inverse=True)
    assert np.allclose(m, np.eye(4))


def test_box_velocity_of_an_annotation_matches_its_neighbours(nusc):
    ns, _ = nusc
    ann = next(a for a in ns.sample_annotation if a["prev"] and a["next"])
    v = ns.box_velocity(ann["token"])
    prev, nxt = ns.get("sample_annotation", ann["prev"]), ns.get("sample_annotation", ann["next"])
    dt = (ns.get("sample", nxt["sample_token"])["timestamp"] - ns.get("sample", prev["sample_token"])["timestamp"]) * 1e-6
    want = (np.array(nxt["translation"]) - np.array(prev["translation"])) / dt
    assert np.allclose(v, want) and math.isfinite(float(np.linalg.norm(v)))


def test_official_splits_have_their_sizes_and_map_onto_train_and_val():
    splits = create_splits_scenes()
    assert [len(splits[k]) for k in ("train", "val", "mini_train", "mini_val")] == [700, 150, 8, 2]
    mini = reader.scene_splits("v1.0-mini")
    assert len(mini) == 10 and mini["scene-0061"] == "train" and mini["scene-0103"] == "val"
    full = reader.scene_splits("v1.0-trainval")
    assert len(full) == 850 and sum(v == "val" for v in full.values()) == 150
