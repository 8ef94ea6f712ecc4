"""wam-diff-bench2drive: run Bench2Drive's leaderboard evaluator with the WAM-Diff agent, resume,
merge and score.

    wam-diff-bench2drive [run] --bench2drive B2D --carla-root CARLA_0.9.15 --out runs/b2d \
        [--routes ROUTES.xml] [--ports 2000,2100] [--gpus 0,1] [--agent-config config/carla_agent.yaml] [--resume]
    wam-diff-bench2drive score --out runs/b2d [--routes ROUTES.xml]

`run` is the default sub-command; --routes defaults to the checkout's leaderboard/data/bench2drive220.xml.
Before starting anything the checkout (CHECKOUT_FILES), the CARLA install (CARLA_FILES) and the Python
modules the evaluator imports (EVALUATOR_MODULES) are checked: a missing one is one line naming it.

`run` splits the route file round-robin into one shard per port and starts one evaluator per shard
in parallel (Bench2Drive's evaluator starts its own CARLA server from CARLA_ROOT on that port;
traffic manager on port + tm_offset). An evaluator that stops before its shard is done (simulation
crash) is restarted with --resume up to --max-restarts times. `--resume` continues an interrupted
run in the same --out. Finally the shard checkpoints are merged (merged.json, in the evaluator's own
result layout, readable by `wam-diff score --leaderboard`) and scored with wam_diff_core.eval.bench2drive
(summary.json and a table on stdout).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from wam_diff_core.console import console_main
from wam_diff_core.errors import WamDiffError
from wam_diff_core.eval import leaderboard
from wam_diff_ros.carla import results
from wam_diff_ros.carla.route_xml import RouteFileError, parse_routes, split_route_file

MANIFEST = "run.json"
COMPAT_NOTE = "written by wam-diff-bench2drive"
DEFAULT_ROUTES = "leaderboard/data/bench2drive220.xml"
EVALUATOR = "leaderboard/leaderboard/leaderboard_evaluator.py"
# What the evaluator needs from a Bench2Drive checkout: itself, the agent base class, the weather table it reads
# relative to its working directory, and the scenario runner it imports.
CHECKOUT_FILES = (EVALUATOR, "leaderboard/leaderboard/autoagents/autonomous_agent.py", "leaderboard/data/weather.xml",
                  "scenario_runner/srunner/scenariomanager/carla_data_provider.py")
# From CARLA: the server the evaluator starts, and the `agents` package of its PythonAPI the scenario runner imports.
CARLA_FILES = ("CarlaUE4.sh", "PythonAPI/carla/agents/navigation/global_route_planner.py")
# Third-party modules the evaluator and the scenario runner import (requirements-carla.txt installs them).
EVALUATOR_MODULES = ("carla", "pkg_resources", "py_trees", "six", "simple_watchdog_timer", "tabulate", "dictor",
                     "networkx", "shapely", "ephem", "psutil", "xmlschema", "pexpect", "transforms3d", "requests")
SETUP_HINT = "pip install -r requirements-carla.txt (make install does)"


class RunnerError(WamDiffError, RuntimeError):
    """A run that cannot start or continue; the message says what to change."""


@dataclass
class Shard:
    index: int
    port: int
    tm_port: int
    gpu: int
    routes: Path
    dir: Path
    route_ids: list[str]
    restarts: int = 0
    proc: Optional[subprocess.Popen] = None
    log: Optional[object] = None
    history: list[int] = field(default_factory=list)  # exit codes
    connected: bool = False  # the evaluator's latest start reached its CARLA server

    @property
    def checkpoint(self) -> Path:
        return self.dir / "checkpoint.json"

    def done(self) -> bool:
        p = results.progress(self.checkpoint)
        return p is not None and p[1] > 0 and p[0] >= p[1] and len(results.load_records(self.checkpoint)) >= p[1]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _needs_compat() -> bool:
    """True when the evaluator's `pkg_resources.get_distribution("carla")` would fail here (no
    pkg_resources in setuptools >= 81, or the 0.9.15 client installed under the name carla-0-9-15)."""
    try:
        import pkg_resources  # noqa: F401

        pkg_resources.get_distribution("carla")
        return False
    except Exception:
        return True


def write_compat(dir_: Path) -> Path:
    """A one-function `pkg_resources` answering the leaderboard's CARLA version check from the client."""
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "pkg_resources.py").write_text(f'''"""{COMPAT_NOTE}: the leaderboard evaluator's only use of
pkg_resources is get_distribution("carla").version; setuptools >= 81 has no pkg_resources and the
CARLA 0.9.15 client wheel for Python 3.10+ is named carla-0-9-15. Put on the evaluator's PYTHONPATH only."""


class _Dist:
    def __init__(self, name, version):
        self.project_name, self.version = name, version

    def __str__(self):
        return f"{{self.project_name}} {{self.version}}"


def get_distribution(name):
    if name != "carla":
        raise RuntimeError(f"{COMPAT_NOTE}: only get_distribution('carla') is provided, got {{name!r}}")
    import carla

    return _Dist("carla", carla.Client("localhost", 1).get_client_version())


def __getattr__(attr):
    raise AttributeError(f"{COMPAT_NOTE}: pkg_resources.{{attr}} is not provided; install setuptools<81")
''')
    return dir_


