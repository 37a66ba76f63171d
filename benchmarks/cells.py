"""Suite cells: every instance × solver × oracle × time limit × seed × sharding setting of a suite is a
cell, run in its own process under a hard deadline (shardbench.isolation) so that a solver that crashes or
hangs costs one error row, not the sweep. A cell's record is what the results store keeps."""
from __future__ import annotations

import functools
import resource
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from costmodels import get_oracle
from instances import Instance
from instances.memory import storage_fields
from instances.sharding import compact
from shardbench.isolation import Job, Outcome, kill_deadline, run_isolated
from shardbench.pipeline import price
from solvers import Budget, Candidates, best_option_bound, get_solver, run_solver
from solvers.base import incompatibility

from .analysis import TABLE_WISE_SETTING, setting_types
from .environment import provenance, revision
from .metrics import degree_of_balance
from .suite import Suite


@dataclass(frozen=True)
class Cell:
    """`oracle` guides the solver; `judge` prices the plan it returns (the same oracle unless the suite
    names a judge); `sharding` is the setting the instance is planned under (analysis.setting_types);
    `instance_set` names the set the instance came from (a suite's grid runs several)."""

    instance: Instance
    solver: str
    oracle: str
    time_limit: float
    seed: int
    judge: str
    sharding: str = TABLE_WISE_SETTING
    deadline: float | None = None  # wall-clock seconds before the cell is killed (default: kill_deadline)
    instance_set: str | None = None

    @property
    def key(self) -> tuple:
        return (self.instance.id, self.solver, self.oracle, self.time_limit, self.seed, self.judge, self.sharding)

    @property
    def planned_instance(self) -> Instance:
        types = setting_types(self.sharding)
        return self.instance.restricted_to(None if types is None else tuple(types))

    def record_base(self) -> dict:
        return {"instance": self.instance.id, "solver": self.solver, "oracle": self.oracle,
                "time_limit": self.time_limit, "seed": self.seed, "judge": self.judge, "sharding": self.sharding,
                "instance_set": self.instance_set}


def cell_deadline(cell: "Cell") -> float:
    return cell.deadline if cell.deadline is not None else kill_deadline(cell.time_limit)


def suite_cells(suite: Suite, instances: Iterable[Instance]) -> list[Cell]:
    """Deterministic solvers run once (seed 0) per setting; random runs with the suite's random seeds,
    always, because speedups are measured against it; other stochastic solvers with the suite's seeds.
    Random ignores its oracle, so under a separate judge it runs once, guided by the judge itself.
    Solvers that split run under each of the suite's sharding settings; the others place whole tables and
    run once, under table-wise."""
    guides = suite.oracles if suite.judge is None else tuple(dict.fromkeys((suite.judge, *suite.oracles)))
    built = {name: get_oracle(name) for name in guides}  # a neural oracle loads weights: once
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
                    if incompatibility(info, built[oracle].additive, built[oracle].prices_tiers,
                                       instance.uses_host_memory):
                        continue
                    seeds = suite.random_seeds if solver == "random" else suite.seeds if info.stochastic else (0,)
                    settings = suite.sharding if info.splits else (TABLE_WISE_SETTING,)
                    deadline = None if info.budgeted else suite.peer_deadline
                    cells.extend(Cell(instance, solver, oracle, time_limit, s, suite.judge or oracle, setting, deadline,
                                      suite.instances.name)
                                 for setting in settings for s in seeds)
    return cells


def execute_cell(cell: Cell) -> dict:
    oracle = get_oracle(cell.oracle)
    judge = oracle if cell.judge == cell.oracle else get_oracle(cell.judge)
    instance = cell.planned_instance
    start = time.perf_counter()
    # The pipeline's price stage, as `plan` prices: the clock starts there, and the solver reads its prices.
    priced = price(instance, oracle, Budget(cell.time_limit), whole_tables=not get_solver(cell.solver).splits)
    result = run_solver(cell.solver, instance, oracle, priced.clock, cell.seed, problem=priced.problem)
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
        memory = storage_fields(result.plan.storage_per_device(instance), instance.topology.capacity)
        record.update(objective=max(costs), device_costs=costs, balance=degree_of_balance(costs),
                      **memory, peak_memory=max(memory["memory_per_device"]),
                      memory_capacity=instance.topology.memory_bytes, types_used=result.plan.sharding_types(),
                      plan=compact(result.plan, instance))
    record["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the cell's process
    record.update(provenance())
    return record


def error_record(cell: Cell, message: str, elapsed: float, status: str = "error") -> dict:
    """The record of a cell that left none of its own (an error, a death, a kill); its provenance is that of
    the process writing it."""
    return {**cell.record_base(), "status": status, "error": message, "solve_time": elapsed,
            "num_tables": cell.instance.num_tables, "num_devices": cell.instance.num_devices, **provenance()}


def outcome_record(outcome: Outcome) -> dict:
    """The record of a finished cell: its own, or an error or timeout row saying what happened."""
    cell, elapsed = outcome.job.key, outcome.elapsed
    if outcome.kind == "ok":
        return outcome.value
    if outcome.kind == "error":
        return error_record(cell, outcome.value, elapsed)
    if outcome.kind == "died":
        return error_record(cell, f"solver process died (exit code {outcome.value})", elapsed)
    return error_record(cell, f"killed after {elapsed:.1f} s: exceeded its "
                              + (f"{cell.time_limit:g} s budget by too much" if cell.deadline is None
                                 else f"deadline of {cell.deadline:g} s"), elapsed, "timeout")


def run_cells(cells: list[Cell], workers: int, on_record: Callable[[dict], None],
              progress: Callable[[dict], None] | None = None, stop: Callable[[dict], bool] | None = None) -> None:
    """Runs the cells, `workers` at a time. When a record satisfies `stop`, the cells still running are
    killed (they leave no record) and the rest are not started."""
    latest: list[dict] = []

    def finished(outcome: Outcome) -> None:
        latest[:] = [outcome_record(outcome)]
        on_record(latest[0])
        if progress:
            progress(latest[0])

    jobs = [Job(cell, functools.partial(execute_cell, cell), cell_deadline(cell)) for cell in cells]
    revision()  # read here, once: the forked cells inherit it instead of each running git beside the solvers
    run_isolated(jobs, workers, finished, None if stop is None else lambda _: stop(latest[0]))
