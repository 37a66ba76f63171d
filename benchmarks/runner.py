"""Runs a suite: every instance × solver × oracle × time limit × seed is a cell, run in its own forked
process under a hard deadline so that a solver that crashes or hangs costs one error row, not the sweep.
Finished cells are appended to the results store at once; cells already there are not run again."""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import resource
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Iterable

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from costmodels import get_oracle
from instances import Instance, load_instances
from instances.sharding import compact
from solvers import Budget, Candidates, best_option_bound, get_solver, run_solver

from .analysis import TABLE_WISE_SETTING, setting_types
from .metrics import degree_of_balance
from .store import Store, cell_key
from .suite import Suite

PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Cell:
    """`oracle` guides the solver; `judge` prices the plan it returns (the same oracle unless the suite
    names a judge); `sharding` is the setting the instance is planned under (analysis.setting_types)."""

    instance: Instance
    solver: str
    oracle: str
    time_limit: float
    seed: int
    judge: str
    sharding: str = TABLE_WISE_SETTING
    deadline: float | None = None  # wall-clock seconds before the cell is killed (default: kill_deadline)

    @property
    def key(self) -> tuple:
        return (self.instance.id, self.solver, self.oracle, self.time_limit, self.seed, self.judge, self.sharding)

    @property
    def planned_instance(self) -> Instance:
        types = setting_types(self.sharding)
        return self.instance.restricted_to(None if types is None else tuple(types))

    def record_base(self) -> dict:
        return {"instance": self.instance.id, "solver": self.solver, "oracle": self.oracle,
                "time_limit": self.time_limit, "seed": self.seed, "judge": self.judge, "sharding": self.sharding}


def kill_deadline(time_limit: float) -> float:
    """Wall-clock a cell may take before it is killed: its budget plus room for start-up and checks."""
    return 1.5 * time_limit + 10.0


def cell_deadline(cell: "Cell") -> float:
    return cell.deadline if cell.deadline is not None else kill_deadline(cell.time_limit)


def suite_cells(suite: Suite, instances: Iterable[Instance]) -> list[Cell]:
    """Deterministic solvers run once (seed 0) per setting; random runs with the suite's random seeds,
    always, because speedups are measured against it; other stochastic solvers with the suite's seeds.
    Random ignores its oracle, so under a separate judge it runs once, guided by the judge itself.
    Solvers that split run under each of the suite's sharding settings; the others place whole tables and
    run once, under table-wise."""
    guides = suite.oracles if suite.judge is None else tuple(dict.fromkeys((suite.judge, *suite.oracles)))
    additive = {name: get_oracle(name).additive for name in guides}  # a neural oracle loads weights: once
    others = [s for s in suite.solvers if s != "random"]
    cells = []
    for instance in instances:
        for time_limit in suite.time_limits:
            for oracle in guides:
                if suite.judge is None or oracle == suite.judge:
                    solvers = ["random", *others] if oracle in suite.oracles else ["random"]
                else:
                    solvers = others
                for solver in solvers:
                    info = get_solver(solver)
                    if info.needs_additive and not additive[oracle]:
                        continue
                    seeds = suite.random_seeds if solver == "random" else suite.seeds if info.stochastic else (0,)
                    settings = suite.sharding if info.splits else (TABLE_WISE_SETTING,)
                    deadline = None if info.budgeted else suite.peer_deadline
                    cells.extend(Cell(instance, solver, oracle, time_limit, s, suite.judge or oracle, setting, deadline)
                                 for setting in settings for s in seeds)
    return cells


