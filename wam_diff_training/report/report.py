"""`wam-diff-train report`: evaluate trained models and write a markdown table, plots and JSON.

    wam-diff-train report --spec wam_diff_training/configs/report.yaml --out runs/report [--resume] [--no-closed-loop]

Per model (spec: wam_diff_training/report/spec.py): planning L2 per horizon and PDMS, detection mAP and QA
accuracy on evenly spaced validation samples, tokens/s on this machine at batch 1 with the spec's
remasking, closed-loop driving score and success rate on the route suite, and top-5 agreement with
its teacher. Sweeps: quality against denoising steps, tokens/s against block size. Each model's
results are cached in OUT/models/<name>.json, closed-loop routes in OUT/closed_loop/<name>/, so an
interrupted report continues with --resume. A progress bar on stderr counts the work (samples decoded,
routes driven) with an ETA.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import torch

from wam_diff_core.eval.compare_drives import scenario_scores
from wam_diff_core.model.checkpoint import LoadedModel, load

from .progress import WorkBar
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


def block_size_of(entry: ModelEntry, loaded: LoadedModel) -> int:
    return int(entry.block_size or loaded.settings.trained_block_size)


def _planning_point(res: dict) -> dict:
    scores = res.get("scores") or {}
    parsed = scores.get("samples", 0) if "l2_mean" in scores else 0
    return {"block_size": res["block_size"], "steps": res["steps"], "l2_mean": scores.get("l2_mean"),
            "invalid_share": 1.0 - parsed / max(1, res["samples"]), "tokens_per_s": res["tokens_per_s"],
            "forwards_per_token": res["forwards_per_token"]}


def routes_described(cl) -> str:
    """The closed-loop setting in words, for the report's header."""
    which = (f"{len(cl.ids)} routes" if cl.ids else
             (f"the first {cl.limit} routes of the suite" if cl.limit else "the whole route suite"))
    return f"{which}, {cl.frame_size[0]}x{cl.frame_size[1]} frames, a plan every {cl.replan_every} ticks"


