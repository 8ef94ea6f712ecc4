"""GNSS noise as the leaderboard adds it, and what it does to the agent's steering with and without the filter.

The leaderboard's GNSS set-up adds N(0, 5e-6 deg) to latitude and to longitude at every reading: at the
geo-reference of CARLA's towns (49 N, 8 E) that is 0.557 m along CARLA y (north-south) and 0.365 m along
x. Its compass and speedometer are exact; its gyroscope has N(0, 0.001 rad/s). The closed loop below drives
the agent's own run_step (route planner, held plan, controller, CARLA steer) on a kinematic bicycle with
those sensors, and a policy that always returns the lane centre in the true ego frame (a perfect plan): any
steering jitter comes from the pose, not from the plan.
"""
import math

import numpy as np
import pytest
import yaml

from wam_diff_core.types import Plan
from wam_diff_ros.carla import agent as agent_mod
from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG, AgentConfig, AgentConfigError
from wam_diff_ros.carla.frames import GeoProjection, world_to_ego
from wam_diff_ros.carla.gnss_filter import LEADERBOARD_GNSS_STD_DEG, GnssFilterConfig, PositionFilter

GEO = GeoProjection(49.0, 8.0)
DT = 0.05            # the leaderboard's 20 Hz
WHEELBASE = 2.9      # the agent YAML's controller wheelbase (Lincoln MKZ)
GYRO_STD = 0.001     # rad/s, the leaderboard's noise_gyro_stddev_z
LEVER = GnssFilterConfig().gnss_ahead_of_rear_axle_m  # the vehicle origin (and GNSS) ahead of the rear axle


class Road:
    """Lane centre in the right-handed world frame: a straight along +x, or a left arc of `radius` from the origin."""

    def __init__(self, radius=None):
        self.radius = radius

    def point(self, s):
        s = np.asarray(s, dtype=np.float64)
        if self.radius is None:
            return np.stack([s, np.zeros_like(s)], axis=-1)
        a = s / self.radius
        return np.stack([self.radius * np.sin(a), self.radius * (1.0 - np.cos(a))], axis=-1)

    def project(self, xy):
        """(arc length, signed offset to the left of the lane centre) of a point."""
        x, y = xy
        if self.radius is None:
            return float(x), float(y)
        dx, dy = x, y - self.radius
        return self.radius * math.atan2(dx, -dy), self.radius - math.hypot(dx, dy)


class Drive:
    """A kinematic bicycle (rear axle at x_r, y_r; right-handed yaw; speed at the rear axle) with extra tyre
    slip, its leaderboard-like sensors at the vehicle origin (LEVER ahead of the rear axle, where the agent's
    GNSS sits), and the perfect policy: the lane centre ahead in the true ego frame."""

    def __init__(self, road, speed=8.0, seed=0, slip_rad_per_mps2=0.0, gnss_std_deg=LEADERBOARD_GNSS_STD_DEG):
        self.road, self.speed, self.slip, self.gnss_std = road, speed, slip_rad_per_mps2, gnss_std_deg
        self.rng = np.random.default_rng(seed)
        self.x_r, self.y_r, self.yaw, self.yaw_rate = -LEVER, 0.0, 0.0, 0.0

    @property
    def xy(self):
        """The vehicle origin (right-handed world, m)."""
        return self.x_r + LEVER * math.cos(self.yaw), self.y_r + LEVER * math.sin(self.yaw)

    def plan(self, images, ego, command, target=None):  # DrivingPolicy.plan's signature
        s0, _ = self.road.project(self.xy)
        ahead = self.road.point(s0 + self.speed * 0.5 * np.arange(1, 9))
        return Plan(trajectory=world_to_ego(ahead, self.xy, self.yaw), valid=True)

    def input_data(self, frame):
        x, y = self.xy
        lat, lon = GEO.to_gnss(x, -y)
        lat, lon = lat + self.rng.normal(0.0, self.gnss_std), lon + self.rng.normal(0.0, self.gnss_std)
        gyro_z = -self.yaw_rate + self.rng.normal(0.0, GYRO_STD)  # CARLA: + turns right
        imu = np.array([0.0, 0.0, 9.81, 0.0, 0.0, gyro_z, math.pi / 2 - self.yaw])
        return {"rgb_front": (frame, np.zeros((9, 16, 4), np.uint8)), "speed": (frame, {"speed": self.speed}),
                "imu": (frame, imu), "gnss": (frame, np.array([lat, lon, 0.0]))}

    def advance(self, wheel_angle, substeps=10):
        h = DT / substeps
        for _ in range(substeps):
            self.yaw_rate = self.speed * math.tan(wheel_angle) / WHEELBASE
            slip = self.slip * self.speed * self.yaw_rate  # unmodelled tyre slip, growing with lateral acceleration
            self.x_r += self.speed * math.cos(self.yaw + slip) * h
            self.y_r += self.speed * math.sin(self.yaw + slip) * h
            self.yaw += self.yaw_rate * h


