"""The exact model for additive oracles, described once for its two backends (solvers.cpsat, solvers.milp):
one option per table and a device for every free piece, chosen together, minimising the max device cost
under memory. Both backends start from the split-aware heuristic (a complete hint / MIP start), break the
symmetry of interchangeable devices, and report the bound they proved (CP-SAT first solves the model over the
`core_tables` alone where a few tables do most of the work, whose bound it keeps, and where tables trade HBM for
cost over `neighbourhoods` of the summed-memory knapsack, whose bounds it drops);
a plan is called optimal only when that bound meets it, and then it is optimal over the enumerated
options (`optimal_over: "enumerated options"`).

Variables: y[o] picks option o of a table (a constant where a table has one option); a free option of c
equal pieces has n[o, d] ∈ 0..c pieces on device d with Σ_d n = c·y; a node option has z[o, node] with
Σ z = y (written as a grid of one block, below); a node_free option (table-column-wise) has z[o, node] and its c pieces n[o, d] on the devices of
the chosen node, Σ_{d in node} n = c·z; a grid of c blocks has g[o, node] ∈ 0..c blocks on each node with
Σ g = c·y; pinned options add their per-device costs and memory through y. Devices of one node that every
pinned and node option treats alike are interchangeable: they are numbered by first use, so that the
table at position q (costliest first) may only use the first U_q + c of them, U_q being how many pieces
the tables before it can hold at most."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from instances.memory import HBM
from instances.moves import plan_moved_bytes

from .assembly import Assembly, place_table
from .base import (
    OPTIMALITY_TOLERANCE,
    Budget,
    Cause,
    NoPlan,
    SolveResult,
    Status,
    order_by_cost,
)
from .bounds import best_option_bound, lp_bound
from .candidates import Candidates, Problem
from .choice import knapsack_centre
from .search import searched, send_back

HEURISTIC_SHARE = 0.1        # share of the budget spent on the heuristic start before the exact model
# With splits the model is larger and CP-SAT or HiGHS rarely beat local search within seconds (on 80 × 8
# DLRM tasks they returned its start at 10 s, while a longer start closed a third of the gap): half the
# budget goes to the start there.
SPLIT_HEURISTIC_SHARE = 0.5
# Where tables trade HBM for cost (memory tiers), the per-device packing, not the option choice, is what the
# search gets wrong: its plans cost several % more work than the knapsack over HBM summed over devices,
# while the model cut down to that knapsack's options and their hull neighbours (`neighbourhoods`) packs
# within ~2 % of it in seconds. So the start gets a smaller share there, the neighbourhoods, widening, run
# up to their share of the budget, and the whole model the rest.
TIERED_HEURISTIC_SHARE = 0.1
NEIGHBOURHOOD_SHARE = 0.8
KNAPSACK_SHARE = 0.05        # of the budget, the most the neighbourhood's knapsack may take
# Per side, the hull options next to the knapsack's that each neighbourhood keeps, narrowest first: the
# narrowest packs best within seconds, a wider one hinted with its plan then improves on it (4 of 5 tiered
# tasks) or escapes where the narrowest packs badly.
HULL_NEIGHBOURS = (1, 2)
# Tables × devices beyond which the neighbourhoods are left out: at 80 × 8 (narrowest ~1,500 variables) they
# lowered CP-SAT's 30 s plans by 2-8 % under TorchRec's estimator, at 200 × 16 (~7,000) two run side by
# side did not settle and ended worse than the longer heuristic start alone (certified 5.6 % against 4.0 %).
NEIGHBOURHOOD_MAX_SIZE = 1_600
# The core (`core_tables`): the tables whose option in the knapsack (their least work where nothing trades HBM)
# does at least CORE_LOAD of the average load, solved alone where they are at most CORE_TABLES with at most
# CORE_OPTIONS options together and do at least CORE_WORK of all the work, on at most NEIGHBOURHOOD_MAX_SIZE
# tables × devices. On the MLPerf Criteo-1TB tables with HBM short under TorchRec's estimator, 5 tables (195
# options) do 93 % of it: CP-SAT proved their optimum, 33.53 ms against the LP's 23.96, in 3-7 s on 2 cores, and
# with the next one or three tables too (232, 299 options) in 5.8 and 7.9 s; 12 tables not within 10 s, nor the
# 5 with the LP's load factors offered beside the grid's (231 options) within 20 s. On the tiers suites' tasks
# no table set passes (the 8 largest do about 40 %), and their optimum alone, with the other tables as a priced
# fluid, was the LP's. A core the price stage names (`Problem.core`) has no option cap: its tables are offered
# fine load factors, over which CP-SAT seeks a plan more than a proof (on the Criteo tables, 1,432 options in
# all with the five offered them: 29.9-30.0 ms at 20 and 30 s; shardbench.pipeline.CORE_BUDGET_S).
CORE_LOAD = 0.4
CORE_WORK = 0.5
CORE_TABLES = 8
CORE_OPTIONS = 300
MAX_MODEL_VARIABLES = 250_000  # beyond this building the model alone eats the budget on 2 cores
# Where the model is larger still, the start is the plan returned, so it gets the budget bar a margin: at
# 5,000 x 512 the bounds before it take ~3 s and local search ends up to 4 s past its deadline (given the
# whole budget, cells ran 74-76 s of 60; at its split share, 800 x 128 tiered tasks returned a start cut
# before it balanced, 23-64 % above the bound).
OVERSIZED_START_SHARE = 0.85


# ---------------------------------------------------------------- the start


@dataclass
class ExactStart:
    """What an exact model starts from: the heuristic plan (or None) and the best bound known before the
    model runs."""

    assembly: Assembly | None
    lower_bound: float
    failure: SolveResult | None = None

    def objective(self) -> float:
        return self.assembly.objective() if self.assembly is not None else np.inf

    def proven(self, gap: float = 0.0) -> bool:
        """The heuristic plan already meets the bound (or comes within `gap` of it): nothing is left for
        the model to do."""
        return self.objective() <= self.lower_bound * (1 + max(gap, OPTIMALITY_TOLERANCE))

    def improved(self, candidates: Candidates, found: tuple[list[int], np.ndarray] | None) -> "ExactStart":
        """The start with `found` (options and devices over `candidates`) as its plan where that costs less;
        the bound stays."""
        if found is None:
            return self
        assembly = Assembly(candidates)
        assembly.load(np.asarray(found[0]), np.asarray(found[1]))
        if assembly.objective() >= self.objective():
            return self
        return ExactStart(assembly, self.lower_bound, self.failure)


def exact_start(problem: Problem, budget: Budget, seed: int, widens: bool = False,
                oversized: bool = False) -> ExactStart:
    """The heuristic start and the best bound known; `widens`: the backend runs `neighbourhoods` after it
    (CP-SAT), so that on `tiered` candidates the start gets TIERED_HEURISTIC_SHARE of the budget;
    `oversized`: the model will not be built, the start is the plan returned."""
    candidates = problem.candidates
    bound = best_option_bound(candidates)
    if problem.chooses_options:
        lp = lp_bound(candidates)
        bound = max(bound, lp if lp is not None else 0.0)
    share = (OVERSIZED_START_SHARE if oversized else
             HEURISTIC_SHARE if not problem.chooses_options else
             TIERED_HEURISTIC_SHARE if widens and tiered(candidates) else SPLIT_HEURISTIC_SHARE)
    assembly, failure, _ = searched(problem, budget, seed, budget.share(share), bound)
    return ExactStart(assembly, bound, failure)


def cut_down_settles(candidates: Candidates) -> bool:
    """Whether a model cut down from this one (a neighbourhood, a core) is one CP-SAT settles within seconds:
    at most NEIGHBOURHOOD_MAX_SIZE tables × devices, and not a replan."""
    size = candidates.instance.num_tables * candidates.num_devices
    return candidates.moves is None and size <= NEIGHBOURHOOD_MAX_SIZE


def tiered(candidates: Candidates) -> bool:
    """Whether the model gets neighbourhoods first: tables trade HBM for cost and the neighbourhoods are ones
    CP-SAT settles (`cut_down_settles`)."""
    return cut_down_settles(candidates) and candidates.trades_hbm


def centre_of(candidates: Candidates, budget: Budget) -> np.ndarray | None:
    """Where `tiered`, each table's option in the knapsack over memory summed over devices
    (solvers.choice.knapsack_centre) within its share of the budget; else, or where it finds none, None."""
    if not tiered(candidates):
        return None
    return knapsack_centre(candidates, KNAPSACK_SHARE * budget.time_limit, budget.deadline())


def core_of(work: np.ndarray, num_devices: int) -> np.ndarray | None:
    """Given each table's work, the few tables that do most of it: each at least CORE_LOAD of the average
    device's load, at most CORE_TABLES of them, together at least CORE_WORK of all of it and not every table;
    None where there are none such."""
    total = float(work.sum())
    core = np.flatnonzero(work >= CORE_LOAD * total / num_devices)
    if not 0 < core.size <= CORE_TABLES or core.size == work.size or work[core].sum() < CORE_WORK * total:
        return None
    return core


def core_tables(problem: Problem, centre: np.ndarray | None) -> np.ndarray | None:
    """The tables the exact model solves alone first: those the price stage named (`Problem.core`, offered fine
    load factors there), or else `core_of` their option in `centre` or their least work, at most CORE_OPTIONS
    options together; None where there are none such, where the instance is larger than
    NEIGHBOURHOOD_MAX_SIZE or a replan (`cut_down_settles`; its moves are not modelled alone), and where caches
    are offered load factors beside the grid's that the price stage named no core for (over the LP's, CP-SAT
    proved no core: above). Leaving tables out never raises an additive oracle's optimum (their pieces' costs
    and bytes go, nothing else changes), so what the model over the core alone proves bounds the whole; where
    a few tables are each worth several devices, their pieces' coarse cuts are what the LP does not see."""
    candidates = problem.candidates
    if not cut_down_settles(candidates):
        return None
    if problem.core:
        return np.asarray(problem.core, dtype=np.int64)
    if problem.load_factors:
        return None
    core = core_of(candidates.work[centre] if centre is not None else candidates.least_work, candidates.num_devices)
    if core is None or sum(candidates.by_table[t].size for t in core) > CORE_OPTIONS:
        return None
    return core


