"""Global route -> navigation command, the way the model was prompted ("turn left", ...).

The leaderboard hands the agent its route as (point, RoadOption) pairs, downsampled to the points
where the option changes and every ~50 m. RoadOption is CARLA's `agents.navigation.local_planner`
IntEnum; it is matched here by name or value so this module needs neither CARLA nor its agents.
The planner follows the ego along the route (monotonic progress, nearest point in a window ahead)
and announces the first junction or lane-change option within a look-ahead distance. It also gives
the route target point: the route ROUTE_TARGET_AHEAD_M ahead of the ego's position along it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from wam_diff_core.constants import NAV_COMMANDS, ROUTE_TARGET_AHEAD_M

# RoadOption (name, value) -> project navigation command.
ROAD_OPTION_COMMANDS = {
    "VOID": "follow lane",
    "LEFT": "turn left",
    "RIGHT": "turn right",
    "STRAIGHT": "go straight",
    "LANEFOLLOW": "follow lane",
    "CHANGELANELEFT": "change lane left",
    "CHANGELANERIGHT": "change lane right",
}
ROAD_OPTION_VALUES = {-1: "VOID", 1: "LEFT", 2: "RIGHT", 3: "STRAIGHT", 4: "LANEFOLLOW", 5: "CHANGELANELEFT",
                      6: "CHANGELANERIGHT"}
assert set(ROAD_OPTION_COMMANDS.values()) == set(NAV_COMMANDS)


def road_option_name(option) -> str:
    """Name of a RoadOption given as the enum, its name or its integer value; ValueError otherwise."""
    name = getattr(option, "name", None)
    if name is None:
        if isinstance(option, str):
            name = option.upper().replace("ROADOPTION.", "")
        else:
            try:
                name = ROAD_OPTION_VALUES[int(option)]
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"unknown RoadOption {option!r}; expected one of {sorted(ROAD_OPTION_VALUES)}") from None
    if name not in ROAD_OPTION_COMMANDS:
        raise ValueError(f"unknown RoadOption {option!r}; expected one of {list(ROAD_OPTION_COMMANDS)}")
    return name


def command_for(option) -> str:
    """RoadOption -> one of NAV_COMMANDS."""
    return ROAD_OPTION_COMMANDS[road_option_name(option)]


@dataclass(frozen=True)
class RoutePlannerConfig:
    command_lookahead_m: float = 20.0   # announce a turn / lane change this far before its route point
    search_window_m: float = 50.0       # progress search: route points at most this far ahead of the last match
    reached_m: float = 5.0              # the final point counts as reached within this distance


@dataclass(frozen=True)
class RouteTarget:
    command: str
    index: int              # index of the matched (nearest) route point
    distance_to_route_m: float
    remaining_m: float      # along the route from the matched point to its end
    done: bool


class RoutePlanner:
    """Follows an ego position along a route. Positions are in any one consistent metric frame
    (the agent uses CARLA world x, y)."""

    def __init__(self, points: Sequence[Sequence[float]], options: Sequence, config: RoutePlannerConfig | None = None):
        pts = np.asarray(points, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[0] < 1 or pts.shape[1] < 2:
            raise ValueError(f"route points must be (N, 2+) with N >= 1, got shape {pts.shape}")
        if len(options) != pts.shape[0]:
            raise ValueError(f"route has {pts.shape[0]} points but {len(options)} options")
        self.cfg = config or RoutePlannerConfig()
        self.points = pts[:, :2]
        self.commands = [command_for(o) for o in options]
        seg = np.linalg.norm(np.diff(self.points, axis=0), axis=1)
        self.cum = np.concatenate([[0.0], np.cumsum(seg)])  # arc length at each point
        self.index = 0

    @property
    def length_m(self) -> float:
        return float(self.cum[-1])

    def update(self, ego_xy: Sequence[float]) -> RouteTarget:
        """Advance along the route to the point nearest `ego_xy` (never backwards) and return the command."""
        ego = np.asarray(ego_xy, dtype=np.float64)[:2]
        c = self.cfg
        window = np.nonzero(self.cum <= self.cum[self.index] + c.search_window_m)[0]
        window = window[window >= self.index]
        d = np.linalg.norm(self.points[window] - ego, axis=1)
        best = int(window[np.argmin(d)])
        self.index = best
        command = self.commands[best]
        ahead = np.nonzero((self.cum >= self.cum[best]) & (self.cum <= self.cum[best] + c.command_lookahead_m))[0]
        for i in ahead:
            if self.commands[i] != "follow lane":
                command = self.commands[i]
                break
        dist = float(np.linalg.norm(self.points[best] - ego))
        remaining = float(self.cum[-1] - self.cum[best])
        done = best == len(self.points) - 1 and float(np.linalg.norm(self.points[-1] - ego)) <= c.reached_m
        return RouteTarget(command=command, index=best, distance_to_route_m=dist, remaining_m=remaining, done=done)

    def progress_m(self, ego_xy: Sequence[float]) -> float:
        """Arc length (m) of the ego's projection onto the route segments next to the matched point (`index`,
        from the last update): the leaderboard's route points lie up to ~50 m apart, so the nearest point alone
        can be far behind or ahead of the ego."""
        ego = np.asarray(ego_xy, dtype=np.float64)[:2]
        best_d, best_s = np.inf, float(self.cum[self.index])
        for i in (self.index - 1, self.index):
            if i < 0 or i + 1 >= len(self.points):
                continue
            a, seg = self.points[i], self.points[i + 1] - self.points[i]
            length2 = float(seg @ seg)
            t = 0.0 if length2 == 0.0 else float(np.clip((ego - a) @ seg / length2, 0.0, 1.0))
            d = float(np.linalg.norm(a + t * seg - ego))
            if d < best_d:
                best_d, best_s = d, float(self.cum[i]) + t * float(self.cum[i + 1] - self.cum[i])
        return best_s

    def ahead_point(self, ego_xy: Sequence[float], ahead_m: float = ROUTE_TARGET_AHEAD_M) -> np.ndarray:
        """The route point `ahead_m` metres along the route from the ego's projection onto it (the route's end
        when nearer), (2,) in the route's frame: the route target point, before conversion to the ego frame."""
        s = min(self.progress_m(ego_xy) + float(ahead_m), float(self.cum[-1]))
        return np.array([np.interp(s, self.cum, self.points[:, 0]), np.interp(s, self.cum, self.points[:, 1])])
