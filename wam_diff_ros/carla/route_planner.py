"""Global route -> navigation command, the way the model was prompted ("turn left", ...).

The leaderboard hands the agent its route as (point, RoadOption) pairs, downsampled to the points
where the option changes and every ~50 m. RoadOption is CARLA's `agents.navigation.local_planner`
IntEnum; it is matched here by name or value so this module needs neither CARLA nor its agents.
The planner follows the ego along the route (monotonic progress, nearest point in a window ahead)
and announces the first junction or lane-change option within a look-ahead distance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from wam_diff_core.constants import NAV_COMMANDS

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
