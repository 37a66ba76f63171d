"""`pair-balance`: for tables that trade HBM for cost, a price on HBM spreads the single-piece tables over the
devices evenly in work and in memory at once; then the busiest device and one other at a time (two others
where no one helps) are solved again exactly — which of their tables goes where, in which option — until no
group lowers the busiest device. Deterministic: the seed plays no part."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from instances.memory import HBM

from .assembly import Assembly, Trial
from .base import Budget, SolveResult, Status, past, register
from .candidates import Candidates, Problem
from .choice import RELATIVE_STEP, knapsack_centre
from .search import split_greedy, stuck_result

KNAPSACK_SHARE = 0.1     # of the budget, the most the summed-memory knapsack may take
GROUP_TIME_CAP = 1.0     # seconds one group's MILP may take (most take well under 0.5 s at 80 x 8)
STRANDED_ROUNDS = 3      # knapsack solves at most, each splitting the tables whose single pieces fit nowhere
LAMBDA_STEPS = 60        # bisection steps on the HBM price (relative precision 2^-60)


def movable(candidates: Candidates, chosen: np.ndarray, ceiling: float = np.inf) -> dict[int, np.ndarray]:
    """The tables whose chosen option is one piece that may sit on any device, each with every such option of
    its own that costs at most `ceiling` (and the chosen one): what a device group may re-choose and move.
    Split tables stay as they are."""
    single = [o.placement == "free" and o.parts == 1 for o in candidates.options.options]
    pools = {}
    for table, option in enumerate(chosen):
        if option >= 0 and single[option]:
            ids = candidates.by_table[table]
            keep = np.array([single[o] for o in ids], dtype=bool) & ((candidates.work[ids] <= ceiling) | (ids == option))
            pools[table] = ids[keep]
    return pools


def piece_ceiling(candidates: Candidates, chosen: np.ndarray, split_costs: np.ndarray) -> float:
    """The average load of `chosen` less the least any device carries of the split tables (`split_costs`): a
    single piece dearer than that would set the makespan alone."""
    return float(candidates.work[chosen].sum()) / split_costs.size - float(split_costs.min())


def priced_choice(candidates: Candidates, pools: dict[int, np.ndarray], hbm_left: float) -> dict[int, int]:
    """Per movable table, its option of least work + λ · HBM bytes, for the least price λ ≥ 0 (bisected) at
    which their HBM fits in `hbm_left`: the Lagrangian choice of the knapsack over those tables."""
    work, hbm = candidates.work, candidates.total_storage[:, HBM].astype(float)

    def choice(price: float) -> dict[int, int]:
        return {t: int(ids[np.argmin(work[ids] + price * hbm[ids])]) for t, ids in pools.items()}

    def used(price: float) -> float:
        return sum(hbm[o] for o in choice(price).values())

    low, high = 0.0, 1.0 / max(float(hbm.max(initial=0.0)), 1.0) * max(float(work.max(initial=0.0)), 1e-300)
    if used(low) <= hbm_left:
        return choice(low)
    while used(high) > hbm_left and high < 1e300:
        high *= 2
    for _ in range(LAMBDA_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if used(middle) > hbm_left else (low, middle)
    return choice(high)


def spread(assembly: Assembly, choice: dict[int, int]) -> dict[int, int]:
    """A device per table: largest first (work and memory in shares of what is left), each where the
    fuller of its work and each binding memory tier ends least full; loads start from what is placed."""
    c = assembly.c
    tiers = list(c.binding_tiers)
    load = assembly.costs().astype(float)
    target = (load.sum() + sum(c.work[o] for o in choice.values())) / assembly.k
    room = np.maximum(assembly.free[:, tiers].astype(float), 1.0)
    fill = np.zeros_like(room)
    need = {t: c.storage[c.members(o)[0]][tiers].astype(float) for t, o in choice.items()}
    size = {t: c.work[o] / max(target, 1e-300) + float((need[t] / room.mean(axis=0)).max(initial=0.0))
            for t, o in choice.items()}
    where = {}
    for t in sorted(choice, key=lambda t: (-size[t], t)):
        o = choice[t]
        fuller = np.maximum((load + c.work[o]) / max(target, 1e-300), ((fill + need[t]) / room).max(axis=1, initial=0.0))
        d = int(np.argmin(fuller))
        where[t] = d
        load[d] += c.work[o]
        fill[d] += need[t]
    return where


@dataclass(frozen=True)
class Regroup:
    """A group's new layout: per table its option and device, and the busiest of the group's devices then."""

    layout: dict[int, tuple[int, int]]
    peak: float


def regroup(assembly: Assembly, devices: list[int], tables: list[int], pools: dict[int, np.ndarray],
            time_limit: float) -> Regroup | None:
    """The exact MILP (HiGHS) over `tables` (taken out of the assembly) and `devices`: each table one option
    of its pool on one of them, every binding memory tier within what the devices have left, the busiest of
    them as light as can be. None where HiGHS finds no layout within the time limit."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    c = assembly.c
    tiers = list(c.binding_tiers)
    costs, free = assembly.costs(), assembly.free
    columns = [(t, int(o), d) for t in tables for o in pools[t] for d in devices
               if (c.storage[c.members(int(o))[0]][tiers] <= free[d, tiers]).all()]
    if not columns:
        return None
    scale = max(float(costs[devices].max()) + sum(float(c.work[pools[t]].max()) for t in tables), 1e-300)
    # Rows: one choice row per table, then per device its cost row and a row per binding tier.
    table_row = {t: i for i, t in enumerate(tables)}
    device_row = {d: len(tables) + i * (1 + len(tiers)) for i, d in enumerate(devices)}
    row = len(tables) + len(devices) * (1 + len(tiers))
    peak = len(columns)  # the last column: the group's busiest device, in units of `scale`
    rows, cols, values = [], [], []
    for j, (t, o, d) in enumerate(columns):
        rows += [table_row[t], device_row[d]]
        cols += [j, j]
        values += [1.0, float(c.work[o]) / scale]
        for i, tier in enumerate(tiers):
            rows.append(device_row[d] + 1 + i), cols.append(j)
            values.append(float(c.storage[c.members(o)[0], tier]) / max(float(free[d, tier]), 1.0))
    lower, upper = [1.0] * len(tables), [1.0] * len(tables)
    for d in devices:
        rows.append(device_row[d]), cols.append(peak), values.append(-1.0)
        lower += [-np.inf] * (1 + len(tiers))
        upper += [-float(costs[d]) / scale] + [1.0] * len(tiers)
    matrix = coo_matrix((values, (rows, cols)), shape=(row, peak + 1)).tocsr()
    objective = np.zeros(peak + 1)
    objective[peak] = 1.0
    integrality = np.ones(peak + 1)
    integrality[peak] = 0
    result = milp(objective, constraints=LinearConstraint(matrix, lower, upper), integrality=integrality,
                  bounds=Bounds(np.zeros(peak + 1), np.r_[np.ones(peak), np.inf]),
                  options={"time_limit": max(time_limit, 0.01)})
    if result.x is None:
        return None
    layout = {t: (o, d) for j, (t, o, d) in enumerate(columns) if result.x[j] > 0.5}
    return Regroup(layout, float(result.x[peak]) * scale) if len(layout) == len(tables) else None