def route_plan(road, length=400.0):
    carla = pytest.importorskip("carla")
    world, gps = [], []
    for s in np.arange(0.0, length, 5.0):
        x, y_rh = road.point(s)
        world.append((carla.Transform(carla.Location(x=float(x), y=float(-y_rh))), 4))
        lat, lon = GEO.to_gnss(float(x), float(-y_rh))
        gps.append(({"lat": lat, "lon": lon, "z": 0.0}, 4))
    return gps, world


def drive(road, filtered, seconds=20.0, seed=0, slip=0.0, gnss_std_deg=LEADERBOARD_GNSS_STD_DEG):
    """Run the agent's run_step in closed loop; per tick: CARLA steer, lane offset (m, + left) and the agent's
    pose error (m; NaN without the filter)."""
    sim = Drive(road, seed=seed, slip_rad_per_mps2=slip, gnss_std_deg=gnss_std_deg)
    a = agent_mod.WamDiffAgent("localhost", 2000, False)
    a.set_global_plan(*route_plan(road))
    a.setup(str(DEFAULT_CONFIG), policy=sim)
    a.config.gnss_filter = GnssFilterConfig(enabled=filtered)
    steer, offset, pose_err = [], [], []
    for tick in range(int(seconds / DT)):
        ctrl = a.run_step(sim.input_data(tick), tick * DT)
        steer.append(ctrl.steer)
        offset.append(sim.road.project(sim.xy)[1])
        pose_err.append(float(np.hypot(*(a._gnss.position - sim.xy))) if a._gnss is not None else float("nan"))
        sim.advance(-ctrl.steer * a._max_steer_rad())
    return np.array(steer), np.array(offset), np.array(pose_err)


def test_noise_model_is_the_leaderboards_5e6_degrees_which_is_0_56_m_north_south():
    sx, sy = GEO.gnss_noise_m(LEADERBOARD_GNSS_STD_DEG)
    assert sy == pytest.approx(0.5566, abs=1e-3) and sx == pytest.approx(0.5566 * math.cos(math.radians(49.0)), abs=1e-3)
    lat, lon = GEO.to_gnss(30.0, -40.0)
    x, y = GEO.to_world(lat + LEADERBOARD_GNSS_STD_DEG, lon + LEADERBOARD_GNSS_STD_DEG)
    assert abs(y + 40.0) == pytest.approx(sy, rel=1e-3) and abs(x - 30.0) == pytest.approx(sx, rel=1e-3)


def test_standing_still_the_filter_averages_fixes_to_a_quarter_of_their_noise():
    rng = np.random.default_rng(1)
    f = PositionFilter(GnssFilterConfig(), (0.56, 0.56))
    fixes = rng.normal(0.0, 0.56, (400, 2))
    est = np.array([f.update(fix, 0.0, 0.3, 0.0, k * DT) for k, fix in enumerate(fixes)])
    err, raw = np.hypot(*est[200:].T), np.hypot(*fixes[200:].T)
    assert err.mean() < raw.mean() / 4 and err.max() < 0.3 and f.resets == 0


def test_a_jump_beyond_reset_m_or_a_gap_in_time_restarts_the_filter_at_the_fix():
    f = PositionFilter(GnssFilterConfig(reset_m=10.0, max_gap_s=1.0), (0.5, 0.5))
    for k in range(20):
        f.update((0.0, 0.0), 0.0, 0.0, 0.0, k * DT)
    np.testing.assert_allclose(f.update((30.0, 5.0), 0.0, 0.0, 0.0, 20 * DT), [30.0, 5.0])
    np.testing.assert_allclose(f.update((31.0, 5.0), 0.0, 0.0, 0.0, 20 * DT + 2.0), [31.0, 5.0])
    assert f.resets == 2


