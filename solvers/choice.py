"""Which option each table takes: the knapsack over memory that the greedy, the packer and the whole-table
heuristics share (tables move leaner along their (memory, work) hull, cheapest work per byte first), the
weights it reads, and the same knapsack solved exactly over memory summed over devices (the centre of
CP-SAT's neighbourhoods). Functions of priced candidates (solvers.candidates), which they take as they are."""
from __future__ import annotations

import time

import numpy as np

from .quiet import c_stdout_silenced

RELATIVE_STEP = 1e-12  # an improvement must beat the current cost by more than float noise


# Of the memory left once every table takes its leanest option, the shares that replicas, larger caches and
# other memory-hungry options may use; the rest is slack for packing. Which share packs best depends on how
# large pieces are against a device: half suits splits under tight memory, while tables kept in host memory
# want nearly all of HBM for their caches (at half alone, the best 30 s plans of the tiers suites under
# TorchRec's estimator came out a median 1.1-1.9x worse). The greedy tries each, the first one first.
MEMORY_SHARES = (0.5, 0.7, 0.85, 0.95, 1.0)


def choose_options(candidates, level: float, weight: np.ndarray,
                   memory_share: float = MEMORY_SHARES[0], allowed: np.ndarray | None = None) -> np.ndarray:
    """Per table, among its `allowed` options (a mask over options; all of a table's where it allows none,
    or where no mask is given), the lightest option (by `weight`, then memory) whose largest piece stays at
    or below `level`, failing that the option with the smallest largest piece; then, while the choices need more
    extra memory (over every table's leanest such option) than `memory_share` of the memory left, the
    table whose next leaner option costs the least work per byte it saves moves to it. The options a
    table moves through are the lower convex hull of its (memory, work) points, so this is the
    Lagrangian choice of a knapsack over every table's options at once: a cached table can give up part
    of its cache instead of all of it."""
    biggest = candidates.biggest if candidates.priced.additive else piece_peaks(candidates)
    memory = candidates.device_shares(candidates.total_storage)
    # Options whose work differs by float noise alone (row shards summing to the whole table) are equally
    # light: the one enumerated first (whole tables first) wins.
    weight = np.array([float(f"{w:.10g}") for w in weight])
    chosen = np.empty(len(candidates.by_table), dtype=np.int64)
    pools = []
    for table, ids in enumerate(candidates.by_table):
        if allowed is not None and allowed[ids].any():
            ids = ids[allowed[ids]]
        small = [int(o) for o in ids if biggest[o] <= level * (1 + RELATIVE_STEP)]
        pool = small or [min((int(o) for o in ids), key=lambda o: (biggest[o], weight[o]))]
        chosen[table] = min(pool, key=lambda o: (weight[o], memory[o]))
        pools.append(pool)
    leanest = np.array([min(pool, key=lambda o: (memory[o], weight[o])) for pool in pools], dtype=np.int64)
    budget = memory_share * (candidates.num_devices - float(memory[leanest].sum()))
    used = float((memory[chosen] - memory[leanest]).sum())
    if used <= budget:
        return chosen
    steps = [(slope, table, after, saved) for table, pool in enumerate(pools)
             for slope, after, saved in _leaner_steps(int(chosen[table]), pool, weight, memory)]
    for _, table, after, saved in sorted(steps, key=lambda s: (s[0], s[1])):
        if used <= budget:
            break
        chosen[table] = after
        used -= saved
    return chosen


def _leaner_steps(start: int, pool: list[int], weight: np.ndarray, memory: np.ndarray) -> list[tuple[float, int, float]]:
    """From `start` to the table's leanest option along the lower convex hull of (memory, work): each step
    as (work added per memory saved, the option it reaches, memory saved), the slopes increasing."""
    steps, here = [], start
    while True:
        leaner = [o for o in pool if memory[o] < memory[here]]
        if not leaner:
            return steps
        slopes = [(weight[o] - weight[here]) / (memory[here] - memory[o]) for o in leaner]
        best = min(slopes)
        # Of the options on the same line, the leanest: a step never stops halfway along a straight edge.
        here_next = min((o for o, s in zip(leaner, slopes) if s <= best + 1e-12 * abs(best)),
                        key=lambda o: (memory[o], weight[o]))
        steps.append((best, here_next, float(memory[here] - memory[here_next])))
        here = here_next


def piece_peaks(candidates) -> np.ndarray:
    """Per option, its largest piece's cost alone on a device (for oracles without per-piece costs)."""
    return np.maximum.reduceat(candidates.single_costs, candidates.options.first)


def option_weight(candidates) -> np.ndarray:
    """What an option adds in all: its work (additive oracles), else its pieces' costs alone."""
    if candidates.priced.additive:
        return candidates.work
    return np.add.reduceat(candidates.single_costs, candidates.options.first)


HULL_SLACK = 1e-9  # relative: a point this close to the hull (float noise in its cost) is on it


