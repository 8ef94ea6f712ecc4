"""A small dataset in the nuScenes schema written from embedded-world drives whose ground truth is known: the tables
of v1.0-mini (scene, sample, sample_data, ego_pose, calibrated_sensor, sensor, log, map, category, attribute,
visibility, instance, sample_annotation), a CAM_FRONT JPEG per camera frame and a map mask, loadable by the
official `NuScenes(version, dataroot)`; and that ground truth, computed from the world without the devkit, to hold
the converter's samples against (`agreement`).

The expert drives each scene's route at the world's 10 Hz: every tick is a CAM_FRONT frame, every 5th a keyframe
(2 Hz; a scene may drop some to make an irregular interval). The ego pose is the rear axle, EGO_CENTRE_AHEAD_M
behind the world car's centre, as nuScenes' ego frame is. The world's other vehicles within ANNOTATION_RANGE_M are
annotated as 3D boxes standing on the ground; the world has cars only, so categories and visibility levels are
assigned by vehicle id (`category_of`, `visibility_of`) to exercise the class mapping and the visibility filter.
The camera is a pinhole at CAMERA_XYZ looking forward; the images show the boxes' projections.

    python -m wam_diff_core.nuscenes.fixture DATAROOT            # write it, print the tables' row counts
    python -m wam_diff_core.nuscenes.fixture DATAROOT --check DIR  # agreement of `wam-diff data --nuscenes` in DIR
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..constants import NUM_WAYPOINTS
from .geometry import EGO_CENTRE_AHEAD_M, to_frame, yaw_quaternion
from .labels import navigation_command

VERSION = "v1.0-mini"
IMAGE_SIZE = (400, 225)  # nuScenes' 1600 x 900 CAM_FRONT at a quarter
INTRINSIC = ((316.6, 0.0, 204.1), (0.0, 316.6, 122.9), (0.0, 0.0, 1.0))
CAMERA_XYZ = (1.70, 0.0, 1.51)  # in the ego frame (rear axle), metres
# camera axes (x right, y down, z forward) as columns in the ego frame (x forward, y left, z up)
CAMERA_AXES = ((0.0, 0.0, 1.0), (-1.0, 0.0, 0.0), (0.0, -1.0, 0.0))
ANNOTATION_RANGE_M = 60.0
KEYFRAME_EVERY = 5  # world ticks (10 Hz) per keyframe
HEIGHT_M = {"vehicle.car": 1.6, "vehicle.truck": 3.0, "vehicle.bicycle": 1.2}
TIME_BASE_US = 1_533_151_603_000_000
TABLES = ("scene", "sample", "sample_data", "ego_pose", "calibrated_sensor", "sensor", "log", "map", "category",
          "attribute", "visibility", "instance", "sample_annotation")


@dataclass(frozen=True)
class FixtureScene:
    """A scene of the fixture: its nuScenes name (which decides its split), the suite route the expert drives, the
    seconds driven at most, and keyframes left out (counted from 0) to make irregular intervals."""

    name: str
    route_id: str
    seconds: float
    drop_keyframes: tuple[int, ...] = ()


SCENES = (FixtureScene("scene-0061", "roundabout_01", 17.0),          # mini_train
          FixtureScene("scene-0553", "highway_01", 12.0, (10,)),      # mini_train, one 1 s gap
          FixtureScene("scene-0103", "roundabout_00", 14.0))          # mini_val


def category_of(vid: int) -> str:
    return "vehicle.truck" if vid % 7 == 3 else "vehicle.bicycle" if vid % 7 == 5 else "vehicle.car"


def visibility_of(vid: int) -> str:
    return str(1 + vid % 4)


def token(*parts) -> str:
    return hashlib.md5(":".join(map(str, parts)).encode()).hexdigest()


# ---------------------------------------------------------------- the world's drive, as ground truth
def drive(scene: FixtureScene) -> list[dict]:
    """The expert's drive of the scene's route, one dict per world tick: t (s), pose [x, y, yaw] of the rear axle,
    the world's ego velocity and acceleration, and the annotated objects (global centre, yaw, size, category,
    visibility)."""
    from ..sim.highway import HighwayWorld, ego_to_world, route_over
    from ..sim.routes import load_routes

    route = load_routes(ids=[scene.route_id])[0]
    world = HighwayWorld(route, driver="expert", render=False)
    ticks = [world.reset()]
    while not route_over(route, ticks[-1]) and ticks[-1].t < scene.seconds - 1e-9:
        ticks.append(world.step(frame=False))
    world.close()
    out = []
    for tk in ticks:
        x, y, yaw = tk.pose
        objects = []
        for v in tk.vehicles:
            if math.hypot(*v.xy) > ANNOTATION_RANGE_M:
                continue
            gx, gy = ego_to_world(np.array(v.xy), np.array([x, y]), yaw)
            category = category_of(v.vid)
            objects.append({"vid": v.vid, "category": category, "visibility": visibility_of(v.vid),
                            "xy": [float(gx), float(gy)], "yaw": float(v.heading + yaw), "length": v.length,
                            "width": v.width, "height": HEIGHT_M[category], "speed": math.hypot(*v.velocity)})
        rear = [x - EGO_CENTRE_AHEAD_M * math.cos(yaw), y - EGO_CENTRE_AHEAD_M * math.sin(yaw), yaw]
        out.append({"t": tk.t, "pose": rear, "ego": [tk.ego.vx, tk.ego.vy, tk.ego.ax, tk.ego.ay], "objects": objects})
    return out


def keyframe_ticks(scene: FixtureScene, n_ticks: int) -> list[int]:
    """World tick indices that are keyframes (the last tick a keyframe is on ends the scene)."""
    ks = range(0, n_ticks, KEYFRAME_EVERY)
    return [k for i, k in enumerate(ks) if i not in scene.drop_keyframes]


# ---------------------------------------------------------------- the pinhole camera, without the devkit
def box_corners_3d(obj: dict) -> np.ndarray:
    """The 8 corners (8, 3) of an object's box in the global frame, standing on z = 0."""
    c, s = math.cos(obj["yaw"]), math.sin(obj["yaw"])
    out = []
    for dx, dy, z in itertools.product((1, -1), (1, -1), (0.0, obj["height"])):
        lx, ly = dx * obj["length"] / 2, dy * obj["width"] / 2
        out.append([obj["xy"][0] + c * lx - s * ly, obj["xy"][1] + s * lx + c * ly, z])
    return np.array(out)


