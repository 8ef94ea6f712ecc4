"""CARLA <-> ego frame conversion: the only place the project meets CARLA's left-handed axes.

CARLA world: x forward/east, y right/south, z up (left-handed); yaw in degrees, positive turning
from +x toward +y (clockwise seen from above). The project's ego frame (docs/architecture.md): x forward,
y left, metres; headings in radians, counter-clockwise positive. In between we use a right-handed
"world" frame with y flipped: (x, y_rh) = (x_carla, -y_carla), heading_rh = -yaw_carla.

Also here: IMU compass -> heading, GNSS (lat, lon) <-> CARLA world metres (the leaderboard's
Mercator projection around the map's geo-reference) and its fit from the route.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from wam_diff_core.types import EgoState

EARTH_RADIUS_M = 6378137.0  # equatorial radius used by CARLA and the leaderboard


def carla_yaw_to_heading(yaw_deg: float) -> float:
    """CARLA yaw (degrees, clockwise seen from above) -> right-handed heading (radians, CCW)."""
    return -math.radians(yaw_deg)


def heading_to_carla_yaw(heading: float) -> float:
    """Right-handed heading (radians, CCW) -> CARLA yaw (degrees)."""
    return -math.degrees(heading)


def compass_to_heading(compass: float) -> float:
    """IMU compass (radians clockwise from north = CARLA -y) -> right-handed heading (radians, CCW).

    A vehicle with CARLA yaw psi reads compass = psi + pi/2, so heading = -psi = pi/2 - compass.
    NaN compass (seen on the first frames) -> 0 is left to the caller.
    """
    return math.pi / 2.0 - compass


def wrap_angle(angle):
    """Wrap radians to [-pi, pi)."""
    return (np.asarray(angle) + np.pi) % (2.0 * np.pi) - np.pi


def carla_to_rh(points) -> np.ndarray:
    """CARLA world points (N, 2+) -> right-handed world (N, 2): y flipped."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, np.shape(points)[-1])[:, :2]
    return np.stack([p[:, 0], -p[:, 1]], axis=1)


def rh_to_carla(points) -> np.ndarray:
    """Right-handed world points (N, 2) -> CARLA world (N, 2): y flipped (its own inverse)."""
    return carla_to_rh(points)


def world_to_ego(points_rh, ego_xy_rh, heading: float) -> np.ndarray:
    """Right-handed world points (N, 2) -> ego frame of a vehicle at ego_xy_rh with `heading` (rad, CCW)."""
    d = np.asarray(points_rh, dtype=np.float64).reshape(-1, 2) - np.asarray(ego_xy_rh, dtype=np.float64)[:2]
    c, s = math.cos(heading), math.sin(heading)
    return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=1)


def ego_to_world(points_ego, ego_xy_rh, heading: float) -> np.ndarray:
    """Inverse of world_to_ego."""
    p = np.asarray(points_ego, dtype=np.float64).reshape(-1, 2)
    c, s = math.cos(heading), math.sin(heading)
    x0, y0 = np.asarray(ego_xy_rh, dtype=np.float64)[:2]
    return np.stack([x0 + c * p[:, 0] - s * p[:, 1], y0 + s * p[:, 0] + c * p[:, 1]], axis=1)


def carla_to_ego(points_carla, ego_location_carla, ego_yaw_deg: float) -> np.ndarray:
    """CARLA world points (N, 2+) -> ego frame (N, 2) of a vehicle at a CARLA location and yaw (degrees)."""
    return world_to_ego(carla_to_rh(points_carla), carla_to_rh(ego_location_carla)[0], carla_yaw_to_heading(ego_yaw_deg))


def ego_to_carla(points_ego, ego_location_carla, ego_yaw_deg: float) -> np.ndarray:
    """Ego frame points (N, 2) -> CARLA world (N, 2); inverse of carla_to_ego."""
    rh = ego_to_world(points_ego, carla_to_rh(ego_location_carla)[0], carla_yaw_to_heading(ego_yaw_deg))
    return rh_to_carla(rh)


def carla_vector_to_ego(vector_carla, ego_yaw_deg: float) -> np.ndarray:
    """A CARLA world vector (velocity, acceleration; (2+,)) expressed in the ego frame (2,)."""
    return world_to_ego(carla_to_rh([vector_carla]), (0.0, 0.0), carla_yaw_to_heading(ego_yaw_deg))[0]


def sensor_vector_to_ego(vector_sensor) -> np.ndarray:
    """A vector in a CARLA sensor/vehicle frame (x forward, y right) -> ego frame (x forward, y left)."""
    v = np.asarray(vector_sensor, dtype=np.float64)
    return np.array([v[0], -v[1]])


def ego_state_from_imu(speed: float, accelerometer: Sequence[float], gyroscope: Sequence[float]) -> EgoState:
    """EgoState from the speedometer (m/s, forward) and the IMU (m/s^2 and rad/s in CARLA's
    left-handed vehicle frame). A positive CARLA gyro z turns right, so the ego yaw rate is -gz."""
    acc = sensor_vector_to_ego(accelerometer[:2])
    gz = float(gyroscope[2])

    def finite(v: float) -> float:
        v = float(v)
        return v if math.isfinite(v) else 0.0

    return EgoState(vx=finite(speed), vy=0.0, ax=finite(acc[0]), ay=finite(acc[1]), yaw_rate=finite(-gz))


