"""Bench2Drive agent run_step on synthetic leaderboard input_data with the real carla client."""
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from wam_diff_core.codec import ParseError, format_trajectory, parse_trajectory
from wam_diff_core.types import Plan
from wam_diff_ros.carla import agent as agent_mod
from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG, AgentConfig, AgentConfigError
from wam_diff_ros.carla.frames import GeoProjection

carla = pytest.importorskip("carla")

GEO = GeoProjection(49.0, 8.0)


class TextPolicy:
    """DrivingPolicy stand-in: returns fixed model text, parsed by the project codec as plan() does."""

    def __init__(self, text):
        self.text = text
        self.calls = []
        self.targets = []

    def plan(self, images, ego, command, target=None):
        self.calls.append((images, ego, command))
        self.targets.append(target)
        parsed = parse_trajectory(self.text)
        if isinstance(parsed, ParseError):
            return Plan(trajectory=None, valid=False, raw_text={"planning": self.text}, errors={"planning": str(parsed)})
        return Plan(trajectory=parsed, valid=True, raw_text={"planning": self.text})


def straight_route(n=11, step=10.0, yaw=0.0, turn_at=None):
    """Route along CARLA yaw `yaw` from the origin: (gps plan, world plan) as the leaderboard gives them."""
    world, gps = [], []
    for i in range(n):
        x, y = i * step * math.cos(math.radians(yaw)), i * step * math.sin(math.radians(yaw))
        opt = 1 if turn_at == i else 4  # RoadOption.LEFT / LANEFOLLOW values
        world.append((carla.Transform(carla.Location(x=x, y=y), carla.Rotation(yaw=yaw)), opt))
        lat, lon = GEO.to_gnss(x, y)
        gps.append(({"lat": lat, "lon": lon, "z": 0.0}, opt))
    return gps, world


def input_data(frame, x=0.0, y=0.0, yaw=0.0, speed=5.0, bgra=None):
    lat, lon = GEO.to_gnss(x, y)
    compass = math.radians(yaw) + math.pi / 2
    img = np.zeros((90, 160, 4), np.uint8) if bgra is None else bgra
    return {
        "rgb_front": (frame, img),
        "speed": (frame, {"speed": speed}),
        "imu": (frame, np.array([0.1, 0.0, 9.81, 0.0, 0.0, 0.0, compass])),
        "gnss": (frame, np.array([lat, lon, 0.0])),
    }


def make_agent(text, yaw=0.0, turn_at=None, conf=str(DEFAULT_CONFIG)):
    assert agent_mod.get_entry_point() == "WamDiffAgent"
    a = getattr(agent_mod, agent_mod.get_entry_point())("localhost", 2000, False)
    a.set_global_plan(*straight_route(yaw=yaw, turn_at=turn_at))
    policy = TextPolicy(text)
    a.setup(conf, policy=policy)
    return a, policy


STRAIGHT_5MPS = format_trajectory(np.stack([np.arange(1, 9) * 2.5, np.zeros(8)], 1))  # 5 m/s ahead
LEFT_ARC = format_trajectory(np.stack([np.arange(1, 9) * 2.5, 0.05 * (np.arange(1, 9) * 2.5) ** 2], 1))


def test_sensors_come_from_yaml_with_front_camera():
    a, _ = make_agent(STRAIGHT_5MPS)
    sensors = {s["id"]: s for s in a.sensors()}
    assert set(sensors) == {"rgb_front", "speed", "imu", "gnss"}
    cam = sensors["rgb_front"]
    assert cam["type"] == "sensor.camera.rgb" and (cam["width"], cam["height"], cam["fov"]) == (1600, 900, 70)
    assert a.config.plan_every_ticks == 10  # 20 Hz simulation, 2 Hz planning