def completed(candidates: Candidates, found: tuple[list[int], np.ndarray]) -> Assembly | None:
    """A plan of some tables' options and pieces (the others' option -1) with every other table fitted in
    turn, costliest first, where its pieces cost least, its least-work option first (`place_table`). Where one
    finds no room in HBM, one of the given tables gives up HBM first: the one whose next leaner option cut the
    same way, on the same devices, raises the most loaded device least (the core's caches sized before the
    other tables took their room); None where none can, or where what the table lacks is another tier."""
    assembly = Assembly(candidates)
    assembly.load(np.asarray(found[0]), np.asarray(found[1]))
    given = np.flatnonzero(assembly.chosen >= 0)
    for table in order_by_cost(candidates.least_work):
        if assembly.chosen[table] >= 0:
            continue
        ids = candidates.by_table[table]
        lightest = int(ids[np.argmin(candidates.work[ids])])
        while True:
            placed, stuck = place_table(assembly, int(table), lightest, candidates.work)
            if placed:
                break
            if stuck is None or stuck.tier != HBM or not _leaner(assembly, given):
                return None
    return assembly


def _leaner(assembly: Assembly, tables: np.ndarray) -> bool:
    """One of `tables` switched, in place, to its next option with less HBM cut the same way, the one that
    leaves the most loaded device lowest (and fits every tier); whether there was one."""
    candidates = assembly.c
    hbm = candidates.total_storage[:, HBM]
    best = None
    for table in tables:
        option = int(assembly.chosen[table])
        same = candidates.leaner(option)
        if not same.size:
            continue
        leaner = int(same[np.argmax(hbm[same])])
        _, devices = assembly.take(int(table))
        if assembly.fits_at(leaner, devices):
            assembly.put(leaner, devices)
            peak = assembly.objective()
            assembly.take(int(table))
            if best is None or peak < best[0]:
                best = (peak, int(table), leaner)
        assembly.put(option, devices)
    if best is None:
        return False
    _, devices = assembly.take(best[1])
    assembly.put(best[2], devices)
    return True


