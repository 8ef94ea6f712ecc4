"""The versioned route suite of the embedded world (the role bench2drive220.xml plays for Bench2Drive).

A route is one scenario instance: scenario type, seed, traffic density, target distance, time
limit and scenario options. The suite lives in wam_diff_core/data/routes_v1.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from ..constants import FRAME_SIZE, WAM_DIFF_CONFIG_NAME
from ..errors import UsageError

DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "data" / "routes_v1.json"

# Scenario type -> Bench2Drive abilities it exercises. Intersections are unsignalised junctions
# with a priority road (give way); roundabout entries are yield-sign controlled (traffic signs).
SCENARIO_ABILITIES: dict[str, tuple[str, ...]] = {
    "highway": ("overtaking",),
    "highway_dense": ("overtaking",),
    "merge": ("merging",),
    "intersection": ("give_way",),
    "roundabout": ("traffic_signs",),
    "emergency_brake": ("emergency_brake",),
    "cut_in": ("emergency_brake",),
}


@dataclass(frozen=True)
class Route:
    """One route of the suite. density: traffic multiplier; target_distance_m: distance along the
    route that completes it; time_limit_s: simulated seconds before a timeout."""

    route_id: str
    scenario: str
    seed: int
    density: float
    target_distance_m: float
    time_limit_s: float
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.scenario not in SCENARIO_ABILITIES:
            raise ValueError(f"route {self.route_id}: unknown scenario {self.scenario!r}; "
                             f"expected one of {sorted(SCENARIO_ABILITIES)}")
        if self.target_distance_m <= 0 or self.time_limit_s <= 0:
            raise ValueError(f"route {self.route_id}: target distance and time limit must be > 0")

    @property
    def abilities(self) -> tuple[str, ...]:
        return SCENARIO_ABILITIES[self.scenario]

    def to_dict(self) -> dict:
        return {"route_id": self.route_id, "scenario": self.scenario, "seed": self.seed, "density": self.density,
                "target_distance_m": self.target_distance_m, "time_limit_s": self.time_limit_s,
                "options": dict(self.options)}


def load_routes(path: Optional[str | Path] = None, ids: Optional[Sequence[str]] = None,
                scenarios: Optional[Sequence[str]] = None, limit: Optional[int] = None) -> list[Route]:
    """Routes of a suite file, optionally filtered by id or scenario, first `limit` kept."""
    p = Path(path) if path else DEFAULT_SUITE
    if not p.is_file():
        raise FileNotFoundError(f"route suite {p} not found")
    data = json.loads(p.read_text())
    if not isinstance(data, dict) or "routes" not in data:
        raise ValueError(f"route suite {p}: expected an object with a 'routes' list")
    routes = [Route(**r) for r in data["routes"]]
    seen = set()
    for r in routes:
        if r.route_id in seen:
            raise ValueError(f"route suite {p}: duplicate route id {r.route_id!r}")
        seen.add(r.route_id)
    if ids:
        wanted = set(ids)
        missing = wanted - seen
        if missing:
            raise ValueError(f"route ids not in suite {p}: {sorted(missing)}")
        routes = [r for r in routes if r.route_id in wanted]
    if scenarios:
        routes = [r for r in routes if r.scenario in set(scenarios)]
    if limit is not None:
        routes = routes[:limit]
    return routes


def suite_version(path: Optional[str | Path] = None) -> str:
    p = Path(path) if path else DEFAULT_SUITE
    return str(json.loads(p.read_text()).get("version", p.stem))


def add_selection_arguments(parser) -> None:
    """The route-selection options every suite command shares (--routes, --ids, --scenarios, --limit)."""
    parser.add_argument("--routes", default=str(DEFAULT_SUITE), help="route suite JSON (default: the bundled routes_v1)")
    parser.add_argument("--ids", default="", help="comma-separated route ids")
    parser.add_argument("--scenarios", default="", help="comma-separated scenario types")
    parser.add_argument("--limit", type=int, default=None, help="first N routes only")


def select_routes(args) -> list[Route]:
    """The routes `add_selection_arguments`' options choose; a bad selection exits with its message."""
    try:
        return load_routes(args.routes, ids=[i for i in args.ids.split(",") if i] or None,
                           scenarios=[s for s in args.scenarios.split(",") if s] or None, limit=args.limit)
    except (ValueError, OSError) as exc:
        raise UsageError(f"route selection: {exc}")


