"""Search on any oracle through the incremental device state: iterated local search (best-improvement
moves and swaps off the most loaded device, random kicks between descents) and AutoShard's random search
(best of N random feasible plans)."""
from __future__ import annotations

import time

import numpy as np

from costmodels import DeviceState, Oracle
from instances import Instance

from .base import (
    Budget,
    Cause,
    MemoryTracker,
    NoPlan,
    SolveResult,
    Status,
    planned,
    register,
)
from .baselines import random_assignment
from .bounds import best_additive_lower_bound
from .greedy import best_greedy

RELATIVE_STEP = 1e-12  # an improvement must beat the current cost by more than float noise
RANDOM_SEARCH_SAMPLES = 1000  # the most AutoShard's random search drew


class _Search:
    """A plan under change: assignment, per-device members, free memory and the oracle's device state."""

    def __init__(self, instance: Instance, oracle: Oracle, assignment):
        self.instance, self.oracle = instance, oracle
        self.load(assignment)

    def load(self, assignment) -> None:
        self.assignment = np.array(assignment, dtype=np.int64)
        self.state: DeviceState = self.oracle.new_state(self.instance)
        self.memory = MemoryTracker(self.instance)
        for table, device in enumerate(self.assignment):
            self.state.add(table, int(device))
            self.memory.place(table, int(device))

    def objective(self) -> float:
        return float(self.state.costs().max())

    def move(self, table: int, device: int) -> None:
        source = int(self.assignment[table])
        self.state.remove(table, source)
        self.memory.unplace(table, source)
        self.state.add(table, device)
        self.memory.place(table, device)
        self.assignment[table] = device

    def best_step(self) -> tuple | None:
        """The move or swap off the most loaded device that lowers the larger of the two touched devices'
        costs the most, or None at a local optimum."""
        costs = self.state.costs()
        top = int(np.argmax(costs))
        ceiling = costs[top] * (1 - RELATIVE_STEP)
        best_value, best = ceiling, None
        need = self.memory.need
        elsewhere = np.flatnonzero(self.assignment != top)
        other_devices = self.assignment[elsewhere]
        for table in np.flatnonzero(self.assignment == top):
            table = int(table)
            after_top = self.state.cost_if_exchanged(top, table, None)
            targets = np.flatnonzero((self.memory.free >= need[table]) & (np.arange(costs.size) != top))
            if targets.size:
                pair = np.maximum(after_top, self.state.costs_if_added(table, targets))
                i = int(np.argmin(pair))
                if pair[i] < best_value:
                    best_value, best = pair[i], ("move", table, int(targets[i]))
            if elsewhere.size:
                fits = ((self.memory.free[top] + need[table] - need[elsewhere] >= 0)
                        & (self.memory.free[other_devices] + need[elsewhere] - need[table] >= 0))
                candidates, devices = elsewhere[fits], other_devices[fits]
                if candidates.size:
                    here, there = self.state.costs_if_swapped(table, top, candidates, devices)
                    pair = np.maximum(here, there)
                    i = int(np.argmin(pair))
                    if pair[i] < best_value:
                        best_value, best = pair[i], ("swap", table, int(candidates[i]))
        return best

    def descend(self, deadline: float) -> int:
        steps = 0
        while time.monotonic() < deadline:
            step = self.best_step()
            if step is None:
                break
            kind, table, target = step
            if kind == "move":
                self.move(table, target)
            else:
                mine, theirs = int(self.assignment[table]), int(self.assignment[target])
                self.move(table, theirs)
                self.move(target, mine)
            steps += 1
        return steps

    def kick(self, rng: np.random.Generator, size: int) -> None:
        """Move `size` random tables to random devices with room."""
        for table in rng.choice(self.assignment.size, size=min(size, self.assignment.size), replace=False):
            room = np.flatnonzero(self.memory.free >= self.memory.need[table])
            room = room[room != self.assignment[table]]
            if room.size:
                self.move(int(table), int(rng.choice(room)))


def improve(instance: Instance, oracle: Oracle, start, deadline: float, seed: int,
            max_rounds: int | None = None) -> tuple[tuple[int, ...], dict]:
    """Iterated local search from `start` until the deadline, `max_rounds` kicks (which makes the result
    a function of the seed alone) or a plan that meets the lower bound. Never worse than the start."""
    target = (best_additive_lower_bound(oracle.table_costs(instance), instance.num_devices) * (1 + 1e-12)
              if oracle.additive else -np.inf)
    rng = np.random.default_rng(seed)
    search = _Search(instance, oracle, start)
    start_value = search.objective()
    steps = search.descend(deadline)
    best, best_value = search.assignment.copy(), search.objective()
    kick_size = max(2, instance.num_tables // 50)
    rounds = 0
    while (time.monotonic() < deadline and (max_rounds is None or rounds < max_rounds) and best_value > target
           and instance.num_devices > 1):
        rounds += 1
        search.kick(rng, int(rng.integers(1, kick_size + 1)))
        steps += search.descend(deadline)
        value = search.objective()
        if value <= best_value:
            if value < best_value * (1 - RELATIVE_STEP):
                best, best_value = search.assignment.copy(), value
            else:
                best = search.assignment.copy()
        else:
            search.load(best)
    return tuple(int(d) for d in best), {"start_objective": start_value, "steps": steps, "kicks": rounds}


@register("local-search", "iterated local search (moves, swaps, random kicks) from the best greedy; any oracle",
          stochastic=True)
def local_search(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    deadline = budget.deadline()
    start = best_greedy(instance, oracle)
    if start.plan is None:
        return start
    assignment, stats = improve(instance, oracle, start.plan.assignment, deadline, seed, budget.max_rounds)
    return planned(instance, assignment, stats=stats)


@register("random-search", "best of up to 1000 random memory-feasible plans (AutoShard §5.3)", stochastic=True)
def random_search(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    deadline = budget.deadline()
    rng = np.random.default_rng(seed)
    best, best_value, samples, dead_ends = None, np.inf, 0, 0
    limit = budget.max_rounds if budget.max_rounds is not None else RANDOM_SEARCH_SAMPLES
    while samples < limit and (samples == 0 or time.monotonic() < deadline):
        samples += 1
        result = random_assignment(instance, rng)
        if result.plan is None:
            dead_ends += 1
            continue
        value = oracle.plan_cost(instance, result.plan)
        if value < best_value:
            best, best_value = result.plan, value
    stats = {"samples": samples, "dead_ends": dead_ends}
    if best is None:
        return SolveResult(Status.NO_PLAN, reason=f"all {samples} random samples hit a memory dead end (not a proof)",
                           stats=stats, no_plan=NoPlan(Cause.SAMPLING, samples=samples))
    return SolveResult(Status.FEASIBLE, plan=best, stats=stats)

