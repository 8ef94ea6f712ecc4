"""wam_diff_training.recipe: a model card's commands run in order, timed, resumable; bad recipes named."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from wam_diff_training.cli import main as train_main
from wam_diff_training.config import ConfigError
from wam_diff_training.recipe import RECORD_FILE, StepFailed, load_recipe, run_recipe

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, steps: list, name: str = "t") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": name, "out": str(tmp_path / "out"), "steps": steps}))
    return path


def _touch(path: Path, sleep: float = 0.0) -> str:
    return f"{sys.executable} -c \"import time, pathlib; time.sleep({sleep}); pathlib.Path(r'{path}').write_text('x')\""


def test_steps_run_in_order_with_wall_times(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    order = tmp_path / "order.txt"
    steps = [
        {"name": "a", "run": _touch(a, 0.2), "done": str(a)},
        {"name": "b", "run": f"{sys.executable} -c \"import pathlib; p = pathlib.Path(r'{order}'); "
                             f"p.write_text(str(pathlib.Path(r'{a}').exists())); pathlib.Path(r'{b}').write_text('y')\"",
         "done": str(b)},
    ]
    record = run_recipe(load_recipe(_write(tmp_path, steps)), echo=lambda *_: None)
    assert order.read_text() == "True"  # b ran after a had finished
    assert record["complete"] is True
    assert [r["status"] for r in record["steps"]] == ["ok", "ok"]
    assert record["steps"][0]["wall_s"] >= 0.2
    assert record["total_wall_s"] == pytest.approx(sum(r["wall_s"] for r in record["steps"]), abs=0.11)
    on_disk = json.loads((tmp_path / "out" / RECORD_FILE).read_text())
    assert on_disk == record
    assert (tmp_path / "out" / "logs" / "a.log").is_file()


def test_failure_names_the_step_and_keeps_the_record(tmp_path):
    a = tmp_path / "a.txt"
    steps = [{"name": "a", "run": _touch(a), "done": str(a)},
             {"name": "boom", "run": f"{sys.executable} -c \"print('bad config'); raise SystemExit(3)\""},
             {"name": "never", "run": _touch(tmp_path / "n.txt")}]
    with pytest.raises(StepFailed, match=r"'boom' failed \(exit 3\)"):
        run_recipe(load_recipe(_write(tmp_path, steps)), echo=lambda *_: None)
    record = json.loads((tmp_path / "out" / RECORD_FILE).read_text())
    assert [r["status"] for r in record["steps"]] == ["ok", "exit 3"]
    assert record["complete"] is False
    assert "bad config" in (tmp_path / "out" / "logs" / "boom.log").read_text()
    assert not (tmp_path / "n.txt").exists()


def test_exit_zero_without_its_output_is_a_failure(tmp_path):
    steps = [{"name": "quiet", "run": f"{sys.executable} -c pass", "done": str(tmp_path / "never.txt")}]
    with pytest.raises(StepFailed, match="never.txt is missing"):
        run_recipe(load_recipe(_write(tmp_path, steps)), echo=lambda *_: None)


def test_resume_skips_finished_steps_and_keeps_their_times(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    steps = [{"name": "a", "run": _touch(a, 0.2), "done": str(a)},
             {"name": "b", "run": f"{sys.executable} -c \"raise SystemExit(1)\"", "done": str(b)}]
    path = _write(tmp_path, steps)
    with pytest.raises(StepFailed):
        run_recipe(load_recipe(path), echo=lambda *_: None)
    first = json.loads((tmp_path / "out" / RECORD_FILE).read_text())["steps"][0]["wall_s"]
    steps[1]["run"] = _touch(b)
    a.write_text("from the first run")
    record = run_recipe(load_recipe(_write(tmp_path, steps)), resume=True, echo=lambda *_: None)
    assert a.read_text() == "from the first run"  # not run again
    assert [r["status"] for r in record["steps"]] == ["done before", "ok"]
    assert record["steps"][0]["wall_s"] == first >= 0.2
    assert record["complete"] is True
    again = run_recipe(load_recipe(path), resume=True, echo=lambda *_: None)  # a second resume keeps them too
    assert [r["wall_s"] for r in again["steps"]] == [r["wall_s"] for r in record["steps"]]
    assert again["total_wall_s"] == record["total_wall_s"]


def test_only_runs_the_named_steps(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    steps = [{"name": "a", "run": _touch(a)}, {"name": "b", "run": _touch(b)}]
    record = run_recipe(load_recipe(_write(tmp_path, steps)), only={"b"}, echo=lambda *_: None)
    assert not a.exists() and b.exists()
    assert [r["status"] for r in record["steps"]] == ["skipped", "ok"]
    assert record["complete"] is False
    with pytest.raises(ConfigError, match="unknown step"):
        run_recipe(load_recipe(_write(tmp_path, steps)), only={"c"}, echo=lambda *_: None)


def test_only_runs_keep_the_walls_of_steps_they_skip(tmp_path):
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    steps = [{"name": "a", "run": _touch(a, 0.2)}, {"name": "b", "run": _touch(b, 0.1)},
             {"name": "c", "run": f"{sys.executable} -c \"raise SystemExit(2)\""}]
    path = _write(tmp_path, steps)
    first = run_recipe(load_recipe(path), only={"a"}, echo=lambda *_: None)["steps"][0]["wall_s"]
    second = run_recipe(load_recipe(path), only={"b"}, echo=lambda *_: None)
    assert [r["status"] for r in second["steps"]] == ["skipped", "ok", "skipped"]
    assert second["steps"][0]["wall_s"] == first >= 0.2  # a's wall survives a run that skipped it
    with pytest.raises(StepFailed):
        run_recipe(load_recipe(path), only={"c"}, echo=lambda *_: None)
    third = run_recipe(load_recipe(path), only={"b"}, echo=lambda *_: None)
    assert third["steps"][0]["wall_s"] == first  # and two of them
    assert third["steps"][2]["wall_s"] is None  # a failed step's wall is not carried
    assert third["total_wall_s"] == pytest.approx(first + third["steps"][1]["wall_s"], abs=0.11)


@pytest.mark.parametrize("text, match", [
    ("name: t\nout: o\nsteps: []\n", "non-empty 'steps'"),
    ("name: t\nout: o\nsteps: [{name: a}]\n", r"expected \{name, run"),
    ("name: t\nout: o\nsteps: [{name: a, run: x}, {name: a, run: y}]\n", "must be unique"),
    ("name: t\nout: o\nsteps: [{name: 'a b', run: x}]\n", "must be unique and made of"),
    ("name: t\nout: o\nsteps: [{name: a, run: '  '}]\n", "non-empty command"),
    ("name: t\nout: o\nextra: 1\nsteps: [{name: a, run: x}]\n", "unknown keys"),
    ("name: t\nsteps: [{name: a, run: x}]\n", "'out' must be"),
    ("name: [\n", "not valid YAML"),
])
def test_bad_recipes_are_named(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_recipe(path)


def test_cli_reports_a_missing_command(tmp_path, capsys):
    path = _write(tmp_path, [{"name": "x", "run": "no-such-program-wam-diff --flag"}])
    assert train_main(["recipe", str(path)]) == 1
    assert "'x' failed (exit 127)" in capsys.readouterr().err
    assert "command not found" in (tmp_path / "out" / "logs" / "x.log").read_text()
    assert train_main(["recipe", str(tmp_path / "missing.yaml")]) == 2


def test_the_shipped_recipe_rebuilds_the_shipped_pair_from_its_own_steps():
    """wam_diff_training/recipes/nano_s.yaml: 29 steps; every config it names exists; step export_b32 exports the B = 32
    model to runs/nano_s/nano-s-b32 (step export_ar its AR teacher to runs/nano_s/nano-s-ar) and the last two write
    each one's box head into it; every checkpoint a step starts from is one an earlier step made; no step runs a file
    under scripts/."""
    recipe = load_recipe(REPO / "wam_diff_training" / "recipes" / "nano_s.yaml")
    assert len(recipe.steps) == 29 and str(recipe.out) == "runs/nano_s"
    export_b32 = next(s for s in recipe.steps if s.name == "export_b32")
    assert export_b32.run[:2] == ("wam-diff-train", "export") and export_b32.run[3] == "runs/nano_s/nano-s-b32"
    assert export_b32.done == "runs/nano_s/nano-s-b32/model.safetensors"
    for step, model in zip(recipe.steps[-2:], ("runs/nano_s/nano-s-ar", "runs/nano_s/nano-s-b32")):
        assert step.run[:2] == ("wam-diff-train", "box-head") and step.run[step.run.index("--model") + 1] == model
        assert step.done == f"{model}/box_head.safetensors"
    export_ar = next(s for s in recipe.steps if s.name == "export_ar")
    assert export_ar.run[3] == "runs/nano_s/nano-s-ar" and export_ar.done == "runs/nano_s/nano-s-ar/model.safetensors"
    made: list[str] = []
    for step in recipe.steps:
        argv = list(step.run)
        assert not any("scripts/" in a for a in argv), step.name
        for flag, value in zip(argv, argv[1:]):
            if flag == "--config":
                assert (REPO / value).is_file(), (step.name, value)
            if flag in ("--init", "--student", "--teacher", "--policy", "--model"):
                assert any(Path(d).is_relative_to(value) for d in made), (step.name, flag, value)
        if step.done:
            made.append(step.done)


def test_include_puts_the_other_recipes_steps_first(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"name": "base", "out": "o", "steps": [{"name": "a", "run": "echo a"},
                                                                          {"name": "b", "run": "echo b"}]}))
    (tmp_path / "sub").mkdir()
    more = tmp_path / "sub" / "more.yaml"
    more.write_text(yaml.safe_dump({"name": "more", "out": "m", "include": "../base.yaml",
                                    "steps": [{"name": "c", "run": "echo c"}]}))
    recipe = load_recipe(more)
    assert [s.name for s in recipe.steps] == ["a", "b", "c"]
    assert (recipe.name, str(recipe.out)) == ("more", "m")
    # a step name already taken by the included recipe, an include cycle, a missing file: each named
    clash = tmp_path / "clash.yaml"
    clash.write_text(yaml.safe_dump({"name": "x", "out": "o", "include": "base.yaml", "steps": [{"name": "b", "run": "echo"}]}))
    with pytest.raises(ConfigError, match="name 'b' must be unique"):
        load_recipe(clash)
    loop = tmp_path / "loop.yaml"
    loop.write_text(yaml.safe_dump({"name": "x", "out": "o", "include": "loop.yaml", "steps": [{"name": "z", "run": "echo"}]}))
    with pytest.raises(ConfigError, match="includes itself"):
        load_recipe(loop)
    gone = tmp_path / "gone.yaml"
    gone.write_text(yaml.safe_dump({"name": "x", "out": "o", "include": "nope.yaml", "steps": [{"name": "z", "run": "echo"}]}))
    with pytest.raises(ConfigError, match="nope.yaml: no such file"):
        load_recipe(gone)


def test_the_ablation_recipes_continue_the_shipped_recipe():
    chain = load_recipe(REPO / "wam_diff_training/recipes/nano_s.yaml")
    for name, added in (("ablate_direct", ["adapt_direct", "distill_direct"]),
                        ("ablate_teacher", ["distill_diffusion_teacher", "distill_ar_teacher"])):
        ablation = load_recipe(REPO / f"wam_diff_training/recipes/{name}.yaml")
        assert ablation.steps[:len(chain.steps)] == chain.steps
        assert [s.name for s in ablation.steps[len(chain.steps):]] == added
        assert ablation.out != chain.out  # its own record and logs, beside the chain's


def test_every_shipped_recipe_and_the_configs_its_steps_name_load():
    """The recipes in wam_diff_training/recipes and each --config their steps pass (with their `base:` chains)."""
    import re

    from wam_diff_training.config import load_config

    recipes = sorted((REPO / "wam_diff_training/recipes").glob("*.yaml"))
    assert {p.name for p in recipes} == {"nano_s.yaml", "ablate_direct.yaml", "ablate_teacher.yaml"}
    configs = set()
    for path in recipes:
        recipe = load_recipe(path)
        assert recipe.steps, path
        for step in recipe.steps:
            configs.update(re.findall(r"--config (\S+)", " ".join(step.run)))
    assert "wam_diff_training/configs/nano_s_final.yaml" in configs
    for cfg in sorted(configs):
        assert load_config(REPO / cfg).out.startswith("runs/"), cfg
    base = load_config(REPO / "wam_diff_training/configs/nano_s.yaml")
    dagger = load_config(REPO / "wam_diff_training/configs/nano_s_dagger1.yaml")
    final = load_config(REPO / "wam_diff_training/configs/nano_s_final.yaml")
    # a config keeps its bases' settings it does not name
    assert final.perception == base.perception and final.train.batch_size == base.train.batch_size
    assert (base.optim.lr, dagger.optim.lr, final.optim.lr, final.perception.occupancy_weight) == (1e-3, 3e-4, 3e-4, 1.0)
    # the route target switch: a base's data.route_targets reaches a child that replaces data.train
    targets = {name: load_config(REPO / f"wam_diff_training/configs/nano_s_{name}.yaml").data.route_targets
               for name in ("dagger1", "dagger2", "dagger3", "final")}
    assert targets == {"dagger1": False, "dagger2": False, "dagger3": False, "final": ["roundabout"]}
    assert {Path(d["path"]).name for d in final.data.train} >= {"train_balanced.json", "train_bending.json"}


def test_steps_find_the_projects_commands_without_an_activated_venv(tmp_path, monkeypatch):
    """A bare `python` (or `wam-diff`) in a step is the interpreter running the recipe, not whatever PATH had first."""
    from wam_diff_training.recipe import step_env

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = step_env()
    bindir = str(Path(sys.executable).parent)
    assert env["PATH"].split(":")[0] == bindir and "/usr/bin" in env["PATH"].split(":")
    assert step_env({"PATH": f"{bindir}:/bin"})["PATH"] == f"{bindir}:/bin"  # not added twice
    out = tmp_path / "which.txt"
    name = Path(sys.executable).name
    steps = [{"name": "w", "run": f"{name} -c \"import sys, pathlib; pathlib.Path(r'{out}').write_text(sys.executable)\"",
              "done": str(out)}]
    record = run_recipe(load_recipe(_write(tmp_path, steps)), echo=lambda *_: None)
    assert record["complete"] is True
    assert Path(out.read_text()).parent == Path(sys.executable).parent
