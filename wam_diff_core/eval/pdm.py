"""NAVSIM-v1-style PDM score of one planned trajectory, computed open-loop on a recorded frame.

PDMS = NC x DAC x (5 EP + 5 TTC + 2 C) / 12   (reference-facts.md)

Everything is in the ego frame of the scored frame (x forward, y left, metres). The map is the
world's lanes: a point is drivable when it lies within half a lane width of a lane centreline.
Differences from NAVSIM, on purpose and documented: the plan is interpolated linearly to 0.1 s
instead of being tracked by an LQR bicycle model; EP's reference is the expert's progress on the
same frame (NAVSIM uses the best safe PDM-Closed proposal).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..constants import NUM_WAYPOINTS, WAYPOINT_DT_S
from .comfort import trajectory_is_comfortable

SIM_DT_S = 0.1
TTC_HORIZONS_S = (0.3, 0.6, 0.9)
EP_MIN_REFERENCE_M = 5.0
STATIC_COLLISION_NC = 0.5
EGO_LENGTH_M = 5.0
EGO_WIDTH_M = 2.0
DAC_MARGIN_M = 0.5  # shoulder: lanes are the only map, NAVSIM's drivable area is wider than lane centres +- w/2


@dataclass
class Agent:
    """Another road user at the frame time: centre (x, y) m, heading rad, velocity (vx, vy) m/s, box size.
    `future` (optional) holds its logged centres and headings (NUM_WAYPOINTS, 3) at 0.5 s steps."""

    xy: tuple[float, float]
    heading: float
    velocity: tuple[float, float]
    length: float = 5.0
    width: float = 2.0
    static: bool = False
    future: Optional[np.ndarray] = None

    def state_at(self, t: float) -> tuple[np.ndarray, float]:
        """Centre and heading at time t (s) from the log if any, else at constant velocity (`states_at` at one time)."""
        centres, headings = self.states_at(np.array([t], dtype=np.float64))
        return centres[0], float(headings[0])

    def states_at(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Centres (T, 2) and headings (T,) at every time of `times` (T,) s: from the log if any (past its end, its
        last step's velocity held), else at constant velocity."""
        t = np.asarray(times, dtype=np.float64)
        xy = np.asarray(self.xy, dtype=np.float64)
        if self.static:
            return np.repeat(xy[None], t.shape[0], axis=0), np.full(t.shape[0], float(self.heading))
        if self.future is None:
            moved = xy + np.asarray(self.velocity, dtype=np.float64) * t[:, None]
            return moved, np.full(t.shape[0], float(self.heading))
        f = np.asarray(self.future, dtype=np.float64)
        knots = np.arange(0, f.shape[0] + 1) * WAYPOINT_DT_S
        xs, ys = np.concatenate([[xy[0]], f[:, 0]]), np.concatenate([[xy[1]], f[:, 1]])
        hs = np.unwrap(np.concatenate([[self.heading], f[:, 2]]))
        centres = np.stack([np.interp(t, knots, xs), np.interp(t, knots, ys)], axis=1)
        headings = np.interp(t, knots, hs)
        late = t > knots[-1]  # past the log: its last step's velocity held
        if late.any():
            end = np.array([xs[-1], ys[-1]])
            v = (end - np.array([xs[-2], ys[-2]])) / WAYPOINT_DT_S
            centres[late] = end + v * (t[late] - knots[-1])[:, None]
            headings[late] = hs[-1]
        return centres, headings


@dataclass
class PdmScene:
    """What PDMS needs from one frame: ego speed, agents, lanes (centreline (N, 2), width) and the
    reference progress (metres along x of the expert's 4 s plan)."""

    ego_speed: float
    agents: list[Agent] = field(default_factory=list)
    lanes: list[tuple[np.ndarray, float]] = field(default_factory=list)
    reference_progress: float = 0.0
    ego_length: float = EGO_LENGTH_M
    ego_width: float = EGO_WIDTH_M