def test_run_step_returns_vehicle_control_in_range_and_feeds_rgb():
    a, policy = make_agent(STRAIGHT_5MPS)
    bgra = np.zeros((90, 160, 4), np.uint8)
    bgra[..., 0], bgra[..., 1], bgra[..., 2], bgra[..., 3] = 10, 20, 30, 255
    ctrl = a.run_step(input_data(0, speed=2.0, bgra=bgra), 0.0)
    assert isinstance(ctrl, carla.VehicleControl)
    assert 0.0 < ctrl.throttle <= 1.0 and ctrl.brake == 0.0 and abs(ctrl.steer) < 1e-3
    images, ego, command = policy.calls[0]
    assert images[0].shape == (90, 160, 3) and tuple(images[0][0, 0]) == (30, 20, 10)  # BGRA -> RGB
    assert command == "follow lane" and ego.vx == 2.0


def test_left_plan_steers_left_which_is_negative_carla_steer():
    a, _ = make_agent(LEFT_ARC)
    ctrl = a.run_step(input_data(0, speed=5.0), 0.0)
    assert -1.0 <= ctrl.steer < -0.01 and 0.0 <= ctrl.throttle <= 1.0 and 0.0 <= ctrl.brake <= 1.0


def test_garbage_model_text_brakes_and_is_counted():
    a, _ = make_agent("sure! here is the plan: go forward fast")
    for tick in range(12):
        ctrl = a.run_step(input_data(tick, x=0.5 * tick, speed=6.0), tick * 0.05)
        assert isinstance(ctrl, carla.VehicleControl)
        assert ctrl.throttle == 0.0 and ctrl.brake > 0.5 and ctrl.steer == 0.0
    s = a.summary()
    assert s["plans"] == 2 and s["invalid_plans"] == 2 and s["valid_plans"] == 0 and s["brake_ticks"] == 12
    assert "planning" in s["last_errors"][0]


def test_plan_is_held_between_planning_ticks_and_late_plans_brake(tmp_path):
    a, policy = make_agent(STRAIGHT_5MPS)
    for tick in range(10):
        ctrl = a.run_step(input_data(tick, x=0.25 * tick, speed=5.0), tick * 0.05)
        assert ctrl.brake < 1e-6  # tracking 5 m/s at 5 m/s: no braking
    assert len(policy.calls) == 1 and a.summary()["valid_plans"] == 1 and a.summary()["brake_ticks"] == 0
    # same policy, but any wall time counts as late
    conf = tmp_path / "late.yaml"
    conf.write_text(DEFAULT_CONFIG.read_text().replace("late_plan_s: null", "late_plan_s: 1.0e-9"))
    late, _ = make_agent(STRAIGHT_5MPS, conf=str(conf))
    ctrl = late.run_step(input_data(0, speed=5.0), 0.0)
    assert ctrl.throttle == 0.0 and ctrl.brake > 0.5
    assert late.summary()["late_plans"] == 1 and late.summary()["valid_plans"] == 0


def test_route_turn_reaches_the_policy_as_a_command_and_pose_uses_gnss():
    # route heading CARLA yaw 90 (+y_carla); the left-turn option sits 30 m ahead of the start
    a, policy = make_agent(STRAIGHT_5MPS, yaw=90.0, turn_at=3)
    a.run_step(input_data(0, x=0.0, y=0.0, yaw=90.0), 0.0)
    assert policy.calls[-1][2] == "follow lane"
    for tick in range(1, 11):
        a.run_step(input_data(tick, x=0.0, y=12.0, yaw=90.0), tick * 0.05)
    assert policy.calls[-1][2] == "turn left"
    assert a._route.index == 1


def test_route_target_is_the_route_25m_ahead_in_the_ego_frame_with_y_left():
    # route along CARLA yaw 90 (+y_carla); the ego 12 m along it, 2 m to CARLA +x = the ego's left (CARLA y right)
    a, policy = make_agent(STRAIGHT_5MPS, yaw=90.0)
    a.run_step(input_data(0, x=2.0, y=12.0, yaw=90.0), 0.0)
    x, y = policy.targets[-1]
    assert x == pytest.approx(25.0, abs=0.05) and y == pytest.approx(-2.0, abs=0.05)  # the route is on its right


