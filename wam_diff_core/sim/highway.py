"""The embedded closed-loop world: highway-env scenes driven at the policy rate (10 Hz).

Each tick gives an ego-aligned top-down RGB frame, the ego state, the navigation command and
ground truth (vehicle boxes in image pixels, lane geometry, collision and off-road flags).
Control in: signed acceleration (m/s^2) and front-wheel steering angle (rad, + left).

Frames and coordinates (docs/architecture.md): highway-env's y points to the driver's right and a
positive heading turns right. This module converts once, here: world X = x_hw, Y = -y_hw,
yaw = -heading_hw. Frames are rotated so the ego always faces right (+x forward = image right,
+y left = image up), the ego sitting at `ego_anchor` (fractions of width, height).

The env is used only to build the road and traffic and to render; ticks step the road directly
(no observation or reward is computed: the kinematics observation dominated step time and
merge-v0's reward crashes under continuous control in 1.12.1).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..types import Detection, EgoState
from ..constants import BOX_SCALE, EGO_ACCEL_LIMITS_MPS2, FRAME_SIZE, JUNCTION_SCENARIOS, ROUTE_TARGET_AHEAD_M
from ..model.settings import check_route_target_scenarios
from ..scoring.camera import TOP_DOWN_EGO_ANCHOR, TOP_DOWN_PX_PER_M, TopDownCamera
from .routes import Route

import os  # noqa: E402
import tempfile  # noqa: E402

# SDL complains on stderr without a runtime dir; never set SDL_VIDEODRIVER=dummy (frames go black).
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import gymnasium as gym  # noqa: E402
import highway_env  # noqa: E402,F401  (registers the envs)
from highway_env.road.lane import AbstractLane  # noqa: E402
from highway_env.vehicle.behavior import IDMVehicle  # noqa: E402
from highway_env.vehicle.graphics import VehicleGraphics  # noqa: E402
from highway_env.vehicle.kinematics import Vehicle  # noqa: E402

gym.logger.min_level = 40  # silence "environment is out of date" deprecation notes

# Creating an intersection env rewrites IDMVehicle class constants process-wide; snapshot the
# defaults at import and restore them before every reset so one route never changes another.
from .expert import is_junction_lane  # noqa: E402
from .traffic import TrafficVehicle  # noqa: E402

_IDM_KEYS = ("DISTANCE_WANTED", "COMFORT_ACC_MAX", "COMFORT_ACC_MIN", "TIME_WANTED", "DELTA", "ACC_MAX")
_IDM_DEFAULTS = {cls: {k: cls.__dict__[k] for k in _IDM_KEYS if k in cls.__dict__}
                 for cls in (IDMVehicle, TrafficVehicle)}
TRAFFIC_CLASS = "wam_diff_core.sim.traffic.TrafficVehicle"

WHEELBASE_M = Vehicle.LENGTH  # highway-env's bicycle is referenced at the centre with wheelbase = LENGTH
EGO_LENGTH_M = Vehicle.LENGTH
EGO_WIDTH_M = Vehicle.WIDTH
MAX_STEER_RAD = math.radians(45.0)
OFF_ROAD_TOLERANCE_M = 0.5  # centre beyond a lane edge by more than this counts as outside the lanes
# A lane that ends while the road goes on (the on-ramp's acceleration lane) within this distance ahead
# makes the navigation command "change lane left", as a route planner announces a lane drop; 160 m
# covers the 4 s plan horizon at 20 m/s past the point where the expert starts to merge.
LANE_DROP_LOOKAHEAD_M = 160.0
_LANE_JOIN_TOLERANCE_M = 1.0  # a lane continues on the next road's lane starting this close to its end
_VID_ATTR = "_wam_vid"  # the attribute a vehicle carries its ground-truth id in (Tick.vehicles vid)

ENV_IDS = {
    "highway": "highway-v0", "highway_dense": "highway-v0", "emergency_brake": "highway-v0", "cut_in": "highway-v0",
    "merge": "merge-v0", "intersection": "intersection-v0", "roundabout": "roundabout-v0",
}


def hw_to_world(xy_hw) -> np.ndarray:
    """highway-env (x, y right) -> world (X, Y left)."""
    p = np.asarray(xy_hw, dtype=np.float64)
    return np.stack([p[..., 0], -p[..., 1]], axis=-1)


def world_to_ego(points_world: np.ndarray, ego_xy: np.ndarray, ego_yaw: float) -> np.ndarray:
    """World (X, Y left) points (..., 2) into the ego frame (x forward, y left)."""
    d = np.asarray(points_world, dtype=np.float64) - ego_xy
    c, s = math.cos(ego_yaw), math.sin(ego_yaw)
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


def ego_to_world(points_ego: np.ndarray, ego_xy: np.ndarray, ego_yaw: float) -> np.ndarray:
    p = np.asarray(points_ego, dtype=np.float64)
    c, s = math.cos(ego_yaw), math.sin(ego_yaw)
    return np.stack([c * p[..., 0] - s * p[..., 1], s * p[..., 0] + c * p[..., 1]], axis=-1) + ego_xy


def _in_junction(v) -> bool:
    return v.lane_index[0].startswith("ir")


def _junction_first_priorities(v1, v2):
    """Right of way at intersections: a vehicle already inside the junction goes first (highway-env
    only compares lane priorities, so crossing traffic drove into vehicles already clearing the box);
    otherwise highway-env's rule (lane priority, then the vehicle behind yields)."""
    from highway_env.road.regulation import RegulatedRoad

    in1, in2 = _in_junction(v1), _in_junction(v2)
    if in1 and not in2:
        return v2
    if in2 and not in1:
        return v1
    if in1 and in2:
        # both inside: the one that entered first goes on
        e1, e2 = getattr(v1, "junction_entry_t", 0.0), getattr(v2, "junction_entry_t", 0.0)
        if e1 != e2:
            return v2 if e1 < e2 else v1
    return RegulatedRoad.respect_priorities(v1, v2)


