"""Per-route jobs of the suite commands (`wam-diff drive`, `data`, `dagger`, `counterfactual`, `sensitivity`):
each route in this process or in a spawn pool of workers, with a progress bar over the routes on stderr."""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Optional


@contextlib.contextmanager
def worker_threads(workers: int):
    """Spawned policy workers share the cores: unless OMP_NUM_THREADS is set, each gets cpu_count //
    workers torch threads (measured: two 2-thread workers on 2 cores drove the AR model 5 routes in 12
    min, one thread each 43 routes in 7.4 min)."""
    key = "OMP_NUM_THREADS"
    if workers <= 1 or key in os.environ:
        yield
        return
    os.environ[key] = str(max(1, (os.cpu_count() or 1) // workers))
    try:
        yield
    finally:
        os.environ.pop(key, None)


def route_jobs(worker, args: list[tuple], workers: int, *, desc: Optional[str] = None, total: Optional[int] = None,
               postfix: Optional[Callable[[list], dict]] = None):
    """worker(*a) for each job (a[0] is the route dict), in this process or a spawn pool of `workers`
    (one share of the cores each, `worker_threads`); yields each result as it finishes, None for a
    route whose worker crashed (reported: it costs its route, not the run). With `desc`: a progress bar
    (tqdm, on stderr, with the time left) over `total` routes (default: the jobs; more when some were done
    before), `postfix(results so far)` shown beside it."""
    bar = None
    if desc is not None:
        from tqdm import tqdm

        total = len(args) if total is None else total
        bar = tqdm(total=total, initial=total - len(args), desc=desc, unit="route")
    done = []  # the finished results, kept only for `postfix`
    try:
        for res in _run_jobs(worker, args, workers):
            if bar is not None:
                bar.update(1)
                if postfix is not None:
                    done += [res] if res is not None else []
                    bar.set_postfix(postfix(done))
            yield res
    finally:
        if bar is not None:
            bar.close()


def _run_jobs(worker, args: list[tuple], workers: int):
    if workers <= 1:
        for a in args:
            yield worker(*a)
        return
    with worker_threads(workers), \
            ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(worker, *a): a[0]["route_id"] for a in args}
        for f in as_completed(futs):
            try:
                yield f.result()
            except Exception as exc:
                print(f"route {futs[f]} failed in its worker: {type(exc).__name__}: {exc}")
                yield None


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """--no-progress: no progress bar over the routes (it goes to stderr otherwise)."""
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar over the routes (default: one on stderr, with the time left)")
