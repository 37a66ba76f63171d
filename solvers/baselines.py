"""Naive baselines: seeded random placement (the papers' reference for speedups) and round-robin;
both respect memory."""
from __future__ import annotations

import numpy as np

from instances import Instance

from .base import (
    Budget,
    MemoryTracker,
    SolveResult,
    planned,
    register,
    stuck,
)
from .candidates import Problem


def random_assignment(instance: Instance, rng: np.random.Generator, need: np.ndarray | None = None,
                      kernels=None) -> SolveResult:
    """Tables in random order, each on a device drawn uniformly among those with room."""
    tracker = MemoryTracker(instance, need)
    assignment = np.full(instance.num_tables, -1, dtype=np.int64)
    for table in rng.permutation(instance.num_tables):
        feasible = np.flatnonzero(tracker.fits(table))
        if feasible.size == 0:
            return stuck(instance, int(table), tracker)
        device = int(rng.choice(feasible))
        tracker.place(int(table), device)
        assignment[table] = device
    return planned(instance, assignment, kernels=kernels)


@register("random", "uniformly random device per table among those with room", stochastic=True)
def random_placement(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return random_assignment(problem.instance, np.random.default_rng(seed), problem.table_wise.storage,
                             problem.table_kernels)


@register("round-robin", "table i to the next device in cyclic order that has room")
def round_robin(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    instance = problem.instance
    tracker = MemoryTracker(instance, problem.table_wise.storage)
    k = instance.num_devices
    assignment, cursor = [], 0
    for table in range(instance.num_tables):
        fits = tracker.fits(table)
        step = next((s for s in range(k) if fits[(cursor + s) % k]), None)
        if step is None:
            return stuck(instance, table, tracker)
        device = (cursor + step) % k
        tracker.place(table, device)
        assignment.append(device)
        cursor = device + 1
    return planned(instance, assignment, kernels=problem.table_kernels)
