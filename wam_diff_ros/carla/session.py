"""A synchronous CARLA session: connect, fixed 0.05 s steps, ego + sensors, tick, clean up.

No ROS here (the bridge node wraps it). Connecting to a dead server fails within the client
timeout with CarlaConnectionError naming host:port and the timeout. On close (normal exit or
error) the session destroys every actor it spawned and restores the world settings it found
(asynchronous mode), each step guarded so one failure does not skip the others.
"""
from __future__ import annotations

import math
import queue
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from wam_diff_core.errors import WamDiffError
from wam_diff_ros.carla.agent_config import validate_sensors

SENSOR_TIMEOUT_S = 10.0


class CarlaConnectionError(WamDiffError, RuntimeError):
    """No CARLA server answered; the message names host:port and the timeout."""


def probe(host: str, port: int, timeout_s: float) -> None:
    """TCP check of the RPC port before the CARLA client touches it: the client library aborts the
    whole process (C++ terminate) on some network errors, e.g. an unreachable host."""
    try:
        with socket.create_connection((str(host), int(port)), timeout=float(timeout_s)):
            pass
    except socket.gaierror as exc:
        raise CarlaConnectionError(f"cannot resolve CARLA host {host!r} ({exc}); pass the right --host") from None
    except OSError as exc:
        reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else (exc.strerror or str(exc))
        raise CarlaConnectionError(
            f"no CARLA server at {host}:{port} ({reason}; client timeout {timeout_s:g} s); start one "
            f"(CarlaUE4.sh -carla-rpc-port={port}) or pass the right --host/--port") from None


_CHECK = """
import sys, carla
client = carla.Client(sys.argv[1], int(sys.argv[2]))
client.set_timeout(float(sys.argv[3]))
try:
    print(client.get_server_version(), flush=True)
except RuntimeError as exc:
    print(exc, file=sys.stderr, flush=True)
    sys.exit(3)
"""


def check_server(host: str, port: int, timeout_s: float) -> str:
    """The server's CARLA version, asked from a child process: the client library aborts its
    process (std::terminate) when something that is not CARLA answers on the port."""
    cmd = [sys.executable, "-c", _CHECK, str(host), str(int(port)), str(float(timeout_s))]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=float(timeout_s) + 30.0)
    except subprocess.TimeoutExpired:  # run() kills the child before raising
        raise CarlaConnectionError(f"no CARLA server answered at {host}:{port}: the version query did not return "
                                   f"within {timeout_s:g} s + 30 s") from None
    if res.returncode == 0:
        return res.stdout.strip()
    if res.returncode == 3:
        raise CarlaConnectionError(
            f"no CARLA server answered at {host}:{port} within the {timeout_s:g} s client timeout "
            f"({res.stderr.strip()}); start one (CarlaUE4.sh -carla-rpc-port={port}) or pass the right --host/--port")
    raise CarlaConnectionError(
        f"something at {host}:{port} accepted the connection but did not answer as a CARLA server within "
        f"{timeout_s:g} s (the CARLA client exited with {res.returncode}: {res.stderr.strip()[-200:]})")


def connect(host: str, port: int, timeout_s: float):
    """(client, world) of the server at host:port; CarlaConnectionError, naming host:port and the
    timeout, when nothing answers within `timeout_s` (a refused port fails at once)."""
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    probe(host, port, timeout_s)
    server_version = check_server(host, port, timeout_s)
    import carla

    try:
        client = carla.Client(str(host), int(port))
        client.set_timeout(float(timeout_s))
        world = client.get_world()
    except RuntimeError as exc:
        raise CarlaConnectionError(
            f"no CARLA server answered at {host}:{port} within the {timeout_s:g} s client timeout ({exc})") from None
    if server_version != client.get_client_version():
        print(f"warning: CARLA server {server_version} at {host}:{port}, client {client.get_client_version()}; "
              f"Bench2Drive expects 0.9.15 on both sides", file=sys.stderr)
    return client, world


@dataclass
class SessionConfig:
    fixed_delta_s: float = 0.05
    town: Optional[str] = None                       # load this map first; None keeps the current one
    vehicle: str = "vehicle.lincoln.mkz_2020"
    spawn_point: int = 0                             # index into world.get_map().get_spawn_points()
    role_name: str = "hero"
    sensors: list = field(default_factory=list)      # leaderboard sensor dicts (agent_config.validate_sensors)


