"""Runs a suite: its cells (benchmarks.cells) on this machine or as Ray tasks, each finished cell appended
to the results store at once; cells already there are not run again."""
from __future__ import annotations

import contextlib

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from instances import load_instances

from .cells import Cell, run_cells, suite_cells
from .store import Store, cell_key
from .suite import Suite

EXECUTORS = ("local", "ray")


def run_suite(suite: Suite, fresh: bool = False, workers: int | None = None, quiet: bool = False,
              executor: str = "local", address: str | None = None, rerun: tuple[str, ...] = ()) -> list[dict]:
    """Runs what the store lacks and returns every record of this suite's cells. The store stays locked
    while the suite runs: a second bench process on it is refused. `executor` "ray" runs the cells as Ray
    tasks (on the cluster at `address`, or a local instance), into the same store. `rerun` names solvers
    whose stored records are dropped first, so that only their cells run again."""
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
        elif rerun:
            dropped = store.discard(rerun)
            if not quiet:
                print(f"{suite.name}: dropped {dropped} stored records of {', '.join(rerun)} to run them again")
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