class Report:
    """The work of one report spec under one output directory; `run()` does it all and writes report.md/json."""

    def __init__(self, spec: ReportSpec, spec_path: str, out: Path, resume: bool, closed_loop: bool,
                 progress: bool = True):
        self.spec, self.spec_path, self.out = spec, spec_path, out
        self.resume, self.closed_loop, self.progress = resume, closed_loop, progress
        self._examples: dict = {}
        self._loaded: dict[str, LoadedModel] = {}
        self._routes: Optional[int] = None
        self.bar = WorkBar(0, enabled=False)  # run() counts its work on a live one

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

    def _write(self, path: Path, obj: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=2))

    # ------------------------------------------------------------ work items (the progress bar's units)
    def agreement_task(self) -> str:
        return "planning" if "planning" in self.spec.data else next(iter(self.spec.data))

    def open_loop_items(self) -> int:
        """Samples one model decodes open loop, all tasks."""
        return sum(self.spec.samples[task] for task in self.spec.data)

    def route_count(self) -> int:
        """Routes of one closed-loop drive."""
        if self._routes is None:
            from wam_diff_core.sim.routes import load_routes

            cl = self.spec.closed_loop
            self._routes = len(load_routes(cl.routes, ids=list(cl.ids) or None, limit=cl.limit))
        return self._routes

    def work_items(self) -> int:
        """The whole report in items: samples decoded (open loop, agreement, sweeps, speed pass) and routes
        driven (closed loop, baselines, traffic-response probes)."""
        spec = self.spec
        planning = spec.samples["planning"] if "planning" in spec.data else 0
        items = sum(self.open_loop_items() + (spec.samples[self.agreement_task()] if m.teacher else 0)
                    for m in spec.models)
        items += sum(len(sw.values) * planning for sw in spec.sweeps.values()) + len(spec.models) * planning
        if self.closed_loop:
            driven = [m for m in spec.models if m.closed_loop]
            if driven or spec.baselines:
                items += (len(driven) + len(spec.baselines)) * self.route_count()
            if spec.sensitivity:
                items += len(driven) * len(spec.sensitivity.ids)
        return items

    # ------------------------------------------------------------ per model
    def evaluate_model(self, entry: ModelEntry) -> dict:
        """One model's results, written to OUT/models/<slug>.json as each part completes (reused with --resume)."""
        path = self.out / "models" / f"{entry.slug}.json"
        result = self._cached(path)
        if result is None:
            result = self.open_loop(entry)
            self._write(path, result)
        else:
            self.bar.reused(self.open_loop_items())
            if entry.teacher and (result.get("agreement") or {}).get("teacher") != entry.teacher:
                # a cached result whose spec entry has gained (or changed) its teacher since
                loaded = self.loaded(entry)
                result["agreement"] = self.agreement(entry, loaded, block_size_of(entry, loaded))
                self._write(path, result)
            elif entry.teacher:
                self.bar.reused(self.spec.samples[self.agreement_task()])
        if self.closed_loop and entry.closed_loop:
            self.closed_loop_of(entry, result, path)
        return result

    def open_loop(self, entry: ModelEntry) -> dict:
        """Every task of the spec decoded and scored, and the agreement with the teacher when the entry names one."""
        from .open_loop import evaluate_task

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
            self.bar.done(self.spec.samples[task])
        if entry.teacher:
            result["agreement"] = self.agreement(entry, loaded, B)
        return result

    def closed_loop_of(self, entry: ModelEntry, result: dict, path: Path) -> None:
        """The model's drive of the route suite and its traffic-response probe, added to `result` (and its file)."""
        if "closed_loop" not in result:
            result["closed_loop"] = self.drive(entry.path, entry.slug, result["block_size"], self.number_order(entry))
            self._write(path, result)
        else:
            self.bar.reused(self.route_count())
        if not self.spec.sensitivity:
            return
        if "sensitivity" not in result:
            result["sensitivity"] = self.sensitivity(entry.path, entry.slug, result["block_size"],
                                                     self.number_order(entry))
            self._write(path, result)
        else:
            self.bar.reused(len(self.spec.sensitivity.ids))

    def number_order(self, entry: ModelEntry) -> bool:
        """Whether this model's trajectory digits are committed most significant first."""
        return self.spec.decoding.number_order if entry.number_order is None else bool(entry.number_order)

    def decoding(self, block_size: int, number_order: bool) -> dict:
        """The spec's decoding settings for a model decoded at `block_size` (DecoderConfig fields, laid on the
        checkpoint's own by `resolve_decoding`: B = 1 takes one step whatever the spec's steps)."""
        d = self.spec.decoding
        return {"number_order": number_order, "block_size": block_size, "steps": d.steps, "strategy": d.strategy,
                "threshold": d.threshold}

    def sensitivity(self, policy: str, slug: str, block_size: int, number_order: bool = True) -> dict:
        """`wam-diff sensitivity` of one model on the spec's routes (OUT/sensitivity/<slug>/, reused with
        --resume): does it slow for the vehicle ahead the way the expert does?"""
        from wam_diff_core.sim.routes import load_routes
        from wam_diff_core.sim.sensitivity import probe

        sv, cl = self.spec.sensitivity, self.spec.closed_loop
        out = self.out / "sensitivity" / slug
        cached = self._cached(out / "sensitivity.json")
        if cached is None:
            cached = probe(load_routes(cl.routes, ids=list(sv.ids)), policy, out, every=sv.every, max_s=sv.max_seconds,
                           frame_size=cl.frame_size, workers=cl.workers, decoding=self.decoding(block_size, number_order),
                           progress=self.progress)
            self.bar.done(len(sv.ids))
        else:
            self.bar.reused(len(sv.ids))
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
        task = self.agreement_task()
        res = top5_agreement(loaded, block_size, teacher, block_size_of(t_entry, teacher), self.examples(task, loaded))
        self.bar.done(self.spec.samples[task])
        return {"teacher": t_entry.name, **res}

    def drive(self, policy: str, slug: str, block_size: int | None, number_order: bool = True) -> dict:
        from wam_diff_core.sim.closed_loop import drive_suite
        from wam_diff_core.sim.routes import checkpoint_frame_size, load_routes

        cl = self.spec.closed_loop
        trained = checkpoint_frame_size(policy)
        if trained is not None and tuple(trained) != tuple(cl.frame_size):
            print(f"note: {policy} was trained on {trained[0]}x{trained[1]} frames; closed_loop.frame_size drives it at "
                  f"{cl.frame_size[0]}x{cl.frame_size[1]}", flush=True)
        routes = load_routes(cl.routes, ids=list(cl.ids) or None, limit=cl.limit)
        summary = drive_suite(routes, policy, self.out / "closed_loop" / slug, workers=cl.workers,
                              frame_size=cl.frame_size, replan_every=cl.replan_every, resume=self.resume,
                              progress=self.progress,
                              decoding=None if block_size is None else self.decoding(block_size, number_order))
        self.bar.done(len(routes))
        keep = ("driving_score", "success_rate", "abilities", "efficiency", "comfort", "num_routes", "wall_s",
                "invalid_plans", "policy_overrides")
        return {k: summary.get(k) for k in keep} | held_out_score(routes, summary) | scenario_scores(summary)

    def baselines(self) -> dict:
        """Closed-loop drives of the spec's baselines (with --no-closed-loop: none), and the constant-velocity
        baseline's open-loop planning scores."""
        baselines = {}
        for name in self.spec.baselines if self.closed_loop else ():
            path = self.out / "models" / f"baseline_{name}.json"
            cl = self._cached(path)
            if cl is None:
                cl = self.drive(name, f"baseline_{name}", None)
                self._write(path, cl)
            else:
                self.bar.reused(self.route_count())
            baselines[name] = cl
        if "constant-velocity" in self.spec.baselines and "planning" in self.spec.data:
            baselines.setdefault("constant-velocity", {})["open_loop"] = {"planning": self.constant_velocity_open_loop()}
        return baselines

    # ------------------------------------------------------------ speed
    def speed_pass(self) -> dict:
        """tokens/s of every model in one pass, the models taking turns sample by sample (so load on
        the machine falls on all of them alike): the table's speed column and the x-AR ratios."""
        from .open_loop import Decoded, decode_in_turns, decoder_config

        path = self.out / "speed.json"
        cached = self._cached(path)
        samples = self.spec.samples["planning"]
        if cached is not None and set(cached["models"]) == {m.name for m in self.spec.models}:
            self.bar.reused(len(self.spec.models) * samples)
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
        examples = [self.examples("planning", loaded) for _, loaded, _ in runs]
        totals = [Decoded([], 0, 0, 0.0) for _ in runs]
        n = max(len(ex) for ex in examples)
        for i in range(n):  # one turn per sample, so the bar moves as they go
            turn = decode_in_turns([(loaded, cfg, ex[i:i + 1]) for (_, loaded, cfg), ex in zip(runs, examples)])
            for acc, one in zip(totals, turn):
                acc.tokens += one.tokens
                acc.forwards += one.forwards
                acc.seconds += one.seconds
            self.bar.done(len(runs))
        self.bar.done(len(runs) * max(0, samples - n))  # a split with fewer samples than the spec asks for
        result = {"samples": len(examples[0]), "threads": torch.get_num_threads(),
                  "models": {e.name: {"block_size": cfg.block_size, "steps": cfg.steps, "tokens": acc.tokens,
                                      "seconds": acc.seconds, "tokens_per_s": acc.tokens_per_s,
                                      "forwards_per_token": acc.forwards_per_token}
                             for (e, _, cfg), acc in zip(runs, totals)}}
        self._write(path, result)
        return result

    # ------------------------------------------------------------ sweeps
    def sweep(self, kind: str) -> dict:
        from .open_loop import evaluate_task

        sw = self.spec.sweeps[kind]
        path = self.out / "sweeps" / f"{kind}.json"
        cached = self._cached(path)
        samples = self.spec.samples["planning"]
        if cached is not None:
            self.bar.reused(len(sw.values) * samples)
            return cached
        entry = self.spec.model(sw.model)
        loaded = self.loaded(entry)
        d = self.spec.decoding
        points = []
        for v in sw.values:
            B, K = (block_size_of(entry, loaded), v) if kind == "steps" else (v, d.steps)
            res = evaluate_task(loaded, self.spec.data["planning"], "planning", samples, B, K,
                                d.strategy, d.threshold, self.out, f"{entry.slug}_{kind}_{v}", self.progress,
                                examples=self.examples("planning", loaded),
                                max_new_tokens=self.spec.max_new_tokens["planning"],
                                number_order=self.number_order(entry))
            points.append(_planning_point(res))
            self.bar.done(samples)
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

    # ------------------------------------------------------------ all
    def plots(self, models: list, sweeps: dict) -> dict:
        """The report's plots (those with data to show): title -> path under OUT."""
        from . import plots

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
        return made

    def run(self) -> dict:
        """Every model, baseline, sweep and the speed pass; writes OUT/report.json and OUT/report.md."""
        from .table import render

        if self.spec.sweeps and "planning" not in self.spec.data:
            raise SpecError("sweeps need data.planning")
        t0 = time.perf_counter()
        self.bar = WorkBar(self.work_items(), enabled=self.progress)
        try:
            models = [self.evaluate_model(m) for m in self.spec.models]
            self.add_l2_gaps(models)
            baselines = self.baselines()
            sweeps = {kind: self.sweep(kind) for kind in self.spec.sweeps}
            speed = self.speed_pass() if "planning" in self.spec.data else None
        finally:
            self.bar.close()
        report = {
            "spec": self.spec_path, "machine": machine(), "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "decoding": asdict(self.spec.decoding), "closed_loop_routes": routes_described(self.spec.closed_loop),
            "models": models, "baselines": baselines, "sweeps": sweeps, "speed": speed,
            "plots": self.plots(models, sweeps), "wall_s": round(time.perf_counter() - t0, 1),
        }
        self._write(self.out / "report.json", report)
        (self.out / "report.md").write_text(render(report))
        return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="report spec YAML (wam_diff_training/configs/report*.yaml)")
    parser.add_argument("--out", required=True, help="output directory: report.md, report.json, plots/, predictions/")
    parser.add_argument("--resume", action="store_true", help="reuse results already written under --out")
    parser.add_argument("--no-closed-loop", action="store_true", help="open loop and sweeps only")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = load_spec(args.spec)
    out = Path(args.out)
    report = Report(spec, args.spec, out, args.resume, not args.no_closed_loop, not args.no_progress).run()
    print((out / "report.md").read_text())
    print(f"written: {out / 'report.md'}, {out / 'report.json'}; {len(report['plots'])} plots under {out / 'plots'}")
    return 0