def _on(assembly: Assembly, pools: dict[int, np.ndarray], devices: list[int]) -> list[int]:
    c = assembly.c
    return [t for t in pools if int(assembly.device[c.members(int(assembly.chosen[t]))[0]]) in devices]


def try_group(assembly: Assembly, pools: dict[int, np.ndarray], devices: list[int], deadline: float) -> bool:
    """Solves the group again and keeps the new layout where its busiest device costs less than before
    (under the assembly's own costs, not the model's); otherwise leaves the assembly as it was."""
    tables = _on(assembly, pools, devices)
    if not tables:
        return False
    before = float(assembly.costs()[devices].max())
    old = {t: assembly.take(t) for t in tables}
    found = regroup(assembly, devices, tables, pools, min(GROUP_TIME_CAP, deadline - time.monotonic()))
    if found is not None and found.peak < before * (1 - RELATIVE_STEP):
        for t, (o, d) in found.layout.items():
            assembly.put(o, np.array([d]))
        if float(assembly.costs()[devices].max()) < before * (1 - RELATIVE_STEP):
            return True
        for t in found.layout:
            assembly.take(t)
    for option, where in old.values():
        assembly.put(option, where)
    return False


def balanced_start(candidates: Candidates, deadline: float,
                   knapsack_limit: float) -> tuple[Assembly, dict[int, np.ndarray]] | None:
    """The knapsack's (`knapsack_centre`) split tables placed first, then its single-piece tables re-chosen
    at one HBM price (among options below `piece_ceiling`), spread over the devices and each device's options
    chosen exactly: the assembly, with the pools its groups may re-choose from. A table none of whose single
    pieces fits where the split tables leave room is split: the knapsack is solved again without them (at
    most STRANDED_ROUNDS times). None where a step finds no room."""
    keep = candidates.live.copy()
    for _ in range(STRANDED_ROUNDS):
        centre = knapsack_centre(candidates.restricted(keep), knapsack_limit, deadline)
        if centre is None:
            return None
        assembly = Assembly(candidates)
        single = movable(candidates, centre)
        for table, option in enumerate(centre):
            if table in single:
                continue
            trial = assembly.fit(int(option))
            if not isinstance(trial, Trial):
                return None
            assembly.put(int(option), trial.devices)
        pools = movable(candidates, centre, piece_ceiling(candidates, centre, assembly.costs()))
        roomiest = assembly.free.max(axis=0)
        stranded = [t for t, ids in pools.items()
                    if not any((candidates.storage[candidates.members(int(o))[0]] <= roomiest).all() for o in ids)]
        if not stranded:
            break
        for t in stranded:
            keep[single[t]] = False
    else:
        return None
    choice = priced_choice(candidates, pools, float(assembly.free[:, HBM].sum()))
    where = spread(assembly, choice)
    for d in range(assembly.k):
        tables = [t for t in where if where[t] == d]
        if not tables:
            continue
        found = regroup(assembly, [d], tables, pools, min(GROUP_TIME_CAP, deadline - time.monotonic()))
        if found is None:
            return None
        for t, (o, device) in found.layout.items():
            assembly.put(o, np.array([device]))
    return assembly, pools


