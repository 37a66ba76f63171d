"""The reliability report: how many malformed inputs every file-reading command was given and how many it
handled (one line, exit 2, nothing written, no traceback); sweeps killed with SIGKILL at random points and
resumed (cells lost, duplicated, corrupt lines, leaderboard equal to an uninterrupted run's); a second
bench process on a busy store; crashing, hanging and cheating solvers; and a sweep of 2,000 cells with the
bench process's memory sampled as it goes.

    python -m benchmarks.reliability [--seeds 5] [--kills 10] [-o docs/results/reliability.md]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from instances import save_instance_set
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from shardbench.cli import main

from .fuzz import MUTATIONS, TARGETS, mutate, run_case
from .leaderboard import leaderboard_rows, publish_report
from .store import cell_key, read_records
from .suite import PAGES


def bad_input(seeds: int, work: Path) -> tuple[list[str], int, int]:
    by_mutation: Counter = Counter()
    handled_by_mutation: Counter = Counter()
    by_target: Counter = Counter()
    handled_by_target: Counter = Counter()
    failures = []
    for target in TARGETS:
        for mutation in MUTATIONS:
            for seed in range(seeds):
                mutated = mutate(target.kind, mutation, seed)
                outcome = run_case(target, mutated, work / "fuzz", main)
                by_mutation[mutation] += 1
                by_target[target.name] += 1
                handled_by_mutation[mutation] += outcome.handled
                handled_by_target[target.name] += outcome.handled
                if not outcome.handled:
                    failures.append(f"{target.name}, {mutated.mutation}: {outcome.problem}")
    tried, handled = sum(by_mutation.values()), sum(handled_by_mutation.values())
    lines = [f"**Bad input**: {tried} malformed files through {len(TARGETS)} file-reading commands, "
             f"{handled} handled (one line naming the problem, exit 2, no traceback, nothing written; or exit 0 "
             "where the mutation left the file valid).", "",
             "| kind of damage | tried | handled |", "|---|---|---|"]
    lines += [f"| {m} | {by_mutation[m]} | {handled_by_mutation[m]} |" for m in MUTATIONS]
    lines += ["", "| command (file it reads) | tried | handled |", "|---|---|---|"]
    lines += [f"| `{t.name}` ({t.kind}) | {by_target[t.name]} | {handled_by_target[t.name]} |" for t in TARGETS]
    if failures:
        lines += ["", "Mishandled:", ""] + [f"- {f}" for f in failures[:30]]
    return lines, tried, handled


def _suite(folder: Path, solvers: list[str], oracles=("lookup", "size"), time_limit: float = 1.0,
           random_seeds=(0, 1, 2), tasks: int = 4, split: str = "test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "set").exists():
        spec = TaskSpec("autoshard", 30, split=split, memory=MemorySpec(tightness=1.5))
        save_instance_set(sample_tasks(spec)[:tasks], folder / "set", {})
    path = folder / "suite.toml"
    path.write_text(f'name = "r"\ninstances = "set"\nresults = "out/r.jsonl"\noracles = {json.dumps(list(oracles))}\n'
                    f"solvers = {json.dumps(solvers)}\ntime_limits = [{time_limit}]\n"
                    f"random_seeds = {list(random_seeds)}\nworkers = 2\n")
    return path


def _bench(suite: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shardbench.cli", "bench", str(suite)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _deterministic(records: list[dict]) -> dict:
    return {cell_key(r): (r["status"], r.get("objective"), json.dumps(r.get("plan"))) for r in records}


def _board(records: list[dict]) -> list:
    return [(r.oracle, r.solver, r.cells, r.with_plan, r.objective, r.balance, r.speedup, r.gap)
            for r in leaderboard_rows(records)]


# Deterministic solvers only: a time-limited search may stop elsewhere in a rerun, kills or not.
SWEEP_SOLVERS = ["lpt", "lookup-greedy", "size-greedy", "dim-greedy", "size-lookup-greedy", "round-robin",
                 "best-greedy", "oracle-greedy"]


def kills(count: int, work: Path, seed: int = 0) -> list[str]:
    reference = _suite(work / "reference", SWEEP_SOLVERS, time_limit=0.5)
    _bench(reference).wait()
    expected = read_records(reference.parent / "out" / "r.jsonl")
    rng = np.random.default_rng(seed)
    lost = duplicated = corrupt = unequal = truncated_lines = 0
    for round_ in range(count):
        suite = _suite(work / f"killed-{round_}", SWEEP_SOLVERS, time_limit=0.5)
        store = suite.parent / "out" / "r.jsonl"
        for delay in rng.uniform(0.3, 4.0, size=3):
            process = _bench(suite)
            time.sleep(delay)
            process.send_signal(signal.SIGKILL)
            process.wait()
            if store.exists() and not store.read_text().endswith("\n") and store.read_text():
                truncated_lines += 1
        _bench(suite).wait()
        lines = store.read_text().splitlines()
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                corrupt += 1
        keys = [cell_key(r) for r in records]
        duplicated += len(keys) - len(set(keys))
        lost += len(set(_deterministic(expected)) - set(keys))
        unequal += (_deterministic(records) != _deterministic(expected)) or (_board(records) != _board(expected))
    cells = len(expected)
    return [f"**Killed sweeps**: {count} sweeps of {cells} cells, each killed with SIGKILL at 3 random points "
            f"(0.3–4 s) and resumed: {lost} cells lost, {duplicated} duplicated, {corrupt} corrupt lines in the "
            f"final stores, {unequal} final leaderboards different from an uninterrupted run's; "
            f"{truncated_lines} kills left a record cut short mid-write, each cut off and rerun on resume."]


def second_process(work: Path) -> list[str]:
    suite = _suite(work / "two", ["local-search"], time_limit=2.0, random_seeds=(0,))
    first = _bench(suite)
    lock = suite.parent / "out" / ".r.jsonl.lock"
    deadline = time.monotonic() + 60
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = _bench(suite)
    code = second.wait()
    message = second.stderr.read().strip()
    first.wait()
    records = read_records(suite.parent / "out" / "r.jsonl")
    duplicates = len(records) - len({cell_key(r) for r in records})
    return [f"**Two bench processes on one store**: the second exits {code} with \"{message}\"; the first "
            f"finishes its {len(records)} cells, {duplicates} duplicated."]


def misbehaving(work: Path) -> list[str]:
    from solvers.base import planned, register

    from .runner import run_suite
    from .suite import load_suite

    def raises(problem, budget, seed):
        raise RuntimeError("boom")

    def hangs(problem, budget, seed):
        time.sleep(3600)

    def dies(problem, budget, seed):
        os._exit(9)

    def cheats(problem, budget, seed):
        return planned(problem.instance, (0,) * problem.instance.num_tables)

    names = {"r-raises": raises, "r-hangs": hangs, "r-dies": dies, "r-cheats": cheats}
    for name, fn in names.items():
        register(name, "misbehaves on purpose")(fn)
    suite = load_suite(_suite(work / "bad-solvers", ["lpt", *names], oracles=("lookup",), time_limit=1.0,
                              random_seeds=(0,)))
    started = time.monotonic()
    records = run_suite(suite, quiet=True)
    elapsed = time.monotonic() - started
    errors = Counter(r["solver"] for r in records if r["status"] in ("error", "timeout"))
    fine = sum(r["status"] in ("feasible", "optimal") for r in records if r["solver"] in ("lpt", "random"))
    return [f"**Misbehaving solvers**: a solver that raises, one that hangs, one that calls `os._exit`, and one "
            f"that returns a plan over memory, each on {len(suite_instances(suite))} instances: "
            + ", ".join(f"{n} → {errors[n]} error rows" for n in names) + " (the hanging ones as timeouts)"
            + f"; the sweep went on ({fine} valid plans from `lpt` and `random`) and ended in {elapsed:.0f} s "
              "(the hanging cells were killed at their deadline, 1.5 × budget + 10 s)."]


def suite_instances(suite) -> list[str]:
    from instances import load_instances

    return [i.id for i in load_instances(suite.instances)]


def _rss_kib(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load(work: Path) -> list[str]:
    from .runner import run_suite
    from .suite import load_suite

    solvers = ["lpt", "lookup-greedy", "size-greedy", "dim-greedy", "size-lookup-greedy", "round-robin",
               "best-greedy", "oracle-greedy", "local-search", "random-search"]
    suite = load_suite(_suite(work / "load", solvers, oracles=("lookup", "size"), time_limit=0.05,
                              random_seeds=tuple(range(10)), tasks=90, split="train"))
    samples = []

    def sample(record: dict) -> None:
        samples.append(_rss_kib(os.getpid()))

    import benchmarks.runner as runner

    original = runner.run_cells

    def run_cells(cells, workers, on_record, progress=None):
        def both(record):
            sample(record)
            if progress:
                progress(record)
        return original(cells, workers, on_record, both)

    runner.run_cells = run_cells
    try:
        started = time.monotonic()
        records = run_suite(suite, quiet=True)
        elapsed = time.monotonic() - started
    finally:
        runner.run_cells = original
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    tenth = max(1, len(samples) // 10)
    first, last = np.median(samples[:tenth]), np.median(samples[-tenth:])
    statuses = Counter(r["status"] for r in records)
    return [f"**Load**: a sweep of {len(records)} cells ({len(suite_instances(suite))} instances × 2 oracles × "
            f"{len(solvers)} solvers + 10 random seeds, 0.05 s budgets, 2 workers) ran to the end in {elapsed:.0f} s "
            f"({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}). Bench process RSS: median "
            f"{first / 1024:.0f} MiB over the first tenth of the cells, {last / 1024:.0f} MiB over the last tenth, "
            f"peak {peak / 1024:.0f} MiB; the largest cell process peaked at {children / 1024:.0f} MiB."]


def main_report(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="malformed files per command and kind of damage")
    parser.add_argument("--kills", type=int, default=10, help="sweeps killed and resumed")
    parser.add_argument("-o", "--output", default=str(PAGES / "reliability.md"), help="the report page (default: %(default)s)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="shardbench-reliability-"))
    try:
        started = time.monotonic()
        fuzz_lines, tried, handled = bad_input(args.seeds, work)
        sections = [fuzz_lines, kills(args.kills, work), second_process(work), misbehaving(work), load(work)]
        elapsed = time.monotonic() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = "\n\n".join("\n".join(s) for s in sections)
    text = (f"#### Reliability report\n\n`python -m benchmarks.reliability --seeds {args.seeds} --kills {args.kills}` "
            f"({elapsed / 60:.0f} min on this machine).\n\n{text}\n")
    publish_report(text, Path(args.output))
    return 0 if tried == handled else 1


if __name__ == "__main__":
    sys.exit(main_report())