def on_lower_hull(memory: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Which (memory, cost) points lie on the lower convex hull of them all, run on flat to the right of
    its cheapest point: the points a Lagrangian price on memory can pick. A point above it — dearer than
    a mix of two others that use no more memory on average, or than one that uses no more — never gives
    the best cost for the memory it takes in a relaxed knapsack. Ties and points on a straight edge are
    on the hull."""
    memory, cost = np.asarray(memory, dtype=float), np.asarray(cost, dtype=float)
    hull: list[int] = []
    for i in np.lexsort((cost, memory)):
        if hull and cost[i] >= cost[hull[-1]]:
            continue  # no cheaper for its memory than the last vertex: on or above the flat part
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is a vertex only while strictly below the line from a to i.
            if (cost[b] - cost[a]) * (memory[i] - memory[a]) < (cost[i] - cost[a]) * (memory[b] - memory[a]):
                break
            hull.pop()
        hull.append(int(i))
    if not hull:
        return np.zeros(0, dtype=bool)
    floor = np.interp(memory, memory[hull], cost[hull])
    return cost <= floor + HULL_SLACK * max(float(np.abs(cost).max()), 1e-300)


KNAPSACK_GAP = 1e-6  # relative: how far from the least work HiGHS may stop


def summed_knapsack(candidates, time_limit: float, level: float = np.inf) -> np.ndarray | None:
    """Per table, the option of least total work such that every tier that may bind holds the chosen
    options' bytes summed over all tables within the capacity summed over all devices: the knapsack the LP
    bound relaxes, solved whole (HiGHS through scipy, to KNAPSACK_GAP) within `time_limit` seconds. Unlike
    `choose_options`, it is exact, so it ends where HBM is full rather than where the greedy's last hull
    step overshoots. Options whose largest piece costs more than `level` are left out (all but those with
    the smallest largest piece, where a table has none below it). None where HiGHS returns no choice in
    time."""
    from scipy.optimize import Bounds, milp

    if any(ids.size == 0 for ids in candidates.by_table):
        return None
    live, rows, constraints, work = _summed_model(candidates, level)
    with c_stdout_silenced():  # scipy's HiGHS has the same stray print as highspy's
        result = milp(work, constraints=constraints, integrality=np.ones(live.size), bounds=Bounds(0, 1),
                      options={"time_limit": max(time_limit, 0.01), "mip_rel_gap": KNAPSACK_GAP})
    if result.x is None:
        return None
    picked = result.x > 0.5
    chosen = np.full(len(candidates.by_table), -1, dtype=np.int64)
    chosen[rows[picked]] = live[picked]
    return chosen if (chosen >= 0).all() else None


def summed_relaxation(candidates) -> float:
    """The least total work of `summed_knapsack` with its options fractional (an LP, a fraction of the
    knapsack's time): a lower bound on the work of any choice that fits the summed memory; infinite where
    none does, 0 where HiGHS returns no answer (no bound)."""
    from scipy.optimize import Bounds, milp

    if any(ids.size == 0 for ids in candidates.by_table):
        return np.inf
    live, _, constraints, work = _summed_model(candidates, np.inf)
    result = milp(work, constraints=constraints, bounds=Bounds(0, 1))
    if result.x is None:
        return np.inf if result.status == 2 else 0.0
    return float(result.fun) * _work_unit(candidates, live)


def _work_unit(candidates, live: np.ndarray) -> float:
    """What the knapsack's work is measured in: the largest option's, so that HiGHS's absolute tolerances
    mean the same at any cost scale."""
    return max(float(candidates.work[live].max()), 1e-300)


def _summed_model(candidates, level: float):
    """The summed-memory knapsack's columns (live options below `level`, as `summed_knapsack` keeps them),
    each column's table, its rows (one option per table, each binding tier's bytes within the summed
    capacity) and its work in `_work_unit`s."""
    from scipy.optimize import LinearConstraint
    from scipy.sparse import coo_matrix

    by_table = []
    for ids in candidates.by_table:
        below = candidates.biggest[ids] <= level * (1 + RELATIVE_STEP)
        by_table.append(ids[below] if below.any() else ids[candidates.biggest[ids] == candidates.biggest[ids].min()])
    live = np.concatenate(by_table)
    rows = np.concatenate([np.full(ids.size, t) for t, ids in enumerate(by_table)])
    one_each = coo_matrix((np.ones(live.size), (rows, np.arange(live.size))), shape=(len(by_table), live.size))
    constraints = [LinearConstraint(one_each.tocsr(), 1, 1)]
    capacity = candidates.instance.capacity.sum(axis=0).astype(float)
    for tier in candidates.binding_tiers:
        constraints.append(LinearConstraint(candidates.total_storage[live, tier][None, :] / capacity[tier], 0, 1))
    return live, rows, constraints, candidates.work[live] / _work_unit(candidates, live)


def knapsack_centre(candidates, time_cap: float, deadline: float) -> np.ndarray | None:
    """`summed_knapsack`, chosen again among options whose pieces stay below the average load it leaves
    where one of its pieces costs more than that (such a piece sets the makespan alone: tiers-80x8 at HBM
    0.75, CP-SAT at 30 s was 3.6 % and 1.9 % lower on the two tasks where it applies); the first choice where
    the second finds none. Each solve gets `time_cap` seconds, or what is left before `deadline` (monotonic)."""
    def knapsack(level: float = np.inf) -> np.ndarray | None:
        return summed_knapsack(candidates, min(deadline - time.monotonic(), time_cap), level)

    centre = knapsack()
    if centre is None:
        return None
    level = float(candidates.work[centre].sum()) / candidates.num_devices
    if candidates.biggest[centre].max() > level:
        below = knapsack(level)
        centre = below if below is not None else centre
    return centre