def test_route_target_around_a_carla_right_turn_has_negative_y():
    # 20 m along CARLA +x, then the route turns to CARLA +y: a right turn (CARLA is left-handed, y right)
    world, gps = [], []
    for x, y in [(0.0, 0.0), (10.0, 0.0), (20.0, 0.0), (20.0, 10.0), (20.0, 20.0)]:
        world.append((carla.Transform(carla.Location(x=x, y=y), carla.Rotation(yaw=0.0)), 4))
        lat, lon = GEO.to_gnss(x, y)
        gps.append(({"lat": lat, "lon": lon, "z": 0.0}, 4))
    a = agent_mod.WamDiffAgent("localhost", 2000, False)
    a.set_global_plan(gps, world)
    policy = TextPolicy(STRAIGHT_5MPS)
    a.setup(str(DEFAULT_CONFIG), policy=policy)
    a.run_step(input_data(0, x=0.0, y=0.0, yaw=0.0), 0.0)
    x, y = policy.targets[-1]  # 25 m along: 20 m ahead, then 5 m to the right
    assert x == pytest.approx(20.0, abs=0.05) and y == pytest.approx(-5.0, abs=0.05)


def test_route_planner_ahead_point_projects_the_ego_between_sparse_points_and_stops_at_the_end():
    from wam_diff_ros.carla.route_planner import RoutePlanner

    rp = RoutePlanner([(0.0, 0.0), (50.0, 0.0), (100.0, 0.0)], [4, 4, 4])
    rp.update((20.0, 1.0))  # nearest point is (0, 0), 20 m behind the ego
    np.testing.assert_allclose(rp.ahead_point((20.0, 1.0)), [45.0, 0.0])
    rp.update((90.0, 0.0))
    np.testing.assert_allclose(rp.ahead_point((90.0, 0.0)), [100.0, 0.0])  # the route ends 10 m ahead


def test_shift_plan_moves_along_the_trajectory_in_time():
    from wam_diff_ros.carla.plan_tracking import shift_plan

    traj = np.stack([np.arange(1, 9) * 2.5, np.zeros(8)], 1)
    np.testing.assert_allclose(shift_plan(traj, 0.0), traj)
    np.testing.assert_allclose(shift_plan(traj, 0.25)[:, 0], np.arange(1, 9) * 2.5 + 1.25)  # incl. extrapolation
    curve = np.stack([np.arange(1, 9) * 2.5, 0.1 * np.arange(1, 9) ** 2], 1)
    np.testing.assert_allclose(shift_plan(curve, 1.0)[:6], curve[2:])  # 1 s later = two waypoints on


