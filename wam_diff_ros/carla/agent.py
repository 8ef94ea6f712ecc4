"""Bench2Drive (leaderboard 2.0) agent driving with DrivingPolicy and the shared controller.

The leaderboard imports this file by path (`--agent .../wam_diff_ros/carla/agent.py`), so every
import here is absolute. Per tick (20 Hz): sensors -> ego pose (GNSS fixes smoothed by
gnss_filter.PositionFilter, which dead-reckons from speed, compass and IMU yaw rate; heading from
the compass) and ego state (speedometer + IMU) -> route planner -> navigation command and route
target point (the route ROUTE_TARGET_AHEAD_M ahead, in the ego frame); every `plan_every_ticks` ticks the policy plans from
the front camera (BGRA -> RGB here), with `candidates` > 1 as N trajectories of which `scorer` picks one
(wam_diff_core.scoring.planner); between plans the last plan is shifted in time and
re-expressed in the current ego frame; the controller turns it into throttle/steer/brake.
An invalid plan (bad model text, bad input) or a late one (wall time over `late_plan_s`) is dropped:
the controller brakes until the next valid plan. Each case is counted in `stats` and written with
the comfort signals to `<SAVE_PATH>/<save_name>/wam_diff_agent.json` on destroy().

Frames: CARLA is left-handed; conversion happens only through wam_diff_ros.carla.frames.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Optional

import numpy as np

from wam_diff_core.control import Controller
from wam_diff_core.scoring.planner import CandidatePlanner
from wam_diff_core.types import EgoState, Plan
from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG, AgentConfig
from wam_diff_ros.carla.frames import (GeoProjection, carla_steer, carla_to_rh, compass_to_heading,
                                       ego_state_from_imu, vehicle_max_steer_rad, world_to_ego)
from wam_diff_ros.carla.gnss_filter import PositionFilter
from wam_diff_ros.carla.plan_tracking import HeldPlan, valid_trajectory
from wam_diff_ros.carla.route_planner import RoutePlanner

try:  # inside the leaderboard evaluator
    from leaderboard.autoagents.autonomous_agent import AutonomousAgent, Track
except ImportError:  # standalone (tests, tools): same constructor and plan bookkeeping, no hero lookup
    from enum import Enum

    class Track(Enum):
        SENSORS = "SENSORS"
        MAP = "MAP"

    class AutonomousAgent:
        def __init__(self, carla_host, carla_port, debug=False):
            self.track = Track.SENSORS
            self._global_plan = None
            self._global_plan_world_coord = None
            self.hero_actor = None

        def set_global_plan(self, global_plan_gps, global_plan_world_coord):
            self._global_plan = list(global_plan_gps)
            self._global_plan_world_coord = list(global_plan_world_coord)

        @staticmethod
        def get_ros_version():  # the evaluator asks every agent class; -1: not a ROS agent
            return -1


def get_entry_point() -> str:
    return "WamDiffAgent"


def bgra_to_rgb(image: np.ndarray) -> np.ndarray:
    """CARLA camera frame (H, W, 4) uint8 BGRA -> contiguous (H, W, 3) uint8 RGB."""
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 4 or img.dtype != np.uint8:
        raise ValueError(f"camera frame must be (H, W, 4) uint8 BGRA, got shape {img.shape} dtype {img.dtype}")
    return np.ascontiguousarray(img[:, :, 2::-1])


def _xy(point) -> tuple[float, float]:
    """(x, y) of a carla.Transform / Location, or of a sequence."""
    point = getattr(point, "location", point)
    if hasattr(point, "x"):
        return float(point.x), float(point.y)
    return float(point[0]), float(point[1])


class WamDiffAgent(AutonomousAgent):
    """Leaderboard agent API: setup(conf), sensors(), run_step(input_data, timestamp), destroy()."""

    def setup(self, path_to_conf_file: str, policy=None):
        """path_to_conf_file: agent YAML; Bench2Drive appends '+<save_name>' for every route to the same
        string, so the YAML is what precedes the first '+' and the save name what follows the last.
        `policy`: an object with DrivingPolicy's plan(images, ego, command, target=(x, y)) -> Plan (tests pass
        a fake); by default the model named in the YAML is loaded. It plans through a CandidatePlanner with the
        YAML's candidates, scorer and candidate_sampling (candidates 1: the policy's own plan)."""
        parts = (path_to_conf_file or "").split("+")
        conf, save_name = parts[0], (parts[-1] if len(parts) > 1 else "")
        self.config = AgentConfig.load(conf or DEFAULT_CONFIG)
        self.save_name = save_name or None
        self.track = Track.SENSORS
        if policy is None:
            from wam_diff_core.policy import DrivingPolicy

            policy = DrivingPolicy.load(self.config.model, device=self.config.device, dtype=self.config.dtype,
                                        **self.config.decoding)
        self.policy = policy
        self.planner = CandidatePlanner(policy, self.config.candidates, self.config.scorer,
                                        self.config.candidate_sampling, where="a CARLA agent",
                                        braking=self.config.candidate_braking)
        self.controller = Controller(self.config.controller)
        self.stats = Counter(ticks=0, plans=0, valid_plans=0, invalid_plans=0, late_plans=0, brake_ticks=0)
        self.commands = Counter()
        self.plan_wall_s: list[float] = []
        self.last_errors: list[str] = []
        self.comfort = {"dt": 1.0 / self.config.comfort_hz, "lon_accel": [], "lat_accel": [], "yaw_rate": []}
        self.metric_info: dict[int, dict] = {}
        self._route: Optional[RoutePlanner] = None
        self._geo: Optional[GeoProjection] = None
        self._gnss: Optional[PositionFilter] = None
        self._held: Optional[HeldPlan] = None
        self._max_steer: Optional[float] = None
        self._heading = 0.0
        self._last_control = None
        self._comfort_every = max(1, int(round(self.config.sim_hz / self.config.comfort_hz)))

    def sensors(self) -> list[dict]:
        return [dict(s) for s in self.config.sensors]

    # ---------------------------------------------------------------- route and pose
    def _init_route(self) -> None:
        if not self._global_plan_world_coord:
            raise RuntimeError("no global plan: the leaderboard must call set_global_plan before run_step")
        world = [_xy(p) for p, _ in self._global_plan_world_coord]
        options = [o for _, o in self._global_plan_world_coord]
        self._route = RoutePlanner(world, options, self.config.route)
        gps = [(g["lat"], g["lon"]) for g, _ in self._global_plan]
        self._geo = GeoProjection.fit(gps, world)
        filt = self.config.gnss_filter
        if filt.enabled:
            self._gnss = PositionFilter(filt, self._geo.gnss_noise_m(filt.gnss_std_deg))

    def _pose(self, input_data, speed: float, yaw_rate: float, time_s: float) -> tuple[np.ndarray, float]:
        """Ego (x, y) in CARLA world metres from GNSS (filtered unless the YAML turns it off), and
        right-handed heading (rad) from the compass. speed m/s, yaw_rate rad/s (CCW), time_s simulation s."""
        lat, lon = (float(v) for v in input_data[self.config.gnss][1][:2])
        compass = float(input_data[self.config.imu][1][6])
        if math.isfinite(compass):  # the compass reads NaN on the first frames
            self._heading = compass_to_heading(compass)
        fix = np.array(self._geo.to_world(lat, lon))
        if self._gnss is None:
            return fix, self._heading
        x, y_rh = self._gnss.update(carla_to_rh(fix)[0], speed, self._heading, yaw_rate, time_s)
        return np.array([x, -y_rh]), self._heading

    def _images(self, input_data) -> list[np.ndarray]:
        images = [bgra_to_rgb(input_data[cam][1]) for cam in self.config.cameras]
        if self.config.image_size is not None:
            from PIL import Image

            images = [np.asarray(Image.fromarray(img).resize(self.config.image_size, Image.BILINEAR)) for img in images]
        return images

    # ---------------------------------------------------------------- planning
    def _route_target(self, ego_xy: np.ndarray, ego_rh: np.ndarray, heading: float) -> tuple[float, float]:
        """The route ROUTE_TARGET_AHEAD_M ahead of the ego along the route, (x forward, y left) m in the ego
        frame (the route and `ego_xy` are CARLA world metres; CARLA's y right is flipped here)."""
        point = carla_to_rh(self._route.ahead_point(ego_xy))
        x, y = world_to_ego(point, ego_rh, heading)[0]
        return float(x), float(y)

    def _plan(self, input_data, ego: EgoState, command: str, ego_rh: np.ndarray, heading: float, timestamp: float,
              target: Optional[tuple[float, float]] = None):
        self.stats["plans"] += 1
        start = time.perf_counter()
        try:
            plan: Plan = self.planner.plan(self._images(input_data), ego, command, target=target, time_s=timestamp)
        except ValueError as exc:  # bad input frame: no plan this time, brake
            plan = Plan(trajectory=None, valid=False, errors={"input": str(exc)})
        wall = time.perf_counter() - start
        self.plan_wall_s.append(wall)
        traj = plan.trajectory
        if not plan.valid or not valid_trajectory(traj):
            self.stats["invalid_plans"] += 1
            self.last_errors = (self.last_errors + ["; ".join(f"{k}: {v}" for k, v in plan.errors.items()) or "invalid"])[-5:]
            self._held = None
        elif self.config.late_plan_s is not None and wall > self.config.late_plan_s:
            self.stats["late_plans"] += 1
            self._held = None
        else:
            self.stats["valid_plans"] += 1
            self._held = HeldPlan(np.asarray(traj, dtype=np.float64), ego_rh.copy(), heading, timestamp)

    # ---------------------------------------------------------------- leaderboard API
    def run_step(self, input_data, timestamp):
        import carla

        cfg = self.config
        if self._route is None:
            self._init_route()
        tick = self.stats["ticks"]
        self.stats["ticks"] += 1
        speed = float(input_data[cfg.speedometer][1]["speed"])
        imu = np.asarray(input_data[cfg.imu][1], dtype=np.float64)
        ego = ego_state_from_imu(speed, imu[0:3], imu[3:6])
        ego_xy, heading = self._pose(input_data, speed, ego.yaw_rate, float(timestamp))
        ego_rh = np.array([ego_xy[0], -ego_xy[1]])
        route = self._route.update(ego_xy)
        self.commands[route.command] += 1
        if tick % cfg.plan_every_ticks == 0:
            self._plan(input_data, ego, route.command, ego_rh, heading, float(timestamp),
                       self._route_target(ego_xy, ego_rh, heading))
        waypoints, age = self._held.waypoints(ego_rh, heading, float(timestamp)) if self._held else (None, 0.0)
        control = self.controller.step(waypoints, speed, cfg.dt, plan_age_s=age)
        if control.reason in ("invalid plan", "stale plan"):
            self.stats["brake_ticks"] += 1
        if tick % self._comfort_every == 0:
            self.comfort["lon_accel"].append(ego.ax)
            self.comfort["lat_accel"].append(ego.ay)
            self.comfort["yaw_rate"].append(ego.yaw_rate)
            if getattr(self, "hero_actor", None) is not None and hasattr(self, "get_metric_info"):
                self.metric_info[tick] = self.get_metric_info()
        self._last_control = control
        return carla.VehicleControl(
            throttle=float(np.clip(control.throttle, 0.0, 1.0)),
            steer=carla_steer(control.steer, self._max_steer_rad(), cfg.steer_scale),
            brake=float(np.clip(control.brake, 0.0, 1.0)),
        )

    def _max_steer_rad(self) -> float:
        """Full lock of the ego: the YAML's max_steer_deg, else the hero vehicle's physics (read once),
        else the controller's own limit (then CARLA steer = the controller's normalised steer)."""
        if self._max_steer is None:
            if self.config.max_steer_deg is not None:
                self._max_steer = math.radians(self.config.max_steer_deg)
            else:
                self._max_steer = vehicle_max_steer_rad(getattr(self, "hero_actor", None)) or self.config.controller.max_steer_rad
        return self._max_steer

    def summary(self) -> dict:
        """Counters of this route: ticks, plans (valid / invalid / late), brake ticks, plan wall time."""
        wall = np.asarray(self.plan_wall_s) if self.plan_wall_s else np.zeros(1)
        return {**dict(self.stats), "commands": dict(self.commands), "plan_wall_s_mean": float(wall.mean()),
                "plan_wall_s_max": float(wall.max()), "last_errors": list(self.last_errors),
                "gnss_filter_resets": self._gnss.resets if self._gnss is not None else None,
                "candidates": {**self.planner.settings(), **self.planner.stats.as_dict()}}

    def output_dir(self) -> Optional[Path]:
        root = os.environ.get("SAVE_PATH")
        if not root or not self.save_name:
            return None
        return Path(root) / self.save_name

    def destroy(self):
        out = self.output_dir() if hasattr(self, "config") else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "wam_diff_agent.json", "w") as fh:
                json.dump({"stats": self.summary(), "comfort": self.comfort}, fh)
            if self.metric_info:  # Bench2Drive's efficiency_smoothness_benchmark.py reads this file
                with open(out / "metric_info.json", "w") as fh:
                    json.dump(self.metric_info, fh)
        self.policy = None
        if getattr(self, "planner", None) is not None:
            self.planner.policy = None  # its counts stay readable
