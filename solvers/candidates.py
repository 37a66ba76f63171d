"""The problem a solver is given — an instance and an oracle — and, built once on first use, the priced
sharding options that split-aware solvers and the bounds share: every option's pieces bound to the oracle,
options that cannot fit memory dropped, and (for additive oracles) options dominated by another option of
the same table pruned.

An option b is dominated by an option a of the same table when for every placement of b there is a
placement of a that puts no more cost and no more memory on any device (memory is ignored when the whole
instance fits one device, so that it can never bind). The checks used, each sufficient:
- a table-wise (one free piece of cost x): some device where b puts at least x (and at least a's memory);
- a column-wise (c free pieces of cost x): c such devices, or b column-wise with ≥ c pieces of cost ≥ x;
- a pinned (row-wise, data-parallel): b pinned with at least a's cost and memory on every device;
- a table-row-wise: b pinned with at least a's costs on every device of some node.
Ties keep the option enumerated first. Pruning never removes the last option of a table, so an optimum
over the pruned set is an optimum over all options."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from costmodels import Oracle, Priced
from instances import Instance, Plan
from instances.memory import HBM
from instances.pieces import Pieces
from instances.options import (
    FREE,
    GRID,
    NODE,
    NODE_FREE,
    PINNED,
    Option,
    OptionPieces,
    enumerate_options,
    plan_from_choice,
)
from instances.moves import NOT_REPLANNED, Previous
from instances.sharding import COLUMN_BLOCKS, DATA_PARALLEL, TABLE_WISE

from .choice import MEMORY_SHARES, choose_options, on_lower_hull, option_weight
from .moves import Moves, old_option_of


DOMINANCE_SLACK = 1e-9  # relative: sums of the same costs in another order differ by far less


class PricingError(RuntimeError):
    """Something asked a problem that was priced up front (the planning pipeline's price stage) for
    prices that stage did not compute: pricing them now would repeat in every process that asks."""


@dataclass(eq=False)
class Problem:
    """An instance and the oracle that prices it; `candidates` and `table_wise` are built on first use
    and shared by whoever asks (the solver, the bounds, run_solver). `priced` builds them up front and
    seals the problem: a sealed problem prices nothing more on demand (a member forked from the planning
    pipeline reads what the price stage computed, or fails loudly)."""

    instance: Instance
    oracle: Oracle
    sealed: bool = False
    previous: Previous | None = None  # a replan's previous plan and move budget (None: plan afresh)
    # Per table, load factors its cache is offered beside the grid's (instances.options.enumerate_options).
    load_factors: Mapping[int, tuple[float, ...]] | None = None
    # The few tables that do most of the work, named by the price stage where it offered them fine load factors
    # (among `load_factors`): the exact model solves them alone first (solvers.exact_model.core_tables).
    core: tuple[int, ...] = ()

    @classmethod
    def priced(cls, instance: Instance, oracle: Oracle, whole_tables: bool = False,
               previous: Previous | None = None,
               load_factors: Mapping[int, tuple[float, ...]] | None = None,
               candidates: "Candidates | None" = None, core: tuple[int, ...] = ()) -> "Problem":
        """The problem with its options priced (`candidates` where they already are, and, for solvers of whole
        tables, its whole-table restriction with its options and table-wise pieces priced too), sealed."""
        problem = cls(instance, oracle, previous=previous, load_factors=load_factors, core=core)
        if candidates is not None:
            problem.__dict__["candidates"] = candidates  # what the cached property would have built
        problem.candidates
        if whole_tables:
            problem.whole_tables.candidates
            problem.whole_tables.table_wise
            problem.whole_tables.sealed = True
        problem.sealed = True
        return problem

    def _price(self, what: str) -> None:
        if self.sealed:
            raise PricingError(f"{what} of {self.instance.id} under {self.oracle.name} was not priced by the price "
                               "stage; price it there (Problem.priced) instead of in a solver")

    @cached_property
    def candidates(self) -> "Candidates":
        self._price("the sharding options")
        return Candidates.build(self.instance, self.oracle, self.previous, self.load_factors)

    @cached_property
    def table_wise(self) -> Priced:
        """The oracle bound to one piece per whole table: in HBM, or — where tables may live in host memory —
        each in the kernel and cache the knapsack over memory gives whole tables (solvers.choice at all of
        the spare memory), so that the solvers of whole tables honour host memory. A table without a
        whole-table option that fits keeps its HBM piece (the obstacle the caller reports)."""
        self._price("the whole tables")
        if not self.instance.uses_host_memory:
            return self.oracle.table_wise(self.instance)
        candidates = self.candidates
        if not all(ids.size for ids in candidates.by_table):
            return self.oracle.table_wise(self.instance)
        chosen = choose_options(candidates, np.inf, option_weight(candidates), MEMORY_SHARES[-1])
        whole = Pieces.table_wise(self.instance)
        members = np.array([int(candidates.members(int(o))[0]) for o in chosen])
        pieces = candidates.options.pieces
        return self.oracle.bind(self.instance, Pieces.of(whole.table, whole.kind, whole.row_start, whole.row_end,
                                                         whole.col_start, whole.col_end, pieces.kernel[members],
                                                         pieces.load_factor[members]))

    @property
    def table_kernels(self) -> tuple[tuple[str, float | None], ...]:
        """Each whole table's kernel and cache load factor in `table_wise` (what a whole-table plan says)."""
        return tuple(self.table_wise.pieces.kernel_names())

    @property
    def chooses_options(self) -> bool:
        """Whether tables choose among options: a sharding type other than table-wise, or, where host
        memory is used, a compute kernel and cache load factor (so a table-wise instance with memory tiers
        has options too)."""
        return self.instance.allows_splits or self.instance.uses_host_memory

    @cached_property
    def whole_tables(self) -> "Problem":
        """The same problem with every table whole (what solvers that do not split are given)."""
        if not self.instance.allows_splits:
            return self
        self._price("the whole-table restriction")
        return Problem(self.instance.restricted_to((TABLE_WISE,)), self.oracle, previous=self.previous,
                       load_factors=self.load_factors, core=self.core)


def replan_options(instance: Instance, options: list[Option], previous: Previous) -> list[Option]:
    """The options of a replan (none of the types it does not plan, NOT_REPLANNED): each old table's old
    sharding among them where the instance allows it (added where we do not enumerate it, e.g. three column
    blocks, after the table's own), and its only one where every old table keeps its option."""
    old = {t: old_option_of(t, s) for t, (table, s) in enumerate(zip(instance.tables, previous.shardings))
           if s is not None and s.sharding_type in instance.allowed_types(table) and s.sharding_type not in
           NOT_REPLANNED and s.compute_kernel in instance.allowed_kernels(table, s.sharding_type)}
    by_table: dict[int, list[Option]] = {}
    for option in options:
        if option.sharding_type not in NOT_REPLANNED:
            by_table.setdefault(option.table, []).append(option)
    for t, option in old.items():
        mine = by_table.get(t, [])
        by_table[t] = [option] if previous.keep_types else mine + ([option] if option not in mine else [])
    return [o for t in range(instance.num_tables) for o in by_table.get(t, [])]


def counted_storage(instance: Instance, pieces: Pieces, priced: Priced, oracle_counts_memory: bool) -> np.ndarray:
    """Per piece, its bytes in each tier as solvers place by: the oracle's count (`priced`), and where the
    oracle counts memory its own way, the larger of that and the instance's, tier by tier."""
    if not oracle_counts_memory:
        return priced.storage
    return np.maximum(priced.storage, pieces.storage(instance))


@dataclass(eq=False)
class Candidates:
    instance: Instance
    options: OptionPieces
    priced: Priced
    live: np.ndarray                    # per option
    oracle_counts_memory: bool = False  # the oracle's storage is its own (Oracle.own_memory), not the instance's
    pruned: dict[str, int] = field(default_factory=dict)
    memo: dict = field(default_factory=dict)  # what pure functions of the candidates (the bounds) computed once
    moves: Moves | None = None          # what each piece moves from a replan's previous plan, per device

    @classmethod
    def build(cls, instance: Instance, oracle: Oracle, previous: Previous | None = None,
              load_factors: Mapping[int, tuple[float, ...]] | None = None) -> "Candidates":
        enumerated = enumerate_options(instance, load_factors)
        options = OptionPieces.build(instance, enumerated if previous is None else
                                     replan_options(instance, enumerated, previous))
        priced = oracle.bind(instance, options.pieces)
        candidates = cls(instance, options, priced, np.ones(len(options.options), dtype=bool), oracle.own_memory)
        if previous is not None:
            candidates.moves = Moves.build(instance, options, previous)
        candidates._drop_unfit()
        if priced.additive:
            candidates._prune_dominated()
        return candidates

    def restricted(self, keep: np.ndarray) -> "Candidates":
        """The same priced options with only those `keep` marks (a mask over options, within the live ones)
        live: a neighbourhood a solver searches first. Bounds over it hold over its options alone."""
        return replace(self, live=self.live & keep, pruned=dict(self.pruned), memo={})

    # ------------------------------------------------------------ structure

    @property
    def num_devices(self) -> int:
        return self.instance.num_devices

    @cached_property
    def by_table(self) -> list[np.ndarray]:
        """Live option ids of each table, in enumeration order."""
        table_of = np.array([o.table for o in self.options.options], dtype=np.int64)
        live = np.flatnonzero(self.live)
        return [live[table_of[live] == t] for t in range(self.instance.num_tables)]

    @cached_property
    def layout(self) -> np.ndarray:
        """Per option, an id shared by its table's options cut the same way (sharding type and piece count):
        they differ in kernel and cache alone, so their pieces match one to one and one can take the
        other's devices."""
        keys: dict[tuple, int] = {}
        return np.array([keys.setdefault((o.table, o.sharding_type, o.parts), len(keys)) for o in self.options.options],
                        dtype=np.int64)

    def leaner(self, option: int, among: np.ndarray | None = None) -> np.ndarray:
        """The options of `among` (by default the table's live ones) cut as `option` is that need less HBM:
        where it can shrink in place, on the same devices (a smaller cache, or host memory instead of HBM)."""
        ids = self.by_table[self.options.options[option].table] if among is None else among
        hbm = self.total_storage[:, HBM]
        return ids[(self.layout[ids] == self.layout[option]) & (hbm[ids] < hbm[option])]

    @cached_property
    def search_options(self) -> list[np.ndarray]:
        """Per table, its live options on the lower convex hull of (HBM bytes, work) among those of the same
        layout (solvers.choice.on_lower_hull): the options local search's option changes and kicks try. A
        cache size above the hull never makes the best use of its HBM in the relaxed knapsack; in an
        integer plan it may, so the bounds and exact models keep every option."""
        hbm = self.total_storage[:, HBM]
        weight = option_weight(self)
        kept = []
        for ids in self.by_table:
            on_hull = np.zeros(ids.size, dtype=bool)
            for layout in np.unique(self.layout[ids]):
                same = self.layout[ids] == layout
                on_hull[same] = on_lower_hull(hbm[ids[same]], weight[ids[same]])
            kept.append(ids[on_hull])
        return kept

    @cached_property
    def trades_hbm(self) -> bool:
        """Whether some table's cut offers search options that differ in kernel or cache: HBM to trade for
        cost (tables that may live in host memory)."""
        return any(np.unique(self.layout[ids]).size < ids.size for ids in self.search_options)

    def members(self, o: int) -> np.ndarray:
        return self.options.members(o)

    @cached_property
    def parts(self) -> np.ndarray:
        """Per option, its piece count."""
        return np.array([o.parts for o in self.options.options], dtype=np.int64)

    def placement(self, o: int) -> str:
        return self.options.options[o].placement

    @cached_property
    def replicated(self) -> np.ndarray:
        """Per option, whether it is data-parallel: a replica of the whole table on every device."""
        return np.array([o.sharding_type == DATA_PARALLEL for o in self.options.options], dtype=bool)

    @cached_property
    def free_piece(self) -> np.ndarray:
        """Per piece, whether it may sit on any device by itself (a piece of a table- or column-wise option):
        the pieces local search moves and swaps."""
        free = np.array([o.placement == FREE for o in self.options.options], dtype=bool)
        return free[self.options.option] if len(self.options.option) else np.zeros(0, dtype=bool)

    def devices(self, o: int, free_devices=None, node: int | None = None) -> np.ndarray:
        return self.options.devices(o, free_devices, node, self.instance.topology.devices_per_node)

    def outside(self, plan: Plan) -> str | None:
        """Why the plan is not one of the enumerated options' plans (a table cut, served or cached as no
        option is), or None: bounds over the options say nothing about such a plan."""
        offered = {(o.table, o.sharding_type, o.parts, o.kernel, o.load_factor) for o in self.options.options}
        for t, sharding in enumerate(plan.tables):
            key = (t, sharding.sharding_type, len(sharding.shards), sharding.compute_kernel, sharding.cache_load_factor)
            if key not in offered:
                cache = (f" with a cache of {sharding.cache_load_factor:g}" if sharding.cache_load_factor is not None
                         else "")
                return (f"table {self.instance.tables[t].name} is {sharding.sharding_type} × {len(sharding.shards)} "
                        f"{sharding.compute_kernel}{cache}, which no enumerated option is")
        return None

    def plan(self, chosen: list[int], devices: np.ndarray) -> Plan:
        return plan_from_choice(self.instance, self.options, chosen, devices)

    @cached_property
    def storage(self) -> np.ndarray:
        """Per piece, its bytes in each tier (pieces × 2): the instance's rule, and where the oracle counts
        memory its own way, the larger of the two, tier by tier — the one rule solvers place by, so that
        every plan they build fits both the instance (validation) and the oracle's own count."""
        return counted_storage(self.instance, self.options.pieces, self.priced, self.oracle_counts_memory)

    @cached_property
    def single_costs(self) -> np.ndarray:
        """Each piece's cost alone on a device."""
        return self.priced.single_costs()

    # ------------------------------------------------------------ per option, additive oracles

    @cached_property
    def work(self) -> np.ndarray:
        """Total cost of each option's pieces."""
        return np.add.reduceat(self.priced.costs, self.options.first) if len(self.options.first) else np.zeros(0)

    @cached_property
    def biggest(self) -> np.ndarray:
        """The most cost any one device gets from the option (its largest piece)."""
        return np.maximum.reduceat(self.priced.costs, self.options.first) if len(self.options.first) else np.zeros(0)

    @cached_property
    def total_storage(self) -> np.ndarray:
        """Per option, its pieces' bytes in each tier together (options × 2)."""
        if not len(self.options.first):
            return np.zeros((0, 2), np.int64)
        return np.add.reduceat(self.storage, self.options.first, axis=0)

    @cached_property
    def least_work(self) -> np.ndarray:
        """Per table, the least work of its live options (infinite where it has none)."""
        return np.array([self.work[ids].min() if ids.size else np.inf for ids in self.by_table])

    @cached_property
    def most_per_table(self) -> np.ndarray:
        """Per table and tier, the most bytes any one device could receive from it (in its live option that can
        put the most there; tables × 2)."""
        most = np.zeros((self.instance.num_tables, 2), dtype=np.int64)
        for t, ids in enumerate(self.by_table):
            if ids.size:
                most[t] = np.max([self._most_on_one_device(int(o)) for o in ids], axis=0)
        return most

    @cached_property
    def binding_tiers(self) -> tuple[int, ...]:
        """The memory tiers that may bind: those where the most any one device could receive (each table
        in its option that can put the most there) exceeds a device's capacity; any plan fits the others,
        and they can be left out of models and dominance. Computed over the options that fit a device."""
        most = self.most_per_table.sum(axis=0)
        return tuple(int(t) for t in np.flatnonzero(most > self.instance.topology.capacity.as_array()))

    @cached_property
    def fits(self) -> np.ndarray:
        """Per option, whether each of its pieces fits a device's capacity in every tier (live or pruned)."""
        capacity = self.instance.topology.capacity.as_array()
        if not len(self.options.first):
            return np.zeros(0, dtype=bool)
        return ~(np.maximum.reduceat(self.storage, self.options.first, axis=0) > capacity).any(axis=1)

    def _most_on_one_device(self, o: int) -> np.ndarray:
        """Per tier, the most option o can put on one device: all its pieces for a free or node_free option
        (they may share one), its fullest device for a pinned option, its largest piece for a node option, a
        local rank's pieces of every block for a grid (its blocks may share a node)."""
        placement = self.placement(o)
        if placement in (FREE, NODE_FREE):
            return self.total_storage[o]
        if placement == PINNED:
            return self.device_profile(o, self.storage).max(axis=0)
        members = self.members(o)
        if placement == GRID:
            per_rank = np.zeros((self.instance.topology.devices_per_node, 2), dtype=np.int64)
            np.add.at(per_rank, self.options.pin[members], self.storage[members])
            return per_rank.max(axis=0)
        return self.storage[members].max(axis=0)

    def device_shares(self, storage: np.ndarray) -> np.ndarray:
        """Bytes as shares of one device, summed over the tiers it has (…× 2 → …): how much memory an
        option takes when the tiers are weighed together."""
        capacity = self.instance.topology.capacity.as_array().astype(float)
        has = capacity > 0
        return (np.asarray(storage, dtype=float)[..., has] / capacity[has]).sum(axis=-1)

    def device_profile(self, o: int, values: np.ndarray) -> np.ndarray:
        """Per device, what pinned option o puts there (cost, or bytes per tier for a 2-column `values`)."""
        profile = np.zeros((self.num_devices, *values.shape[1:]), dtype=values.dtype)
        np.add.at(profile, self.options.pin[self.members(o)], values[self.members(o)])
        return profile

    # ------------------------------------------------------------ pruning

    def _drop_unfit(self) -> None:
        """An option with a piece larger than a device's capacity in some tier can never be placed."""
        too_big = ~self.fits
        self.live &= ~too_big
        self.pruned["larger than a device"] = int(too_big.sum())

    def _prune_dominated(self) -> None:
        """Per table, an option is dropped where a live one dominates it (`_dominance`); of two that dominate
        each other the first stays. Options are taken in order, so one dropped no longer drops others."""
        memory_matters = bool(self.binding_tiers)
        tiers = list(self.binding_tiers)
        costs, memory = self.priced.costs, self.storage[:, tiers]
        shapes = _Shapes.of(self.options, costs, memory) if len(self.options.first) else None
        count = 0
        for table, ids in enumerate(self.by_table):
            # Options that move different bytes from a previous plan do not dominate one another.
            if len(ids) < 2 or (self.moves is not None and self.moves.previous.shardings[table] is not None):
                continue
            # Each sufficient condition of `_dominance` puts a's pieces where b puts at least as much, so a
            # dominates b only if its total work and total bytes (per tier compared) are at most b's too
            # (the slack covers float summation order; bytes are exact).
            work = self.work[ids]
            screen = work[:, None] <= (work + DOMINANCE_SLACK * np.abs(work))[None, :]
            if memory_matters:
                total = self.total_storage[ids][:, tiers]
                screen &= (total[:, None, :] <= total[None, :, :]).all(axis=2)
            np.fill_diagonal(screen, False)
            asked = np.flatnonzero(screen.any(axis=0) | screen.any(axis=1))
            if asked.size == 0:
                continue
            # Only options in a pair the screen passes (either way round) are asked.
            over = np.zeros_like(screen)
            over[np.ix_(asked, asked)] = self._dominance(ids[asked], costs, memory, shapes, memory_matters)
            order = np.arange(ids.size)
            drops = screen & over & ((order[:, None] < order[None, :]) | ~over.T)
            live = self.live[ids].copy()
            for j in range(ids.size):
                if (live & drops[:, j]).any():
                    live[j] = False
                    count += 1
            self.live[ids] = live
        self.pruned["dominated"] = count
        self.__dict__.pop("by_table", None)

    def _dominance(self, ids: np.ndarray, costs: np.ndarray, memory: np.ndarray, shapes: "_Shapes",
                   memory_matters: bool) -> np.ndarray:
        """Sufficient conditions for 'every placement of b has a placement of a that is no worse anywhere'
        (memory compared tier by tier, over the tiers that may bind), for every pair (a, b) of one table's
        options `ids`. Options whose pieces must share a node (node_free, grid) are never claimed to dominate,
        and a grid (whose blocks may pile up on one node) is never claimed dominated.
        - a free over a free or node-free b: b's pieces sit on devices that a's may take too (one block of
          a's to each, where b has as many blocks, each at least as costly and as large);
        - a free over a pinned or node b: a's pieces go where b puts at least as much (for a node option, on
          the local ranks of whichever node b picks);
        - a pinned over a pinned b: no more anywhere; a node over a pinned b: no more on some node's ranks."""
        place, pieces = shapes.placement[ids], shapes.pieces[ids]
        free, pinned, node = place == _FREE, place == _PINNED, place == _NODE
        most_cost, least_cost = shapes.most_cost[ids], shapes.least_cost[ids]
        most_memory, least_memory = shapes.most_memory[ids], shapes.least_memory[ids]

        def fits(cost, mem, b_cost, b_mem) -> np.ndarray:
            ok = cost <= b_cost
            return ok & (mem <= b_mem).all(axis=-1) if memory_matters else ok

        blocks = shapes.table_wise[ids][:, None] | shapes.column_blocks[ids][None, :]
        over = free[:, None] & (free | (place == _NODE_FREE))[None, :] & blocks & \
            (pieces[None, :] >= pieces[:, None]) & fits(most_cost[:, None], most_memory[:, None, :],
                                                        least_cost[None, :], least_memory[None, :, :])
        placed = np.flatnonzero(pinned | node)
        if placed.size == 0:
            return over
        # What each pinned option puts on each device, and each node option on each local rank (padded: a
        # slot no piece fills fits nothing).
        k = self.num_devices
        counts = pieces[placed]
        row = np.repeat(np.arange(placed.size), counts)
        members = np.repeat(self.options.first[ids[placed]] - np.cumsum(counts) + counts, counts) + \
            np.arange(int(counts.sum()))
        # A pinned option's pieces add up on their devices; a node option's fill its local ranks in order.
        on_pin = np.repeat(pinned[placed], counts)
        slot = np.where(on_pin, self.options.pin[members], members - np.repeat(self.options.first[ids[placed]], counts))
        cost = np.full((placed.size, k), -np.inf)
        mem = np.full((placed.size, k, memory.shape[1]), -1, dtype=memory.dtype)
        cost[row, slot], mem[row, slot] = 0.0, 0
        np.add.at(cost, (row, slot), costs[members])
        np.add.at(mem, (row, slot), memory[members])
        sources = np.flatnonzero(free)
        slots = fits(most_cost[sources, None, None], most_memory[sources, None, None, :], cost[None], mem[None])
        over[np.ix_(sources, placed)] = slots.sum(axis=2) >= pieces[sources, None]
        pins, ranks = np.flatnonzero(pinned[placed]), np.flatnonzero(node[placed])
        if pins.size:
            target = (cost[pins], mem[pins])
            over[np.ix_(placed[pins], placed[pins])] = fits(
                cost[pins, None], mem[pins, None], target[0][None], target[1][None]).all(axis=2)
            if ranks.size:
                per_node = self.instance.topology.devices_per_node
                nodes = k // per_node
                by_node = fits(cost[ranks, None, None, :per_node], mem[ranks, None, None, :per_node],
                               target[0].reshape(1, pins.size, nodes, per_node),
                               target[1].reshape(1, pins.size, nodes, per_node, memory.shape[1]))
                over[np.ix_(placed[ranks], placed[pins])] = by_node.all(axis=3).any(axis=2)
        return over


_PLACEMENTS = (FREE, PINNED, NODE, NODE_FREE, GRID)
_FREE, _PINNED, _NODE, _NODE_FREE, _GRID = range(len(_PLACEMENTS))


@dataclass(frozen=True)
class _Shapes:
    """Per option, what `Candidates._dominance` compares: its placement, whether it is table-wise or cuts
    column blocks, its piece count, and its pieces' largest and smallest cost and memory (per tier compared)."""

    placement: np.ndarray
    table_wise: np.ndarray
    column_blocks: np.ndarray
    pieces: np.ndarray
    most_cost: np.ndarray
    least_cost: np.ndarray
    most_memory: np.ndarray
    least_memory: np.ndarray

    @staticmethod
    def of(options: OptionPieces, costs: np.ndarray, memory: np.ndarray) -> "_Shapes":
        first = options.first
        return _Shapes(np.array([_PLACEMENTS.index(o.placement) for o in options.options]),
                       np.array([o.sharding_type == TABLE_WISE for o in options.options]),
                       np.array([o.sharding_type in COLUMN_BLOCKS for o in options.options]),
                       np.array([o.parts for o in options.options], dtype=np.int64),
                       np.maximum.reduceat(costs, first), np.minimum.reduceat(costs, first),
                       np.maximum.reduceat(memory, first, axis=0), np.minimum.reduceat(memory, first, axis=0))