def neighbourhoods(candidates: Candidates, centre: np.ndarray | None) -> list[Candidates]:
    """The candidates cut down to each table's option in `centre` (`centre_of`; None: none) and, for each
    width in HULL_NEIGHBOURS, that many options either side of it on its layout's (HBM, work) hull, narrowest
    first, each differing from the one before. What a model proves over one bounds nothing beyond it."""
    if centre is None:
        return []
    hbm = candidates.total_storage[:, HBM]
    lines = []
    for table, option in enumerate(centre):
        hull = candidates.search_options[table]
        line = hull[candidates.layout[hull] == candidates.layout[option]]
        line = line[np.argsort(hbm[line], kind="stable")]
        at = np.flatnonzero(line == option)
        # The knapsack may pick an option above the hull: its neighbours are then the hull's options either
        # side of its HBM (first > last: none in between).
        first = int(at[0]) if at.size else int(np.searchsorted(hbm[line], hbm[option]))
        lines.append((int(option), line, first, first if at.size else first - 1))
    cuts: list[Candidates] = []
    for width in HULL_NEIGHBOURS:
        keep = np.zeros(candidates.live.size, dtype=bool)
        for option, line, first, last in lines:
            keep[option] = True
            keep[line[max(0, first - width): last + width + 1]] = True
        cut = candidates.restricted(keep)
        if not cuts or not np.array_equal(cut.live, cuts[-1].live):
            cuts.append(cut)
    return cuts