def test_on_a_circle_dead_reckoning_from_speed_compass_and_yaw_rate_keeps_the_estimate_within_0_15_m():
    radius, speed, lever = 20.0, 8.0, 1.45
    w, rng = speed / radius, np.random.default_rng(2)
    cfg = GnssFilterConfig(gnss_ahead_of_rear_axle_m=lever)
    errors = {}
    for name, told_speed in (("dead reckoning", speed), ("fixes only", 0.0)):
        f, err = PositionFilter(cfg, (0.56, 0.56)), []
        for k in range(200):  # 10 s, 1.3 turns
            t = k * DT
            rear = np.array([radius * math.sin(w * t), radius * (1 - math.cos(w * t))])
            gnss = rear + lever * np.array([math.cos(w * t), math.sin(w * t)])
            est = f.update(gnss + rng.normal(0.0, 0.56, 2), told_speed, w * t, w if told_speed else 0.0, t)
            err.append(np.hypot(*(est - gnss)))
        errors[name] = float(np.mean(err[40:]))
    assert errors["dead reckoning"] < 0.15 and errors["fixes only"] > 1.0, errors


def test_bad_gnss_filter_yaml_is_rejected_naming_the_field():
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert AgentConfig.from_dict(data).gnss_filter == GnssFilterConfig()  # the YAML states the defaults
    with pytest.raises(AgentConfigError, match="gnss_filter: speed_std_mps must be a positive number, got -1"):
        AgentConfig.from_dict({**data, "gnss_filter": {"speed_std_mps": -1}}, "agent.yaml")
    with pytest.raises(AgentConfigError, match=r"unknown gnss_filter keys \['std'\]"):
        AgentConfig.from_dict({**data, "gnss_filter": {"std": 1.0}}, "agent.yaml")


def test_with_leaderboard_gnss_noise_and_a_perfect_plan_steering_std_on_a_straight_is_under_0_02():
    pytest.importorskip("carla")
    raw, raw_offset, _ = drive(Road(), filtered=False)
    flt, flt_offset, pose_err = drive(Road(), filtered=True)
    # from 2 s on: the filter starts at the first fix and converges within ~1 s (a route starts at rest; this
    # drive starts at 8 m/s, the harder case)
    after = slice(40, None)
    raw, flt = raw[after], flt[after]
    print(f"straight 8 m/s, CARLA steer: raw GNSS std {raw.std():.4f} max {np.abs(raw).max():.4f}; "
          f"filtered std {flt.std():.4f} max {np.abs(flt).max():.4f}; lane offset |max| raw "
          f"{np.abs(raw_offset[after]).max():.3f} m filtered {np.abs(flt_offset[after]).max():.3f} m; pose error mean "
          f"{pose_err[after].mean():.3f} m")
    assert raw.std() > 0.05  # the jitter the filter removes is there without it
    assert flt.std() < 0.02 and np.abs(flt).max() < 0.05
    assert np.abs(flt_offset[after]).max() < 0.15


def test_on_a_30_m_curve_the_filtered_agent_drives_within_0_15_m_of_a_noise_free_one():
    pytest.importorskip("carla")
    road = Road(radius=30.0)  # 8 m/s: 2.1 m/s^2 lateral; unmodelled tyre slip 0.5 degrees on top
    steer, offset, pose_err = drive(road, filtered=True, seconds=10.0, slip=0.004)
    exact_steer, exact_offset, _ = drive(road, filtered=False, seconds=10.0, slip=0.004, gnss_std_deg=0.0)
    raw_steer, raw_offset, _ = drive(road, filtered=False, seconds=10.0, slip=0.004)
    after = slice(40, None)
    print(f"curve R 30 m at 8 m/s: lane offset filtered {offset[after].mean():+.3f} m (|max| {np.abs(offset[after]).max():.3f}), "
          f"exact pose {exact_offset[after].mean():+.3f} m (|max| {np.abs(exact_offset[after]).max():.3f}), raw GNSS |max| "
          f"{np.abs(raw_offset[after]).max():.3f} m; pose error mean {pose_err[after].mean():.3f} m max {pose_err[after].max():.3f} m; "
          f"steer std filtered {steer[after].std():.4f} exact {exact_steer[after].std():.4f} raw {raw_steer[after].std():.4f}")
    assert np.abs(offset[after] - exact_offset[after]).max() < 0.15
    assert pose_err[after].mean() < 0.2
    assert steer[after].std() < 0.02 and abs(steer[after].mean() - exact_steer[after].mean()) < 0.005
