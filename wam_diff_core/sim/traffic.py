"""Traffic at junctions: highway-env's IDM driver made to see what is physically in front of it.

highway-env's IDM only looks for leaders on its own lane chain, so two vehicles on sibling
junction lanes (e.g. a straight and a right-turn lane leaving the same approach) drive into
each other. Junction traffic here also brakes for the nearest vehicle heading the same way inside a corridor
straight ahead of it.
"""
from __future__ import annotations

import numpy as np

from highway_env.vehicle.behavior import IDMVehicle

CORRIDOR_LENGTH_M = 25.0
CORRIDOR_MARGIN_M = 0.6
SAME_DIRECTION_RAD = np.radians(50.0)


def geometric_leader(vehicle, vehicles) -> tuple[object, float] | tuple[None, None]:
    """Nearest other vehicle whose centre lies in the corridor ahead; (vehicle, gap in m) or (None, None)."""
    h = np.array([np.cos(vehicle.heading), np.sin(vehicle.heading)])
    best, best_lon = None, None
    for o in vehicles:
        if o is vehicle:
            continue
        d = o.position - vehicle.position
        lon = float(d @ h)
        if not 0.0 < lon < CORRIDOR_LENGTH_M:
            continue
        # same-direction traffic only: crossing conflicts are the right-of-way rules' job, and
        # braking for crossing vehicles too gridlocked the junction
        dh = (o.heading - vehicle.heading + np.pi) % (2 * np.pi) - np.pi
        if abs(dh) > SAME_DIRECTION_RAD:
            continue
        lat = abs(float(h[0] * d[1] - h[1] * d[0]))
        if lat > (vehicle.WIDTH + o.WIDTH) / 2 + CORRIDOR_MARGIN_M:
            continue
        if best_lon is None or lon < best_lon:
            best, best_lon = o, lon
    if best is None:
        return None, None
    return best, best_lon - (vehicle.LENGTH + best.LENGTH) / 2


def leader_acceleration(vehicle, vehicles) -> float | None:
    """IDM acceleration towards the geometric leader, None when the corridor is free."""
    leader, gap = geometric_leader(vehicle, vehicles)
    if leader is None:
        return None
    # IDM interaction term with the physical gap (the lane-based distance is wrong across lanes)
    closing = float(np.dot(vehicle.velocity - leader.velocity, [np.cos(vehicle.heading), np.sin(vehicle.heading)]))
    d0 = vehicle.DISTANCE_WANTED
    star = d0 + max(vehicle.speed, 0.0) * vehicle.TIME_WANTED + vehicle.speed * closing / (
        2 * np.sqrt(vehicle.COMFORT_ACC_MAX * -vehicle.COMFORT_ACC_MIN))
    target = max(getattr(vehicle, "target_speed", vehicle.speed) or 0.0, 0.1)
    free = 1.0 - np.power(max(vehicle.speed, 0.0) / target, vehicle.DELTA)
    return float(vehicle.COMFORT_ACC_MAX * (free - (max(star, 0.0) / max(gap, 0.3)) ** 2))


class TrafficVehicle(IDMVehicle):
    """Junction traffic: IDM/MOBIL that also brakes for whatever is physically ahead."""

    def act(self, action=None):
        super().act(action)
        if self.crashed:
            return
        a = leader_acceleration(self, self.road.vehicles)
        if a is not None:
            self.action["acceleration"] = float(np.clip(min(self.action["acceleration"], a), -self.ACC_MAX, self.ACC_MAX))