def box_corners(xy, heading: float, length: float, width: float) -> np.ndarray:
    """Corners (4, 2) of an oriented rectangle centred at xy."""
    c, s = np.cos(heading), np.sin(heading)
    half = np.array([[length / 2, width / 2], [length / 2, -width / 2], [-length / 2, -width / 2], [-length / 2, width / 2]])
    rot = np.array([[c, -s], [s, c]])
    return half @ rot.T + np.asarray(xy, dtype=np.float64)


def boxes_overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Separating-axis test for two convex quadrilaterals (4, 2)."""
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            axis = np.array([-edge[1], edge[0]])
            pa, pb = a @ axis, b @ axis
            if pa.max() < pb.min() or pb.max() < pa.min():
                return False
    return True


def _point_segment_distance(points: np.ndarray, polyline: np.ndarray) -> np.ndarray:
    """Distance (P,) from each point (P, 2) to a polyline (N, 2)."""
    a, b = polyline[:-1], polyline[1:]
    ab = b - a
    denom = np.maximum((ab ** 2).sum(-1), 1e-12)
    t = np.clip(((points[:, None, :] - a[None]) * ab[None]).sum(-1) / denom[None], 0.0, 1.0)
    proj = a[None] + t[..., None] * ab[None]
    return np.linalg.norm(points[:, None, :] - proj, axis=-1).min(axis=1)


def drivable(points: np.ndarray, lanes: list[tuple[np.ndarray, float]], margin: float = DAC_MARGIN_M) -> np.ndarray:
    """Whether each point (P, 2) lies within half a lane width (+ margin) of some lane centreline."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    ok = np.zeros(points.shape[0], dtype=bool)
    for centre, width in lanes:
        centre = np.asarray(centre, dtype=np.float64)
        if centre.shape[0] < 2:
            continue
        ok |= _point_segment_distance(points, centre) <= width / 2 + margin
    return ok