# ---------------------------------------------------------------- the model, once


@dataclass
class LinearModel:
    """Variables (bounds, integrality, hint), choice rows (Σ terms = rhs, integer coefficients), cost rows
    (Σ cost · var ≤ makespan, in cost units), memory rows (Σ bytes · var ≤ capacity, one per device and memory
    tier that may bind), and in a replan link rows and the moved-bytes row; minimise makespan."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    hint: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    choices: list[tuple[list[int], list[int], int]] = field(default_factory=list)
    costs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    memory: list[tuple[list[int], list[int], int]] = field(default_factory=list)
    links: list[tuple[list[int], list[int], int]] = field(default_factory=list)  # Σ coefficient · var ≤ rhs
    moves: tuple[list[int], list[int], int] | None = None  # Σ bytes · var ≤ the bytes the budget leaves
    makespan_hint: float = 0.0
    decode: dict = field(default_factory=dict)  # variable -> (kind, option, device or node)

    def var(self, name: str, upper: int, hint: float, decode: tuple | None = None) -> int:
        self.lower.append(0)
        self.upper.append(upper)
        self.hint.append(hint)
        self.names.append(name)
        if decode is not None:
            self.decode[len(self.names) - 1] = decode
        return len(self.names) - 1


def device_classes(candidates: Candidates) -> list[list[int]]:
    """Devices of one node that every live pinned and node option treats alike (same cost and memory); in a
    replan, where the previous plan held anything, each device alone (it tells them apart)."""
    instance = candidates.instance
    k, per_node = candidates.num_devices, instance.topology.devices_per_node
    if candidates.moves is not None and candidates.moves.keys.size:
        return [[d] for d in range(k)]
    columns = [np.arange(k) // per_node]
    for o in np.flatnonzero(candidates.live):
        placement = candidates.placement(int(o))
        if placement == "pinned":
            columns += [candidates.device_profile(int(o), candidates.priced.costs),
                        *candidates.device_profile(int(o), candidates.storage).T]
        elif placement in ("node", "grid"):  # a grid's blocks are alike: its first block's profile
            members = candidates.members(int(o))[:per_node]
            local = np.arange(k) % per_node
            columns += [candidates.priced.costs[members][local], *candidates.storage[members][local].T]
    signature = np.stack(columns, axis=1)
    _, label = np.unique(signature, axis=0, return_inverse=True)
    classes: dict[int, list[int]] = {}
    for d, c in enumerate(np.asarray(label).ravel()):
        classes.setdefault(int(c), []).append(d)
    return list(classes.values())


def _identical_pieces(candidates: Candidates, o: int) -> tuple[float, np.ndarray]:
    members = candidates.members(o)
    costs, storage = candidates.priced.costs[members], candidates.storage[members]
    if np.ptp(costs) != 0 or np.ptp(storage, axis=0).any():
        raise ValueError(f"option {o}: free pieces of unequal cost or memory")  # our cuts are equal blocks
    return float(costs[0]), storage[0]


def relabelled_free_devices(candidates: Candidates, assembly: Assembly, order: np.ndarray,
                            classes: list[list[int]]) -> np.ndarray:
    """The assembly's devices with each class of interchangeable devices renumbered by first use of a free
    piece in table order (the same plan up to relabelling, and one that obeys the symmetry breaking)."""
    class_of = np.empty(candidates.num_devices, dtype=np.int64)
    for c, members in enumerate(classes):
        class_of[members] = c
    mapping: dict[int, int] = {}
    used = [0] * len(classes)
    device = assembly.device.copy()
    for table in order:
        option = int(assembly.chosen[table])
        if candidates.placement(option) != "free":
            continue
        for piece in candidates.members(option):
            d = int(assembly.device[piece])
            if d not in mapping:
                c = class_of[d]
                mapping[d] = classes[c][used[c]]
                used[c] += 1
            device[piece] = mapping[d]
    return device


def build_model(candidates: Candidates, start: ExactStart, tables: np.ndarray | None = None) -> LinearModel:
    """The model, with the start as a complete hint; over `tables` alone where given (the others left out)."""
    instance = candidates.instance
    k = candidates.num_devices
    order = order_by_cost(candidates.least_work)
    if tables is not None:
        order = order[np.isin(order, tables)]
    classes = device_classes(candidates)
    hint_device = (relabelled_free_devices(candidates, start.assembly, order, classes)
                   if start.assembly is not None else None)
    chosen = start.assembly.chosen if start.assembly is not None else np.full(instance.num_tables, -1)
    model = LinearModel()
    cost_terms: list[tuple[list[int], list[float]]] = [([], []) for _ in range(k)]
    memory_terms: list[tuple[list[int], list[np.ndarray]]] = [([], []) for _ in range(k)]
    loads = np.zeros(k)
    moves = candidates.moves
    budgeted = moves is not None and moves.previous.budget is not None
    moved = _MovedRow()
    # Symmetry breaking: how many pieces the tables before position q can put on free devices at most.
    used_before = 0
    for table in order:
        options = [int(o) for o in candidates.by_table[table]]
        y_vars = {}
        if len(options) > 1:
            for o in options:
                y_vars[o] = model.var(f"y{o}", 1, float(chosen[table] == o), ("y", o, None))
            _choice_row(model, list(y_vars.values()), 1, None)  # Σ_o y[o] = 1
        most_parts = 0
        for o in options:
            picked = chosen[table] == o
            placement = candidates.placement(o)
            parts = candidates.options.options[o].parts
            if placement == "free":
                cost, memory = _identical_pieces(candidates, o)
                most_parts = max(most_parts, parts)
                reach = used_before + parts
                allowed = [d for members in classes for d in members[:reach]]
                counts = (np.bincount(hint_device[candidates.members(o)], minlength=k) if picked and hint_device is not None
                          else np.zeros(k, dtype=np.int64))
                rows = moves.rows(candidates.members(o)) if budgeted else None
                if rows is not None and _free_moves(rows) == "each piece":
                    _piece_variables(model, candidates, o, y_vars.get(o), rows, cost, memory, cost_terms,
                                     memory_terms, hint_device if picked else None, moved)
                    loads += np.bincount(hint_device[candidates.members(o)], minlength=k) * cost if \
                        picked and hint_device is not None else 0.0
                    continue
                n_vars = []
                for d in sorted(allowed):
                    v = model.var(f"n{o}_{d}", parts, float(counts[d]), ("n", o, d))
                    n_vars.append(v)
                    _charge(cost_terms, memory_terms, d, v, cost, memory)
                    loads[d] += cost * counts[d]
                if rows is not None:
                    _count_moves(model, o, y_vars.get(o), rows, dict(zip(sorted(allowed), n_vars)), counts, moved)
                _choice_row(model, n_vars, parts, y_vars.get(o))
            elif placement == "pinned":
                profile = candidates.device_profile(o, candidates.priced.costs)
                needs = candidates.device_profile(o, candidates.storage)
                if picked:
                    loads += profile
                y = y_vars.get(o)
                if y is None:  # the table's only option: a variable held at 1 carries its constant load
                    y = model.var(f"fixed{o}", 1, 1.0)
                    _choice_row(model, [y], 1, None)
                if budgeted:
                    moved.add(y, int(moves.moved(candidates.members(o), candidates.devices(o)).sum()))
                for d in range(k):
                    _charge(cost_terms, memory_terms, d, y, float(profile[d]), needs[d])
            elif placement == "node_free":
                _node_free_terms(model, candidates, o, picked, start, y_vars.get(o), cost_terms, memory_terms, loads)
            else:  # a node option is a grid of one block
                _grid_terms(model, candidates, o, picked, start, y_vars.get(o), cost_terms, memory_terms, loads,
                            moved if budgeted else None)
        used_before += most_parts
    model.costs = cost_terms
    capacity = instance.topology.capacity.as_array()
    model.memory = [(terms, [int(n[tier]) for n in needs], int(capacity[tier]))
                    for tier in candidates.binding_tiers for terms, needs in memory_terms]
    model.makespan_hint = float(loads.max()) if start.assembly is not None else 0.0
    if budgeted:
        model.moves = (moved.terms, moved.bytes, int(moves.previous.budget) - moved.constant)
    return model


def _charge(cost_terms: list, memory_terms: list, d: int, var: int, cost: float, memory) -> None:
    """Each unit of `var` puts `cost` and `memory` (bytes per tier) on device d."""
    cost_terms[d][0].append(var)
    cost_terms[d][1].append(cost)
    memory_terms[d][0].append(var)
    memory_terms[d][1].append(memory)


def _choice_row(model: LinearModel, terms: list[int], parts: int, y: int | None) -> None:
    """Σ terms = parts · y (or = parts where the table has this one option)."""
    if y is not None:
        model.choices.append((terms + [y], [1] * len(terms) + [-parts], 0))
    else:
        model.choices.append((terms, [1] * len(terms), parts))


def _node_free_terms(model: LinearModel, candidates: Candidates, o: int, picked: bool, start: ExactStart,
                     y: int | None, cost_terms: list, memory_terms: list, loads: np.ndarray) -> None:
    """A table-column-wise option: z[o, node] picks its node, n[o, d] ∈ 0..c its pieces on each device there
    (Σ_{d in node} n = c·z); the start's devices as the hint."""
    k, per_node = candidates.num_devices, candidates.instance.topology.devices_per_node
    members, parts = candidates.members(o), candidates.options.options[o].parts
    cost, memory = _identical_pieces(candidates, o)
    hint = (np.bincount(start.assembly.device[members], minlength=k) if picked and start.assembly is not None
            else np.zeros(k, dtype=np.int64))
    z_vars = []
    for node in range(k // per_node):
        held = hint[node * per_node:(node + 1) * per_node]
        z = model.var(f"z{o}_{node}", 1, float(held.sum() > 0), ("z", o, node))
        z_vars.append(z)
        n_vars = []
        for i in range(per_node):
            d = node * per_node + i
            v = model.var(f"n{o}_{d}", parts, float(held[i]), ("n", o, d))
            n_vars.append(v)
            _charge(cost_terms, memory_terms, d, v, cost, memory)
        _choice_row(model, n_vars, parts, z)
    loads += cost * hint
    _choice_row(model, z_vars, 1, y)


def _grid_terms(model: LinearModel, candidates: Candidates, o: int, picked: bool, start: ExactStart,
                y: int | None, cost_terms: list, memory_terms: list, loads: np.ndarray,
                moved: "_MovedRow | None" = None) -> None:
    """A grid of c alike blocks (a node option: one): g[o, node] ∈ 0..c of them on each node (Σ g = c·y), each
    putting its piece of local rank i on the node's device i. In a replan (a node option: a replan plans no
    grid) a node the option must stay on bounds the others to 0, and `moved` gets what each node moves."""
    k, per_node = candidates.num_devices, candidates.instance.topology.devices_per_node
    members = candidates.members(o)
    blocks = int(candidates.options.block[members].max()) + 1
    costs, needs = candidates.priced.costs[members[:per_node]], candidates.storage[members[:per_node]]
    hint = np.zeros(k // per_node, dtype=np.int64)
    if picked and start.assembly is not None:
        np.add.at(hint, start.assembly.device[members[::per_node]] // per_node, 1)
    moves = candidates.moves
    fixed = -1 if moves is None else int(moves.fixed_node[o])
    g_vars = []
    for node in range(k // per_node):
        v = model.var(f"g{o}_{node}", blocks if fixed in (-1, node) else 0, float(hint[node]), ("g", o, node))
        g_vars.append(v)
        if moved is not None:
            moved.add(v, int(moves.moved(members, candidates.devices(o, node=node)).sum()))
        for i in range(per_node):
            d = node * per_node + i
            _charge(cost_terms, memory_terms, d, v, float(costs[i]), needs[i])
            loads[d] += costs[i] * hint[node]
    _choice_row(model, g_vars, blocks, y)


@dataclass
class _MovedRow:
    """The moved-bytes row as it is built: Σ bytes · var, plus what the tables' only options move anyway."""

    terms: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    constant: int = 0

    def add(self, var: int | None, moved: int) -> None:
        if moved == 0:
            return
        if var is None:
            self.constant += moved
        else:
            self.terms.append(var)
            self.bytes.append(moved)


def _free_moves(rows: np.ndarray) -> str:
    """How a free option's pieces move (rows: pieces × devices, bytes each moves there): "alike" where every
    piece moves the same onto each device; "one device each" where each piece moves all its bytes but onto
    at most one device, which held it (column blocks of the same cut); else "each piece"."""
    if (rows == rows[0]).all():
        return "alike"
    full = rows.max()
    if ((rows == 0) | (rows == full)).all() and ((rows == 0).sum(axis=1) <= 1).all():
        return "one device each"
    return "each piece"


def _count_moves(model: LinearModel, o: int, y: int | None, rows: np.ndarray, n_vars: dict[int, int],
                 counts: np.ndarray, moved: _MovedRow) -> None:
    """The bytes a free option modelled by piece counts n[o, d] moves: Σ_d m[d]·n where its pieces move
    alike; else (each piece kept only on the one device it was on) all its bytes less what k[o, d] ≤
    min(n[o, d], the pieces that were on d) keep in place."""
    if _free_moves(rows) == "alike":
        for d, v in n_vars.items():
            moved.add(v, int(rows[0, d]))
        return
    full, parts = int(rows.max()), rows.shape[0]
    moved.add(y, full * parts)
    for d, v in n_vars.items():
        was_here = int((rows[:, d] == 0).sum())
        if was_here:
            keep = model.var(f"k{o}_{d}", min(was_here, parts), float(min(was_here, counts[d])))
            model.links.append(([keep, v], [1, -1], 0))
            moved.add(keep, -full)


def _piece_variables(model: LinearModel, candidates: Candidates, o: int, y: int | None, rows: np.ndarray,
                     cost: float, memory: np.ndarray, cost_terms: list, memory_terms: list,
                     hint_device: np.ndarray | None, moved: _MovedRow) -> None:
    """A free option whose pieces move differently onto each device (a cut across the old one): a device
    variable x[p, d] per piece, Σ_d x[p, d] = y (or 1), each moving its own bytes."""
    for i, piece in enumerate(candidates.members(o)):
        x_vars = []
        for d in range(candidates.num_devices):
            hint = float(hint_device is not None and hint_device[piece] == d)
            v = model.var(f"x{o}_{i}_{d}", 1, hint, ("x", o, (int(piece), d)))
            x_vars.append(v)
            _charge(cost_terms, memory_terms, d, v, cost, memory)
            moved.add(v, int(rows[i, d]))
        _choice_row(model, x_vars, 1, y)
def decode(candidates: Candidates, model: LinearModel, values: list[float],
           tables: np.ndarray | None = None) -> tuple[list[int], np.ndarray]:
    """The chosen option per table and a device per piece from a solution's variable values; for a model over
    `tables` alone, -1 (and no devices) for the others."""
    picked_y = {o for v, (kind, o, _) in model.decode.items() if kind == "y" and values[v] > 0.5}
    chosen = []
    for table, ids in enumerate(candidates.by_table):
        options = [int(o) for o in ids]
        chosen.append(-1 if tables is not None and table not in tables else
                      options[0] if len(options) == 1 else next(o for o in options if o in picked_y))
    device = np.full(len(candidates.options.pieces), -1, dtype=np.int64)
    counts: dict[int, list[tuple[int, int]]] = {}
    for v, (kind, o, where) in model.decode.items():
        if o not in chosen:
            continue
        if kind == "x":
            if values[v] > 0.5:
                device[where[0]] = where[1]
        elif kind in ("n", "g"):
            n = int(round(values[v]))
            if n > 0:
                counts.setdefault(o, []).append((where, n))
    for o in chosen:
        if o < 0:
            continue
        placement = candidates.placement(o)
        spread = [where for where, n in sorted(counts.get(o, [])) for _ in range(n)]
        members = candidates.members(o)
        if placement == "pinned":
            device[members] = candidates.devices(o)
        elif placement in ("free", "node_free"):  # n[o, d] pieces on device d (a node_free one's all on its node)
            if device[members[0]] < 0:  # else placed piece by piece (x[p, d])
                slots = np.array(spread, dtype=np.int64)
                device[members] = slots if candidates.moves is None else least_moving(candidates, members, slots)
        elif placement in ("grid", "node"):  # g[o, node] blocks on each node, in block order
            if not spread:
                raise ValueError(f"option {o}: no node chosen")
            device[members] = candidates.devices(o, node=spread if placement == "grid" else spread[0])
    return chosen, device


def least_moving(candidates: Candidates, members: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The free pieces `members` on the devices `slots` (one each, any order), each piece where the pieces
    together move the fewest bytes from the previous plan."""
    from scipy.optimize import linear_sum_assignment

    moved = candidates.moves.rows(members)[:, slots]
    pieces, slot = linear_sum_assignment(moved)
    devices = np.empty(members.size, dtype=np.int64)
    devices[pieces] = slots[slot]
    return devices


# ---------------------------------------------------------------- finishing


def finish(problem: Problem, found: tuple[list[int], np.ndarray] | None, bound: float, start: ExactStart,
            stats: dict, failure: NoPlan | None = None) -> SolveResult:
    """The better of the model's plan and the heuristic start; optimal only when the proven bound meets the
    plan's true objective. Without either plan, `failure` says why."""
    candidates, oracle = problem.candidates, problem.oracle
    plans = []
    if found is not None:
        plans.append(moving_least(candidates, *found))
    if start.assembly is not None:
        plans.append(moving_least(candidates, *start.assembly.snapshot()))
    if problem.previous is not None and problem.previous.budget is not None:
        # A backend's tolerances may let a plan overstep the budget by a hair: it is not one of the plans.
        plans = [p for p in plans if plan_moved_bytes(problem.instance, problem.previous, p) <= problem.previous.budget]
    if not plans:
        if failure is None or failure.cause == Cause.TIME_LIMIT:
            return SolveResult(Status.NO_PLAN, lower_bound=bound, reason="no plan found within the time limit",
                               stats=stats, no_plan=NoPlan(Cause.TIME_LIMIT))
        return SolveResult(Status.NO_PLAN, lower_bound=bound, stats=stats, no_plan=failure, reason=(
            "the only plan the solver found overflows memory (by its feasibility tolerance); no valid plan "
            "was found"))
    best = min(plans, key=lambda p: oracle.plan_cost(problem.instance, p))
    objective = oracle.plan_cost(problem.instance, best)
    if bound <= objective * (1 + OPTIMALITY_TOLERANCE):
        # Only rounding can put a valid bound a hair above the plan; anything more is left for run_solver
        # to reject, so that a wrong bound is never turned into an "optimal".
        bound = min(bound, objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    status = Status.OPTIMAL if gap <= OPTIMALITY_TOLERANCE else Status.FEASIBLE
    stats = {**stats, "certified_gap": gap}
    if problem.chooses_options:
        stats["optimal_over"] = "enumerated options"
        stats["options"] = int(candidates.live.sum())
    return SolveResult(status, plan=best, lower_bound=bound, stats=stats)


def moving_least(candidates: Candidates, chosen, device: np.ndarray):
    """The plan of these options and devices; in a replan, with every piece that moved for nothing sent
    back where it moves less (the cost stays: the model minimises cost alone, not bytes)."""
    if candidates.moves is None:
        return candidates.plan(list(chosen), device)
    assembly = Assembly(candidates)
    assembly.load(np.asarray(chosen), np.asarray(device))
    send_back(assembly)
    return assembly.plan()


def prelude(problem: Problem, budget: Budget, seed: int, backend: str,
            widens: bool = False) -> tuple[ExactStart, SolveResult | None]:
    """The start (`exact_start`), and a finished result where the model need not run (the start meets the
    bound) or cannot (it has more than MAX_MODEL_VARIABLES variables)."""
    size = model_size(problem.candidates)
    start = exact_start(problem, budget, seed, widens=widens, oversized=size > MAX_MODEL_VARIABLES)
    if start.proven(budget.gap):
        return start, finish(problem, None, start.lower_bound, start, {
            "backend": backend, "note": "the heuristic start meets the lower bound" if start.proven() else
            f"the heuristic start is within the requested gap ({budget.gap:.4%}) of the lower bound"})
    if size > MAX_MODEL_VARIABLES:
        return start, finish(problem, None, start.lower_bound, start, {
            "backend": backend, "variables": size,
            "note": f"model of {size} variables is too large to build and solve within the budget; the heuristic "
                    "plan with the best bound known"})
    return start, None


def model_size(candidates: Candidates) -> int:
    """Variables the model would have (before symmetry breaking trims free devices)."""
    k = candidates.num_devices
    per_node = candidates.instance.topology.devices_per_node
    size = 0
    for ids in candidates.by_table:
        for o in ids:
            placement = candidates.placement(int(o))
            size += 1 + {"free": k, "node": k // per_node, "node_free": k + k // per_node,
                         "grid": k // per_node}.get(placement, 0)
    return size
