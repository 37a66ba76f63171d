"""The greedy skeleton, written once: order tables by a cost, then put each on the memory-feasible
device whose cost after adding it is lowest. The variants differ only in the cost they are given."""
from __future__ import annotations

import numpy as np

from costmodels import HEURISTIC_COSTS, DeviceState, heuristic_costs
from costmodels.base import AdditiveDeviceState
from instances import Instance

from .assembly import Assembly
from .base import (
    Budget,
    MemoryTracker,
    SolveResult,
    Status,
    order_by_cost,
    planned,
    register,
    stuck,
)
from .candidates import Problem


def greedy_assign(instance: Instance, order: np.ndarray, state: DeviceState, need: np.ndarray,
                  kernels=None) -> SolveResult:
    tracker = MemoryTracker(instance, need)
    assignment = np.full(instance.num_tables, -1, dtype=np.int64)
    for table in order:
        feasible = np.flatnonzero(tracker.fits(table))
        if feasible.size == 0:
            return stuck(instance, int(table), tracker)
        after = state.costs_if_added(int(table), feasible)
        device = int(feasible[int(np.argmin(after))])
        state.add(int(table), device)
        tracker.place(int(table), device)
        assignment[table] = device
    return planned(instance, assignment, kernels=kernels)


def greedy_by_costs(problem: Problem, costs: np.ndarray) -> SolveResult:
    """Balance a fixed per-table cost vector (longest-processing-time-first with memory)."""
    instance = problem.instance
    return greedy_assign(instance, order_by_cost(costs), AdditiveDeviceState(costs, instance.num_devices),
                         problem.table_wise.storage, problem.table_kernels)


def _heuristic_greedy(kind: str):
    def solve(problem: Problem, budget: Budget, seed: int) -> SolveResult:
        return greedy_by_costs(problem, heuristic_costs(problem.instance, kind))
    return solve


for _kind, (_, _meaning) in HEURISTIC_COSTS.items():
    register(f"{_kind}-greedy", f"greedy balancing of {_meaning}, whatever the oracle")(_heuristic_greedy(_kind))


@register("lpt", "greedy (LPT) on the given oracle's per-table costs", needs_additive=True)
def lpt(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return greedy_by_costs(problem, problem.table_wise.costs)


@register("oracle-greedy", "greedy placing each table where the oracle's device cost after adding it is lowest "
          "(AutoShard's greedy with the cost model); works on non-additive oracles")
def oracle_greedy(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    priced = problem.table_wise
    return greedy_assign(problem.instance, order_by_cost(priced.single_costs()), priced.new_state(), priced.storage,
                         problem.table_kernels)


def best_greedy(problem: Problem) -> SolveResult:
    """The skeleton under three orders — by oracle cost (LPT), by memory (first-fit-decreasing style, which
    survives tight memory where LPT gets stuck), by the sum of both shares — each balancing the oracle on
    whole tables; the best plan, or the first failure when none finds one. It is `split-greedy` on
    whole tables (solvers.search)."""
    from .search import split_greedy, stuck_result

    candidates = problem.whole_tables.candidates
    result = split_greedy(candidates, changes=False)
    if not isinstance(result, Assembly):
        return stuck_result(candidates, result)
    return SolveResult(Status.FEASIBLE, plan=result.plan())


@register("best-greedy", "best of the greedy skeleton under cost, memory and combined orders, whole tables "
          "(memory-robust)")
def best_greedy_solver(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return best_greedy(problem)
