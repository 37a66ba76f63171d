"""Lower bounds on the optimal max device cost for additive oracles, valid over the enumerated sharding
options (table-wise alone is the special case with one option per table):
- average: every table does at least its cheapest option's work, and some device carries the average;
- largest piece: every table puts at least its smallest-possible largest piece on some device;
- pigeonhole: among the m·K + 1 tables with the largest such pieces, some device holds m + 1 of them;
- packing: bin packing by bisection on the target makespan T (see `packing_bound`);
- LP: the relaxation of the option choice (fractional options) with the average, largest-piece, total
  memory and — where the model is small enough — per-device constraints of pinned options; and, per
  table, its largest piece plus the least every other table's pinned option puts on any device (both
  sit on the device that holds the piece);
- integral: the LP with each table's option whole (a MILP, its dual bound within a time limit);
- moves (a replan keeping every old table's option, within a move budget): see `move_bound`."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .candidates import Candidates
from .quiet import c_stdout_silenced

LP_PER_DEVICE_NONZEROS = 2_000_000  # above this the LP leaves out the per-device rows of pinned options
PACKING_STEPS = 30                  # bisection steps of the packing bound (its precision: 2^-30 of its bracket)
PACKING_EPSILONS = (0.1, 0.2, 0.3, 0.4)  # the dual feasible functions U^ε the packing bound tries besides x
# Where the bound is the Lagrangian of HiGHS's duals (`lp_over`'s `safe`), they are asked to this precision: at
# HiGHS's defaults the duals it returned on curves of load factors cost that bound up to 2·10⁻⁴.
SAFE_TOLERANCES = {"dual_feasibility_tolerance": 1e-10, "primal_feasibility_tolerance": 1e-10}
# Generating columns (`lp_over`'s `start`): those priced below -GENERATED_TOLERANCE are added, the most negative
# GENERATED_BATCH at a time, until the bound is within GENERATED_GAP of the LP over the columns added.
GENERATED_TOLERANCE = 1e-9
GENERATED_BATCH = 2_000
GENERATED_GAP = 1e-6
INTEGRAL_GAP = 1e-4                 # relative: where `integral_bound`'s MILP may stop (its dual bound that close to its best)
MANY_PIECES = 16                    # options with more pieces are valued from their total alone (below)
# Weights λ of cost against memory the packing bound tries (λ·cost + (1 − λ)·memory): which weight proves
# the most depends on how dearly an oracle prices the bytes a table moves out of HBM, so one fixed 0.5
# left the bound at half the LP's where TorchRec's estimator prices host memory.
PACKING_MIXES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def gap_to_bound(objective: float, bound: float) -> float:
    """Relative excess over a lower bound: 0 means proven optimal."""
    if bound <= 0:
        return 0.0 if objective <= 0 else float("inf")
    return float(objective / bound - 1.0)


def average_bound(costs: np.ndarray, num_devices: int) -> float:
    """max(Σc / K, max c) for whole tables of costs c: some device carries at least the average, and the
    largest table sits somewhere."""
    costs = np.asarray(costs, dtype=float)
    return float(max(costs.sum() / num_devices, costs.max(initial=0.0)))


def pigeonhole_bound(costs: np.ndarray, num_devices: int) -> float:
    """Among the m·K + 1 largest items some device holds m + 1 of them, so it carries at least the sum
    of the m + 1 smallest of those; m = 1 is the classic (K+1)-largest-items bound."""
    desc = np.sort(np.asarray(costs, dtype=float))[::-1]
    best = 0.0
    m = 1
    while m * num_devices + 1 <= desc.size:
        top = m * num_devices + 1
        best = max(best, float(desc[top - m - 1:top].sum()))
        m += 1
    return best


def additive_lower_bounds(costs: np.ndarray, num_devices: int) -> dict[str, float]:
    """The bounds for whole tables of costs `costs` (every table table-wise)."""
    return {"average": average_bound(costs, num_devices), "pigeonhole": pigeonhole_bound(costs, num_devices)}


def best_additive_lower_bound(costs: np.ndarray, num_devices: int) -> float:
    return max(additive_lower_bounds(costs, num_devices).values())


def option_bounds(candidates: Candidates) -> dict[str, float]:
    """The combinatorial bounds over the candidates' live options (cheap: no LP; computed once per
    candidates); none when some table has no option that fits (then no plan does)."""
    if "option_bounds" not in candidates.memo:
        candidates.memo["option_bounds"] = _option_bounds(candidates)
    return dict(candidates.memo["option_bounds"])


def _option_bounds(candidates: Candidates) -> dict[str, float]:
    if any(ids.size == 0 for ids in candidates.by_table):
        return {}
    k = candidates.num_devices
    cheapest = candidates.least_work
    smallest_largest = np.array([candidates.biggest[ids].min() for ids in candidates.by_table])
    bounds = {"average": float(max(cheapest.sum() / k, smallest_largest.max(initial=0.0))),
              "pigeonhole": pigeonhole_bound(smallest_largest, k)}
    bounds["packing"] = packing_bound(candidates, max(bounds.values()))
    moves = candidates.moves
    if moves is not None and moves.previous.keep_types and moves.previous.budget is not None:
        bounds["moves"] = move_bound(candidates)
    return bounds


def move_bound(candidates: Candidates) -> float:
    """Over the plans within a replan's move budget where every old table keeps its option: a device whose
    old pieces cost L more than a target T ends above T unless pieces of at least L − T of that cost leave
    it, each moving at least the bytes it moves onto the cheapest other device (pinned pieces cannot
    leave); new tables only add load. The least bytes that shed that much is at least the fractional
    knapsack of the device's pieces by bytes per unit of cost; a T whose least bytes, summed over the
    devices, exceed the budget is unreachable. The largest such T, by bisection (0 where none is)."""
    moves = candidates.moves
    k = candidates.num_devices
    load = np.zeros(k)
    shed: list[list[tuple[float, float]]] = [[] for _ in range(k)]  # per device: (bytes per cost, cost)
    for option in moves.old_option[moves.old_option >= 0]:
        members = candidates.members(int(option))
        devices = moves.old_device[members]
        costs = candidates.priced.costs[members]
        np.add.at(load, devices, costs)
        if candidates.placement(int(option)) != "free" or not candidates.live[option]:
            continue
        rows = moves.rows(members).astype(float)
        rows[np.arange(members.size), devices] = np.inf
        for device, cost, moved in zip(devices, costs, rows.min(axis=1)):
            if cost > 0:
                shed[int(device)].append((moved / cost, float(cost)))
    shed = [sorted(pieces) for pieces in shed]

    def least_bytes(target: float) -> float:
        total = 0.0
        for device in np.flatnonzero(load > target):
            need = load[device] - target
            for ratio, cost in shed[device]:
                take = min(cost, need)
                total += ratio * take
                need -= take
                if need <= 0:
                    break
            if need > 0:
                return np.inf
        return total

    budget = float(moves.budget)
    low, high = 0.0, float(load.max(initial=0.0))
    if high <= 0 or least_bytes(0.0) <= budget:
        return 0.0
    for _ in range(PACKING_STEPS * 2):
        middle = (low + high) / 2
        if least_bytes(middle) > budget * (1 + 1e-12):
            low = middle
        else:
            high = middle
    return low


def packing_bound(candidates: Candidates, low: float, mixes: tuple[float, ...] = PACKING_MIXES) -> float:
    """The largest target T proven below the optimum, at least `low` (a valid bound), by bisection.

    At a target T every device carries pieces of costs x_i·T with Σ x_i ≤ 1, so no option with a piece
    above T can be chosen, and for any dual feasible function f (Σ x_i ≤ 1 ⇒ Σ f(x_i) ≤ 1) each device
    has Σ f(x_i) ≤ 1 over its pieces, pinned ones included. Each memory tier that may bind gives the same
    with x_i = bytes / capacity and f the identity, and so does any convex combination λ·(cost) +
    (1 − λ)·(memory), λ in `mixes`. Summing over devices: if Σ_tables min over the options that stay below T of
    Σ_pieces value > K, no plan reaches T. The functions: the identity and U^ε (1 above 1 − ε, 0 below ε,
    x between); an option with more than MANY_PIECES pieces is valued max(0, Σx − n·ε) ≤ Σ U^ε(x_i)
    (every piece loses at most ε), which keeps the bound cheap where row-wise and data-parallel options
    have a piece per device. Infeasibility is monotone in T (U^ε is non-decreasing), so bisection holds."""
    k = candidates.num_devices
    live = np.flatnonzero(candidates.live)
    if live.size == 0 or low <= 0:
        return low
    table_of = np.array([candidates.options.options[o].table for o in live])
    table_starts = np.flatnonzero(np.r_[True, table_of[1:] != table_of[:-1]])
    parts = candidates.parts[live]
    few = parts <= MANY_PIECES
    few_pieces = np.concatenate([candidates.members(int(o)) for o in live[few]]) if few.any() else np.zeros(0, int)
    few_first = np.r_[0, np.cumsum(parts[few])[:-1]]
    piece_costs = candidates.priced.costs[few_pieces]
    work, biggest = candidates.work[live], candidates.biggest[live]
    capacity = candidates.instance.topology.capacity.as_array().astype(float)
    memory = [candidates.total_storage[live, tier] / capacity[tier] for tier in candidates.binding_tiers]

    def cost_values(target: float, epsilon: float | None) -> np.ndarray:
        if epsilon is None:
            return work / target
        values = np.maximum(0.0, work / target - parts * epsilon)
        x = piece_costs / target
        u = np.where(x > 1 - epsilon, 1.0, np.where(x < epsilon, 0.0, x))
        values[few] = np.add.reduceat(u, few_first) if few_first.size else values[few]
        return values

    def unreachable(target: float) -> bool:
        allowed = biggest <= target
        for epsilon in (None, *PACKING_EPSILONS):
            cost = cost_values(target, epsilon)
            for value in [cost, *(mix * cost + (1 - mix) * m for m in memory for mix in mixes)]:
                per_table = np.minimum.reduceat(np.where(allowed, value, np.inf), table_starts)
                if per_table.sum() > k * (1 + 1e-9):
                    return True
        return False

    high = 2 * low
    for _ in range(PACKING_STEPS):
        if not unreachable(high):
            break
        low, high = high, 2 * high
    else:
        return low
    for _ in range(PACKING_STEPS):
        middle = (low + high) / 2
        if unreachable(middle):
            low = middle
        else:
            high = middle
    return low


def best_option_bound(candidates: Candidates) -> float:
    return max(option_bounds(candidates).values(), default=0.0)


def lp_bound(candidates: Candidates) -> float | None:
    """The LP relaxation of choosing one option per table (`_lp_bound`), solved once per candidates: `plan`'s
    price stage solves it before the members fork (`solve_lp_within`), so that they share it."""
    if "lp_bound" not in candidates.memo:
        candidates.memo["lp_bound"] = _lp_bound(candidates)
    return candidates.memo["lp_bound"]


def integral_bound(candidates: Candidates, time_limit: float) -> float | None:
    """The LP bound's model with each table's option whole (`lp_over`'s `integral`), solved once per candidates
    within `time_limit` seconds: at least the LP, as far above it as the tables' options are coarse (the zoo's
    dlrm-criteo with HBM short, under TorchRec's estimator: 23.53 -> 26.18, proven in 0.25 s). None where
    HiGHS proved no bound in time."""
    return _integral(candidates, time_limit)[0]


def integral_choice(candidates: Candidates, time_limit: float) -> np.ndarray | None:
    """The option per table of the best choice `integral_bound`'s MILP found (the same solve): whole options
    within the memory summed over devices, none of whose largest pieces exceeds what the choice's makespan
    allows there. None where it found none."""
    return _integral(candidates, time_limit)[1]


def _integral(candidates: Candidates, time_limit: float) -> tuple[float | None, np.ndarray | None]:
    if "integral" not in candidates.memo:
        if any(ids.size == 0 for ids in candidates.by_table):
            return None, None
        live, solution = np.flatnonzero(candidates.live), []
        bound = lp_over(candidates, LPColumns.of(candidates, live), time_limit, solution=solution, integral=True)
        chosen = None
        if solution:
            chosen = np.full(candidates.instance.num_tables, -1, dtype=np.int64)
            picked = live[solution[0] > 0.5]
            chosen[[candidates.options.options[int(o)].table for o in picked]] = picked
        candidates.memo["integral"] = bound, chosen if chosen is not None and (chosen >= 0).all() else None
    return candidates.memo["integral"]


class LPOutOfTime(RuntimeError):
    """The LP relaxation did not finish within its time limit."""


def solve_lp_within(candidates: Candidates, seconds: float) -> None:
    """`lp_bound` solved now where it takes at most `seconds`; else left to whoever asks for it later."""
    if "lp_bound" not in candidates.memo:
        try:
            candidates.memo["lp_bound"] = _lp_bound(candidates, seconds)
        except LPOutOfTime:
            pass


@dataclass(frozen=True)
class LPColumns:
    """What the LP over options reads of each option it may choose (a column): its table, its total work, its
    largest piece, its bytes per tier; for a pinned option the least it puts on any device (`floor`) and, where
    the model stays small (`profiles`), what it puts on each device (cost, columns × K; bytes, columns × K × 2)."""

    table: np.ndarray
    work: np.ndarray
    biggest: np.ndarray
    storage: np.ndarray
    pinned: np.ndarray
    floor: np.ndarray
    profiles: tuple[np.ndarray, np.ndarray] | None

    @classmethod
    def of(cls, candidates: Candidates, ids: np.ndarray) -> "LPColumns":
        """The columns of options `ids`, as the candidates price them."""
        ids = np.asarray(ids, dtype=np.int64)
        table = np.array([candidates.options.options[o].table for o in ids], dtype=np.int64)
        pinned = np.array([candidates.placement(int(o)) == "pinned" for o in ids], dtype=bool)
        cost = [candidates.device_profile(int(o), candidates.priced.costs) for o in ids[pinned]]
        floor = np.zeros(ids.size)
        floor[pinned] = [c.min() for c in cost]
        profiles = None
        if pinned.sum() * candidates.num_devices <= LP_PER_DEVICE_NONZEROS:
            k = candidates.num_devices
            profiles = (np.stack(cost) if cost else np.zeros((0, k)), np.stack(
                [candidates.device_profile(int(o), candidates.storage) for o in ids[pinned]]) if cost else
                np.zeros((0, k, 2), dtype=np.int64))
        return cls(table, candidates.work[ids], candidates.biggest[ids], candidates.total_storage[ids], pinned,
                   floor, profiles)

    def take(self, keep: np.ndarray) -> "LPColumns":
        """The columns `keep` marks (a mask)."""
        profiles = None if self.profiles is None else tuple(p[keep[self.pinned]] for p in self.profiles)
        return LPColumns(*(getattr(self, f)[keep] for f in ("table", "work", "biggest", "storage", "pinned", "floor")),
                         profiles)

    def __add__(self, other: "LPColumns") -> "LPColumns":
        profiles = None
        if self.profiles is not None and other.profiles is not None:
            k = self.profiles[0].shape[1]
            if (self.pinned.sum() + other.pinned.sum()) * k <= LP_PER_DEVICE_NONZEROS:
                profiles = tuple(np.concatenate([a, b]) for a, b in zip(self.profiles, other.profiles))
        return LPColumns(*(np.concatenate([getattr(self, f), getattr(other, f)]) for f in
                           ("table", "work", "biggest", "storage", "pinned", "floor")), profiles)


def _lp_bound(candidates: Candidates, time_limit: float | None = None) -> float | None:
    """The LP relaxation of choosing one of the live options per table (`lp_over`)."""
    if any(ids.size == 0 for ids in candidates.by_table):
        return None
    return lp_over(candidates, LPColumns.of(candidates, np.flatnonzero(candidates.live)), time_limit)


def lp_over(candidates: Candidates, columns: LPColumns, time_limit: float | None = None,
            safe: bool = False, solution: list | None = None, start: np.ndarray | None = None,
            integral: bool = False) -> float | None:
    """The LP relaxation of choosing one column per table (HiGHS via scipy), or None when it is infeasible
    (then no plan fits either). Rows: one column per table; K·z ≥ total work; z ≥ each table's largest piece;
    total bytes of each memory tier that may bind ≤ K × its capacity; and, while the model stays small,
    z ≥ what pinned columns put on each device and each device's bytes from them ≤ capacity in every tier it
    has. Any columns whose values lie at or below an option's (or a mix of them, below what any value of a
    hidden parameter gives) keep it a bound. HiGHS stops within its tolerances, which on many near-equal
    columns left its optimum up to 2·10⁻⁴ above the LP's; `safe` returns instead the Lagrangian bound of the
    duals it returns (`_lagrangian`), which holds whatever their error. With `start` (safe only; a mask of the
    columns to begin with) the LP is solved by generating columns (`_generated`). `integral` (alone) asks each
    table's choice to be whole: a MILP (HiGHS), whose dual bound holds wherever `time_limit` stops it (None
    where it proved none)."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp
    from scipy.sparse import coo_matrix, vstack

    assert not (integral and (safe or start is not None)), "a whole choice is solved as is, not by columns or duals"

    k = candidates.num_devices
    capacity = candidates.instance.topology.capacity.as_array()
    tiers = [int(t) for t in np.flatnonzero(capacity > 0)]
    n = columns.table.size
    if np.unique(columns.table).size < candidates.instance.num_tables:
        return None  # a table without a column: nothing of it fits a device
    n_vars = n + 2  # y per column, then w (the pinned floor), then z
    work = columns.work
    # The LP in units of the average load; with many columns per table (`safe`: curves of load factors) the
    # average over each table's columns, so that HiGHS's absolute tolerances stay small beside its values.
    per_table = np.bincount(columns.table, minlength=candidates.instance.num_tables) if safe else 1
    scale = max((work / np.maximum(per_table, 1)[columns.table] if safe else work).sum() / k, 1e-300)
    rows, cols, vals, rhs = [], [], [], []

    def add_row(columns, values, bound):
        r = len(rhs)
        rows.extend([r] * len(columns))
        cols.extend(columns)
        vals.extend(values)
        rhs.append(bound)

    add_row(list(range(n)) + [n_vars - 1], list(work / scale) + [-float(k)], 0.0)
    pinned = np.flatnonzero(columns.pinned)
    floor = columns.floor / scale
    # w ≤ Σ_pinned y·(least per-device cost): what pinned options put on every device at least.
    add_row(list(pinned) + [n_vars - 2], list(-floor[pinned]) + [1.0], 0.0)
    order = np.argsort(columns.table, kind="stable")
    starts = np.flatnonzero(np.r_[True, columns.table[order][1:] != columns.table[order][:-1]])
    by_table = np.split(order, starts[1:])
    for ids in by_table:
        # z ≥ Σ_o y·biggest + w − (the table's own pinned floor, already counted in its piece)
        values = columns.biggest[ids] / scale - floor[ids]
        add_row(list(ids) + [n_vars - 2, n_vars - 1], list(values) + [1.0, -1.0], 0.0)
    for tier in candidates.binding_tiers:
        add_row(list(range(n)), list(columns.storage[:, tier] / capacity[tier]), float(k))
    if columns.profiles is not None and pinned.size:
        costs = columns.profiles[0] / scale
        memory = columns.profiles[1] / np.maximum(capacity, 1)
        for d in range(k):
            add_row(list(pinned) + [n_vars - 1], list(costs[:, d]) + [-1.0], 0.0)
            for tier in tiers:
                add_row(list(pinned), list(memory[:, d, tier]), 1.0)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(len(rhs), n_vars)).tocsr()
    eq_rows = np.concatenate([np.full(ids.size, t) for t, ids in enumerate(by_table)])
    eq_cols = np.concatenate(by_table)
    a_eq = coo_matrix((np.ones(eq_cols.size), (eq_rows, eq_cols)), shape=(len(by_table), n_vars)).tocsr()
    objective = np.zeros(n_vars)
    objective[-1] = 1.0
    if start is not None:
        most_floor = sum(float(floor[ids].max()) for ids in by_table)
        model = (objective, a_ub, np.array(rhs), a_eq, np.ones(len(by_table)), most_floor)
        value = _generated(model, np.r_[start, True, True], time_limit, solution)
        return None if value is None else float(value * scale * (1 - 1e-7))
    if integral:
        options = {"mip_rel_gap": INTEGRAL_GAP} | ({} if time_limit is None else {"time_limit": max(time_limit, 1e-3)})
        with c_stdout_silenced():  # scipy's HiGHS has highspy's stray print (solvers.quiet)
            found = milp(objective, integrality=np.r_[np.ones(n), 0, 0],
                         bounds=Bounds(0, np.r_[np.ones(n), np.inf, np.inf]),
                         constraints=[LinearConstraint(a_ub, -np.inf, np.array(rhs)), LinearConstraint(a_eq, 1, 1)],
                         options=options)
        if found.status not in (0, 1):  # neither solved nor stopped by its time: infeasible, or an error
            return None
        if solution is not None and found.x is not None:
            solution.append(found.x[:n])
        dual = getattr(found, "mip_dual_bound", None)
        if dual is None or not np.isfinite(dual):
            return None
        # Its nodes' LPs hold rows to HiGHS's tolerances, as the LP's do: given back ten times over.
        return float(dual * scale * (1 - 1e-6))
    result = linprog(objective, A_ub=vstack([a_ub]), b_ub=np.array(rhs), A_eq=a_eq,
                     b_eq=np.ones(len(by_table)), bounds=[(0, 1)] * n + [(0, None), (0, None)],
                     method="highs", options=(SAFE_TOLERANCES if safe else {}) | (
                         {} if time_limit is None else {"time_limit": max(time_limit, 1e-3)}))
    if result.status == 2:
        return None
    if result.status == 1 and time_limit is not None:
        raise LPOutOfTime(f"the LP relaxation took more than {time_limit:.2f} s")
    if result.status != 0:
        raise RuntimeError(f"LP relaxation failed: {result.message}")
    if solution is not None:
        solution.append(result.x[:n])
    value = result.fun
    if safe:
        most_floor = sum(float(floor[ids].max()) for ids in by_table)
        value, _ = _lagrangian(result, objective, a_ub, np.array(rhs), a_eq, np.ones(len(by_table)),
                               np.r_[np.ones(n), most_floor, 2 * result.fun])
    # HiGHS holds rows to ~1e-9 of the scaled load: give that back so the bound stays below the optimum.
    return float(value * scale * (1 - 1e-7))