def parse_frame_size(text: str) -> tuple[int, int]:
    """--frame-size "WxH" -> (W, H); anything else exits with its message."""
    try:
        w, h = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise UsageError(f"--frame-size {text!r}: expected WxH, e.g. 256x128")
    if w <= 0 or h <= 0:
        raise UsageError(f"--frame-size {text!r}: expected a positive width and height")
    return w, h


def _checkpoint_settings(policy_spec: str):
    """A checkpoint directory's `wam_diff.json` settings, None without one (built-in policies, presets). Reads the
    one JSON file (no model load); a malformed one raises its ValueError naming the file."""
    from ..model.settings import WamDiffSettings
    from ..model.shipped import resolve_model

    path = Path(resolve_model(policy_spec)) / WAM_DIFF_CONFIG_NAME
    return WamDiffSettings.load(path) if path.is_file() else None


def checkpoint_frame_size(policy_spec: str) -> Optional[tuple[int, int]]:
    """The camera frame size a checkpoint directory's `wam_diff.json` records (the frames its planning data was
    rendered at); None for the built-in policies, presets and checkpoints that record none."""
    settings = _checkpoint_settings(policy_spec)
    return None if settings is None else settings.frame_size


def checkpoint_route_target_scenarios(policy_spec: str) -> Optional[tuple[str, ...]]:
    """The route types a checkpoint learned route targets on when it learned them on some only (`wam_diff.json`
    route_target_scenarios); None otherwise."""
    settings = _checkpoint_settings(policy_spec)
    return None if settings is None else settings.route_targets_only_on


def resolve_frame_size(text: Optional[str], policy_spec: Optional[str] = None) -> tuple[int, int]:
    """--frame-size for a closed-loop command: "WxH" when given (with a note when it differs from the frames the
    policy's checkpoint was trained on), else the checkpoint's recorded size, else FRAME_SIZE. Exits with its
    message on a malformed value or a malformed `wam_diff.json`."""
    try:
        trained = checkpoint_frame_size(policy_spec) if policy_spec else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if text is None:
        return trained or FRAME_SIZE
    size = parse_frame_size(text)
    if trained is not None and size != trained:
        print(f"note: --frame-size {size[0]}x{size[1]} differs from the {trained[0]}x{trained[1]} frames "
              f"{policy_spec} was trained on (the world draws 3 px/m: a larger frame shows more road)", flush=True)
    return size


def add_frame_size_argument(parser, policy_default: bool = True) -> None:
    """--frame-size WxH, defaulting to the policy checkpoint's trained frames (policy_default) or FRAME_SIZE."""
    default = (f"the frames the --policy checkpoint was trained on (its wam_diff.json frame_size), else "
               f"{FRAME_SIZE[0]}x{FRAME_SIZE[1]}") if policy_default else f"{FRAME_SIZE[0]}x{FRAME_SIZE[1]}"
    parser.add_argument("--frame-size", default=None if policy_default else f"{FRAME_SIZE[0]}x{FRAME_SIZE[1]}",
                        help=f"WxH of the rendered camera frame (default: {default})")


def parse_seed_offsets(text: str) -> list[int]:
    """--seed-offsets "0,1000" -> [0, 1000]; anything else exits with its message."""
    try:
        return [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--seed-offsets {text!r}: expected comma-separated integers, e.g. 0,1000")


def with_seed_offsets(routes: list[Route], offsets: list[int]) -> tuple[list[Route], dict[str, str]]:
    """Each route once per seed offset (offset 0 is the route itself; others get id
    '<route_id>_s<offset>' and seed + offset: same road and options, other traffic), and
    route_id -> base route id, so a copy always lands in its base route's split."""
    if not offsets or any(o < 0 for o in offsets) or len(set(offsets)) != len(offsets):
        raise ValueError(f"seed offsets {offsets}: expected distinct integers >= 0")
    out, base = [], {}
    for o in offsets:
        for r in routes:
            c = r if o == 0 else replace(r, route_id=f"{r.route_id}_s{o}", seed=r.seed + o)
            out.append(c)
            base[c.route_id] = r.route_id
    return out, base
