"""Bench2Drive / leaderboard 2.0 route files: parse, validate, split into shards.

Schema (as in Bench2Drive's leaderboard/data/bench2drive220.xml):

    <routes>
      <route id="1711" town="Town12">
        <waypoints><position x="-497.6" y="3672.9" z="364.9"/> ...</waypoints>
        <scenarios>
          <scenario name="ParkingCutIn_1" type="ParkingCutIn">
            <trigger_point x="..." y="..." z="..." yaw="..."/>
            <direction value="left"/>            <!-- any other parameter: <name value=".."/> -->
          </scenario>
        </scenarios>
        <weathers><weather route_percentage="0" cloudiness="100.0" .../> ...</weathers>
      </route>
    </routes>

Coordinates are CARLA world metres (left-handed); they stay in CARLA axes here: conversion to
the ego frame happens in frames.py only.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from wam_diff_core.errors import WamDiffError


class RouteFileError(WamDiffError, ValueError):
    """A route file that does not follow the Bench2Drive schema; the message names file, route and field."""


@dataclass(frozen=True)
class Weather:
    route_percentage: float
    params: dict[str, float]


@dataclass(frozen=True)
class Scenario:
    name: str
    type: str
    trigger: tuple[float, float, float, float]  # x, y, z (CARLA metres), yaw (degrees)
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    id: str
    town: str
    waypoints: np.ndarray  # (N, 3) CARLA world x, y, z metres
    scenarios: tuple[Scenario, ...]
    weathers: tuple[Weather, ...]

    @property
    def scenario_type(self) -> str:
        """The route's (first) scenario type; Bench2Drive routes carry exactly one."""
        return self.scenarios[0].type if self.scenarios else ""

    @property
    def length_m(self) -> float:
        """Length of the key-point polyline (the leaderboard densifies it on the map)."""
        return float(np.linalg.norm(np.diff(self.waypoints[:, :2], axis=0), axis=1).sum()) if len(self.waypoints) > 1 else 0.0


def _float(elem: ET.Element, attr: str, where: str) -> float:
    raw = elem.get(attr)
    if raw is None:
        raise RouteFileError(f"{where}: <{elem.tag}> lacks attribute {attr!r}")
    try:
        return float(raw)
    except ValueError:
        raise RouteFileError(f"{where}: <{elem.tag} {attr}={raw!r}> is not a number") from None


def _parse_route(elem: ET.Element, source: str) -> Route:
    rid = elem.get("id")
    town = elem.get("town")
    if not rid or not town:
        raise RouteFileError(f"{source}: <route> needs non-empty 'id' and 'town', got id={rid!r} town={town!r}")
    where = f"{source} route {rid}"
    wps_elem = elem.find("waypoints")
    if wps_elem is None:
        raise RouteFileError(f"{where}: missing <waypoints>")
    positions = wps_elem.findall("position")
    if len(positions) < 2:
        raise RouteFileError(f"{where}: <waypoints> needs at least 2 <position>, got {len(positions)}")
    waypoints = np.array([[_float(p, "x", where), _float(p, "y", where), float(p.get("z", 0.0))] for p in positions])

    scenarios = []
    sc_elem = elem.find("scenarios")
    for sc in (sc_elem.findall("scenario") if sc_elem is not None else []):
        name, typ = sc.get("name"), sc.get("type")
        if not name or not typ:
            raise RouteFileError(f"{where}: <scenario> needs 'name' and 'type', got name={name!r} type={typ!r}")
        trig = sc.find("trigger_point")
        if trig is None:
            raise RouteFileError(f"{where}: scenario {name} lacks <trigger_point>")
        trigger = tuple(_float(trig, a, f"{where} scenario {name}") for a in ("x", "y", "z", "yaw"))
        params = {child.tag: child.get("value", "") for child in sc if child.tag != "trigger_point"}
        scenarios.append(Scenario(name=name, type=typ, trigger=trigger, params=params))

    weathers = []
    w_elem = elem.find("weathers")
    for w in (w_elem.findall("weather") if w_elem is not None else []):
        attrs = dict(w.attrib)
        pct = attrs.pop("route_percentage", None)
        if pct is None:
            raise RouteFileError(f"{where}: <weather> lacks 'route_percentage'")
        weathers.append(Weather(route_percentage=_float(w, "route_percentage", where),
                                params={k: _float(w, k, where) for k in attrs}))
    weathers.sort(key=lambda w: w.route_percentage)
    return Route(id=rid, town=town, waypoints=waypoints, scenarios=tuple(scenarios), weathers=tuple(weathers))


def _root(path: str | Path) -> ET.Element:
    path = Path(path)
    if not path.is_file():
        raise RouteFileError(f"route file {path} does not exist")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise RouteFileError(f"route file {path} is not valid XML: {exc}") from None
    if root.tag != "routes":
        raise RouteFileError(f"route file {path}: root element is <{root.tag}>, expected <routes>")
    return root


def parse_routes(path: str | Path) -> list[Route]:
    """All routes of a Bench2Drive route file, in file order. Raises RouteFileError on schema errors
    or duplicate route ids."""
    root = _root(path)
    routes = [_parse_route(r, str(path)) for r in root.findall("route")]
    seen: set[str] = set()
    for r in routes:
        if r.id in seen:
            raise RouteFileError(f"route file {path}: duplicate route id {r.id!r}")
        seen.add(r.id)
    return routes


def split_route_file(path: str | Path, out_paths: Sequence[str | Path]) -> list[list[str]]:
    """Write the routes of `path` round-robin into len(out_paths) files (the route elements are
    copied verbatim, so attributes this module does not model survive). Returns the ids per file."""
    root = _root(path)
    routes = root.findall("route")
    parse_routes(path)  # validate before writing anything
    shards: list[list[ET.Element]] = [[] for _ in out_paths]
    for i, r in enumerate(routes):
        shards[i % len(out_paths)].append(r)
    ids = []
    for out, elems in zip(out_paths, shards):
        new_root = ET.Element("routes")
        new_root.extend(elems)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(new_root).write(out, encoding="utf-8", xml_declaration=True)
        ids.append([e.get("id") for e in elems])
    return ids


def route_ids(routes: Iterable[Route]) -> list[str]:
    return [r.id for r in routes]
