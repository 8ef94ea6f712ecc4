"""`wam-diff report`: evaluate trained models and write a markdown table, plots and JSON.

    wam-diff report --spec training/configs/report_nano.yaml --out runs/report [--resume] [--no-closed-loop]

Per model (spec: training/report/spec.py): planning L2 per horizon and PDMS, detection mAP and QA
accuracy on evenly spaced validation samples, tokens/s on this machine at batch 1 with the spec's
remasking, closed-loop driving score and success rate on the route suite, and top-5 agreement with
its teacher. Sweeps: quality against denoising steps, tokens/s against block size. Each model's
results are cached in OUT/models/<name>.json, closed-loop routes in OUT/closed_loop/<name>/, so an
interrupted report continues with --resume.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from wam_diff_core.model.checkpoint import LoadedModel, load

from .spec import ModelEntry, ReportSpec, SpecError, load_spec

PLOTS = {"l2_vs_horizon": "plots/l2_vs_horizon.png", "steps_sweep": "plots/quality_vs_steps.png",
         "block_sweep": "plots/tokens_per_s_vs_block_size.png"}


def machine() -> str:
    return f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def held_out_score(routes, summary: dict) -> dict:
    """DS over the suite's held-out routes (the validation split every dataset of this project leaves
    out, `wam_diff_core.sim.datagen.assign_splits`): training data, DAgger's included, never drove them."""
    from wam_diff_core.sim.datagen import VAL_FRACTION, assign_splits

    splits = assign_splits(routes, VAL_FRACTION)
    held = sorted(rid for rid, split in splits.items() if split == "val")
    per_route = summary.get("routes") or {}
    scores = [float((per_route.get(rid) or {}).get("score", 0.0)) for rid in held]
    return {"held_out_routes": held, "held_out_driving_score": sum(scores) / len(scores) if scores else None}


def scenario_scores(summary: dict) -> dict:
    """DS per scenario type and the number of routes that ended in (or recorded) a vehicle collision."""
    per, collisions = {}, 0
    for rec in (summary.get("routes") or {}).values():
        per.setdefault(rec.get("scenario", "?"), []).append(float(rec.get("score", 0.0)))
        collisions += any("collision" in str(i) for i in rec.get("infractions") or [])
    return {"per_scenario": {k: sum(v) / len(v) for k, v in sorted(per.items())}, "collisions": collisions}


def block_size_of(entry: ModelEntry, loaded: LoadedModel) -> int:
    return int(entry.block_size or loaded.settings.trained_block_size)


def _planning_point(res: dict) -> dict:
    scores = res.get("scores") or {}
    parsed = scores.get("samples", 0) if "l2_mean" in scores else 0
    return {"block_size": res["block_size"], "steps": res["steps"], "l2_mean": scores.get("l2_mean"),
            "invalid_share": 1.0 - parsed / max(1, res["samples"]), "tokens_per_s": res["tokens_per_s"],
            "forwards_per_token": res["forwards_per_token"]}