def densify(trajectory: np.ndarray, dt: float = SIM_DT_S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, xy, heading) of the plan from the ego (t = 0) to the last waypoint at `dt` steps."""
    traj = np.asarray(trajectory, dtype=np.float64).reshape(NUM_WAYPOINTS, 2)
    knots_t = np.arange(NUM_WAYPOINTS + 1) * WAYPOINT_DT_S
    knots = np.vstack([[0.0, 0.0], traj])
    times = np.arange(0.0, knots_t[-1] + 1e-9, dt)
    xy = np.stack([np.interp(times, knots_t, knots[:, 0]), np.interp(times, knots_t, knots[:, 1])], axis=1)
    d = np.diff(xy, axis=0)
    step = np.linalg.norm(d, axis=1)
    heading = np.zeros(times.shape[0])
    last = 0.0
    for i, (dd, s) in enumerate(zip(d, step)):
        if s > 1e-3:
            last = float(np.arctan2(dd[1], dd[0]))
        heading[i + 1] = last
    heading[0] = heading[1] if step.size and step[0] > 1e-3 else 0.0
    return times, xy, heading


@dataclass
class PdmResult:
    nc: float
    dac: float
    ttc: float
    ep: float
    c: float

    @property
    def score(self) -> float:
        return self.nc * self.dac * (5 * self.ep + 5 * self.ttc + 2 * self.c) / 12.0

    def as_dict(self) -> dict:
        return {"nc": self.nc, "dac": self.dac, "ttc": self.ttc, "ep": self.ep, "c": self.c, "pdms": self.score}


def _ego_is_at_fault(ego_xy, ego_heading, ego_speed, agent_xy, length) -> bool:
    """NAVSIM ignores collisions while the ego stands still and those where it is hit from behind."""
    if ego_speed < 0.1:
        return False
    rel = np.asarray(agent_xy) - np.asarray(ego_xy)
    longitudinal = rel[0] * np.cos(ego_heading) + rel[1] * np.sin(ego_heading)
    return longitudinal > -length / 2


def pdm_score(trajectory: np.ndarray, scene: PdmScene) -> PdmResult:
    """PDMS sub-scores of a (NUM_WAYPOINTS, 2) ego-frame plan against one recorded frame."""
    times, xy, heading = densify(trajectory)
    speed = np.concatenate([[scene.ego_speed], np.linalg.norm(np.diff(xy, axis=0), axis=1) / SIM_DT_S])
    L, W = scene.ego_length, scene.ego_width
    ego_boxes = [box_corners(p, h, L, W) for p, h in zip(xy, heading)]

    # NC: first at-fault overlap decides (0 for vehicles, 0.5 for static objects).
    nc = 1.0
    collided = set()
    for i, t in enumerate(times):
        for k, agent in enumerate(scene.agents):
            if k in collided:
                continue
            a_xy, a_h = agent.state_at(float(t))
            if boxes_overlap(ego_boxes[i], box_corners(a_xy, a_h, agent.length, agent.width)):
                collided.add(k)
                if _ego_is_at_fault(xy[i], heading[i], speed[i], a_xy, L):
                    nc = min(nc, STATIC_COLLISION_NC if agent.static else 0.0)

    # DAC: every corner of every ego box on a lane.
    corners = np.concatenate(ego_boxes, axis=0)
    dac = 1.0 if drivable(corners, scene.lanes).all() else 0.0

    # TTC: the ego projected at constant velocity for TTC_HORIZONS_S must not hit any agent (at its own
    # state at that time), ignoring agents it already collided with.
    ttc = 1.0
    for i, t in enumerate(times):
        if speed[i] < 0.1 or ttc == 0.0:
            continue
        direction = np.array([np.cos(heading[i]), np.sin(heading[i])])
        for dt in TTC_HORIZONS_S:
            ego_box = box_corners(xy[i] + direction * speed[i] * dt, heading[i], L, W)
            for k, agent in enumerate(scene.agents):
                if k in collided:
                    continue
                a_xy, a_h = agent.state_at(float(t + dt))
                if boxes_overlap(ego_box, box_corners(a_xy, a_h, agent.length, agent.width)) and \
                        _ego_is_at_fault(xy[i], heading[i], speed[i], a_xy, L):
                    ttc = 0.0
                    break
            if ttc == 0.0:
                break

    # EP: progress along x relative to the reference, 1 when the reference is short.
    progress = max(float(np.asarray(trajectory)[-1, 0]), 0.0)
    ref = max(scene.reference_progress, 0.0)
    ep = 1.0 if ref < EP_MIN_REFERENCE_M else float(np.clip(progress / ref, 0.0, 1.0))

    # C: comfort bounds on the 0.5 s plan, with the current motion prepended so the start counts.
    traj = np.asarray(trajectory, dtype=np.float64)
    path = np.vstack([[-scene.ego_speed * WAYPOINT_DT_S, 0.0], [0.0, 0.0], traj])
    c = 1.0 if trajectory_is_comfortable(path, WAYPOINT_DT_S)[0] else 0.0
    return PdmResult(nc=nc, dac=dac, ttc=ttc, ep=ep, c=c)


def scene_from_dict(d: dict) -> PdmScene:
    """Rebuild a PdmScene from its JSON form (as written by the dataset generator)."""
    agents = [Agent(xy=tuple(a["xy"]), heading=a["heading"], velocity=tuple(a["velocity"]),
                    length=a.get("length", 5.0), width=a.get("width", 2.0), static=a.get("static", False),
                    future=np.asarray(a["future"]) if a.get("future") is not None else None)
              for a in d.get("agents", [])]
    lanes = [(np.asarray(l["centre"], dtype=np.float64), float(l["width"])) for l in d.get("lanes", [])]
    return PdmScene(ego_speed=d["ego_speed"], agents=agents, lanes=lanes,
                    reference_progress=d.get("reference_progress", 0.0),
                    ego_length=d.get("ego_length", EGO_LENGTH_M), ego_width=d.get("ego_width", EGO_WIDTH_M))


def mean_pdms(results: list[PdmResult]) -> dict:
    """Mean of each sub-score and of the PDMS over frames."""
    if not results:
        return {"nc": None, "dac": None, "ttc": None, "ep": None, "c": None, "pdms": None, "frames": 0}
    keys = ("nc", "dac", "ttc", "ep", "c", "pdms")
    rows = [r.as_dict() for r in results]
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    out["frames"] = len(results)
    return out
