"""Agent settings and sensor suite from YAML (config/carla_agent.yaml), validated at load.

Sensors use the leaderboard's dict form: {type, id, x, y, z, roll, pitch, yaw, [width, height, fov]}
in the vehicle's CARLA frame (metres, degrees). Errors name the file, the field and what was expected.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from wam_diff_core.constants import SHIPPED_MODEL
from wam_diff_core.control import ControllerConfig
from wam_diff_core.decoding.config import DecoderConfig, resolve_decoding
from wam_diff_core.errors import WamDiffError
from wam_diff_core.model.precision import DTYPE_CHOICES
from wam_diff_core.plain_yaml import yaml_problem

from .gnss_filter import GnssFilterConfig
from .route_planner import RoutePlannerConfig

POSE_KEYS = ("x", "y", "z", "roll", "pitch", "yaw")
SENSOR_KEYS = {
    "sensor.camera.rgb": POSE_KEYS + ("width", "height", "fov"),
    "sensor.other.imu": POSE_KEYS,
    "sensor.other.gnss": POSE_KEYS,
    "sensor.speedometer": (),
    "sensor.lidar.ray_cast": POSE_KEYS,
    "sensor.other.radar": POSE_KEYS,
}
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "carla_agent.yaml"
MAX_CANDIDATES = 16


class AgentConfigError(WamDiffError, ValueError):
    """Bad agent configuration; the message names the file and field."""


def validate_sensors(sensors: Any, source: str = "sensors") -> list[dict]:
    """Check a leaderboard sensor list: known types, unique ids, required numeric fields."""
    if not isinstance(sensors, list) or not sensors:
        raise AgentConfigError(f"{source}: 'sensors' must be a non-empty list, got {sensors!r}")
    out, ids = [], set()
    for i, s in enumerate(sensors):
        if not isinstance(s, dict):
            raise AgentConfigError(f"{source}: sensors[{i}] must be a mapping, got {s!r}")
        typ, sid = s.get("type"), s.get("id")
        if typ not in SENSOR_KEYS:
            raise AgentConfigError(f"{source}: sensors[{i}].type {typ!r} not one of {sorted(SENSOR_KEYS)}")
        if not isinstance(sid, str) or not sid:
            raise AgentConfigError(f"{source}: sensors[{i}] needs a non-empty string 'id', got {sid!r}")
        if sid in ids:
            raise AgentConfigError(f"{source}: duplicate sensor id {sid!r}")
        ids.add(sid)
        for key in SENSOR_KEYS[typ]:
            if not isinstance(s.get(key), (int, float)) or isinstance(s.get(key), bool):
                raise AgentConfigError(f"{source}: sensor {sid!r} ({typ}) needs numeric {key!r}, got {s.get(key)!r}")
        if typ == "sensor.camera.rgb" and (s["width"] <= 0 or s["height"] <= 0 or not 0 < s["fov"] < 180):
            raise AgentConfigError(f"{source}: camera {sid!r} needs width, height > 0 and 0 < fov < 180, got "
                                   f"{s['width']}x{s['height']} fov {s['fov']}")
        out.append(dict(s))
    return out


def _check_decoding(values: Any, source: str) -> dict:
    """The 'decoding' mapping: DecoderConfig fields with valid values (null: unset, the checkpoint's own)."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise AgentConfigError(f"{source}: 'decoding' must be a mapping of DecoderConfig fields, got {values!r}")
    try:
        resolve_decoding(DecoderConfig(), **values)
    except (TypeError, ValueError) as exc:
        raise AgentConfigError(f"{source}: decoding: {exc}") from None
    return dict(values)


def _dataclass_from(cls, values: Any, source: str, name: str):
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise AgentConfigError(f"{source}: {name!r} must be a mapping, got {values!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise AgentConfigError(f"{source}: unknown {name} keys {unknown}; expected some of {sorted(known)}")
    return cls(**values)


@dataclass
class AgentConfig:
    model: str = SHIPPED_MODEL                        # the shipped model's name, a preset or a checkpoint directory
    device: str = "cpu"
    dtype: Optional[str] = None                       # float32 | bfloat16 | float16 | auto; None: the checkpoint's own on a GPU
    decoding: dict = field(default_factory=dict)     # DecoderConfig fields on the checkpoint's own (resolve_decoding)
    candidates: int = 1                               # trajectories per plan from one prefill (1: the greedy plan)
    scorer: Optional[str] = None                      # perception | likelihood picks the one driven; None: candidate 0
    candidate_sampling: str = "tokens"                # tokens | order: how candidates 1..N-1 are drawn
    candidate_braking: bool = True                    # perception: brake along the greedy path when all collide
    sim_hz: float = 20.0
    plan_hz: float = 2.0
    late_plan_s: Optional[float] = None               # wall seconds; slower plans are dropped (brake)
    image_size: Optional[tuple[int, int]] = None      # (width, height) given to the policy; None: as sensed
    cameras: tuple[str, ...] = ("rgb_front",)
    speedometer: str = "speed"
    imu: str = "imu"
    gnss: str = "gnss"
    steer_scale: float = 1.0                          # extra gain on CARLA steer (1.0: geometric)
    max_steer_deg: Optional[float] = None             # ego full lock; None: from the hero's physics
    comfort_hz: float = 10.0                          # ego signals logged for the comfort metric
    sensors: list = field(default_factory=list)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    route: RoutePlannerConfig = field(default_factory=RoutePlannerConfig)
    gnss_filter: GnssFilterConfig = field(default_factory=GnssFilterConfig)
    source: str = "<dict>"

    @property
    def plan_every_ticks(self) -> int:
        return max(1, int(round(self.sim_hz / self.plan_hz)))

    @property
    def dt(self) -> float:
        return 1.0 / self.sim_hz

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> "AgentConfig":
        if not isinstance(data, dict):
            raise AgentConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AgentConfigError(f"{source}: unknown keys {unknown}; expected some of {sorted(known)}")
        d = dict(data)
        d["controller"] = _dataclass_from(ControllerConfig, d.get("controller"), source, "controller")
        d["route"] = _dataclass_from(RoutePlannerConfig, d.get("route"), source, "route")
        d["gnss_filter"] = _dataclass_from(GnssFilterConfig, d.get("gnss_filter"), source, "gnss_filter")
        d["sensors"] = validate_sensors(d.get("sensors"), source)
        d["cameras"] = tuple(d.get("cameras", cls.cameras))
        if d.get("image_size") is not None:
            size = d["image_size"]
            if not (isinstance(size, (list, tuple)) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
                raise AgentConfigError(f"{source}: image_size must be [width, height] positive integers, got {size!r}")
            d["image_size"] = (int(size[0]), int(size[1]))
        d["decoding"] = _check_decoding(d.get("decoding"), source)
        if d.get("dtype") is not None and d["dtype"] not in DTYPE_CHOICES:
            raise AgentConfigError(f"{source}: dtype {d['dtype']!r}: expected one of {', '.join(DTYPE_CHOICES)} or "
                                   f"null (the checkpoint's own on a GPU, float32 on a CPU)")
        cfg = cls(**d, source=source)
        cfg._check()
        cfg._check_candidates()
        return cfg

    def _check_candidates(self) -> None:
        """candidates 1..MAX_CANDIDATES, a scorer CARLA can run (not the embedded world's oracle), a sampling method,
        and decoding that can draw them (the eager path)."""
        from wam_diff_core.decoding.candidates import check_sampling
        from wam_diff_core.policy import check_candidate_settings
        from wam_diff_core.scoring.planner import check_scorer_setting

        src, n = self.source, self.candidates
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CANDIDATES:
            raise AgentConfigError(f"{src}: candidates must be an integer in [1, {MAX_CANDIDATES}], got {n!r}")
        if not isinstance(self.candidate_braking, bool):
            raise AgentConfigError(f"{src}: candidate_braking must be true or false, got {self.candidate_braking!r}")
        try:
            self.scorer = check_scorer_setting(self.scorer, has_world=False, where="a CARLA agent")
            self.candidate_sampling = check_sampling(self.candidate_sampling).method
            check_candidate_settings(n, resolve_decoding(DecoderConfig(), **self.decoding))
        except (TypeError, ValueError) as exc:
            raise AgentConfigError(f"{src}: {exc}") from None

    def _check(self) -> None:
        src = self.source
        for name in ("sim_hz", "plan_hz", "comfort_hz", "steer_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise AgentConfigError(f"{src}: {name} must be a positive number, got {v!r}")
        for problem in self.gnss_filter.problems():
            raise AgentConfigError(f"{src}: gnss_filter: {problem}")
        if self.plan_hz > self.sim_hz:
            raise AgentConfigError(f"{src}: plan_hz {self.plan_hz} exceeds sim_hz {self.sim_hz}")
        if self.max_steer_deg is not None and (not isinstance(self.max_steer_deg, (int, float)) or not 0 < self.max_steer_deg < 90):
            raise AgentConfigError(f"{src}: max_steer_deg must be null or in (0, 90) degrees, got {self.max_steer_deg!r}")
        if self.late_plan_s is not None and (not isinstance(self.late_plan_s, (int, float)) or self.late_plan_s <= 0):
            raise AgentConfigError(f"{src}: late_plan_s must be null or a positive number of seconds, got {self.late_plan_s!r}")
        by_id = {s["id"]: s["type"] for s in self.sensors}
        if not self.cameras:
            raise AgentConfigError(f"{src}: 'cameras' must name at least one camera sensor id")
        for cam in self.cameras:
            if by_id.get(cam) != "sensor.camera.rgb":
                raise AgentConfigError(f"{src}: cameras entry {cam!r} is not a sensor.camera.rgb id; sensors: {by_id}")
        for role, typ in (("speedometer", "sensor.speedometer"), ("imu", "sensor.other.imu"), ("gnss", "sensor.other.gnss")):
            sid = getattr(self, role)
            if by_id.get(sid) != typ:
                raise AgentConfigError(f"{src}: {role} {sid!r} must be the id of a {typ} sensor; sensors: {by_id}")

    @classmethod
    def load(cls, path: str | Path) -> "AgentConfig":
        path = Path(path)
        if not path.is_file():
            raise AgentConfigError(f"agent config {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise AgentConfigError(f"agent config {path}: {yaml_problem(exc)}") from None
        return cls.from_dict(data or {}, str(path))