class Report:
    def __init__(self, spec: ReportSpec, spec_path: str, out: Path, resume: bool, closed_loop: bool,
                 progress: bool = True):
        self.spec, self.spec_path, self.out = spec, spec_path, out
        self.resume, self.closed_loop, self.progress = resume, closed_loop, progress
        self._examples: dict = {}
        self._loaded: dict[str, LoadedModel] = {}

    # ------------------------------------------------------------ helpers
    def loaded(self, entry: ModelEntry) -> LoadedModel:
        if entry.name not in self._loaded:
            loaded = load(entry.path)
            if not entry.grammar:  # decode as an unconstrained ("official") checkpoint
                loaded = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings,
                                                                                  trajectory_format="official"))
            self._loaded[entry.name] = loaded
        return self._loaded[entry.name]

    def examples(self, task: str, loaded: LoadedModel):
        """The same samples for every model (encoded once per trajectory style and route-target use; models of a
        report share the processor)."""
        from .open_loop import load_split

        key = (task, loaded.settings.trajectory_format, loaded.settings.prompt_route_targets)
        if key not in self._examples:
            self._examples[key] = load_split(self.spec.data[task], loaded, task, self.spec.samples[task])
        return self._examples[key]

    def _cached(self, path: Path):
        if self.resume and path.is_file():
            return json.loads(path.read_text())
        return None

    # ------------------------------------------------------------ per model
    def evaluate_model(self, entry: ModelEntry) -> dict:
        from .open_loop import evaluate_task

        path = self.out / "models" / f"{entry.slug}.json"
        cached = self._cached(path)
        if cached is None:
            loaded = self.loaded(entry)
            B = block_size_of(entry, loaded)
            d = self.spec.decoding
            result = {"name": entry.name, "path": entry.path, "block_size": B,
                      "trained_block_size": loaded.settings.trained_block_size,
                      "parameters": sum(p.numel() for p in loaded.model.parameters()), "open_loop": {}}
            for task, split in self.spec.data.items():
                result["open_loop"][task] = evaluate_task(
                    loaded, split, task, self.spec.samples[task], B, d.steps, d.strategy, d.threshold, self.out,
                    entry.slug, self.progress, examples=self.examples(task, loaded),
                    max_new_tokens=self.spec.max_new_tokens[task], number_order=self.number_order(entry))
            if entry.teacher:
                result["agreement"] = self.agreement(entry, loaded, B)
            self._write(path, result)
            cached = result
        elif entry.teacher and (cached.get("agreement") or {}).get("teacher") != entry.teacher:
            # a cached result whose spec entry has gained (or changed) its teacher since
            loaded = self.loaded(entry)
            cached["agreement"] = self.agreement(entry, loaded, block_size_of(entry, loaded))
            self._write(path, cached)
        if self.closed_loop and entry.closed_loop and "closed_loop" not in cached:
            cached["closed_loop"] = self.drive(entry.path, entry.slug, cached["block_size"], self.number_order(entry))
            self._write(path, cached)
        if self.closed_loop and entry.closed_loop and self.spec.sensitivity and "sensitivity" not in cached:
            cached["sensitivity"] = self.sensitivity(entry.path, entry.slug, cached["block_size"],
                                                     self.number_order(entry))
            self._write(path, cached)
        return cached

    def number_order(self, entry: ModelEntry) -> bool:
        """Whether this model's trajectory digits are committed most significant first."""
        return self.spec.decoding.number_order if entry.number_order is None else bool(entry.number_order)

    def sensitivity(self, policy: str, slug: str, block_size: int, number_order: bool = True) -> dict:
        """`wam-diff sensitivity` of one model on the spec's routes (OUT/sensitivity/<slug>/, reused with
        --resume): does it slow for the vehicle ahead the way the expert does?"""
        from wam_diff_core.sim.closed_loop import policy_overrides
        from wam_diff_core.sim.routes import load_routes
        from wam_diff_core.sim.sensitivity import probe

        sv, cl = self.spec.sensitivity, self.spec.closed_loop
        out = self.out / "sensitivity" / slug
        cached = self._cached(out / "sensitivity.json")
        if cached is None:
            overrides = policy_overrides(block_size, self.spec.decoding.steps, number_order)
            overrides.update(strategy=self.spec.decoding.strategy, threshold=self.spec.decoding.threshold)
            cached = probe(load_routes(cl.routes, ids=list(sv.ids)), policy, out, every=sv.every, max_s=sv.max_seconds,
                           frame_size=cl.frame_size, workers=cl.workers, overrides=overrides, progress=self.progress)
        return {**cached["summary"], "route_ids": list(sv.ids)}

    def constant_velocity_open_loop(self) -> dict:
        """The constant-velocity baseline on the same planning samples as the models (open loop)."""
        from .open_loop import constant_velocity_planning

        entry = self.spec.models[0]
        return constant_velocity_planning(self.spec.data["planning"], self.examples("planning", self.loaded(entry)),
                                          self.out)

    def agreement(self, entry: ModelEntry, loaded: LoadedModel, block_size: int) -> dict:
        from .agreement import top5_agreement

        t_entry = self.spec.model(entry.teacher)
        teacher = self.loaded(t_entry)
        task = "planning" if "planning" in self.spec.data else next(iter(self.spec.data))
        res = top5_agreement(loaded, block_size, teacher, block_size_of(t_entry, teacher), self.examples(task, loaded))
        return {"teacher": t_entry.name, **res}

    def drive(self, policy: str, slug: str, block_size: int | None, number_order: bool = True) -> dict:
        from wam_diff_core.sim.closed_loop import drive_suite, policy_overrides
        from wam_diff_core.sim.routes import checkpoint_frame_size, load_routes

        cl = self.spec.closed_loop
        trained = checkpoint_frame_size(policy)
        if trained is not None and tuple(trained) != tuple(cl.frame_size):
            print(f"note: {policy} was trained on {trained[0]}x{trained[1]} frames; closed_loop.frame_size drives it at "
                  f"{cl.frame_size[0]}x{cl.frame_size[1]}", flush=True)
        routes = load_routes(cl.routes, ids=list(cl.ids) or None, limit=cl.limit)
        overrides = None
        if block_size is not None:
            overrides = policy_overrides(block_size, self.spec.decoding.steps, number_order)
            overrides.update(strategy=self.spec.decoding.strategy, threshold=self.spec.decoding.threshold)
        summary = drive_suite(routes, policy, self.out / "closed_loop" / slug, workers=cl.workers,
                              frame_size=cl.frame_size, replan_every=cl.replan_every, resume=self.resume,
                              progress=self.progress, overrides=overrides)
        keep = ("driving_score", "success_rate", "abilities", "efficiency", "comfort", "num_routes", "wall_s",
                "invalid_plans", "policy_overrides")
        return {k: summary.get(k) for k in keep} | held_out_score(routes, summary) | scenario_scores(summary)

    # ------------------------------------------------------------ speed
    def speed_pass(self) -> dict:
        """tokens/s of every model in one pass, the models taking turns sample by sample (so load on
        the machine falls on all of them alike): the table's speed column and the x-AR ratios."""
        from .open_loop import decode_in_turns, decoder_config

        path = self.out / "speed.json"
        cached = self._cached(path)
        if cached is not None and set(cached["models"]) == {m.name for m in self.spec.models}:
            return cached
        d = self.spec.decoding
        runs = []
        for entry in self.spec.models:
            loaded = self.loaded(entry)
            B = block_size_of(entry, loaded)
            # the checkpoint's own forward-only bound, as its closed-loop drive decodes
            runs.append((entry, loaded, decoder_config(B, d.steps, d.strategy, d.threshold,
                                                       self.spec.max_new_tokens["planning"], self.number_order(entry),
                                                       forward_only=loaded.settings.decoding.forward_only)))
        totals = decode_in_turns([(loaded, cfg, self.examples("planning", loaded)) for _, loaded, cfg in runs])
        examples = self.examples("planning", runs[0][1])
        runs = [(entry, loaded, cfg, acc) for (entry, loaded, cfg), acc in zip(runs, totals)]
        result = {"samples": len(examples), "threads": torch.get_num_threads(),
                  "models": {e.name: {"block_size": cfg.block_size, "steps": cfg.steps, "tokens": acc.tokens,
                                      "seconds": acc.seconds, "tokens_per_s": acc.tokens_per_s,
                                      "forwards_per_token": acc.forwards_per_token}
                             for e, _, cfg, acc in runs}}
        self._write(path, result)
        return result

    # ------------------------------------------------------------ sweeps
    def sweep(self, kind: str) -> dict:
        from .open_loop import evaluate_task

        sw = self.spec.sweeps[kind]
        path = self.out / "sweeps" / f"{kind}.json"
        cached = self._cached(path)
        if cached is not None:
            return cached
        entry = self.spec.model(sw.model)
        loaded = self.loaded(entry)
        d = self.spec.decoding
        points = []
        for v in sw.values:
            B, K = (block_size_of(entry, loaded), v) if kind == "steps" else (v, d.steps)
            res = evaluate_task(loaded, self.spec.data["planning"], "planning", self.spec.samples["planning"], B, K,
                                d.strategy, d.threshold, self.out, f"{entry.slug}_{kind}_{v}", self.progress,
                                examples=self.examples("planning", loaded),
                                max_new_tokens=self.spec.max_new_tokens["planning"],
                                number_order=self.number_order(entry))
            points.append(_planning_point(res))
        result = {"model": entry.name, "points": points}
        self._write(path, result)
        return result

    def add_l2_gaps(self, models: list) -> None:
        """Each B > 1 model's paired planning L2 gap to its AR reference (`table.ar_reference`), from the
        prediction files both wrote (plans drawn alike: the same evenly spaced samples)."""
        from .l2_gap import gap_to_reference, ground_truth
        from .table import ar_reference

        def predictions(m):
            plan = (m.get("open_loop") or {}).get("planning") or {}
            path = plan.get("predictions")
            return Path(path) if path and Path(path).is_file() else None

        truth = None
        for m in models:
            ref = ar_reference(models, m, predictions) if m.get("block_size") != 1 else None
            gap = None
            if ref is not None and predictions(m) is not None:
                truth = truth if truth is not None else ground_truth(Path(self.spec.data["planning"]))
                gap = gap_to_reference(truth, predictions(ref), predictions(m))
            if gap is not None:
                m["l2_gap"] = {"reference": ref["name"]} | gap

    def _write(self, path: Path, obj: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=2))

    # ------------------------------------------------------------ all
    def run(self) -> dict:
        from . import plots
        from .table import render

        if self.spec.sweeps and "planning" not in self.spec.data:
            raise SpecError("sweeps need data.planning")
        t0 = time.perf_counter()
        models = [self.evaluate_model(m) for m in self.spec.models]
        self.add_l2_gaps(models)
        baselines = {}
        if self.closed_loop:
            for name in self.spec.baselines:
                path = self.out / "models" / f"baseline_{name}.json"
                cl = self._cached(path)
                if cl is None:
                    cl = self.drive(name, f"baseline_{name}", None)
                    self._write(path, cl)
                baselines[name] = cl
        if "constant-velocity" in self.spec.baselines and "planning" in self.spec.data:
            baselines.setdefault("constant-velocity", {})["open_loop"] = {"planning": self.constant_velocity_open_loop()}
        sweeps = {kind: self.sweep(kind) for kind in self.spec.sweeps}
        speed = self.speed_pass() if "planning" in self.spec.data else None
        made = {}
        rows = [{"name": m["name"], "block_size": m["block_size"],
                 "l2": (m["open_loop"].get("planning") or {}).get("scores")} for m in models]
        rows = [r for r in rows if r["l2"] and "l2_mean" in r["l2"]]
        if plots.plot_l2_vs_horizon(rows, self.out / PLOTS["l2_vs_horizon"]):
            made["L2 against horizon"] = PLOTS["l2_vs_horizon"]
        if "steps" in sweeps and plots.plot_steps_sweep(sweeps["steps"]["model"], sweeps["steps"]["points"],
                                                        self.out / PLOTS["steps_sweep"]):
            made["quality against denoising steps"] = PLOTS["steps_sweep"]
        if "block_size" in sweeps and plots.plot_block_sweep(sweeps["block_size"]["model"],
                                                             sweeps["block_size"]["points"], self.out / PLOTS["block_sweep"]):
            made["tokens/s against block size"] = PLOTS["block_sweep"]
        cl = self.spec.closed_loop
        report = {
            "spec": self.spec_path, "machine": machine(), "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "decoding": asdict(self.spec.decoding),
            "closed_loop_routes": (f"{len(cl.ids)} routes" if cl.ids else (f"the first {cl.limit} routes of the suite"
                                   if cl.limit else "the whole route suite")) +
                                  f", {cl.frame_size[0]}x{cl.frame_size[1]} frames, a plan every {cl.replan_every} ticks",
            "models": models, "baselines": baselines, "sweeps": sweeps, "speed": speed, "plots": made,
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        self._write(self.out / "report.json", report)
        (self.out / "report.md").write_text(render(report))
        return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="report spec YAML (training/configs/report_*.yaml)")
    parser.add_argument("--out", required=True, help="output directory: report.md, report.json, plots/, predictions/")
    parser.add_argument("--resume", action="store_true", help="reuse results already written under --out")
    parser.add_argument("--no-closed-loop", action="store_true", help="open loop and sweeps only")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"wam-diff report: {exc}")
        return 2
    out = Path(args.out)
    report = Report(spec, args.spec, out, args.resume, not args.no_closed_loop, not args.no_progress).run()
    print((out / "report.md").read_text())
    print(f"written: {out / 'report.md'}, {out / 'report.json'}; {len(report['plots'])} plots under {out / 'plots'}")
    return 0