class PolicyVehicle(Vehicle):
    """The ego under external continuous control; never reverses."""

    def step(self, dt: float) -> None:
        if self.speed <= 0.0 and self.action["acceleration"] < 0.0:
            self.speed = 0.0
            self.action["acceleration"] = 0.0
        super().step(dt)
        if self.speed < 0.0:
            self.speed = 0.0


@dataclass
class VehicleGT:
    """Another vehicle in the ego frame: centre (m), heading (rad), velocity (m/s), size, box in pixels."""

    vid: int
    xy: tuple[float, float]
    heading: float
    velocity: tuple[float, float]
    length: float
    width: float
    box_px: Optional[tuple[float, float, float, float]]  # None when not in view
    same_lane: bool
    lane_offset: int  # lanes to the left (+) / right (-) of the ego's lane on the same road, 99 if unrelated


@dataclass
class Tick:
    """What the world gives per policy tick."""

    t: float
    frame: Optional[np.ndarray]                 # (H, W, 3) uint8 RGB, ego facing right
    ego: EgoState
    pose: tuple[float, float, float]            # world X, Y (left), yaw (rad, CCW)
    command: str
    vehicles: list[VehicleGT]
    collision: bool
    off_road: bool
    progress_m: float
    route_deviation_m: float
    lane_count: int
    lane_id: int                                # 0 = right-most lane of the ego's road
    detections: list[Detection] = field(default_factory=list)
    # the route's centreline ROUTE_TARGET_AHEAD_M ahead along the route, ego frame (x, y) m; routes through a
    # junction only (None on roads, whose route is the road itself)
    route_target: Optional[tuple[float, float]] = None