def test_bad_sensor_yaml_is_rejected_naming_the_field(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text(DEFAULT_CONFIG.read_text().replace("fov: 70", "fov: wide"))
    with pytest.raises(AgentConfigError, match="'fov'"):
        AgentConfig.load(conf)
    conf.write_text(DEFAULT_CONFIG.read_text().replace("cameras: [rgb_front]", "cameras: [rgb_back]"))
    with pytest.raises(AgentConfigError, match="rgb_back"):
        AgentConfig.load(conf)


def test_decoding_yaml_is_checked_at_load_naming_the_bad_key_or_value():
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    # the shipped model with its own decoding settings: the YAML's decoding section sets nothing
    assert data["model"] == "nano-s-b32" and data["decoding"] is None and AgentConfig.from_dict(data).decoding == {}
    assert AgentConfig.from_dict({**data, "decoding": {"steps": 2}}).decoding == {"steps": 2}
    for bad, match in (({"stepz": 2}, r"decoding: unknown decoding settings \['stepz'\]"),
                       ({"strategy": "fancy"}, "strategy 'fancy'"), ([2], "mapping of DecoderConfig fields")):
        with pytest.raises(AgentConfigError, match=match):
            AgentConfig.from_dict({**data, "decoding": bad}, "agent.yaml")
    assert AgentConfig.from_dict({**data, "decoding": None}).decoding == {}


def test_destroy_writes_counters_and_comfort_signals(tmp_path, monkeypatch):
    monkeypatch.setenv("SAVE_PATH", str(tmp_path))
    # the evaluator appends '+<save_name>' to the same string for every route
    a, _ = make_agent(STRAIGHT_5MPS, conf=f"{DEFAULT_CONFIG}+RouteScenario_0_rep0_old+RouteScenario_1_rep0_Town01_x")
    for tick in range(4):
        a.run_step(input_data(tick, x=0.25 * tick), tick * 0.05)
    a.destroy()
    import json

    out = json.loads((tmp_path / "RouteScenario_1_rep0_Town01_x" / "wam_diff_agent.json").read_text())
    assert out["stats"]["ticks"] == 4 and out["stats"]["valid_plans"] == 1
    assert out["comfort"]["dt"] == pytest.approx(0.1) and len(out["comfort"]["lon_accel"]) == 2


def test_real_nano_policy_through_setup_gives_counted_brakes_on_its_untrained_text(tmp_path):
    """setup() loads DrivingPolicy from the YAML; the untrained nano preset writes garbage, which must come
    out as an invalid plan and a brake, never an exception."""
    pytest.importorskip("wam_diff_core.policy")
    conf = tmp_path / "nano.yaml"
    conf.write_text(DEFAULT_CONFIG.read_text().replace("model: nano-s-b32", "model: nano").replace("device: cuda", "device: cpu")
                    .replace("# steps: 2", "steps: 2").replace("image_size: null", "image_size: [64, 36]"))
    a = agent_mod.WamDiffAgent("localhost", 2000, False)
    a.set_global_plan(*straight_route())
    a.setup(str(conf))
    assert (a.policy.config.steps, a.policy.config.backend) == (2, "sdpa")  # the rest: the checkpoint's own
    assert a.policy.config.block_size == a.policy.loaded.settings.decoding.block_size
    ctrl = a.run_step(input_data(0, speed=4.0, bgra=np.full((90, 160, 4), 127, np.uint8)), 0.0)
    assert isinstance(ctrl, carla.VehicleControl)
    s = a.summary()
    assert s["plans"] == 1
    if s["invalid_plans"]:  # the expected case for an untrained model
        assert ctrl.throttle == 0.0 and ctrl.brake > 0.5 and s["brake_ticks"] == 1
    else:  # a parseable plan by chance: then it is tracked
        assert s["valid_plans"] == 1 and 0.0 <= ctrl.throttle <= 1.0 and 0.0 <= ctrl.brake <= 1.0
    a.destroy()


LEADERBOARD_STUB = '''
from enum import Enum

class Track(Enum):
    SENSORS = "SENSORS"
    MAP = "MAP"

class AutonomousAgent(object):
    def __init__(self, carla_host, carla_port, debug=False):
        self.track = Track.SENSORS
        self._global_plan = None
        self._global_plan_world_coord = None
        self.hero_actor = None

    @staticmethod
    def get_ros_version():
        return -1

    def set_global_plan(self, global_plan_gps, global_plan_world_coord):
        self._global_plan = global_plan_gps
        self._global_plan_world_coord = global_plan_world_coord
'''

EVALUATOR_STYLE_SETUP = """
import importlib, json, math, os, sys
sys.path.insert(0, {stub_root!r})
agent_path = {agent_path!r}
# as leaderboard_evaluator.py loads an agent: by file path, module named after the file
sys.path.insert(0, os.path.dirname(agent_path))
module = importlib.import_module(os.path.basename(agent_path).split(".")[0])
cls = getattr(module, getattr(module, "get_entry_point")())
assert cls.get_ros_version() == -1
from leaderboard.autoagents.autonomous_agent import AutonomousAgent, Track
import carla
assert carla.Client("localhost", 1).get_client_version() == "0.9.15", "the real client, not our package dir"
agent = cls("localhost", 2000, 0)
assert isinstance(agent, AutonomousAgent) and agent.track is Track.SENSORS
from wam_diff_ros.carla.frames import GeoProjection
world = [(carla.Transform(carla.Location(x=10.0 * i, y=0.0)), 4) for i in range(10)]
gps = [(dict(zip(("lat", "lon"), GeoProjection(49.0, 8.0).to_gnss(10.0 * i, 0.0)), z=0.0), 4) for i in range(10)]
agent.set_global_plan(gps, world)
agent.setup({conf!r} + "+RouteScenario_0_rep0_Town01_x")  # the evaluator appends '+<save_name>'
settings = agent.policy.loaded.settings
print(json.dumps({{"entry": cls.__name__, "model": settings.name, "decoding": dict(vars(agent.policy.config)),
                  "sensors": [s["id"] for s in agent.sensors()], "checkpoint_block_size": settings.decoding.block_size}}))
"""


def test_agent_loads_by_path_and_sets_up_like_the_evaluator_with_the_shipped_model_and_its_decoding(tmp_path):
    """The evaluator: sys.path.insert(0, dirname(agent.py)); importlib.import_module('agent'); get_entry_point();
    get_ros_version(); cls(host, port, debug); set_global_plan(gps, world); setup(conf + '+' + save_name)."""
    import json
    import subprocess
    import sys

    pkg = tmp_path / "leaderboard" / "autoagents"
    pkg.mkdir(parents=True)
    (tmp_path / "leaderboard" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "autonomous_agent.py").write_text(LEADERBOARD_STUB)
    conf = tmp_path / "agent.yaml"  # the default YAML on the CPU
    conf.write_text(DEFAULT_CONFIG.read_text().replace("device: cuda", "device: cpu"))
    code = EVALUATOR_STYLE_SETUP.format(stub_root=str(tmp_path), agent_path=str(Path(agent_mod.__file__).resolve()),
                                        conf=str(conf))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["entry"] == "WamDiffAgent" and out["model"] == "nano-s-b32"
    assert out["sensors"] == ["rgb_front", "speed", "imu", "gnss"]
    shipped = json.loads((Path(agent_mod.__file__).resolve().parents[2] / "models" / "nano-s-b32" / "wam_diff.json").read_text())
    for key, value in shipped["decoding"].items():  # the checkpoint's own decoding, nothing forced by the YAML
        assert out["decoding"][key] == value, key
    assert out["decoding"]["block_size"] == 32 == out["checkpoint_block_size"]


def test_steer_is_normalised_by_the_hero_full_lock():
    from types import SimpleNamespace

    from wam_diff_ros.carla.frames import carla_steer

    assert carla_steer(math.radians(10.0), math.radians(70.0)) == pytest.approx(-1 / 7)
    assert carla_steer(-math.radians(80.0), math.radians(70.0)) == 1.0  # right turn beyond full lock
    a, _ = make_agent(LEFT_ARC)
    ctrl_default = a.run_step(input_data(0, speed=5.0), 0.0)  # no hero: the controller's 35 deg lock
    b, _ = make_agent(LEFT_ARC)
    wheels = [SimpleNamespace(max_steer_angle=70.0)] * 4
    b.hero_actor = SimpleNamespace(get_physics_control=lambda: SimpleNamespace(wheels=wheels))
    ctrl_hero = b.run_step(input_data(0, speed=5.0), 0.0)
    assert ctrl_hero.steer == pytest.approx(ctrl_default.steer / 2, rel=1e-5) and ctrl_hero.steer < 0