def evaluator_command(args, shard: Shard, resume: bool) -> list[str]:
    from wam_diff_ros.carla import agent as agent_module

    cmd = [sys.executable, str(args.evaluator),
           f"--routes={shard.routes}", "--repetitions=1", "--track=SENSORS",
           f"--checkpoint={shard.checkpoint}", f"--debug-checkpoint={shard.dir / 'live_results.txt'}",
           f"--agent={Path(agent_module.__file__).resolve()}", f"--agent-config={Path(args.agent_config).resolve()}",
           "--debug=0", f"--port={shard.port}", f"--traffic-manager-port={shard.tm_port}",
           f"--gpu-rank={shard.gpu}", f"--timeout={args.timeout}"]
    if resume:
        cmd.append("--resume=True")  # the evaluator parses --resume with type=bool: any non-empty value is True
    return cmd


def evaluator_env(args, shard: Shard, compat: Optional[Path]) -> dict:
    env = dict(os.environ)
    b2d, carla_root = Path(args.bench2drive_root).resolve(), Path(args.carla_root).resolve()
    paths = [str(compat)] if compat else []
    paths += [str(carla_root / "PythonAPI"), str(carla_root / "PythonAPI" / "carla"),
              str(b2d / "leaderboard"), str(b2d / "scenario_runner")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(paths),
        "CARLA_ROOT": str(carla_root),
        "CARLA_SERVER": str(carla_root / "CarlaUE4.sh"),
        "SCENARIO_RUNNER_ROOT": str(b2d / "scenario_runner"),
        "LEADERBOARD_ROOT": str(b2d / "leaderboard"),
        "CHALLENGE_TRACK_CODENAME": "SENSORS",
        "IS_BENCH2DRIVE": "True",
        "SAVE_PATH": str(Path(args.out).resolve() / "agent"),
        "CUDA_VISIBLE_DEVICES": str(shard.gpu),
    })
    return env