class CarlaSession:
    """Context manager over a connected world; `carla_module` is injectable for tests."""

    def __init__(self, client, world, config: SessionConfig, carla_module=None):
        if carla_module is None:
            import carla as carla_module
        self.carla = carla_module
        self.client, self.world, self.cfg = client, world, config
        self.cfg.sensors = validate_sensors(config.sensors, "session")
        self.ego = None
        self.sensors: dict[str, Any] = {}
        self._queues: dict[str, queue.Queue] = {}
        self._original_settings = None
        self.closed = False

    # ------------------------------------------------------------------ setup
    def __enter__(self) -> "CarlaSession":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        c = self.carla
        if self.cfg.town:
            self.world = self.client.load_world(self.cfg.town)
        self._original_settings = self.world.get_settings()
        settings = self.world.get_settings()
        settings.synchronous_mode = True
        settings.fixed_delta_seconds = self.cfg.fixed_delta_s
        self.world.apply_settings(settings)
        bp = self.world.get_blueprint_library().find(self.cfg.vehicle)
        bp.set_attribute("role_name", self.cfg.role_name)
        points = self.world.get_map().get_spawn_points()
        if not points or not 0 <= self.cfg.spawn_point < len(points):
            raise ValueError(f"spawn_point {self.cfg.spawn_point} out of range: the map has {len(points)} spawn points")
        self.ego = self.world.spawn_actor(bp, points[self.cfg.spawn_point])
        for spec in self.cfg.sensors:
            if spec["type"] == "sensor.speedometer":  # a leaderboard pseudo-sensor: read from the ego
                continue
            sbp = self.world.get_blueprint_library().find(spec["type"])
            for key in ("width", "height", "fov"):
                if key in spec:
                    sbp.set_attribute("image_size_x" if key == "width" else "image_size_y" if key == "height" else "fov",
                                      str(spec[key]))
            if "sensor_tick" in spec:
                sbp.set_attribute("sensor_tick", str(spec["sensor_tick"]))
            tf = c.Transform(c.Location(x=spec["x"], y=spec["y"], z=spec["z"]),
                             c.Rotation(roll=spec["roll"], pitch=spec["pitch"], yaw=spec["yaw"]))
            actor = self.world.spawn_actor(sbp, tf, attach_to=self.ego)
            q: queue.Queue = queue.Queue()
            actor.listen(q.put)
            self.sensors[spec["id"]] = actor
            self._queues[spec["id"]] = q
        self.world.tick()

    # ------------------------------------------------------------------ stepping
    def apply_control(self, throttle: float, steer: float, brake: float) -> None:
        """CARLA control: throttle, brake 0..1; steer -1..1, positive to the RIGHT (CARLA convention)."""
        self.ego.apply_control(self.carla.VehicleControl(throttle=float(throttle), steer=float(steer), brake=float(brake)))

    def tick(self) -> dict:
        """Advance one fixed step; returns {"frame", "time_s", "ego": snapshot dict, sensor id: data}."""
        frame = self.world.tick()
        snap = self.world.get_snapshot()
        out = {"frame": frame, "time_s": float(snap.timestamp.elapsed_seconds), "ego": self.ego_state()}
        for sid, q in self._queues.items():
            while True:
                try:
                    data = q.get(timeout=SENSOR_TIMEOUT_S)
                except queue.Empty:
                    raise RuntimeError(f"sensor {sid!r} sent nothing for frame {frame} within {SENSOR_TIMEOUT_S} s") from None
                if data.frame >= frame:
                    break
            out[sid] = sensor_to_numpy(data)
        return out

    def ego_state(self) -> dict:
        """CARLA world pose and motion of the ego (left-handed axes, degrees), plus forward speed."""
        tf = self.ego.get_transform()
        vel, acc, ang = self.ego.get_velocity(), self.ego.get_acceleration(), self.ego.get_angular_velocity()
        yaw = math.radians(tf.rotation.yaw)
        return {"x": tf.location.x, "y": tf.location.y, "z": tf.location.z, "yaw_deg": tf.rotation.yaw,
                "velocity": (vel.x, vel.y, vel.z), "acceleration": (acc.x, acc.y, acc.z),
                "angular_velocity_deg": (ang.x, ang.y, ang.z),
                "speed": vel.x * math.cos(yaw) + vel.y * math.sin(yaw)}

    # ------------------------------------------------------------------ teardown
    def close(self) -> list[str]:
        """Destroy sensors and ego, restore the original settings. Returns the errors met (also printed)."""
        if self.closed:
            return []
        self.closed = True
        errors = []
        for sid, actor in list(self.sensors.items()):
            for step in ("stop", "destroy"):
                try:
                    getattr(actor, step)()
                except Exception as exc:  # keep cleaning up
                    errors.append(f"sensor {sid} {step}: {exc}")
        self.sensors.clear()
        if self.ego is not None:
            try:
                self.ego.destroy()
            except Exception as exc:
                errors.append(f"ego destroy: {exc}")
            self.ego = None
        if self._original_settings is not None:
            try:
                settings = self._original_settings
                if settings.synchronous_mode:  # never leave a server blocked waiting for our ticks
                    settings.synchronous_mode = False
                    settings.fixed_delta_seconds = None
                self.world.apply_settings(settings)
            except Exception as exc:
                errors.append(f"restore settings: {exc}")
        for e in errors:
            print(f"carla session cleanup: {e}")
        return errors


def sensor_to_numpy(data):
    """CARLA sensor data -> numpy: camera (H, W, 4) uint8 BGRA; IMU [ax, ay, az, gx, gy, gz, compass];
    GNSS [lat, lon, alt] (the leaderboard's layouts)."""
    if hasattr(data, "raw_data") and hasattr(data, "height"):
        return np.frombuffer(data.raw_data, dtype=np.uint8).reshape(data.height, data.width, 4).copy()
    if hasattr(data, "accelerometer"):
        a, g = data.accelerometer, data.gyroscope
        return np.array([a.x, a.y, a.z, g.x, g.y, g.z, data.compass], dtype=np.float64)
    if hasattr(data, "latitude"):
        return np.array([data.latitude, data.longitude, data.altitude], dtype=np.float64)
    return data