def to_camera(points: np.ndarray, pose) -> np.ndarray:
    """Global points (N, 3) in the camera frame (x right, y down, z forward) of the ego at pose [x, y, yaw]."""
    ego = np.column_stack([to_frame(points[:, :2], pose[:2], pose[2]), points[:, 2]])
    return (ego - np.array(CAMERA_XYZ)) @ np.array(CAMERA_AXES)


def project(cam: np.ndarray) -> np.ndarray:
    """Camera-frame points (N, 3) -> pixels (N, 2)."""
    k = np.array(INTRINSIC)
    return np.column_stack([k[0, 0] * cam[:, 0] / cam[:, 2] + k[0, 2], k[1, 1] * cam[:, 1] / cam[:, 2] + k[1, 2]])


def _inside_triangle(p, a, b, c) -> bool:
    d = [(q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0]) for q, r in ((a, b), (b, c), (c, a))]
    return all(v >= 0 for v in d) or all(v <= 0 for v in d)


def clipped_box(px: np.ndarray, width: int, height: int) -> Optional[tuple[float, float, float, float]]:
    """The box of (hull of px) intersected with the image, from every point the intersection's corners can be:
    points inside the image, image corners inside the hull (some triangle of points holds them), and crossings of
    every segment between two points with the image's edges."""
    cands = [tuple(p) for p in px if 0 <= p[0] <= width and 0 <= p[1] <= height]
    for corner in itertools.product((0.0, float(width)), (0.0, float(height))):
        if any(_inside_triangle(corner, *tri) for tri in itertools.combinations(px, 3)):
            cands.append(corner)
    for a, b in itertools.combinations(px, 2):
        for axis, bound, other in ((0, 0.0, height), (0, width, height), (1, 0.0, width), (1, height, width)):
            if (a[axis] - bound) * (b[axis] - bound) < 0:
                t = (bound - a[axis]) / (b[axis] - a[axis])
                q = a + t * (b - a)
                if 0 <= q[1 - axis] <= other:
                    cands.append(tuple(q))
    if len(cands) < 3:
        return None
    c = np.array(cands)
    return float(c[:, 0].min()), float(c[:, 1].min()), float(c[:, 0].max()), float(c[:, 1].max())