def _generated(model: tuple, active: np.ndarray, time_limit: float | None, solution: list | None) -> float | None:
    """The LP over the `active` columns, then with the columns the duals price below zero added (the most
    negative GENERATED_BATCH at a time), until none is or the Lagrangian of the duals over every column (a bound
    whichever columns are active) is within GENERATED_GAP of the LP over the active ones; the best such
    Lagrangian (scaled), or None where the LP over every column is infeasible. Where the LP over the columns
    first given is infeasible, all are taken."""
    from scipy.optimize import linprog

    objective, a_ub, b_ub, a_eq, b_eq, most_floor = model
    n_vars = objective.size
    deadline = np.inf if time_limit is None else time.monotonic() + time_limit
    a_ub, a_eq = a_ub.tocsc(), a_eq.tocsc()
    best, weights = -np.inf, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LPOutOfTime(f"the LP relaxation took more than {time_limit:.2f} s")
        ids = np.flatnonzero(active)
        result = linprog(objective[ids], A_ub=a_ub[:, ids], b_ub=b_ub, A_eq=a_eq[:, ids], b_eq=b_eq,
                         bounds=[(0, 1)] * (ids.size - 2) + [(0, None), (0, None)], method="highs",
                         options=SAFE_TOLERANCES | ({} if time_limit is None else {"time_limit": max(left, 1e-3)}))
        if result.status == 2:
            if active.all():
                return None
            active[:] = True
            continue
        if result.status == 1 and time_limit is not None:
            raise LPOutOfTime(f"the LP relaxation took more than {time_limit:.2f} s")
        if result.status != 0:
            raise RuntimeError(f"LP relaxation failed: {result.message}")
        upper = np.r_[np.ones(n_vars - 2), most_floor, 2 * result.fun]
        value, reduced = _lagrangian(result, objective, a_ub, b_ub, a_eq, b_eq, upper)
        if value > best:
            best = value
            weights = np.zeros(n_vars)
            weights[ids] = result.x
        priced_below = np.flatnonzero((reduced < -GENERATED_TOLERANCE) & ~active)
        if not priced_below.size or best >= result.fun * (1 - GENERATED_GAP):
            break
        active[priced_below[np.argsort(reduced[priced_below])[:GENERATED_BATCH]]] = True
    if solution is not None:
        solution.append(weights[:-2])
    return best


def _lagrangian(result, objective, a_ub, b_ub, a_eq, b_eq, upper: np.ndarray) -> tuple[float, np.ndarray]:
    """min c·x over 0 ≤ x ≤ `upper` of the Lagrangian c·x + λ·(A_ub x − b_ub) + μ·(A_eq x − b_eq), with λ ≥ 0
    and μ from HiGHS's marginals: at most c·x at any feasible x in the box, so a lower bound on the LP (and on
    any plan) whatever the duals' error. The box holds every feasible point but the makespan's, capped at
    twice HiGHS's optimum; a plan above that cap is above the bound returned (at most the cap) too. Where HiGHS
    solved over some of the columns, the bound is still over every column. Returned with every column's
    reduced cost."""
    lam = np.maximum(-result.ineqlin.marginals, 0.0)
    mu = -result.eqlin.marginals
    reduced = objective + a_ub.T @ lam + a_eq.T @ mu
    value = min(float(np.minimum(0.0, reduced * upper).sum() - lam @ b_ub - mu @ b_eq), float(upper[-1]))
    return value, reduced