class HighwayWorld:
    """One route of the suite as a steppable world.

    driver="policy": the ego follows `step(accel, steer)`; driver="expert": the rule-based expert
    (sim.expert.ExpertVehicle) drives itself and `step()` ignores its arguments.
    """

    def __init__(self, route: Route, frame_size: tuple[int, int] = FRAME_SIZE, scaling: float = TOP_DOWN_PX_PER_M,
                 ego_anchor: tuple[float, float] = TOP_DOWN_EGO_ANCHOR, sim_hz: int = 10, policy_hz: int = 10,
                 driver: str = "policy", render: bool = True,
                 route_target_scenarios: Sequence[str] = JUNCTION_SCENARIOS):
        if sim_hz % policy_hz:
            raise ValueError(f"sim_hz ({sim_hz}) must be a whole multiple of policy_hz ({policy_hz})")
        if driver not in ("policy", "expert"):
            raise ValueError(f"driver must be 'policy' or 'expert', got {driver!r}")
        self.route = route
        self.width, self.height = int(frame_size[0]), int(frame_size[1])
        self.scaling = float(scaling)
        self.anchor = ego_anchor
        self.sim_hz, self.policy_hz = sim_hz, policy_hz
        self.dt = 1.0 / policy_hz
        self.driver = driver
        self.render_frames = render
        self.route_target_scenarios = check_route_target_scenarios(route_target_scenarios)  # whose ticks state one
        ax, ay = ego_anchor[0] * self.width, ego_anchor[1] * self.height
        reach = max(math.hypot(max(ax, self.width - ax), max(ay, self.height - ay)), 1.0)
        self._canvas = int(2 * math.ceil(reach) + 4)
        self.env = None
        self.ego = None

    # ------------------------------------------------------------------ set-up
    def _config(self) -> dict:
        r = self.route
        cfg = {
            "simulation_frequency": self.sim_hz, "policy_frequency": self.policy_hz,
            "screen_width": self._canvas, "screen_height": self._canvas, "centering_position": [0.5, 0.5],
            "scaling": self.scaling, "offscreen_rendering": True, "show_trajectories": False,
            "observation": {"type": "Kinematics", "vehicles_count": 1},
        }
        if r.scenario in ("highway", "highway_dense", "emergency_brake", "cut_in"):
            cfg.update({"lanes_count": int(r.options.get("lanes", 3)),
                        "vehicles_count": int(r.options.get("vehicles", 25)),
                        "vehicles_density": float(r.density), "ego_spacing": 1.5,
                        "initial_lane_id": r.options.get("ego_lane")})
        if r.scenario in JUNCTION_SCENARIOS:
            cfg["other_vehicles_type"] = TRAFFIC_CLASS
        if r.scenario == "intersection":
            cfg.update({"destination": r.options.get("destination", "o1"),
                        "spawn_probability": float(min(0.9, 0.3 * r.density)),
                        "initial_vehicle_count": int(6 * r.density)})
        elif r.scenario == "roundabout":
            pass
        return cfg

    def reset(self) -> Tick:
        """Build the route's scene from its seed and return the first tick."""
        for cls, values in _IDM_DEFAULTS.items():
            for k in _IDM_KEYS:
                if k in values:
                    setattr(cls, k, values[k])
                elif k in cls.__dict__:
                    delattr(cls, k)  # fall back to the parent's value again
        if self.env is not None:
            self.env.close()
        r = self.route
        self.env = gym.make(ENV_IDS[r.scenario], render_mode="rgb_array", config=self._config()).unwrapped
        self.env.reset(seed=int(r.seed))
        self.env.enable_auto_render = False
        road = self.env.road
        if hasattr(road, "respect_priorities"):
            road.respect_priorities = _junction_first_priorities
        old = self.env.vehicle
        route_lanes = list(getattr(old, "route", None) or [])
        if r.scenario == "roundabout":
            route_lanes = self._roundabout_route(old, r.options.get("exit", "nxs"))
        elif r.scenario == "merge" and r.options.get("start") == "ramp":
            old = self._move_to_ramp(old)
        if r.scenario in ("highway", "highway_dense", "emergency_brake", "cut_in", "merge"):
            old.speed = float(r.options.get("ego_speed", old.speed))
        self._route_lanes = list(route_lanes)
        if self.driver == "expert":
            ego = self._expert_from(old)
        else:
            ego = PolicyVehicle(road, old.position.copy(), heading=old.heading, speed=old.speed)
            ego.action = {"steering": 0.0, "acceleration": 0.0}
        idx = road.vehicles.index(old)
        road.vehicles[idx] = ego
        self.env.controlled_vehicles = [ego]
        self.ego = ego
        ego.on_state_update()
        self._build_route_polyline(route_lanes)
        self._t = 0.0
        self._ticks = 0
        self._prev_pose = None
        self._prev_vel = None
        self._yaw_unwrapped = None
        self._progress = 0.0
        self._scenario_state = {}
        self._next_vid = 0  # vehicle ids in order of first sight (`_vehicles_gt`)
        return self._observe(first=True)

    def _expert_from(self, old):
        """The rule-based expert in `old`'s place (position, heading, speed), set up for this route."""
        from .expert import ExpertVehicle

        r = self.route
        if hasattr(old, "target_lane_index"):
            ego = ExpertVehicle.create_from(old)
            route = list(self._route_lanes)
        else:  # the policy's ego: the expert drives on from where it is
            target, route = self._route_ahead(old)
            ego = ExpertVehicle(old.road, old.position.copy(), heading=old.heading, speed=old.speed,
                                target_lane_index=target)
        ego.route = route or None
        ego.target_speed = float(r.options.get("target_speed", self._speed_limit(old)))
        ego.cruise_speed = ego.target_speed
        ego.junction = r.scenario in JUNCTION_SCENARIOS
        # no MOBIL lane changes on the ring: exits leave from the outer lane, and cutting across
        # from the inner one drove through the lane markings
        ego.enable_lane_change = not ego.junction
        ego.dt = 1.0 / self.sim_hz
        return ego

    def _route_ahead(self, vehicle) -> tuple[tuple, list]:
        """The lane an expert taking over `vehicle` should drive and the route's lanes from there.
        highway-env follows a route only while its first entry is the current road (a stale head makes
        it pick the next road by distance), and at a fork the closest lane can be the branch the route
        does not take (on the ring just before the exit): there the route's own branch is taken.
        Elsewhere (the nearest lane is a road the route does not take, e.g. the ring segment ending where
        the entry joins it): the route's entry whose lane is nearest the vehicle, and the route from there."""
        li, lanes = tuple(vehicle.lane_index), list(self._route_lanes)
        if not lanes:
            return li, lanes
        for i, r in enumerate(lanes):
            if tuple(r[:2]) == li[:2]:
                return li, lanes[i:]
        graph = self.env.road.network.graph
        for i, r in enumerate(lanes):
            if r[0] == li[0]:  # a fork: the route leaves this node on another road
                lane = self._route_lane(r, vehicle.position)
                return (r[0], r[1], graph[r[0]][r[1]].index(lane)), lanes[i:]
        best = min(range(len(lanes)), key=lambda i: float(self._route_lane(lanes[i], vehicle.position).distance(vehicle.position)))
        lane = self._route_lane(lanes[best], vehicle.position)
        r = lanes[best]
        return (r[0], r[1], graph[r[0]][r[1]].index(lane)), lanes[best:]

    def expert_rollout(self, seconds: float) -> tuple[np.ndarray, bool]:
        """What the expert would drive from the current state: a copy of the world (traffic, scenario
        triggers and random state included) with the ego handed to the expert, stepped `seconds`
        without rendering. Returns the ego's positions at every policy tick (n, 2) in the current
        ego frame and whether the expert collided. The world itself is not touched."""
        import copy

        if self.env is None:
            raise RuntimeError("expert_rollout before reset()")
        # one deep copy, so the scenario state's actors stay the copied road's vehicles (the env's own
        # __deepcopy__ leaves its viewer out)
        twin = copy.deepcopy(self)
        twin.render_frames = False
        if twin.driver != "expert":
            road = twin.env.road
            expert = twin._expert_from(twin.ego)
            road.vehicles[road.vehicles.index(twin.ego)] = expert
            twin.env.controlled_vehicles = [expert]
            twin.ego = expert
            twin.driver = "expert"
            expert.on_state_update()
        xy, yaw = hw_to_world(self.ego.position), -float(self.ego.heading)
        pts, crashed = [], False
        for _ in range(int(round(seconds / self.dt))):
            tick = twin.step()
            pts.append(tick.pose[:2])
            crashed = crashed or tick.collision
        return world_to_ego(np.asarray(pts, dtype=np.float64), xy, yaw), crashed

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def _speed_limit(self, vehicle) -> float:
        limit = getattr(vehicle.lane, "speed_limit", None) or 20.0
        return float(min(limit, 30.0))

    def _move_to_ramp(self, old):
        """Merge routes that start on the on-ramp: put the ego on lane j->k."""
        lane = self.env.road.network.get_lane(("j", "k", 0))
        s0 = float(self.route.options.get("ramp_start_m", 30.0))
        old.position = lane.position(s0, 0.0)
        old.heading = lane.heading_at(s0)
        old.speed = float(self.route.options.get("ego_speed", 20.0))
        old.target_lane_index = ("j", "k", 0)
        old.on_state_update()
        # the ramp must be free around the ego
        self.env.road.vehicles = [v for v in self.env.road.vehicles
                                  if v is old or np.linalg.norm(v.position - old.position) > 15.0]
        return old

    def _roundabout_route(self, old, exit_node: str) -> list:
        net = self.env.road.network
        path = net.shortest_path("ser", exit_node)
        lanes = [("ser", "ses", 0)] + [(a, b, None) for a, b in zip(path[1:-1], path[2:])]
        exit_next = list(net.graph.get(exit_node, {}).keys())
        if exit_next:
            lanes.append((exit_node, exit_next[0], None))
        return lanes

    def _route_lane(self, li, after):
        """The lane of a route entry; an entry without a lane index (a, b, None) is driven on the lane
        of a -> b that starts nearest to `after` (where the route so far ends): on the roundabout the
        entry joins the outer ring lane, which the traffic and the expert keep to (lane 0, the inner
        one, put the reference 4 m off the path every vehicle drives)."""
        net = self.env.road.network
        if li[2] is not None:
            return net.get_lane(li)
        lanes = net.graph[li[0]][li[1]]
        return min(lanes, key=lambda lane: float(np.linalg.norm(lane.position(0.0, 0.0) - np.asarray(after))))

    def _build_route_polyline(self, route_lanes: list) -> None:
        """Dense centreline (world X, Y) of the route and where its junction part ends."""
        net = self.env.road.network
        pts = []
        junction_end_s = None
        r = self.route
        if route_lanes:
            total = 0.0
            for li in route_lanes:
                lane = self._route_lane(li, pts[-1][-1] if pts else self.ego.position)
                s = np.arange(0.0, lane.length, 1.0)
                p = np.array([lane.position(si, 0.0) for si in s])
                if pts:
                    total += np.linalg.norm(p[0] - pts[-1][-1])
                pts.append(p)
                total += float(lane.length)
                # the junction ends where the route leaves its last inner lane
                if is_junction_lane(li):
                    junction_end_s = total
            poly = np.concatenate(pts, axis=0)
        else:
            lane = self.ego.lane
            s0 = lane.local_coordinates(self.ego.position)[0]
            s = np.arange(s0 - 20.0, s0 + r.target_distance_m + 200.0, 2.0)
            poly = np.array([lane.position(si, 0.0) for si in s])
        self._route_hw = poly
        seg = np.linalg.norm(np.diff(poly, axis=0), axis=1)
        self._route_s = np.concatenate([[0.0], np.cumsum(seg)])
        self._route_idx = int(np.argmin(np.linalg.norm(poly - self.ego.position, axis=1)))
        self._route_s0 = float(self._route_s[self._route_idx])
        self._junction_end_s = None if junction_end_s is None else junction_end_s - self._route_s0
        self._corridor_route = bool(route_lanes) and r.scenario in JUNCTION_SCENARIOS
        # the manoeuvre: heading change from the ego along the whole route
        if self._corridor_route:
            tang = np.diff(poly, axis=0)
            h = np.unwrap(np.arctan2(tang[:, 1], tang[:, 0]))
            turn_hw = float(h[-1] - h[self._route_idx])
            if turn_hw > math.radians(45):
                self._manoeuvre = "turn right"
            elif turn_hw < -math.radians(45):
                self._manoeuvre = "turn left"
            else:
                self._manoeuvre = "go straight"
        else:
            self._manoeuvre = "follow lane"

    # ------------------------------------------------------------------ ticking
    def step(self, accel: float = 0.0, steer: float = 0.0, frame: bool = True) -> Tick:
        """Apply a control (m/s^2, front-wheel rad + left) for one policy tick and observe. frame=False: nobody
        reads this tick's camera frame, so it is not rendered (Tick.frame None); rendering has no effect on the
        world's state, and it is most of a tick's cost (a roundabout route: 3.7 s rendered every tick, 0.4 s not)."""
        ego = self.ego
        if self.driver == "policy":
            a = float(np.clip(accel, *EGO_ACCEL_LIMITS_MPS2)) if math.isfinite(accel) else -6.0
            st = float(np.clip(steer, -MAX_STEER_RAD, MAX_STEER_RAD)) if math.isfinite(steer) else 0.0
            ego.act({"acceleration": a, "steering": -st})  # highway-env steers + right
        self._scenario_events()
        road = self.env.road
        substeps = self.sim_hz // self.policy_hz
        for _ in range(substeps):
            road.act()
            road.step(1.0 / self.sim_hz)
        if self.route.scenario == "intersection":
            for v in road.vehicles:
                if _in_junction(v):
                    if not hasattr(v, "junction_entry_t"):
                        v.junction_entry_t = self._t
                elif hasattr(v, "junction_entry_t"):
                    del v.junction_entry_t
            self.env._clear_vehicles()
            # intersection-v0 spawns once per (1 Hz) env step; keep that rate at our 10 Hz ticks
            if self._ticks % self.policy_hz == 0:
                self.env._spawn_vehicle(spawn_probability=self.env.config["spawn_probability"])
        self._t += self.dt
        self._ticks += 1
        return self._observe(frame=frame)

    def _scenario_events(self) -> None:
        """Emergency brake / cut-in triggers (route options: trigger_s, lead_gap_m...)."""
        r = self.route
        st = self._scenario_state
        if r.scenario not in ("emergency_brake", "cut_in"):
            return
        trigger = float(r.options.get("trigger_s", 4.0))
        ego = self.ego
        if "actor" not in st and self._t >= trigger:
            if r.scenario == "emergency_brake":
                actor = self._vehicle_ahead(same_lane=True, max_gap=float(r.options.get("max_gap_m", 45.0)))
                if actor is not None:
                    actor.target_speed = 0.0
                    st["actor"] = actor
                    st["since"] = self._t
            else:
                actor = self._vehicle_ahead(same_lane=False, max_gap=35.0, min_gap=5.0)
                if actor is not None and isinstance(actor, IDMVehicle):
                    actor.enable_lane_change = False
                    actor.target_lane_index = ego.lane_index
                    actor.target_speed = max(ego.speed - float(r.options.get("cut_in_slowdown", 8.0)), 5.0)
                    st["actor"] = actor
                    st["since"] = self._t
            if "actor" in st:
                st["trigger_t"] = self._t
        elif "actor" in st and r.scenario == "emergency_brake":
            actor = st["actor"]
            # once it has stood for a while, traffic resumes
            if actor.speed < 0.2 and self._t - st["since"] > float(r.options.get("hold_s", 4.0)) + 3.0:
                actor.target_speed = float(r.options.get("resume_speed", 20.0))

    def _vehicle_ahead(self, same_lane: bool, max_gap: float, min_gap: float = 8.0):
        ego = self.ego
        best, best_d = None, None
        for v in self.env.road.vehicles:
            if v is ego:
                continue
            rel = world_to_ego(hw_to_world(v.position), hw_to_world(ego.position), -ego.heading)
            if not (min_gap <= rel[0] <= max_gap):
                continue
            if same_lane and abs(rel[1]) > 1.5:
                continue
            if not same_lane and not (2.0 < abs(rel[1]) < 5.5):
                continue
            if best_d is None or rel[0] < best_d:
                best, best_d = v, rel[0]
        return best

    # ------------------------------------------------------------------ observing
    def _update_progress(self) -> tuple[float, float]:
        poly = self._route_hw
        lo = max(self._route_idx - 5, 0)
        hi = min(self._route_idx + 60, poly.shape[0])
        d = np.linalg.norm(poly[lo:hi] - self.ego.position, axis=1)
        i = lo + int(np.argmin(d))
        self._route_idx = max(self._route_idx, i) if d.min() < 8.0 else self._route_idx
        s = float(self._route_s[self._route_idx]) - self._route_s0
        if not self._corridor_route:
            # along a straight road: project exactly on the lane direction
            lane_dir = poly[-1] - poly[0]
            lane_dir = lane_dir / np.linalg.norm(lane_dir)
            s = float((self.ego.position - poly[self._route_idx]) @ lane_dir) + s
        self._progress = max(self._progress, s)
        return self._progress, float(d.min())

    def _road_deviation(self) -> float:
        """Metres beyond the edge of the nearest lane of the whole road network (0 when on a lane)."""
        pos = self.ego.position
        best = math.inf
        for tos in self.env.road.network.graph.values():
            for lanes in tos.values():
                for lane in lanes:
                    s, lat = lane.local_coordinates(pos)
                    excess = abs(lat) - lane.width_at(s) / 2.0 + max(s - lane.length, 0.0) + max(-s, 0.0)
                    best = min(best, excess)
                    if best <= 0.0:
                        return 0.0
        return max(best, 0.0)

    def _lane_drop_ahead(self) -> bool:
        """Whether the ego's lane (or the lanes it runs on into) ends within LANE_DROP_LOOKAHEAD_M while
        its road goes on with fewer lanes: the next road exists but no lane of it starts where this one
        ends. The end of the map (no next road) is not a drop. The world's only lane drop is the on-ramp's
        acceleration lane, the right-most, hence "change lane left" in `_command`."""
        graph = self.env.road.network.graph
        li = tuple(self.ego.lane_index)
        lane = self.env.road.network.get_lane(li)
        ahead = float(lane.length - lane.local_coordinates(self.ego.position)[0])
        for _ in range(8):  # a few short lanes at most before the lookahead runs out
            nxt = graph.get(li[1], {})
            if not nxt:
                return False
            end = lane.position(lane.length, 0.0)
            joins = [(li[1], to, i) for to, lanes in nxt.items() for i, other in enumerate(lanes)
                     if np.linalg.norm(other.position(0.0, 0.0) - end) < _LANE_JOIN_TOLERANCE_M]
            if not joins:
                return ahead <= LANE_DROP_LOOKAHEAD_M
            if ahead > LANE_DROP_LOOKAHEAD_M:
                return False
            li = joins[0]
            lane = self.env.road.network.get_lane(li)
            ahead += float(lane.length)
        return False

    def _command(self, progress: float) -> str:
        if self._manoeuvre == "follow lane":
            return "change lane left" if self._lane_drop_ahead() else "follow lane"
        if self._junction_end_s is not None and progress > self._junction_end_s + 5.0:
            return "follow lane"
        return self._manoeuvre

    def _route_target(self, xy: np.ndarray, yaw: float) -> Optional[tuple[float, float]]:
        """The route target point of a junction route: the centreline ROUTE_TARGET_AHEAD_M along the route from
        the ego's route position (the end of the route when nearer), in the ego frame; None on road routes and on
        route types outside `route_target_scenarios`."""
        if not self._corridor_route or self.route.scenario not in self.route_target_scenarios:
            return None
        s = min(float(self._route_s[self._route_idx]) + ROUTE_TARGET_AHEAD_M, float(self._route_s[-1]))
        point_hw = [np.interp(s, self._route_s, self._route_hw[:, i]) for i in (0, 1)]
        x, y = world_to_ego(hw_to_world(point_hw), xy, yaw)
        return float(x), float(y)

    def _lane_position(self) -> tuple[int, int]:
        """(number of lanes of the ego's road, ego lane id counted from the right-most lane = 0)."""
        li = self.ego.lane_index
        lanes = self.env.road.network.graph.get(li[0], {}).get(li[1], [])
        n = len(lanes)
        return n, (n - 1 - li[2]) if n else 0

    def _observe(self, first: bool = False, frame: bool = True) -> Tick:
        ego = self.ego
        env = self.env
        xy = hw_to_world(ego.position)
        yaw = -float(ego.heading)
        vel_world = hw_to_world(ego.velocity)
        if self._yaw_unwrapped is None:
            self._yaw_unwrapped = yaw
        else:
            self._yaw_unwrapped += (yaw - self._last_yaw + math.pi) % (2 * math.pi) - math.pi
        self._last_yaw = yaw
        c, s = math.cos(yaw), math.sin(yaw)
        vx, vy = c * vel_world[0] + s * vel_world[1], -s * vel_world[0] + c * vel_world[1]
        if self._prev_vel is None:
            ax = ay = yaw_rate = 0.0
        else:
            acc = (vel_world - self._prev_vel) / self.dt
            ax, ay = c * acc[0] + s * acc[1], -s * acc[0] + c * acc[1]
            yaw_rate = (self._yaw_unwrapped - self._prev_yaw) / self.dt
        self._prev_vel = vel_world
        self._prev_yaw = self._yaw_unwrapped
        progress, dev_route = self._update_progress()
        deviation = dev_route if self._corridor_route else self._road_deviation()
        lane_count, lane_id = self._lane_position()
        vehicles = self._vehicles_gt(xy, yaw)
        image = self._render(yaw) if self.render_frames and frame else None
        detections = [self._detection(v) for v in vehicles if v.box_px is not None]
        return Tick(
            t=round(self._t, 6), frame=image,
            ego=EgoState(vx=float(vx), vy=float(vy), ax=float(ax), ay=float(ay), yaw_rate=float(yaw_rate)),
            pose=(float(xy[0]), float(xy[1]), float(yaw)), command=self._command(progress),
            vehicles=vehicles, collision=bool(ego.crashed), off_road=self._road_deviation() > OFF_ROAD_TOLERANCE_M,
            progress_m=float(progress), route_deviation_m=float(deviation),
            lane_count=lane_count, lane_id=lane_id, detections=detections, route_target=self._route_target(xy, yaw),
        )

    def _detection(self, v: VehicleGT) -> Detection:
        x1, y1, x2, y2 = v.box_px
        norm = (x1 / self.width * BOX_SCALE, y1 / self.height * BOX_SCALE,
                x2 / self.width * BOX_SCALE, y2 / self.height * BOX_SCALE)
        return Detection(label="car", box_px=(x1, y1, x2, y2), box_norm=tuple(round(n) for n in norm), score=1.0)

    @property
    def camera(self) -> TopDownCamera:
        """The top-down camera the frames are drawn with: frame size, `scaling` px/m, ego `anchor`."""
        return TopDownCamera(self.width, self.height, self.scaling, tuple(self.anchor))

    def ego_to_pixels(self, pts_ego: np.ndarray) -> np.ndarray:
        """Ego-frame points (..., 2) metres -> frame pixels (u right, v down)."""
        return self.camera.to_pixels(pts_ego)

    def pixels_to_ego(self, pixels: np.ndarray) -> np.ndarray:
        """Frame pixels (..., 2) (u right, v down) -> ego-frame points (..., 2) metres on the ground."""
        return self.camera.to_ground(pixels)

    def _vehicles_gt(self, ego_xy, ego_yaw) -> list[VehicleGT]:
        out = []
        ego = self.ego
        li = ego.lane_index
        for v in self.env.road.vehicles:
            if v is ego:
                continue
            vid = getattr(v, _VID_ATTR, None)
            if vid is None:  # kept on the vehicle: an id(v) key was reused by vehicles spawned after others left
                vid = self._next_vid
                self._next_vid += 1
                setattr(v, _VID_ATTR, vid)
            p_world = hw_to_world(v.position)
            rel = world_to_ego(p_world, ego_xy, ego_yaw)
            if np.hypot(*rel) > 150.0:
                continue
            h = -float(v.heading) - ego_yaw
            h = (h + math.pi) % (2 * math.pi) - math.pi
            vel = world_to_ego(hw_to_world(v.velocity), np.zeros(2), ego_yaw)
            half = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]]) * [v.LENGTH / 2, v.WIDTH / 2]
            ch, sh = math.cos(h), math.sin(h)
            corners = half @ np.array([[ch, sh], [-sh, ch]]) + rel
            px = self.ego_to_pixels(corners)
            x1, y1 = px.min(axis=0)
            x2, y2 = px.max(axis=0)
            box = None
            cx1, cy1, cx2, cy2 = max(x1, 0.0), max(y1, 0.0), min(x2, self.width), min(y2, self.height)
            if cx2 > cx1 and cy2 > cy1:
                # keep boxes at least half visible
                if (cx2 - cx1) * (cy2 - cy1) >= 0.5 * (x2 - x1) * (y2 - y1):
                    box = (float(cx1), float(cy1), float(cx2), float(cy2))
            vli = v.lane_index
            same_road = vli[0] == li[0] and vli[1] == li[1]
            offset = (li[2] - vli[2]) if same_road else 99  # lane ids grow to the right in highway-env
            out.append(VehicleGT(vid=vid, xy=(float(rel[0]), float(rel[1])), heading=h,
                                 velocity=(float(vel[0]), float(vel[1])), length=float(v.LENGTH),
                                 width=float(v.WIDTH), box_px=box, same_lane=same_road and vli[2] == li[2],
                                 lane_offset=int(offset)))
        return out

    def _render(self, yaw: float) -> np.ndarray:
        from PIL import Image

        ego = self.ego
        ego.color = VehicleGraphics.RED if ego.crashed else VehicleGraphics.EGO_COLOR
        canvas = self.env.render()  # (S, S, 3), ego at the centre, world axes
        img = Image.fromarray(canvas)
        # rotate so the ego faces right: PIL rotates counter-clockwise on screen by the angle;
        # screen has y down, so the on-screen heading is heading_hw = -yaw.
        img = img.rotate(-math.degrees(yaw), resample=Image.BILINEAR, center=(canvas.shape[1] / 2, canvas.shape[0] / 2),
                         fillcolor=(100, 100, 100))
        left = int(round(canvas.shape[1] / 2 - self.anchor[0] * self.width))
        top = int(round(canvas.shape[0] / 2 - self.anchor[1] * self.height))
        return np.asarray(img.crop((left, top, left + self.width, top + self.height)), dtype=np.uint8)

    def render_without_traffic(self) -> np.ndarray:
        """The current frame with every vehicle but the ego left out (road, markings and ego as in
        `Tick.frame`): the counterfactual a perception probe compares plans against."""
        if self.env is None:
            raise RuntimeError("render_without_traffic before reset()")
        road = self.env.road
        others = road.vehicles
        road.vehicles = [self.ego]
        try:
            return self._render(-float(self.ego.heading))
        finally:
            road.vehicles = others

    def without_traffic(self) -> "HighwayWorld":
        """A copy of the world (state, route, scenario) with every vehicle but the ego removed."""
        import copy

        twin = copy.deepcopy(self)
        road = twin.env.road
        road.vehicles = [twin.ego]
        twin._scenario_state = {}  # no actor to brake or cut in
        if "spawn_probability" in twin.env.config:
            twin.env.config["spawn_probability"] = 0.0  # the intersection spawns no new traffic either
        return twin

    # ------------------------------------------------------------------ ground truth on demand
    def lanes_gt(self, radius_m: float = 120.0, step_m: float = 2.0) -> list[dict]:
        """Lane centrelines near the ego, in the ego frame: [{"id", "centre": (N, 2), "width"}]."""
        ego = self.ego
        xy, yaw = hw_to_world(ego.position), -float(ego.heading)
        out = []
        for a, tos in self.env.road.network.graph.items():
            for b, lanes in tos.items():
                for k, lane in enumerate(lanes):
                    s_ego, _ = lane.local_coordinates(ego.position)
                    if lane.length <= 2 * radius_m:
                        # short lanes whole: arcs' longitudinal coordinate wraps far from the arc
                        lo, hi = 0.0, float(lane.length)
                    else:
                        lo = max(0.0, s_ego - radius_m)
                        hi = min(float(lane.length), s_ego + radius_m)
                    if hi <= lo:
                        continue
                    s = np.arange(lo, hi + 1e-9, step_m)
                    if s.size < 2:
                        s = np.array([lo, hi])
                    pts = hw_to_world(np.array([lane.position(si, 0.0) for si in s]))
                    rel = world_to_ego(pts, xy, yaw)
                    near = np.hypot(rel[:, 0], rel[:, 1]) <= radius_m
                    if not near.any():
                        continue
                    idx = np.nonzero(near)[0]
                    rel = rel[idx.min(): idx.max() + 1]
                    if rel.shape[0] < 2:
                        continue
                    out.append({"id": f"{a}->{b}:{k}", "centre": rel, "width": float(lane.width_at(s_ego))})
        return out

    def vehicle_futures(self) -> dict[int, np.ndarray]:
        """Every other vehicle's next NUM_WAYPOINTS centres and headings (x, y, heading) along its lane or route at
        its current speed, in the ego frame, by ground-truth id (`VehicleGT.vid`): the live world's forecast of its
        traffic (the oracle scorer's); a vehicle whose route cannot be followed is left out."""
        from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S

        ego = self.ego
        xy, yaw = hw_to_world(ego.position), -float(ego.heading)
        times = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
        out = {}
        for v in self.env.road.vehicles:
            vid = getattr(v, _VID_ATTR, None)
            if v is ego or vid is None:
                continue
            try:
                positions, headings = v.predict_trajectory_constant_speed(times)
            except (IndexError, KeyError, ValueError):  # highway-env's route projection where lane counts change
                continue
            rel = world_to_ego(hw_to_world(np.asarray(positions)), xy, yaw)
            out[vid] = np.column_stack([rel, -np.asarray(headings, dtype=np.float64) - yaw])
        return out

    def expert_intent(self) -> np.ndarray:
        """The expert ego's intended next NUM_WAYPOINTS positions (its target lane / route at its
        current speed), in the ego frame. Only for driver="expert"."""
        from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S

        ego = self.ego
        times = (np.arange(NUM_WAYPOINTS) + 1) * WAYPOINT_DT_S
        saved = ego.route
        try:
            if not ego.route:
                ego.route = [ego.target_lane_index]
            pos, _ = ego.predict_trajectory_constant_speed(times)
        except (IndexError, KeyError):
            # highway-env's route projection fails where lane counts change (ring -> exit): stay on the lane
            s0, _ = ego.lane.local_coordinates(ego.position)
            pos = [ego.lane.position(s0 + ego.speed * t, 0.0) for t in times]
        finally:
            ego.route = saved
        return world_to_ego(hw_to_world(np.asarray(pos)), hw_to_world(ego.position), -float(ego.heading))

    def snapshot(self) -> dict:
        """World state for hashing/determinism checks: every vehicle's position, heading, speed."""
        return {"t": self._t, "vehicles": [(float(v.position[0]), float(v.position[1]), float(v.heading), float(v.speed))
                                            for v in self.env.road.vehicles]}


