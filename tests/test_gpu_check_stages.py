"""scripts/gpu_check.sh in stages: each stage fits one 10-minute device call and writes one JSON; a stage whose JSON
exists is skipped, so a check resumes across calls. Planned with --dry-run, and one stage (env) run for real on the
CPU."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STAGES = ["env", "sdpa", "flashinfer", "ladder-nano", "ladder-2b-k8", "ladder-2b-k16"]
PLAN = re.compile(r"plan: (\S+) (runs|done|left for the next call) ?\(?(?:limit (\d+)s)?")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def _run(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, **(env or {})}, timeout=120)


def _plan(out: str) -> dict[str, tuple[str, int]]:
    return {m[1]: (m[2], int(m[3] or 0)) for m in PLAN.finditer(out)}


def test_the_script_parses_and_a_bad_stage_or_budget_is_one_line_and_status_2(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    for args, message in ((["--stages", "ladder-3b"], "unknown stage 'ladder-3b'; expected some of: " + " ".join(STAGES)),
                          (["--budget", "5m"], "--budget '5m': expected whole seconds")):
        res = _run("--dry-run", *args, tmp_path)
        assert res.returncode == 2 and res.stderr.splitlines() == [f"gpu_check.sh: error: {message}"]


def test_a_dry_run_skips_the_done_stages_and_plans_the_rest_within_the_budget(tmp_path):
    (tmp_path / "stage_env.json").write_text("{}")
    res = _run("--dry-run", "--budget", 300, tmp_path)
    assert res.returncode == 0, res.stderr
    plan = _plan(res.stdout)
    assert list(plan) == STAGES
    assert plan["env"][0] == "done" and plan["sdpa"] == ("runs", 135)
    assert all(plan[s][0] == "left for the next call" for s in STAGES[2:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage_env.json"]  # a dry run writes nothing
    assert _plan(_run("--dry-run", "--redo", "env", "--stages", "env", tmp_path).stdout) == {"env": ("runs", 60)}


def test_every_call_of_the_default_budget_fits_in_ten_minutes_and_three_calls_run_every_stage(tmp_path):
    calls = []
    while True:
        plan = _plan(_run("--dry-run", tmp_path).stdout)
        runs = {s: limit for s, (what, limit) in plan.items() if what == "runs"}
        if not runs:
            break
        calls.append(runs)
        for s in runs:
            (tmp_path / f"stage_{s}.json").write_text("{}")
    assert [list(c) for c in calls] == [["env", "sdpa", "flashinfer"], ["ladder-nano", "ladder-2b-k8"],
                                        ["ladder-2b-k16"]]
    assert max(sum(c.values()) for c in calls) <= 540  # with the wheel install, inside a 600 s call
    assert calls[1] == {"ladder-nano": 240, "ladder-2b-k8": 235}  # the second ladder's JIT kernels are built


def test_a_stage_writes_its_json_and_the_next_call_skips_it_and_resumes_from_a_copy(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    res = _run("--stages", "env", out, env={"GPU_CHECK_WORK": str(work)})
    assert res.returncode == 0, res.stderr
    record = json.loads((out / "stage_env.json").read_text())
    assert record["stage"] == "env" and record["status"] == "ok" and record["steps"][0]["exit"] == 0
    assert any(line.startswith("missing for flashinfer:") for line in record["log_tail"])
    assert sorted(p.name for p in out.iterdir()) == ["stage_env.json", "summary.txt"]
    again = _run("--stages", "env", out, env={"GPU_CHECK_WORK": str(work)})
    assert _plan(again.stdout) == {"env": ("done", 0)} and "every stage asked for is done" in again.stdout
    fresh = tmp_path / "fresh"
    plan = _plan(_run("--dry-run", "--resume-from", out, fresh).stdout)
    assert plan["env"][0] == "done" and plan["sdpa"][0] == "runs" and (fresh / "stage_env.json").is_file()
