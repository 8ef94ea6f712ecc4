"""A nuScenes release read through the official devkit (`nuscenes.NuScenes`): scene splits, the CAM_FRONT
keyframes of a scene with their ego poses, the ego motion around a keyframe, the annotated boxes seen by the camera
(projected with the devkit's `view_points`) and the annotated boxes on the ground plane.

The devkit is imported inside the functions: the core imports without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..types import EgoState
from .geometry import image_box, to_frame, yaw_of

CAMERA = "CAM_FRONT"
# version -> {devkit split name (nuscenes.utils.splits): the project's split}
VERSIONS = {"v1.0-mini": {"mini_train": "train", "mini_val": "val"},
            "v1.0-trainval": {"train": "train", "val": "val"}}
INSTALL_HINT = "pip install --no-deps -r requirements-nuscenes.txt"
# nuScenes category -> the project's detection label. The project has one: "car", a four-wheeled vehicle (the
# embedded world's only kind, and what the detection prompt asks for). Two-wheelers, people, animals and objects
# are not detection targets. docs/data.md has the table.
DETECTION_LABELS = {
    "vehicle.car": "car", "vehicle.truck": "car", "vehicle.bus.bendy": "car", "vehicle.bus.rigid": "car",
    "vehicle.construction": "car", "vehicle.emergency.ambulance": "car", "vehicle.emergency.police": "car",
    "vehicle.trailer": "car",
}
# The boxes ST-P3's collision metric draws: every vehicle.* category, two-wheelers included.
COLLISION_CATEGORY_PREFIX = "vehicle."
# visibility tokens: "1" 0-40 %, "2" 40-60 %, "3" 60-80 %, "4" 80-100 % of the object visible in the 6 cameras
DEFAULT_MIN_VISIBILITY = 2


def devkit():
    """The `nuscenes` package; a one-line UsageError naming the install command when it is missing."""
    try:
        import nuscenes
        import nuscenes.nuscenes  # noqa: F401  (the class and its imports: cv2, sklearn, pyquaternion)
    except ImportError as exc:
        raise UsageError(f"the nuScenes devkit is not importable ({exc}); install it with `{INSTALL_HINT}`") from None
    return nuscenes


def check_version(version: str) -> str:
    if version not in VERSIONS:
        raise UsageError(f"--version {version!r}: expected one of {sorted(VERSIONS)}")
    return version


def open_dataset(dataroot: str | Path, version: str):
    """The devkit's `NuScenes(version, dataroot)`; a UsageError names a missing table directory."""
    check_version(version)
    tables = Path(dataroot) / version
    if not (tables / "scene.json").is_file():
        raise UsageError(f"--nuscenes {dataroot}: no {version} tables (expected {tables}/scene.json)")
    nuscenes = devkit()
    try:
        return nuscenes.NuScenes(version=version, dataroot=str(dataroot), verbose=False)
    except (AssertionError, KeyError, ValueError, OSError) as exc:  # the devkit asserts on missing files
        raise UsageError(f"--nuscenes {dataroot}: the devkit cannot load {version}: {exc or type(exc).__name__}") from None


def scene_splits(version: str) -> dict[str, str]:
    """scene name -> 'train' | 'val': the official splits of `version` (nuscenes.utils.splits)."""
    devkit()
    from nuscenes.utils.splits import create_splits_scenes

    splits = create_splits_scenes()
    return {name: ours for theirs, ours in VERSIONS[check_version(version)].items() for name in splits[theirs]}


@dataclass(frozen=True)
class Keyframe:
    """A scene's keyframe as CAM_FRONT saw it: ego pose (rear axle, global x, y m and heading rad) at the image's
    timestamp (s), the image file and its size."""

    index: int
    sample_token: str
    camera_token: str
    t: float
    xy: tuple[float, float]
    yaw: float
    image: Path
    size: tuple[int, int]


def _pose(nusc, sample_data: dict) -> tuple[tuple[float, float], float, float]:
    pose = nusc.get("ego_pose", sample_data["ego_pose_token"])
    return (float(pose["translation"][0]), float(pose["translation"][1])), yaw_of(pose["rotation"]), \
        sample_data["timestamp"] * 1e-6


def scene_keyframes(nusc, scene: dict) -> list[Keyframe]:
    """The keyframes of a scene in time order that have a CAM_FRONT image."""
    out, token = [], scene["first_sample_token"]
    while token:
        sample = nusc.get("sample", token)
        cam = sample["data"].get(CAMERA)
        if cam is not None:
            sd = nusc.get("sample_data", cam)
            xy, yaw, t = _pose(nusc, sd)
            out.append(Keyframe(len(out), token, cam, t, xy, yaw, Path(nusc.dataroot) / sd["filename"],
                                (int(sd["width"]), int(sd["height"]))))
        token = sample["next"]
    return out