def _parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise RunnerError(f"--{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise RunnerError(f"--{what} is empty")
    return values


def missing_modules(names=None) -> list[str]:
    """The modules of `names` (default EVALUATOR_MODULES) this Python cannot import (looked up, not imported)."""
    import importlib.util

    return [m for m in (EVALUATOR_MODULES if names is None else names) if importlib.util.find_spec(m) is None]


def check_install(args) -> None:
    """One line naming the first missing file of the checkout or the CARLA install, or the missing modules."""
    b2d, carla_root = Path(args.bench2drive_root), Path(args.carla_root or ".")
    for rel in CHECKOUT_FILES:
        if not (b2d / rel).is_file():
            raise RunnerError(f"{b2d / rel} not found: --bench2drive must be a Bench2Drive checkout "
                              f"(git clone https://github.com/Thinklab-SJTU/Bench2Drive)")
    for rel in CARLA_FILES:
        if not (carla_root / rel).is_file():
            raise RunnerError(f"{carla_root / rel} not found: --carla-root (or $CARLA_ROOT) must be a CARLA 0.9.15 "
                              f"install with its PythonAPI")
    missing = missing_modules()
    if missing:
        raise RunnerError(f"the evaluator needs Python modules {missing}, not importable by {sys.executable}: {SETUP_HINT}")


def prepare(args) -> tuple[list[Shard], list, dict]:
    """Validate inputs, write shard route files and the manifest; returns shards, routes, types."""
    out = Path(args.out)
    if not args.evaluator_is_fake:
        check_install(args)
    routes_path = Path(args.routes or Path(args.bench2drive_root) / DEFAULT_ROUTES)
    try:
        routes = parse_routes(routes_path)
    except RouteFileError as exc:
        raise RunnerError(str(exc)) from None
    if not routes:
        raise RunnerError(f"route file {routes_path} has no <route>")
    ports = _parse_int_list(args.ports, "ports")
    gpus = _parse_int_list(args.gpus, "gpus")
    close = [(a, b) for i, a in enumerate(ports) for b in ports[i + 1:] if abs(a - b) < 3]
    if close:  # a CARLA server also listens on port + 1 (streaming) and port + 2 (secondary)
        raise RunnerError(f"--ports must be at least 3 apart (CARLA uses port, port+1, port+2), got {ports}")
    n = min(len(ports), len(routes))
    evaluator = Path(args.evaluator) if args.evaluator else Path(args.bench2drive_root) / EVALUATOR
    if not evaluator.is_file():
        raise RunnerError(f"leaderboard evaluator not found at {evaluator}; --bench2drive must be a Bench2Drive checkout")
    args.evaluator = evaluator.resolve()
    args.routes = str(routes_path)
    if not Path(args.agent_config).is_file():
        raise RunnerError(f"agent config {args.agent_config} does not exist")
    manifest_path = out / MANIFEST
    manifest = {"routes": str(routes_path.resolve()), "routes_sha256": _sha(routes_path), "shards": n}
    if manifest_path.is_file():
        old = json.loads(manifest_path.read_text())
        if not args.resume:
            raise RunnerError(f"{out} already holds a run ({manifest_path}); pass --resume to continue it or choose a new --out")
        if old.get("routes_sha256") != manifest["routes_sha256"] or old.get("shards") != n:
            raise RunnerError(f"cannot resume {out}: it was started with {old.get('shards')} shard(s) of {old.get('routes')}, "
                              f"now {n} shard(s) of {routes_path}; use the same route file and number of ports")
    out.mkdir(parents=True, exist_ok=True)
    shard_files = [out / "routes" / f"shard_{k}.xml" for k in range(n)]
    ids = split_route_file(routes_path, shard_files)
    manifest["route_ids"] = ids
    manifest_path.write_text(json.dumps(manifest, indent=2))
    shards = []
    for k in range(n):
        d = out / f"shard_{k}"
        d.mkdir(parents=True, exist_ok=True)
        shards.append(Shard(index=k, port=ports[k], tm_port=ports[k] + args.tm_offset, gpu=gpus[k % len(gpus)],
                            routes=shard_files[k], dir=d, route_ids=ids[k]))
    return shards, routes, {r.id: r.scenario_type for r in routes}


def _start(args, shard: Shard, compat: Optional[Path]) -> None:
    resume = shard.checkpoint.is_file() and shard.checkpoint.stat().st_size > 0
    cmd = evaluator_command(args, shard, resume)
    shard.log = open(shard.dir / "evaluator.log", "a")
    shard.log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
    shard.log.flush()
    print(f"[shard {shard.index}] port {shard.port} gpu {shard.gpu}: {len(shard.route_ids)} routes"
          f"{' (resuming)' if resume else ''}; log {shard.dir / 'evaluator.log'}", flush=True)
    shard.connected = False
    shard.proc = subprocess.Popen(cmd, cwd=str(Path(args.bench2drive_root).resolve()), env=evaluator_env(args, shard, compat),
                                  stdout=shard.log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_all(shards: list[Shard], grace_s: float) -> None:
    """SIGINT first (the evaluator then stops its route and its own CARLA server), SIGKILL after grace_s."""
    live = [s for s in shards if s.proc is not None and s.proc.poll() is None]
    for s in live:
        try:
            os.killpg(s.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for s in live:
        try:
            s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(s.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            s.proc.wait()


def _last_run_log(shard: Shard) -> str:
    """The evaluator log of the shard's latest start (each start writes a '# <time> <command>' header line)."""
    path = shard.dir / "evaluator.log"
    text = path.read_text(errors="replace") if path.is_file() else ""
    cut = text.rfind("\n# ")
    return text[cut + 1:] if cut >= 0 else text


def diagnose(log_text: str, port: int) -> Optional[tuple[str, bool]]:
    """One line saying why an evaluator failed, read from its log, and whether a restart can help; None if unknown."""
    missing = re.search(r"No module named '?([\w.]+)'?", log_text)
    if missing:
        return (f"the evaluator cannot import {missing.group(1)!r}: install it for {sys.executable} "
                f"(requirements-carla.txt holds the modules known to be needed)"), False
    if "load_world failed" in log_text and "load_world success" not in log_text:
        return (f"the CARLA server on port {port} is not reachable: the evaluator starts it with "
                f"$CARLA_ROOT/CarlaUE4.sh (GPU, -RenderOffScreen); the server's own lines are in the log"), False
    return None


def _unreachable(shard: Shard, max_failures: int) -> bool:
    """While the evaluator connects: True after max_failures 'load_world failed' lines and no success."""
    if shard.connected:
        return False
    text = _last_run_log(shard)
    shard.connected = "load_world success" in text
    return not shard.connected and text.count("load_world failed") >= max_failures


def _give_up(shard: Shard, why: str) -> None:
    tail = _last_run_log(shard).strip().splitlines()[-15:]
    print(f"[shard {shard.index}] gave up {why}; its missing routes score 0. Continue later with --resume. "
          f"Last log lines:\n  " + "\n  ".join(tail), flush=True)


def _after_exit(args, shard: Shard, rc: int, compat: Optional[Path]) -> bool:
    """Handle an evaluator that exited; True while the shard still runs (restarted)."""
    shard.history.append(rc)
    shard.log.close()
    if shard.done():
        print(f"[shard {shard.index}] finished (exit {rc})", flush=True)
        return False
    reason = diagnose(_last_run_log(shard), shard.port)
    if reason is not None and not reason[1]:
        _give_up(shard, f"at once: {reason[0]}")
        return False
    if shard.restarts < args.max_restarts:
        shard.restarts += 1
        print(f"[shard {shard.index}] stopped with exit {rc} before its routes were done; "
              f"restart {shard.restarts}/{args.max_restarts} with --resume", flush=True)
        _start(args, shard, compat)
        return True
    _give_up(shard, f"after {shard.restarts} restarts (exit codes {shard.history})")
    return False


def _watch(args, pending: list[Shard], compat: Optional[Path]) -> None:
    while pending:
        time.sleep(args.poll_s)
        for s in list(pending):
            rc = s.proc.poll()
            if rc is None and _unreachable(s, args.max_connect_failures):
                _stop_all([s], args.grace_s)
                s.log.close()
                _give_up(s, f"at once: {diagnose(_last_run_log(s), s.port)[0]}")
                pending.remove(s)
            elif rc is not None and not _after_exit(args, s, rc, compat):
                pending.remove(s)


def run(args) -> int:
    shards, routes, types = prepare(args)
    compat = write_compat(Path(args.out) / "compat") if (args.compat == "always" or (args.compat == "auto" and _needs_compat())) else None
    if args.dry_run:
        for s in shards:
            print(" ".join(evaluator_command(args, s, s.checkpoint.is_file())))
        return 0
    pending = [s for s in shards if not s.done()]
    for s in shards:
        if s.done():
            print(f"[shard {s.index}] already complete ({len(s.route_ids)} routes)", flush=True)
    try:
        for s in pending:
            _start(args, s, compat)
        _watch(args, pending, compat)
    except KeyboardInterrupt:
        print("interrupted: stopping evaluators (their CARLA servers stop with them); continue with --resume", flush=True)
        _stop_all(shards, args.grace_s)
        return 130
    summary = score_dir(Path(args.out), routes_path=Path(args.routes))
    incomplete = [s.index for s in shards if not s.done()]
    return 0 if not incomplete and summary["num_routes"] == len(routes) else 3


def score_dir(out: Path, routes_path: Optional[Path] = None) -> dict:
    """Merge every shard checkpoint under `out`, write merged.json and summary.json, print the table."""
    from wam_diff_core.eval.bench2drive import format_table

    files = sorted(out.glob("shard_*/checkpoint.json")) + sorted(out.glob("extra_results/*.json"))
    if not files:
        raise RunnerError(f"no shard_*/checkpoint.json under {out}: no evaluator wrote results; "
                          f"see {out}/shard_*/evaluator.log")
    if routes_path is None and (out / MANIFEST).is_file():
        routes_path = Path(json.loads((out / MANIFEST).read_text())["routes"])
    routes = parse_routes(routes_path) if routes_path else None
    # merged.json is in the evaluator's own layout (progress out of every route of the run): what
    # `wam-diff score --leaderboard` and Bench2Drive's tools read
    merged = results.merge_checkpoints(files, total=len(routes) if routes else None)
    (out / "merged.json").write_text(json.dumps(merged, indent=2))
    summary = results.score(merged["_checkpoint"]["records"],
                            expected_ids=[r.id for r in routes] if routes else None,
                            route_types={r.id: r.scenario_type for r in routes} if routes else None,
                            agent_dir=out / "agent")
    summary["score_composed_mismatches"] = leaderboard.score_results(merged, str(out / "merged.json"))["mismatches"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(format_table(summary), flush=True)
    for m in summary["score_composed_mismatches"]:
        print(f"route {m['route_id']}: the evaluator's score_composed {m['score_composed']:.4f} differs from "
              f"its infractions' {m['recomputed']:.4f}", flush=True)
    if "agent" in summary:
        a = summary["agent"]
        print(f"agent: {a['plans']} plans, {a['invalid_plans']} invalid, {a['late_plans']} late, "
              f"{a['brake_ticks']} of {a['ticks']} ticks braking for lack of a plan", flush=True)
    print(f"wrote {out / 'merged.json'} and {out / 'summary.json'}", flush=True)
    return summary


def build_parser() -> argparse.ArgumentParser:
    from wam_diff_ros.carla.agent_config import DEFAULT_CONFIG

    p = argparse.ArgumentParser(prog="wam-diff-bench2drive", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the leaderboard evaluator with the WAM-Diff agent, then merge and score")
    r.add_argument("--bench2drive", "--bench2drive-root", dest="bench2drive_root", required=True,
                   help="Bench2Drive checkout (leaderboard/, scenario_runner/)")
    r.add_argument("--routes", default=None, help=f"route XML (default: the checkout's {DEFAULT_ROUTES})")
    r.add_argument("--carla-root", default=os.environ.get("CARLA_ROOT", ""), help="CARLA 0.9.15 install (CarlaUE4.sh)")
    r.add_argument("--out", required=True, help="run directory (shards, checkpoints, agent logs, merged results)")
    r.add_argument("--agent-config", default=str(DEFAULT_CONFIG), help="agent YAML (model, sensors, rates)")
    r.add_argument("--ports", default="2000", help="comma-separated CARLA RPC ports, one server + evaluator each")
    r.add_argument("--gpus", default="0", help="comma-separated GPU ranks, assigned round-robin to the ports")
    r.add_argument("--tm-offset", type=int, default=6000, help="traffic manager port = CARLA port + this")
    r.add_argument("--timeout", type=float, default=600.0, help="CARLA client timeout in the evaluator, seconds")
    r.add_argument("--resume", action="store_true", help="continue the run in --out")
    r.add_argument("--max-restarts", type=int, default=3, help="restarts per shard after a crash")
    r.add_argument("--max-connect-failures", type=int, default=3,
                   help="give a shard up after this many failed connections to its CARLA server")
    r.add_argument("--compat", choices=("auto", "always", "never"), default="auto",
                   help="pkg_resources shim for the evaluator's CARLA version check (auto: only when needed)")
    r.add_argument("--evaluator", default="", help=argparse.SUPPRESS)  # tests: a stand-in evaluator script
    r.add_argument("--poll-s", type=float, default=2.0, help=argparse.SUPPRESS)
    r.add_argument("--grace-s", type=float, default=30.0, help=argparse.SUPPRESS)
    r.add_argument("--dry-run", action="store_true", help="print the evaluator commands and exit")
    s = sub.add_parser("score", help="merge the shard checkpoints in --out and score them")
    s.add_argument("--out", required=True)
    s.add_argument("--routes", default=None, help="route XML (default: the one recorded in --out/run.json)")
    return p


@console_main("wam-diff-bench2drive")
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and argv[0] != "--help":  # `run` is the default sub-command
        argv.insert(0, "run")
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "run":
            args.evaluator_is_fake = bool(args.evaluator)
            return run(args)
        score_dir(Path(args.out), Path(args.routes) if args.routes else None)
        return 0
    except (RunnerError, RouteFileError, results.ResultsError) as exc:
        print(f"wam-diff-bench2drive: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