def route_over(route: Route, tick: Tick, max_s: Optional[float] = None) -> bool:
    """An expert-driven route ends: a collision, the target distance reached, or the route's time limit
    (or `max_s`, when earlier)."""
    limit = route.time_limit_s if max_s is None else min(route.time_limit_s, max_s)
    return bool(tick.collision or tick.progress_m >= route.target_distance_m or tick.t >= limit - 1e-9)


class ExpertDrive:
    """The expert drives `route` with frames rendered. Iterating yields (world, tick) at tick 0 and every
    `every` ticks after, until `route_over`; `last` is then the final tick. The world is closed at the end
    (or when the loop is left early)."""

    def __init__(self, route: Route, frame_size=FRAME_SIZE, every: int = 1, max_s: Optional[float] = None,
                 route_target_scenarios: Sequence[str] = JUNCTION_SCENARIOS):
        if every < 1:
            raise ValueError(f"every {every}: expected a whole number of ticks >= 1")
        self.route, self.frame_size, self.every, self.max_s = route, frame_size, every, max_s
        self.route_target_scenarios = route_target_scenarios
        self.last: Optional[Tick] = None

    def __iter__(self):
        world = HighwayWorld(self.route, frame_size=self.frame_size, driver="expert", render=True,
                             route_target_scenarios=self.route_target_scenarios)
        tick = world.reset()
        try:
            while True:
                self.last = tick
                if world._ticks % self.every == 0:
                    yield world, tick
                if route_over(self.route, tick, self.max_s):
                    return
                tick = world.step(frame=(world._ticks + 1) % self.every == 0)
        finally:
            world.close()