def ego_motion(nusc, camera_token: str) -> EgoState:
    """Ego velocity, acceleration (ego frame, m/s, m/s^2) and yaw rate at a camera frame, from the ego poses of
    the neighbouring frames of the same camera (central differences; one-sided at a scene's ends, acceleration 0
    there)."""
    sd = nusc.get("sample_data", camera_token)
    xy, yaw, t = _pose(nusc, sd)
    prev = _pose(nusc, nusc.get("sample_data", sd["prev"])) if sd["prev"] else None
    nxt = _pose(nusc, nusc.get("sample_data", sd["next"])) if sd["next"] else None
    if prev is None and nxt is None:
        return EgoState(vx=0.0)
    a, b = prev or (xy, yaw, t), nxt or (xy, yaw, t)
    dt = b[2] - a[2]
    vel = (np.subtract(b[0], a[0]) / dt) if dt > 0 else np.zeros(2)
    acc = np.zeros(2)
    if prev is not None and nxt is not None and t > a[2] and b[2] > t:
        v_in = np.subtract(xy, a[0]) / (t - a[2])
        v_out = np.subtract(b[0], xy) / (b[2] - t)
        acc = (v_out - v_in) / (dt / 2.0)
    c, s = math.cos(yaw), math.sin(yaw)
    rot = np.array([[c, s], [-s, c]])  # global -> ego
    v, ac = rot @ vel, rot @ acc
    yaw_rate = ((b[1] - a[1] + math.pi) % (2 * math.pi) - math.pi) / dt if dt > 0 else 0.0
    return EgoState(vx=float(v[0]), vy=float(v[1]), ax=float(ac[0]), ay=float(ac[1]), yaw_rate=float(yaw_rate))


@dataclass(frozen=True)
class CameraObject:
    """An annotated box seen by the camera: the project's label, the nuScenes category, the 2D box (x1, y1, x2,
    y2) in the image's pixels, the annotation token."""

    label: str
    category: str
    box_px: tuple[float, float, float, float]
    token: str


def _visibility(annotation: dict) -> int:
    token = annotation.get("visibility_token") or "0"
    return int(token) if token.isdigit() else 0


def camera_objects(nusc, camera_token: str, min_visibility: int = DEFAULT_MIN_VISIBILITY) -> list[CameraObject]:
    """The annotated boxes of a keyframe in the camera image, left to right: the devkit's `get_sample_data`
    (boxes in the camera frame, `BoxVisibility.ANY`: every corner in front, one inside the image), annotations
    with visibility >= `min_visibility` whose category has a DETECTION_LABELS label; each box's corners
    projected with `view_points`, their hull clipped to the image."""
    devkit()
    from nuscenes.utils.geometry_utils import BoxVisibility, view_points

    sd = nusc.get("sample_data", camera_token)
    _, boxes, intrinsic = nusc.get_sample_data(camera_token, box_vis_level=BoxVisibility.ANY)
    out = []
    for box in boxes:
        label = DETECTION_LABELS.get(box.name)
        if label is None or _visibility(nusc.get("sample_annotation", box.token)) < min_visibility:
            continue
        corners = view_points(box.corners(), np.asarray(intrinsic), normalize=True)[:2].T
        px = image_box(corners, int(sd["width"]), int(sd["height"]))
        if px is not None:
            out.append(CameraObject(label, box.name, px, box.token))
    return sorted(out, key=lambda o: (o.box_px[0], o.box_px[1]))


@dataclass(frozen=True)
class PlaneObject:
    """An annotated box on the ground plane of an ego frame: category, centre (m), heading (rad), length and
    width (m)."""

    category: str
    x: float
    y: float
    yaw: float
    length: float
    width: float


@dataclass(frozen=True)
class SampleBoxes:
    """The annotated boxes of a sample on the global ground plane: categories and (N, 5) [x, y, yaw, length,
    width] (m, rad)."""

    categories: tuple[str, ...]
    boxes: np.ndarray


def sample_boxes(nusc, sample_token: str) -> SampleBoxes:
    """The annotated boxes of a sample (its sample_annotation rows) on the global ground plane."""
    cats, rows = [], []
    for token in nusc.get("sample", sample_token)["anns"]:
        ann = nusc.get("sample_annotation", token)
        cats.append(ann["category_name"])
        rows.append([ann["translation"][0], ann["translation"][1], yaw_of(ann["rotation"]), ann["size"][1],
                     ann["size"][0]])
    return SampleBoxes(tuple(cats), np.array(rows, dtype=np.float64).reshape(-1, 5))


def plane_objects(boxes: SampleBoxes, origin: tuple[float, float], yaw: float) -> list[PlaneObject]:
    """A sample's boxes in the ego frame at `origin` (global x, y m) heading `yaw` (rad)."""
    xy = to_frame(boxes.boxes[:, :2], origin, yaw)
    heading = (boxes.boxes[:, 2] - yaw + math.pi) % (2 * math.pi) - math.pi
    return [PlaneObject(c, float(p[0]), float(p[1]), float(h), float(b[3]), float(b[4]))
            for c, p, h, b in zip(boxes.categories, xy, heading, boxes.boxes)]