def ego_state_from_carla(velocity, acceleration, angular_velocity_deg, ego_yaw_deg: float) -> EgoState:
    """EgoState from CARLA actor world vectors (m/s, m/s^2) and angular velocity (deg/s, CARLA axes)."""
    v = carla_vector_to_ego(velocity, ego_yaw_deg)
    a = carla_vector_to_ego(acceleration, ego_yaw_deg)
    return EgoState(vx=float(v[0]), vy=float(v[1]), ax=float(a[0]), ay=float(a[1]),
                    yaw_rate=-math.radians(float(angular_velocity_deg[2])))


# ---------------------------------------------------------------- GNSS <-> CARLA world metres

def _merc_y(lat_deg: float) -> float:
    return math.log(math.tan((90.0 + lat_deg) * math.pi / 360.0))


@dataclass(frozen=True)
class GeoProjection:
    """The leaderboard's world <-> GNSS mapping around a geo-reference (lat_ref, lon_ref), degrees.

    Forward (leaderboard `_location_to_gps`): Mercator scaled by cos(lat_ref), CARLA y points south.
    """

    lat_ref: float = 0.0
    lon_ref: float = 0.0

    @property
    def scale(self) -> float:
        return math.cos(math.radians(self.lat_ref))

    def to_gnss(self, x: float, y: float) -> tuple[float, float]:
        """CARLA world (x, y) metres -> (lat, lon) degrees."""
        s = self.scale
        mx = s * self.lon_ref * math.pi * EARTH_RADIUS_M / 180.0 + x
        my = s * EARTH_RADIUS_M * _merc_y(self.lat_ref) - y
        lon = mx * 180.0 / (math.pi * EARTH_RADIUS_M * s)
        lat = 360.0 * math.atan(math.exp(my / (EARTH_RADIUS_M * s))) / math.pi - 90.0
        return lat, lon

    def gnss_noise_m(self, std_deg: float) -> tuple[float, float]:
        """GNSS noise of `std_deg` degrees on latitude and longitude as (x, y) metres near the reference:
        longitude moves x by R cos(lat_ref) per radian, latitude moves y by R per radian."""
        per_rad = math.radians(std_deg) * EARTH_RADIUS_M
        return per_rad * self.scale, per_rad

    def to_world(self, lat: float, lon: float) -> tuple[float, float]:
        """(lat, lon) degrees -> CARLA world (x, y) metres; exact inverse of to_gnss."""
        s = self.scale
        x = (lon - self.lon_ref) * math.pi * EARTH_RADIUS_M * s / 180.0
        y = s * EARTH_RADIUS_M * (_merc_y(self.lat_ref) - _merc_y(lat))
        return x, y

    @classmethod
    def fit(cls, gnss: Sequence[Sequence[float]], world: Sequence[Sequence[float]]) -> "GeoProjection":
        """The geo-reference from matching route points: gnss (N, 2+) (lat, lon), world (N, 2+) CARLA x, y.

        Each pair fixes lat_ref by a 1-D root find of the y equation, then lon_ref from x; the
        median over pairs is returned. Raises ValueError on empty or mismatched input.
        """
        g = np.asarray(gnss, dtype=np.float64)
        w = np.asarray(world, dtype=np.float64)
        if g.ndim != 2 or w.ndim != 2 or g.shape[0] == 0 or g.shape[0] != w.shape[0]:
            raise ValueError(f"GeoProjection.fit needs matching non-empty (N, 2) arrays, got {g.shape} and {w.shape}")
        lat_refs, lon_refs = [], []
        for (lat, lon), (x, y) in zip(g[:, :2], w[:, :2]):
            def f(lat_ref: float) -> float:
                s = math.cos(math.radians(lat_ref))
                return s * EARTH_RADIUS_M * (_merc_y(lat_ref) - _merc_y(lat)) - y

            lo, hi = max(lat - 5.0, -89.0), min(lat + 5.0, 89.0)
            flo = f(lo)
            for _ in range(200):  # bisection; f increases with lat_ref near lat
                mid = 0.5 * (lo + hi)
                fm = f(mid)
                if (fm > 0) == (flo > 0):
                    lo, flo = mid, fm
                else:
                    hi = mid
                if hi - lo < 1e-13:
                    break
            lat_ref = 0.5 * (lo + hi)
            s = math.cos(math.radians(lat_ref))
            lat_refs.append(lat_ref)
            lon_refs.append(lon - x * 180.0 / (math.pi * EARTH_RADIUS_M * s))
        return cls(float(np.median(lat_refs)), float(np.median(lon_refs)))


# ---------------------------------------------------------------- steering

def carla_steer(steer_rad: float, max_steer_rad: float, scale: float = 1.0) -> float:
    """Front-wheel angle (rad, + left, the controller's) -> CARLA steer in [-1, 1] (+ right), for a
    vehicle whose full lock is `max_steer_rad`."""
    if not max_steer_rad > 0:
        raise ValueError(f"max_steer_rad must be > 0, got {max_steer_rad!r}")
    return float(np.clip(-scale * steer_rad / max_steer_rad, -1.0, 1.0))


def vehicle_max_steer_rad(actor) -> "float | None":
    """Full-lock front-wheel angle of a CARLA vehicle (physics control, degrees -> rad); None if unknown."""
    try:
        wheels = actor.get_physics_control().wheels
        angle = max(float(w.max_steer_angle) for w in wheels[:2])
    except Exception:  # no actor, no physics (fakes), server error: the caller falls back
        return None
    return math.radians(angle) if angle > 0 else None
