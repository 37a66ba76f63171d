"""The executors side by side: one suite run by the local and the Ray executor in turn (cells per second,
Ray's overhead), and the speed-up N workers can be expected to give on committed stores, from their
per-cell times. Writes docs/results/executors.md (or -o FILE).

    python -m benchmarks.executors [--suite benchmarks/suites/quick.toml] [--stores split-80x8-mem1.1 ...] [-o FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from shardbench.isolation import kill_deadline

from .leaderboard import publish_report
from .runner import run_suite
from .store import read_records
from .suite import PAGES, STORES, load_suite

WORKER_COUNTS = (1, 2, 8, 32, 128)


def timed_run(suite, executor: str, work: Path) -> tuple[float, int]:
    """Wall-clock seconds and cells of a fresh run of the suite into a scratch store."""
    copy = dataclasses.replace(suite, results=work / f"{executor}.jsonl")
    started = time.monotonic()
    records = run_suite(copy, fresh=True, quiet=True, executor=executor, workers=suite.workers)
    return time.monotonic() - started, len(records)


def expected_makespan(durations: np.ndarray, workers: int) -> float:
    """Longest-first list scheduling of the cells on `workers` (what a pool that takes the next cell when
    one finishes does, up to order)."""
    loads = np.zeros(workers)
    for d in np.sort(durations)[::-1]:
        loads[loads.argmin()] += d
    return float(loads.max())


def speedups(store: Path, overhead: float) -> str:
    records = read_records(store)
    # A record's solve time is what the solver took; the executor adds `overhead` per cell (measured above).
    durations = np.array([min(r["solve_time"], kill_deadline(r["time_limit"])) for r in records]) + overhead
    serial = durations.sum()
    cells = " | ".join(f"{serial / expected_makespan(durations, n):.1f}×" for n in WORKER_COUNTS)
    return f"| `{store.stem}` | {len(records)} | {serial / 60:.1f} min | {cells} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default=str(Path(__file__).parent / "suites" / "quick.toml"))
    parser.add_argument("--stores", nargs="*", default=["quick", "split-80x8-mem1.1", "vs-torchrec-80x8"],
                        help="committed stores (names under benchmarks/results) to estimate speed-ups for")
    parser.add_argument("-o", "--output", default=str(PAGES / "executors.md"), help="the report page (default: %(default)s)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    suite = load_suite(args.suite)
    with tempfile.TemporaryDirectory(prefix="shardbench-executors-") as scratch:
        local_s, cells = timed_run(suite, "local", Path(scratch))
        ray_s, ray_cells = timed_run(suite, "ray", Path(scratch))
    assert cells == ray_cells
    overhead = {"local": local_s * suite.workers / cells, "ray": ray_s * suite.workers / cells}
    lines = [f"#### Executors on this machine ({os.cpu_count()} cores)", "",
             f"Suite `{suite.name}`, {cells} cells of milliseconds each, {suite.workers} workers, run fresh by "
             "each executor in turn (the Ray time includes starting a local Ray instance):", "",
             "| executor | wall s | cells/s | s per cell per worker |", "|---|---|---|---|",
             f"| local (fork per cell) | {local_s:.1f} | {cells / local_s:.1f} | {overhead['local']:.3f} |",
             f"| ray (task per cell, fork inside) | {ray_s:.1f} | {cells / ray_s:.1f} | {overhead['ray']:.3f} |", "",
             f"Expected speed-up over one worker with N Ray workers, from each store's per-cell solve times "
             f"plus the Ray overhead per cell above ({overhead['ray']:.2f} s), cells scheduled longest first "
             "(the cluster's start-up and the import of a cell's libraries on a fresh node are not included):", "",
             "| store | cells | serial | " + " | ".join(f"N = {n}" for n in WORKER_COUNTS) + " |",
             "|---|---|---|" + "---|" * len(WORKER_COUNTS)]
    for name in args.stores:
        store = STORES / f"{name}.jsonl"
        if store.exists():
            lines.append(speedups(store, overhead["ray"]))
    publish_report("\n".join(lines), Path(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