def expected_boxes(keyframe: dict, min_visibility: int = 2) -> list[tuple[float, float, float, float]]:
    """The detection boxes (pixels) a keyframe should give, left to right: cars and trucks with visibility >=
    min_visibility whose every corner is > 0.1 m in front of the camera and one corner > 1 m in front inside the
    image."""
    out = []
    for obj in keyframe["objects"]:
        if obj["category"] == "vehicle.bicycle" or int(obj["visibility"]) < min_visibility:
            continue
        cam = to_camera(box_corners_3d(obj), keyframe["pose"])
        if np.any(cam[:, 2] <= 0.1):
            continue
        px = project(cam)
        inside = (px[:, 0] > 0) & (px[:, 0] < IMAGE_SIZE[0]) & (px[:, 1] > 0) & (px[:, 1] < IMAGE_SIZE[1])
        if not np.any(inside & (cam[:, 2] > 1)):
            continue
        box = clipped_box(px, *IMAGE_SIZE)
        if box is not None:
            out.append(box)
    return sorted(out)


def expected_trajectory(keyframes: list[dict], i: int) -> Optional[np.ndarray]:
    """The rear axle's next NUM_WAYPOINTS keyframe positions in keyframe i's ego frame; None when fewer follow or
    an interval is not 0.5 s."""
    nxt = keyframes[i:i + NUM_WAYPOINTS + 1]
    if len(nxt) <= NUM_WAYPOINTS or any(abs(b["t"] - a["t"] - 0.5) > 1e-6 for a, b in zip(nxt, nxt[1:])):
        return None
    pose = keyframes[i]["pose"]
    return to_frame(np.array([k["pose"][:2] for k in nxt[1:]]), pose[:2], pose[2])


# ---------------------------------------------------------------- the tables
# CAMERA_AXES as the nuScenes rotation quaternion [w, x, y, z] (ego from camera)
CAMERA_ROTATION = (0.5, -0.5, 0.5, -0.5)
CATEGORIES = ("vehicle.car", "vehicle.truck", "vehicle.bicycle", "human.pedestrian.adult")
ATTRIBUTES = ("vehicle.moving", "vehicle.stopped", "cycle.with_rider")
VISIBILITY = {"1": "v0-40", "2": "v40-60", "3": "v60-80", "4": "v80-100"}
COLOURS = {"vehicle.car": (200, 40, 40), "vehicle.truck": (40, 40, 200), "vehicle.bicycle": (230, 200, 30)}


class _Tables:
    """Rows of every table, by table name."""

    def __init__(self):
        self.rows: dict[str, list[dict]] = {t: [] for t in TABLES}

    def add(self, table: str, **row) -> str:
        self.rows[table].append(row)
        return row["token"]

    def write(self, root: Path) -> None:
        (root / VERSION).mkdir(parents=True, exist_ok=True)
        for table, rows in self.rows.items():
            (root / VERSION / f"{table}.json").write_text(json.dumps(rows, indent=0))


def _static_rows(tables: _Tables) -> None:
    for name in CATEGORIES:
        tables.add("category", token=token("category", name), name=name, description=f"{name} (fixture)")
    for name in ATTRIBUTES:
        tables.add("attribute", token=token("attribute", name), name=name, description=f"{name} (fixture)")
    for level, name in VISIBILITY.items():
        tables.add("visibility", token=level, level=name, description=f"visibility of the object: {name} %")
    tables.add("sensor", token=token("sensor", "CAM_FRONT"), channel="CAM_FRONT", modality="camera")


def _render(path: Path, tick: dict) -> None:
    """A camera frame: sky, ground, and every box in front of the camera as its projected hull (far ones first)."""
    from PIL import Image, ImageDraw

    from .geometry import convex_hull

    w, h = IMAGE_SIZE
    horizon = int(INTRINSIC[1][2])
    img = Image.new("RGB", IMAGE_SIZE, (150, 190, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, horizon, w, h], fill=(90, 90, 90))
    objects = []
    for obj in tick["objects"]:
        cam = to_camera(box_corners_3d(obj), tick["pose"])
        if np.all(cam[:, 2] > 0.1):
            objects.append((float(cam[:, 2].mean()), obj["category"], convex_hull(project(cam))))
    for _, category, hull in sorted(objects, key=lambda o: -o[0]):
        draw.polygon([tuple(p) for p in hull], fill=COLOURS[category], outline=(20, 20, 20))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, quality=85)