def execute_cell(cell: Cell) -> dict:
    oracle = get_oracle(cell.oracle)
    judge = oracle if cell.judge == cell.oracle else get_oracle(cell.judge)
    instance = cell.planned_instance
    start = time.perf_counter()
    result = run_solver(cell.solver, instance, oracle, Budget(cell.time_limit), cell.seed)
    elapsed = time.perf_counter() - start
    # A bound proved under the guiding oracle says nothing about the judge's costs.
    if judge is oracle:
        instance_bound = result.stats.get("option_bound")
    else:
        instance_bound = best_option_bound(Candidates.build(instance, judge)) if judge.additive else None
    record = {**cell.record_base(), "status": result.status.value, "reason": result.reason,
              "solve_time": elapsed, "lower_bound": result.lower_bound if judge is oracle else None,
              "stats": dict(result.stats), "num_tables": instance.num_tables, "num_devices": instance.num_devices,
              "instance_bound": instance_bound}
    if result.plan is not None:
        costs = [c.total for c in judge.device_costs(instance, result.plan)]
        memory = list(result.plan.memory_per_device(instance))
        record.update(objective=max(costs), device_costs=costs, balance=degree_of_balance(costs),
                      memory_per_device=memory, peak_memory=max(memory),
                      memory_capacity=instance.topology.memory_bytes, types_used=result.plan.sharding_types(),
                      plan=compact(result.plan, instance))
    record["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the cell's process
    return record


def _die_with_parent(parent: int) -> None:
    """A cell must not outlive the bench process, even one killed with SIGKILL: the kernel sends this
    process SIGKILL when its parent dies. It also leads its own process group, so that a cell killed at
    its deadline takes along whatever it started (CBC runs as a separate program)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the deadline kill still applies
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _child(connection, cell: Cell, parent: int) -> None:
    _die_with_parent(parent)
    if "torch" in sys.modules:
        # Cells are the parallel unit: a torch thread pool per cell on top would oversubscribe the cores,
        # and OpenMP's spinning threads then slow every small network call by two orders of magnitude.
        sys.modules["torch"].set_num_threads(1)
    try:
        connection.send(("ok", execute_cell(cell)))
    except BaseException as exc:  # the parent turns anything a solver raises into an error row
        connection.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    finally:
        connection.close()


def error_record(cell: Cell, message: str, elapsed: float, status: str = "error") -> dict:
    return {**cell.record_base(), "status": status, "error": message, "solve_time": elapsed,
            "num_tables": cell.instance.num_tables, "num_devices": cell.instance.num_devices}


def run_cells(cells: list[Cell], workers: int, on_record: Callable[[dict], None],
              progress: Callable[[dict], None] | None = None, stop: Callable[[dict], bool] | None = None) -> None:
    """Runs the cells, `workers` at a time. When a record satisfies `stop`, the cells still running are
    killed (they leave no record) and the rest are not started."""
    context = mp.get_context("fork")
    pending = deque(cells)
    running: dict = {}
    while pending or running:
        while pending and len(running) < workers:
            cell = pending.popleft()
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(sender, cell, os.getpid()), daemon=True)
            process.start()
            sender.close()
            running[receiver] = (process, cell, time.monotonic())
        now = time.monotonic()
        nearest = min(started + cell_deadline(c) for _, c, started in running.values())
        ready = wait(list(running), timeout=max(0.0, nearest - now))
        now = time.monotonic()
        for receiver in list(running):
            process, cell, started = running[receiver]
            record = None
            if receiver in ready:
                try:
                    kind, payload = receiver.recv()
                    record = payload if kind == "ok" else error_record(cell, payload, now - started)
                except EOFError:
                    process.join(1.0)
                    record = error_record(cell, f"solver process died (exit code {process.exitcode})", now - started)
            elif now - started > cell_deadline(cell):
                _kill_group(process)
                record = error_record(cell, f"killed after {now - started:.1f} s: exceeded its "
                                             + (f"{cell.time_limit:g} s budget by too much" if cell.deadline is None
                                                else f"deadline of {cell.deadline:g} s"), now - started, "timeout")
            if record is not None:
                process.join(1.0)
                _kill_group(process)  # anything the cell left running (a solver's helper program) goes too
                receiver.close()
                del running[receiver]
                on_record(record)
                if progress:
                    progress(record)
                if stop is not None and stop(record):
                    for other in list(running):
                        _kill_group(running.pop(other)[0])
                        other.close()
                    pending.clear()
                    return


def _kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.join(1.0)


EXECUTORS = ("local", "ray")


def run_suite(suite: Suite, fresh: bool = False, workers: int | None = None, quiet: bool = False,
              executor: str = "local", address: str | None = None) -> list[dict]:
    """Runs what the store lacks and returns every record of this suite's cells. The store stays locked
    while the suite runs: a second bench process on it is refused. `executor` "ray" runs the cells as Ray
    tasks (on the cluster at `address`, or a local instance), into the same store."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    instances = load_instances(suite.instances)
    cells = suite_cells(suite, instances)
    if executor == "ray":  # reach the cluster before the store is touched: a bad address leaves nothing behind
        from .distributed import ray_session

        session = ray_session(address, workers)
    else:
        session = contextlib.nullcontext()
    with session, Store(suite.results) as store:
        if fresh:
            store.clear()
        return _run_missing(suite, cells, store, workers, quiet, executor, address)


def _run_missing(suite: Suite, cells: list[Cell], store: Store, workers: int | None, quiet: bool,
                 executor: str, address: str | None) -> list[dict]:
    done = {cell_key(r): r for r in store.records()}
    todo = [c for c in cells if c.key not in done]
    if not quiet:
        where = (f"{workers or suite.workers} workers" if executor == "local" else
                 f"ray ({address or 'a local instance'}, {workers or 'one task per CPU'})")
        print(f"{suite.name}: {len(cells)} cells, {len(cells) - len(todo)} already in {suite.results}, "
              f"{len(todo)} to run on {where}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  auto_refresh=False, disable=quiet) as bar:
        task = bar.add_task(suite.name, total=len(todo))

        def advance(record: dict) -> None:
            bar.update(task, advance=1, description=f"{suite.name}: {record['solver']} {record['status']}")
            bar.refresh()

        def keep(record: dict) -> None:
            store.append(record)
            done[cell_key(record)] = record

        if executor == "ray":
            from .distributed import run_cells_ray

            run_cells_ray(todo, workers, keep, advance, address)
        else:
            run_cells(todo, workers or suite.workers, keep, advance)
    return [done[c.key] for c in cells if c.key in done]