def greedy_pools(assembly: Assembly) -> dict[int, np.ndarray]:
    """`movable` for a plan built otherwise (split-greedy's), below its own `piece_ceiling`."""
    c = assembly.c
    split_costs = assembly.costs().astype(float)
    for table in movable(c, assembly.chosen):
        option = int(assembly.chosen[table])
        split_costs[assembly.device[c.members(option)[0]]] -= c.work[option]
    return movable(c, assembly.chosen, piece_ceiling(c, assembly.chosen, split_costs))


def rebalance(assembly: Assembly, pools: dict[int, np.ndarray], deadline: float) -> dict:
    """Until `deadline` or no group helps: the busiest device with each other (lightest first), then with
    two of the lightest, solved again (`try_group`). Stats: groups solved, kept, and why it stopped."""
    solved = kept = 0
    while not past(deadline):
        costs = assembly.costs()
        busiest = int(np.argmax(costs))
        others = [int(d) for d in np.argsort(costs, kind="stable") if d != busiest]
        groups = [[busiest, d] for d in others] + [[busiest, a, b] for i, a in enumerate(others[:3])
                                                     for b in others[i + 1:4]]
        improved = False
        for group in groups:
            if past(deadline):
                break
            solved += 1
            if try_group(assembly, pools, group, deadline):
                kept += 1
                improved = True
                break
        if not improved:
            return {"groups_solved": solved, "groups_kept": kept,
                    "stopped": "deadline" if past(deadline) else "no group lowers the busiest device"}
    return {"groups_solved": solved, "groups_kept": kept, "stopped": "deadline"}


@register("pair-balance", "a price on HBM spreads single-piece tables evenly in work and memory, then the busiest "
          "device and one or two others are solved again exactly (HiGHS) while that lowers it; additive oracles, "
          "deterministic", needs_additive=True, splits=True)
def pair_balance(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    candidates, deadline = problem.candidates, budget.deadline()
    balanced = balanced_start(candidates, deadline, KNAPSACK_SHARE * budget.time_limit)
    if balanced is not None:
        (assembly, pools), start = balanced, "balanced"
    else:
        # Where the balanced start finds no room, split-greedy's plan is the one the groups rebalance.
        greedy = split_greedy(candidates, problem.chooses_options, deadline)
        if not isinstance(greedy, Assembly):
            return stuck_result(candidates, greedy)
        assembly, pools, start = greedy, greedy_pools(greedy), "split-greedy"
    stats = {"start": start, "start_objective": assembly.objective(), **rebalance(assembly, pools, deadline)}
    return SolveResult(Status.FEASIBLE, plan=assembly.plan(), stats=stats)