def _annotations(tables: _Tables, name: str, keyframes: list[tuple[str, dict]]) -> None:
    """sample_annotation rows of every keyframe (sample token, tick) and one instance row per vehicle."""
    chains: dict[int, list[tuple[str, str, dict]]] = {}
    for sample, tick in keyframes:
        for obj in tick["objects"]:
            chains.setdefault(obj["vid"], []).append((token("ann", name, sample, obj["vid"]), sample, obj))
    for vid, chain in chains.items():
        instance = token("instance", name, vid)
        for j, (ann, sample, obj) in enumerate(chain):
            attribute = "cycle.with_rider" if obj["category"] == "vehicle.bicycle" else \
                "vehicle.moving" if obj["speed"] > 0.5 else "vehicle.stopped"
            tables.add("sample_annotation", token=ann, sample_token=sample, instance_token=instance,
                       visibility_token=obj["visibility"], attribute_tokens=[token("attribute", attribute)],
                       translation=[*obj["xy"], obj["height"] / 2], size=[obj["width"], obj["length"], obj["height"]],
                       rotation=yaw_quaternion(obj["yaw"]), prev=chain[j - 1][0] if j else "",
                       next=chain[j + 1][0] if j + 1 < len(chain) else "", num_lidar_pts=20, num_radar_pts=0)
        tables.add("instance", token=instance, category_token=token("category", chain[0][2]["category"]),
                   nbr_annotations=len(chain), first_annotation_token=chain[0][0], last_annotation_token=chain[-1][0])


def _write_scene(tables: _Tables, root: Path, scene: FixtureScene, index: int) -> dict:
    """The rows and images of one scene; its ground truth (the keyframes' ticks)."""
    ticks = drive(scene)
    keys = keyframe_ticks(scene, len(ticks))
    ticks = ticks[:keys[-1] + 1]
    log = tables.add("log", token=token("log", scene.name), logfile=f"fixture-{scene.route_id}", vehicle="n015",
                     date_captured="2018-08-01", location="singapore-onenorth")
    calib = tables.add("calibrated_sensor", token=token("calibrated_sensor", scene.name),
                       sensor_token=token("sensor", "CAM_FRONT"), translation=list(CAMERA_XYZ),
                       rotation=list(CAMERA_ROTATION), camera_intrinsic=[list(r) for r in INTRINSIC])
    samples = {k: token("sample", scene.name, k) for k in keys}
    sds = [token("sample_data", scene.name, n) for n in range(len(ticks))]
    stamp = [TIME_BASE_US + index * 10 ** 8 + round(tk["t"] * 1e6) for tk in ticks]
    for n, tk in enumerate(ticks):
        key = n in samples
        ego = tables.add("ego_pose", token=token("ego_pose", scene.name, n), timestamp=stamp[n],
                         translation=[tk["pose"][0], tk["pose"][1], 0.0], rotation=yaw_quaternion(tk["pose"][2]))
        filename = f"{'samples' if key else 'sweeps'}/CAM_FRONT/{scene.name}__CAM_FRONT__{stamp[n]}.jpg"
        tables.add("sample_data", token=sds[n], sample_token=samples[next(k for k in keys if k >= n)],
                   ego_pose_token=ego, calibrated_sensor_token=calib, timestamp=stamp[n], fileformat="jpg",
                   is_key_frame=key, height=IMAGE_SIZE[1], width=IMAGE_SIZE[0], filename=filename,
                   prev=sds[n - 1] if n else "", next=sds[n + 1] if n + 1 < len(ticks) else "")
        _render(root / filename, tk)
    scene_token = token("scene", scene.name)
    for j, k in enumerate(keys):
        tables.add("sample", token=samples[k], timestamp=stamp[k], scene_token=scene_token,
                   prev=samples[keys[j - 1]] if j else "", next=samples[keys[j + 1]] if j + 1 < len(keys) else "")
    _annotations(tables, scene.name, [(samples[k], ticks[k]) for k in keys])
    tables.add("scene", token=scene_token, log_token=log, nbr_samples=len(keys), first_sample_token=samples[keys[0]],
               last_sample_token=samples[keys[-1]], name=scene.name, description=f"fixture: {scene.route_id}")
    return {"name": scene.name, "route_id": scene.route_id,
            "keyframes": [{"index": j, "tick": k, **ticks[k]} for j, k in enumerate(keys)]}


