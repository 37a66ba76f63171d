"""The greedy skeleton, written once: order tables by a cost, then put each on the memory-feasible
device whose cost after adding it is lowest. The variants differ only in the cost they are given."""
from __future__ import annotations

import numpy as np

from costmodels import HEURISTIC_COSTS, DeviceState, Oracle, heuristic_costs
from costmodels.base import AdditiveDeviceState
from instances import Instance

from .base import (
    Budget,
    MemoryTracker,
    SolveResult,
    order_by_cost,
    planned,
    register,
    stuck,
)


def greedy_assign(instance: Instance, order: np.ndarray, state: DeviceState) -> SolveResult:
    tracker = MemoryTracker(instance)
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
    return planned(instance, assignment)


def greedy_by_costs(instance: Instance, costs: np.ndarray) -> SolveResult:
    """Balance a fixed per-table cost vector (longest-processing-time-first with memory)."""
    return greedy_assign(instance, order_by_cost(costs), AdditiveDeviceState(costs, instance.num_devices))


def _heuristic_greedy(kind: str):
    def solve(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
        return greedy_by_costs(instance, heuristic_costs(instance, kind))
    return solve


for _kind, (_, _meaning) in HEURISTIC_COSTS.items():
    register(f"{_kind}-greedy", f"greedy balancing of {_meaning}, whatever the oracle")(_heuristic_greedy(_kind))


@register("lpt", "greedy (LPT) on the given oracle's per-table costs", needs_additive=True)
def lpt(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    return greedy_by_costs(instance, oracle.table_costs(instance))


@register("oracle-greedy", "greedy placing each table where the oracle's device cost after adding it is lowest "
          "(AutoShard's greedy with the cost model); works on non-additive oracles")
def oracle_greedy(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    return greedy_assign(instance, order_by_cost(oracle.single_table_costs(instance)), oracle.new_state(instance))


def greedy_starts(instance: Instance, oracle: Oracle) -> list[SolveResult]:
    """The skeleton under three orders: by oracle cost (LPT), by memory (first-fit-decreasing style, which
    survives tight memory where LPT gets stuck), and by the sum of both shares. Each balances the oracle."""
    cost = oracle.single_table_costs(instance)
    memory = np.array(instance.table_memory(), dtype=float)
    share = cost / max(cost.sum(), 1e-300) + memory / max(memory.sum(), 1e-300)
    return [greedy_assign(instance, order_by_cost(key), oracle.new_state(instance)) for key in (cost, memory, share)]


def best_greedy(instance: Instance, oracle: Oracle) -> SolveResult:
    """The best plan among the greedy starts, or the first failure when none finds one."""
    starts = greedy_starts(instance, oracle)
    with_plan = [r for r in starts if r.plan is not None]
    if not with_plan:
        return starts[0]
    return min(with_plan, key=lambda r: oracle.plan_cost(instance, r.plan))


@register("best-greedy", "best of the greedy skeleton under cost, memory and combined orders (memory-robust)")
def best_greedy_solver(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    return best_greedy(instance, oracle)