def write_fixture(dataroot: str | Path, scenes=SCENES) -> dict:
    """The fixture in DATAROOT (tables under DATAROOT/v1.0-mini, images, a map mask) and its ground truth, also
    written to DATAROOT/fixture_truth.json."""
    from PIL import Image

    root = Path(dataroot)
    tables = _Tables()
    _static_rows(tables)
    truth = {"version": VERSION, "image_size": list(IMAGE_SIZE),
             "scenes": [_write_scene(tables, root, s, i) for i, s in enumerate(scenes)]}
    map_token = token("map", "singapore-onenorth")
    (root / "maps").mkdir(parents=True, exist_ok=True)
    Image.new("L", (16, 16), 255).save(root / "maps" / f"{map_token}.png")
    tables.add("map", token=map_token, log_tokens=[r["token"] for r in tables.rows["log"]], category="semantic_prior",
               filename=f"maps/{map_token}.png")
    tables.write(root)
    (root / "fixture_truth.json").write_text(json.dumps(truth))
    return truth


def table_counts(dataroot: str | Path) -> dict[str, int]:
    """Rows of each table of a dataset in the nuScenes schema."""
    return {t: len(json.loads((Path(dataroot) / VERSION / f"{t}.json").read_text())) for t in TABLES}


# ---------------------------------------------------------------- the converter against the ground truth
def _samples(out_dir: Path) -> dict[str, dict]:
    out = {}
    for split in ("train", "val"):
        for s in json.loads((Path(out_dir) / f"{split}.json").read_text()):
            out[s["id"]] = s
    return out


def _box_error(got: list, want: list) -> Optional[float]:
    """Largest coordinate difference (px) of two box lists, both left to right; None when their counts differ."""
    if len(got) != len(want):
        return None
    return max((abs(a - b) for g, w in zip(sorted(got), sorted(want)) for a, b in zip(g, w)), default=0.0)


def agreement(truth: dict, out_dir: str | Path, min_visibility: int = 2) -> dict:
    """How `wam-diff data --nuscenes` output in out_dir (images kept at their size) agrees with the ground truth:
    planning samples present where a regular 4 s future exists and nowhere else, the largest trajectory error (m,
    of the written two-decimal labels), detection boxes per keyframe (counts and largest coordinate error, px),
    equal commands, and the largest ego speed difference to the world's (m/s, the world's speed is the car's centre's,
    the converter's the rear axle's from poses)."""
    from ..codec import parse_trajectory

    samples = _samples(out_dir)
    res = {"planning_expected": 0, "planning_found": 0, "unexpected_planning": 0, "max_trajectory_error_m": 0.0,
           "commands_equal": 0, "detection_frames": 0, "boxes_expected": 0, "box_count_mismatches": 0,
           "max_box_error_px": 0.0, "max_speed_difference_mps": 0.0}
    for scene in truth["scenes"]:
        for kf in scene["keyframes"]:
            base = f"{scene['name']}_{kf['index']:03d}"
            want = expected_trajectory(scene["keyframes"], kf["index"])
            plan = samples.get(f"{base}_plan")
            if want is None:
                res["unexpected_planning"] += plan is not None
            else:
                res["planning_expected"] += 1
                if plan is not None:
                    got = parse_trajectory(plan["conversations"][1]["value"])
                    res["planning_found"] += 1
                    err = float(np.linalg.norm(got - want, axis=1).max())
                    res["max_trajectory_error_m"] = max(res["max_trajectory_error_m"], err)
                    res["commands_equal"] += plan["meta"]["command"] == navigation_command(want)
                    speed = math.hypot(*plan["meta"]["ego"][:2]) - math.hypot(*kf["ego"][:2])
                    res["max_speed_difference_mps"] = max(res["max_speed_difference_mps"], abs(speed))
            det = samples.get(f"{base}_det")
            if det is not None:
                boxes = expected_boxes(kf, min_visibility)
                res["detection_frames"] += 1
                res["boxes_expected"] += len(boxes)
                err = _box_error(det["meta"]["boxes_px"], boxes)
                res["box_count_mismatches"] += err is None
                res["max_box_error_px"] = max(res["max_box_error_px"], err or 0.0)
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wam_diff_core.nuscenes.fixture", description=__doc__.splitlines()[0])
    parser.add_argument("dataroot")
    parser.add_argument("--check", metavar="DIR", help="a `wam-diff data --nuscenes DATAROOT` output to hold against "
                                                       "the fixture's ground truth (DATAROOT/fixture_truth.json)")
    args = parser.parse_args(argv)
    if args.check:
        truth = json.loads((Path(args.dataroot) / "fixture_truth.json").read_text())
        print(json.dumps(agreement(truth, args.check), indent=2))
        return 0
    write_fixture(args.dataroot)
    print(json.dumps(table_counts(args.dataroot), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
