"""Search on any oracle through the incremental device state. Iterated local search over pieces:
best-improvement moves and swaps of free pieces off the most loaded device, and — where tables may be
split — changes of a table's sharding option (its pieces refitted), with random kicks between descents;
the split-aware greedy (construction plus descent on option changes), which in a replan starts from the
previous plan; and AutoShard's random search (best of N random feasible plans)."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from instances.kernels import DENSE, FUSED, FUSED_UVM_CACHING, TORCHREC_LOAD_FACTOR
from instances.memory import HBM, format_sizes, tier_label

from .assembly import Assembly, Stuck, Trial, construct, place_table
from .base import (
    Budget,
    Cause,
    NoPlan,
    SolveResult,
    Status,
    order_by_cost,
    past,
    register,
)
from .baselines import random_assignment
from .bounds import best_option_bound
from .candidates import Candidates, Problem
from .choice import MEMORY_SHARES, RELATIVE_STEP, choose_options, option_weight, piece_peaks
from .packing import packed
from .retier import Retier, usable

RANDOM_SEARCH_SAMPLES = 1000  # the most AutoShard's random search drew
OPTION_CHANGES = 8            # per step, the tables with the costliest pieces on the busiest device that may change option
OPTION_KICK_SHARE = 0.25      # of a kick's changes, the share that switch a table's option (when splitting)
RETIER_SHARE = 0.25           # of local search's time, the last share that descends with re-tiering steps too
COST_NOISE = 1e-9             # relative: costs this close are equal (float noise of the device state's sums)
TRADE_DONORS = 3              # per trade, the donors (best first by the vectorised screen) checked on the device state


@dataclass(frozen=True)
class _Donors:
    """In-place shrinks on offer: per row, a table, the leaner option it would take on its own devices, and
    what that adds per device (bytes per tier, negative where freed; cost) and which devices it touches."""

    table: np.ndarray    # rows
    option: np.ndarray   # rows
    memory: np.ndarray   # rows × devices × tiers
    cost: np.ndarray     # rows × devices
    touched: np.ndarray  # rows × devices


class _Search:
    """Local search on an assembly; `changes` allows tables to change option."""

    def __init__(self, assembly: Assembly, changes: bool, hull: bool = True):
        self.a, self.c, self.changes = assembly, assembly.c, changes
        # The iterated search tries hull options only (twice the kicks a second); one descent can afford
        # every option, and split-greedy's last descent does.
        self.options = self.c.search_options if hull else self.c.by_table
        self.hbm = self.c.total_storage[:, HBM]
        self.weight = option_weight(self.c)
        self._siblings: dict[int, np.ndarray] = {}
        self.tiered = changes and self.c.trades_hbm

    @cached_property
    def retier(self) -> Retier | None:
        """Re-tiering steps, where they apply (built on first use: most descents never ask)."""
        return Retier(self.a) if self.changes and usable(self.a) else None

    def free_pieces(self) -> np.ndarray:
        placed = self.a.placed()
        return placed[self.c.free_piece[placed]]

    def best_step(self) -> tuple | None:
        """The move or swap of a free piece off the most loaded device, or the option change of a table
        with a piece there, that lowers the largest cost among the devices it touches the most; None at a
        local optimum."""
        a, state = self.a, self.a.state
        costs = state.costs()
        top = int(np.argmax(costs))
        ceiling = costs[top] * (1 - RELATIVE_STEP)
        best_value, best = ceiling, None
        need, free = a.memory, a.free
        movable = self.free_pieces()
        elsewhere = movable[a.device[movable] != top]
        other_devices = a.device[elsewhere]
        for piece in movable[a.device[movable] == top]:
            piece = int(piece)
            after_top = state.cost_if_exchanged(top, piece, None)
            targets = np.flatnonzero((free >= need[piece]).all(axis=1) & (np.arange(costs.size) != top))
            if a.moves is not None:
                targets = targets[self.move_cost(piece, top, targets) <= a.allowance()]
            if targets.size:
                pair = np.maximum(after_top, state.costs_if_added(piece, targets))
                i = int(np.argmin(pair))
                if pair[i] < best_value:
                    best_value, best = pair[i], ("move", piece, int(targets[i]))
            if elsewhere.size:
                fits = ((free[top] + need[piece] - need[elsewhere] >= 0).all(axis=1)
                        & (free[other_devices] + need[elsewhere] - need[piece] >= 0).all(axis=1))
                candidates, devices = elsewhere[fits], other_devices[fits]
                if a.moves is not None:
                    affordable = self.move_cost(piece, top, devices) + self.move_cost(candidates, devices, top) \
                        <= a.allowance()
                    candidates, devices = candidates[affordable], devices[affordable]
                if candidates.size:
                    here, there = state.costs_if_swapped(piece, top, candidates, devices)
                    pair = np.maximum(here, there)
                    i = int(np.argmin(pair))
                    if pair[i] < best_value:
                        best_value, best = pair[i], ("swap", piece, int(candidates[i]))
        if self.changes:
            heaviest = self.heaviest_tables_on(top)
            for table in heaviest:
                value, trial = self.best_option_change(table)
                if trial is not None and value < best_value:
                    best_value, best = value, ("option", table, trial)
            donors: dict[int, _Donors | None] = {}
            for table in heaviest if self.tiered else ():
                value, trade = self.best_trade(table, best_value, donors)
                if trade is not None:
                    best_value, best = value, ("trade", trade, None)
        return best

    def move_cost(self, pieces, source, targets) -> np.ndarray:
        """What moving pieces from `source` to `targets` adds to the bytes moved from the previous plan
        (arrays or scalars, broadcast together)."""
        arrays = (np.asarray(x, dtype=np.int64) for x in (pieces, source, targets))
        pieces, source, targets = np.broadcast_arrays(*arrays)
        moves = self.a.moves
        return moves.moved(pieces.ravel(), targets.ravel()) - moves.moved(pieces.ravel(), source.ravel())

    def reclaim(self) -> int:
        """Pieces that moved from the previous plan go back where they move less, wherever that does not
        raise the most loaded device's cost: bytes the move budget then spends elsewhere. Returns how many
        went back."""
        a = self.a
        if a.moves is None:
            return 0
        went = 0
        ceiling = float(a.costs().max())
        for piece in self.free_pieces():
            piece, here = int(piece), int(a.device[piece])
            saved = -self.move_cost(piece, here, np.arange(a.k))
            targets = np.flatnonzero((saved > 0) & (a.free >= a.memory[piece]).all(axis=1))
            if not targets.size:
                continue
            after = a.state.costs_if_added(piece, targets)
            targets, after = targets[after <= ceiling], after[after <= ceiling]
            if targets.size:
                a.move(piece, int(targets[np.argmax(saved[targets])]))
                went += 1
        return went

    def heaviest_tables_on(self, device: int) -> list[int]:
        """The tables whose pieces cost the most on `device` (by the pieces' cost alone), at most OPTION_CHANGES."""
        pieces = self.a.on(device)
        tables = self.c.options.pieces.table[pieces]
        cost = np.zeros(self.a.chosen.size)
        np.add.at(cost, tables, self.c.single_costs[pieces])
        present = np.unique(tables)
        return [int(t) for t in present[np.argsort(-cost[present], kind="stable")][:OPTION_CHANGES]]

    def best_option_change(self, table: int):
        """The table's other option whose fitting leaves the devices it touches lowest; of those within
        COST_NOISE of the lowest, the first. Under an additive oracle (piece costs ≥ 0) an option leaves them no
        lower than its largest piece on the least loaded device, so options are fitted in the order of that
        floor until it passes the lowest found: the same choice as fitting every option, with fewer fits."""
        a = self.a
        old, devices = a.take(table)
        options = self.options[table]
        order, floor = range(len(options)), None
        if self.c.priced.additive:
            floor = float(a.costs().min()) + self.c.biggest[options]
            order = np.argsort(floor, kind="stable")
        found, least = [], np.inf
        for i in order:
            # Every option from here on leaves the devices above the lowest found, beyond noise either side.
            if floor is not None and floor[i] * (1 - COST_NOISE) > least * (1 + COST_NOISE):
                break
            option = int(options[i])
            if option == old:
                continue
            trial = a.fit(option)
            if not isinstance(trial, Trial):
                continue
            value = float(trial.costs[np.union1d(devices, trial.devices)].max())
            least = min(least, value)
            found.append((int(i), value, trial))
        a.put(old, devices)
        # The state's running sums carry float noise from each fit's add and undo: values within COST_NOISE of
        # the lowest tie, and the first option wins, whatever the order they were fitted in.
        near = [entry for entry in found if entry[1] <= least * (1 + COST_NOISE)]
        if not near:
            return np.inf, None
        _, value, trial = min(near, key=lambda entry: entry[0])
        return value, trial

    # ------------------------------------------------------------ trading HBM between two tables

    def siblings(self, option: int) -> np.ndarray:
        """The table's search options cut as `option` is (so that they can take its pieces' devices one to
        one), whatever its own kernel and cache."""
        layout = int(self.c.layout[option])
        if layout not in self._siblings:
            ids = self.c.search_options[self.c.options.options[option].table]
            self._siblings[layout] = ids[self.c.layout[ids] == layout]
        return self._siblings[layout]

    def switches(self, olds: list[int], news: list[int], devices: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        """What switching each option `olds[r]`, whose pieces sit on `devices[r]`, to `news[r]` on the same
        devices adds per device, side by side: bytes per tier (rows × devices × tiers), cost (rows ×
        devices; the pieces' costs alone: exact under an additive oracle, a screen under others) and which
        devices each switch touches."""
        a, c = self.a, self.c
        befores = [c.members(o) for o in olds]
        row = np.concatenate([np.full(b.size, r) for r, b in enumerate(befores)])
        before, device_of = np.concatenate(befores), np.concatenate(devices)
        after = np.concatenate([c.members(o) for o in news])
        memory = np.zeros((len(olds), *a.free.shape), dtype=np.int64)
        np.add.at(memory, (row, device_of), a.memory[after] - a.memory[before])
        cost = np.zeros((len(olds), a.k))
        np.add.at(cost, (row, device_of), c.single_costs[after] - c.single_costs[before])
        touched = np.zeros((len(olds), a.k), dtype=bool)
        touched[row, device_of] = True
        return memory, cost, touched

    def donors_on(self, device: int) -> _Donors | None:
        """Every table with a piece on `device` shrunk in place to each leaner search option of its cut
        (a smaller cache, or host memory instead of HBM), side by side; None where there is none."""
        a, c = self.a, self.c
        tables, olds, news, devices = [], [], [], []
        for table in np.unique(c.options.pieces.table[a.on(device)]):
            old = int(a.chosen[table])
            for new in c.leaner(old, self.siblings(old)):
                tables.append(int(table))
                olds.append(old)
                news.append(int(new))
                devices.append(a.device[c.members(old)])
        if not tables:
            return None
        return _Donors(np.array(tables), np.array(news), *self.switches(olds, news, devices))

    def best_trade(self, table: int, ceiling: float, donors: dict[int, _Donors | None]) -> tuple[float, tuple | None]:
        """The table grows in place into a search option that costs less and needs more HBM than its devices
        have free, while a table sharing the device that lacks it shrinks in place to free the bytes: the
        pair that leaves the devices either touches lowest, if below `ceiling` (and the trade, as
        ((table, option, devices), (donor, option, devices))). Option changes find what fits alone; this
        finds the trades no single change can make. `donors` caches `donors_on` per device for the step."""
        a = self.a
        old = int(a.chosen[table])
        devices = a.device[self.c.members(old)]
        costs = a.costs()
        mine = np.zeros(a.k, dtype=bool)
        mine[devices] = True
        best_value, best = ceiling, None
        for new in self.siblings(old):
            if self.hbm[new] <= self.hbm[old] or self.weight[new] >= self.weight[old]:
                continue
            (memory,), (cost,), _ = self.switches([old], [int(new)], [devices])
            after = costs + cost
            short = memory > a.free
            # A donor shrinks along its hull, which costs more: a growth that does not beat the ceiling
            # alone is not worth a donor.
            if not short.any() or after[mine].max() >= best_value:
                continue
            device = int(np.flatnonzero(short.any(axis=1))[0])
            if device not in donors:
                donors[device] = self.donors_on(device)
            offer = donors[device]
            if offer is None:
                continue
            fits = (memory + offer.memory <= a.free).all(axis=(1, 2)) & (offer.table != table)
            values = np.where(offer.touched | mine, after + offer.cost, -np.inf).max(axis=1)
            values[~fits] = np.inf
            for r in np.argsort(values, kind="stable")[:TRADE_DONORS]:
                if values[r] >= best_value:
                    break
                donor = int(offer.table[r])
                shrunk = (donor, int(offer.option[r]), a.device[self.c.members(int(a.chosen[donor]))])
                trade = ((table, int(new), devices), shrunk)
                value = self.trade_value(trade)
                if value < best_value:
                    best_value, best = value, trade
                    break
        return best_value, best

    def trade_value(self, trade: tuple) -> float:
        """The largest cost among the devices the in-place changes of `trade` touch, were they made
        (nothing changes); infinite where the move budget cannot pay for them."""
        a, state = self.a, self.a.state
        old = [self.c.members(int(a.chosen[table])) for table, _, _ in trade]
        new = [self.c.members(option) for _, option, _ in trade]
        devices = [d for _, _, d in trade]
        if a.moves is not None and sum(a.moved_by(n, d) - a.moved_by(o, d) for o, n, d in zip(old, new, devices)) \
                > a.allowance():
            return np.inf
        for members, d in zip(old, devices):
            state.remove_many(members, d)
        try:
            costs = state.costs_with(np.concatenate(new), np.concatenate(devices))
        finally:
            for members, d in zip(old, devices):
                state.add_many(members, d)
        return float(costs[np.unique(np.concatenate(devices))].max())

    def apply(self, step: tuple) -> None:
        kind, first, second = step
        a = self.a
        if kind == "move":
            a.move(first, second)
        elif kind == "swap":
            mine, theirs = int(a.device[first]), int(a.device[second])
            a.move(first, theirs)
            a.move(second, mine)
        elif kind == "retier":
            self.retier.apply(first)
        elif kind == "trade":
            for table, _, _ in first:
                a.take(table)
            for _, option, devices in first:
                a.put(option, devices)
        else:
            a.take(first)
            a.put(second.option, second.devices)

    def descend(self, deadline: float, deep: bool = False) -> int:
        """Best steps until none lowers the busiest device; `deep`: then re-tiering steps too
        (solvers.retier), and plain steps again after each."""
        steps = 0
        while time.monotonic() < deadline:
            step = self.best_step()
            if step is None and deep and self.retier is not None:
                costs = self.a.costs()
                found = self.retier.best_step(float(costs.max()) * (1 - RELATIVE_STEP), deadline)
                step = None if found is None else ("retier", found[1], None)
            if step is None:
                break
            self.apply(step)
            steps += 1
        return steps

    def kick(self, rng: np.random.Generator, size: int) -> None:
        """Moves `size` random free pieces to random devices with room; when splitting, also switches a
        share of that many random tables to a random other option."""
        a = self.a
        movable = self.free_pieces()
        for i in rng.choice(movable.size, size=min(size, movable.size), replace=False):
            piece = int(movable[i])
            room = np.flatnonzero((a.free >= a.memory[piece]).all(axis=1))
            room = room[room != a.device[piece]]
            if a.moves is not None:
                room = room[self.move_cost(piece, a.device[piece], room) <= a.allowance()]
            if room.size:
                a.move(piece, int(rng.choice(room)))
        if not self.changes:
            return
        for table in rng.choice(a.chosen.size, size=max(1, int(OPTION_KICK_SHARE * size)), replace=True):
            options = [int(o) for o in self.options[table] if o != a.chosen[table]]
            if not options:
                continue
            old, devices = a.take(int(table))
            trial = a.fit(int(rng.choice(options)))
            if not isinstance(trial, Trial):
                a.put(old, devices)
            else:
                a.put(trial.option, trial.devices)
        self.trade_kick(rng)

    def trade_kick(self, rng: np.random.Generator) -> None:
        """A random table grows in place into a random search option of its cut that costs less and needs
        more HBM; where its devices lack the bytes, a random table on the first device short of them that
        can free them shrinks in place."""
        a = self.a
        if not self.tiered:
            return  # no draw either: where no table has a leaner-in-cost, richer-in-HBM option, kicks are as before
        table = int(rng.integers(a.chosen.size))
        old = int(a.chosen[table])
        richer = [int(o) for o in self.siblings(old)
                  if self.hbm[o] > self.hbm[old] and self.weight[o] < self.weight[old]]
        if not richer:
            return
        new = richer[int(rng.integers(len(richer)))]
        devices = a.device[self.c.members(old)]
        (memory,), _, _ = self.switches([old], [new], [devices])
        trade = [(table, new, devices)]
        short = memory > a.free
        if short.any():
            offer = self.donors_on(int(np.flatnonzero(short.any(axis=1))[0]))
            if offer is None:
                return
            rows = np.flatnonzero((memory + offer.memory <= a.free).all(axis=(1, 2)) & (offer.table != table))
            if not rows.size:
                return
            r = int(rows[rng.integers(rows.size)])
            donor = int(offer.table[r])
            trade.append((donor, int(offer.option[r]), a.device[self.c.members(int(a.chosen[donor]))]))
        if a.moves is None or np.isfinite(self.trade_value(tuple(trade))):
            self.apply(("trade", tuple(trade), None))


def improve(assembly: Assembly, deadline: float, seed: int, max_rounds: int | None = None, changes: bool = False,
            target: float = -np.inf) -> dict:
    """Iterated local search on `assembly` until the deadline, `max_rounds` kicks (which makes the result
    a function of the seed alone) or a plan at `target` (a lower bound). Leaves the best plan found in
    the assembly — never worse than the start — and returns statistics. In a replan, every descent ends
    with the pieces that moved for nothing going back (`_Search.reclaim`), so that kicks do not spend the
    move budget. Where devices can be re-tiered (solvers.retier), the last RETIER_SHARE of the time goes
    on from the best plan with descents that re-tier too: dearer steps, and plans full to the brim of HBM
    that plain moves can no longer rearrange, so they come last."""
    rng = np.random.default_rng(seed)
    search = _Search(assembly, changes)
    start_value = assembly.objective()
    steps = search.descend(deadline)
    search.reclaim()
    best, best_value = assembly.snapshot(), assembly.objective()
    kick_size = max(2, assembly.chosen.size // 50)
    rounds = 0
    target = target * (1 + 1e-12)

    def iterate(stop: float, deep: bool, cap: int | None) -> None:
        nonlocal steps, best, best_value, rounds
        done = 0
        while (time.monotonic() < stop and (cap is None or done < cap) and best_value > target
               and assembly.k > 1):
            rounds, done = rounds + 1, done + 1
            search.kick(rng, int(rng.integers(1, kick_size + 1)))
            steps += search.descend(deadline, deep)
            search.reclaim()
            value = assembly.objective()
            if value <= best_value:
                if value < best_value * (1 - RELATIVE_STEP):
                    best_value = value
                best = assembly.snapshot()
            else:
                assembly.load(*best)

    deep = search.retier is not None
    # Without a deadline (max_rounds alone), every round is plain and the re-tiering descent comes once after.
    last_share = deep and np.isfinite(deadline)
    iterate(deadline - RETIER_SHARE * (deadline - time.monotonic()) if last_share else deadline, False, max_rounds)
    if deep and time.monotonic() < deadline and best_value > target:
        assembly.load(*best)
        steps += search.descend(deadline, deep=True)
        if assembly.objective() < best_value:
            best, best_value = assembly.snapshot(), assembly.objective()
        iterate(deadline, True, 0 if max_rounds is not None else None)
    if not np.array_equal(assembly.snapshot()[1], best[1]):
        assembly.load(*best)
    return {"start_objective": start_value, "steps": steps, "kicks": rounds}


def descend(assembly: Assembly, changes: bool, deadline: float) -> int:
    """Best-improvement steps (moves, swaps and — with `changes` — option changes off the busiest device)
    until none lowers it or the deadline; the steps taken."""
    return _Search(assembly, changes).descend(deadline)


def send_back(assembly: Assembly) -> int:
    """In a replan, the pieces that moved for nothing sent back where they move less (`_Search.reclaim`)."""
    return _Search(assembly, changes=False).reclaim()


def target_bound(candidates: Candidates) -> float:
    return best_option_bound(candidates) if candidates.priced.additive else -np.inf


def _orders(candidates: Candidates, chosen: np.ndarray, weight: np.ndarray) -> list[np.ndarray]:
    """The greedy skeleton's three table orders for the chosen options: by cost (largest piece, LPT), by
    memory (largest piece's memory, which survives tight memory where LPT gets stuck), and by the sum of
    both shares."""
    peaks = candidates.biggest if candidates.priced.additive else piece_peaks(candidates)
    cost = peaks[chosen]
    memory = np.array([float(candidates.device_shares(candidates.storage[candidates.members(int(o))]).max())
                       for o in chosen])
    share = cost / max(cost.sum(), 1e-300) + memory / max(memory.sum(), 1e-300)
    return [order_by_cost(key) for key in (cost, memory, share)]


LEVEL_STEPS = 8  # bisection steps on the level below which pieces must stay


def split_greedy(candidates: Candidates, changes: bool = True,
                 deadline: float | None = None) -> Assembly | Stuck | None:
    """The split-aware greedy. For a level L, every table takes its lightest option whose largest piece
    stays below L (whole tables where they are small enough, splits only where they must) within a share
    of the spare memory (`choose_options`), and the chosen options are placed LPT-style under the three
    orders; L is bisected between the lower bound and the plan that splits nothing it need not. Under an
    additive oracle, best-fit packing at a bisected target (solvers.packing) then tries to beat that
    plan. That runs for each of MEMORY_SHARES (after the floors, `_choices`) while `deadline` allows; the
    best plan over every option and the best floor then each descend on option changes of the tables on
    the busiest device while that lowers it, and the better is kept. Past `deadline` each stage
    returns what it has (choices are built until one over every option gives a plan). With one option
    per table it is `best-greedy`. Given a previous plan, it starts from that plan instead (`replanned`), and returns
    None where the move budget leaves a table no place."""
    if candidates.moves is not None:
        return replanned(candidates, changes, deadline)
    for table, ids in enumerate(candidates.by_table):
        if ids.size == 0:  # no option fits a device at all (run_solver reports that as infeasible first)
            o = next(o for o, option in enumerate(candidates.options.options) if option.table == table)
            piece = int(candidates.members(o)[0])
            capacity = candidates.instance.topology.capacity.as_array()
            tier = int(np.argmax(candidates.storage[piece] > capacity))
            return Stuck(piece, int(candidates.storage[piece, tier]), int(capacity[tier]), tier)
    weight = option_weight(candidates)
    # The best plan built over every option and the best floor each descend: a floor that starts ahead can
    # end behind once both have descended.
    best: dict[bool, Assembly] = {}
    stuck = None
    for choice in _choices(candidates, changes, weight):
        found = _at_share(candidates, changes, deadline, weight, choice)
        every_option = choice.allowed is None  # else a floor's restricted options
        if isinstance(found, Stuck):
            stuck = stuck or found
        elif every_option not in best or found.objective() < best[every_option].objective():
            best[every_option] = found
        # Past the deadline, stop once a choice over every option gave a plan: the floors come first (the
        # HBM-only one dead-ends where HBM is short, TorchRec's defaults fit but serve hot tables from
        # host memory), and one unrefined plan over every option costs a construction more.
        if past(deadline) and True in best:
            break
    if not best:
        return stuck
    if changes:
        for assembly in best.values():
            _descend_on_options(assembly, deadline)
    return min(best.values(), key=lambda a: a.objective())


@dataclass(frozen=True)
class Choice:
    """How split_greedy chooses options for one of its plans: within `share` of the spare memory, among the
    `allowed` options (None: all), `unsplit` the choice at an unbounded level; `floor` marks a plan built
    once, as a floor under the search, not refined."""

    share: float
    allowed: np.ndarray | None
    unsplit: np.ndarray
    floor: bool = False


def _choices(candidates: Candidates, changes: bool, weight: np.ndarray) -> list[Choice]:
    """The choices worth building, each different from every earlier one. Where tables may live in host
    memory, two floors come first: every table in HBM where it fits (the best HBM-only plan, refined like
    the rest: where HBM suffices it is the answer) and TorchRec's default options (its kernels, caches at
    its default load factor), so that the first plans are at least as good as those; then the memory
    shares over every option (all of them where there are kernels to choose, the first alone for a solver
    that keeps its first choices)."""
    rules = []
    if candidates.instance.uses_host_memory:
        options = candidates.options.options
        in_hbm = np.array([o.kernel in (FUSED, DENSE) for o in options])
        rules.append((MEMORY_SHARES[0], in_hbm, False))
        default = np.array([o.kernel != FUSED_UVM_CACHING or o.load_factor == TORCHREC_LOAD_FACTOR
                            or candidates.instance.tables[o.table].cache_load_factor is not None for o in options])
        rules.append((MEMORY_SHARES[-1], default, True))
    shares = MEMORY_SHARES if changes or candidates.instance.uses_host_memory else MEMORY_SHARES[:1]
    rules += [(share, None, False) for share in shares]
    choices: list[Choice] = []
    for share, allowed, floor in rules:
        chosen = choose_options(candidates, np.inf, weight, share, allowed)
        if not any(np.array_equal(chosen, other.unsplit) for other in choices):
            choices.append(Choice(share, allowed, chosen, floor))
    return choices


def _at_share(candidates: Candidates, changes: bool, deadline: float | None, weight: np.ndarray,
              choice: Choice) -> Assembly | Stuck:
    """split_greedy's plan for one choice: built at an unbounded level, then (unless a floor) refined by
    bisecting the level and by packing."""
    def build(level: float, orders: str = "all") -> tuple[Assembly | None, Stuck | None]:
        chosen = choice.unsplit if level == np.inf else choose_options(candidates, level, weight, choice.share,
                                                                       choice.allowed)
        built = [construct(candidates, order, chosen, weight) for order in _orders(candidates, chosen, weight)
                 [: 1 if orders == "cost" else 3]]
        assemblies = [b for b in built if isinstance(b, Assembly)]
        if not assemblies:
            return None, built[0]
        return min(assemblies, key=lambda a: a.objective()), None

    best, stuck = build(np.inf)
    if changes and best is not None and not choice.floor:
        low, high = target_bound(candidates), best.objective()
        for _ in range(LEVEL_STEPS):
            if high <= low * (1 + 1e-6) or past(deadline):
                break
            level = (low + high) / 2
            trial, _ = build(level, "cost")
            if trial is not None and trial.objective() < best.objective():
                best = trial
            if trial is not None and trial.objective() <= level * (1 + 1e-6):
                high = level
            else:
                low = level
        if candidates.priced.additive:
            best = packed(candidates, target_bound(candidates), best, weight, deadline, choice.share, choice.allowed)
    return best if best is not None else stuck


def _descend_on_options(assembly: Assembly, deadline: float | None = None) -> None:
    if past(deadline):
        return  # setting up the search alone takes ~1 s at 5,000 x 512
    search = _Search(assembly, changes=True, hull=False)
    while not past(deadline):
        costs = assembly.costs()
        top = int(np.argmax(costs))
        step, value = None, costs[top] * (1 - RELATIVE_STEP)
        for table in search.heaviest_tables_on(top):
            change_value, trial = search.best_option_change(table)
            if trial is not None and change_value < value:
                value, step = change_value, ("option", table, trial)
        if step is None:
            return
        search.apply(step)


# ---------------------------------------------------------------- replanning: from the previous plan


def from_previous(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | Stuck | None:
    """The previous plan kept, and what it lacks added: each old table in its old option on its old devices
    unless that option is gone or no longer fits the memory left (then it is placed anew, as the new
    tables are, largest first where it costs least, moving what it must); then descent within the move
    budget. A Stuck where a table fits nowhere, None where the move budget cannot place one."""
    moves = candidates.moves
    assembly = Assembly(candidates)
    for table, option in enumerate(moves.old_option):
        if option < 0 or not candidates.live[option]:
            continue
        devices = moves.old_device[candidates.members(int(option))]
        if assembly.fits_at(int(option), devices):
            assembly.put(int(option), devices)
    weight = option_weight(candidates)
    chosen = choose_options(candidates, np.inf, weight)
    biggest = candidates.biggest if candidates.priced.additive else np.maximum.reduceat(
        candidates.single_costs, candidates.options.first)
    unplaced = sorted(np.flatnonzero(assembly.chosen < 0).tolist(), key=lambda t: (-biggest[chosen[t]], t))
    for table in unplaced:
        placed, stuck = place_table(assembly, table, int(chosen[table]), weight)
        if not placed:
            return stuck
    descend(assembly, changes, np.inf if deadline is None else deadline)
    return assembly


def fresh_within_budget(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | None:
    """The split-aware greedy's plan made afresh (the previous plan ignored), where the bytes it moves fit
    the move budget; else None."""
    fresh = copy.copy(candidates)
    fresh.moves = None
    found = split_greedy(fresh, changes, deadline)
    if not isinstance(found, Assembly):
        return None
    placed = found.placed()
    if candidates.moves.moved(placed, found.device[placed]).sum() > candidates.moves.budget:
        return None
    assembly = Assembly(candidates)
    assembly.load(*found.snapshot())
    return assembly


def replanned(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | Stuck | None:
    """The better of the previous plan kept and improved (`from_previous`) and the fresh greedy's plan
    where the budget affords it."""
    kept = from_previous(candidates, changes, deadline)
    fresh = fresh_within_budget(candidates, changes, deadline)
    if fresh is not None and (not isinstance(kept, Assembly) or fresh.objective() < kept.objective()):
        return fresh
    return kept


def stuck_result(candidates: Candidates, stuck: Stuck | None) -> SolveResult:
    """The no-plan of a dead end: the table that fits on no device, or (None) no room within the move budget."""
    if stuck is None:
        return SolveResult(Status.NO_PLAN, reason=(
            "no placement of every table within the move budget was found (a heuristic dead end, not a proof)"),
            no_plan=NoPlan(Cause.MOVE_BUDGET))
    table = int(candidates.options.pieces.table[stuck.piece])
    name = candidates.instance.tables[table].name
    need_text, free_text = format_sizes(stuck.need, stuck.most_free)
    return SolveResult(Status.NO_PLAN, reason=(
        f"table {name} (a piece of {need_text} of {tier_label(stuck.tier)}) fits on no device it may take: the "
        f"most free {tier_label(stuck.tier)} left there is {free_text} (a heuristic dead end, not a proof of "
        "infeasibility)"),
        no_plan=NoPlan(Cause.DEAD_END, table=table, need=stuck.need, most_free=stuck.most_free, tier=stuck.tier))


def searched(problem: Problem, budget: Budget, seed: int, deadline: float,
             bound: float | None = None) -> tuple[Assembly | None, SolveResult | None, dict]:
    """Split-greedy, then iterated local search until `deadline`, or until the plan is within the budget's
    gap of `bound` (default: the candidates' combinatorial bounds): the assembly, or the dead end."""
    candidates = problem.candidates
    start = split_greedy(candidates, problem.chooses_options, deadline)
    if not isinstance(start, Assembly):
        return None, stuck_result(candidates, start), {}
    bound = target_bound(candidates) if bound is None else bound
    stats = improve(start, deadline, seed, budget.max_rounds, problem.chooses_options, bound * (1 + budget.gap))
    return start, None, stats


@register("split-greedy", "split-aware greedy: each table takes its lightest option whose pieces stay below a level "
          "(bisected down from the plan that splits nothing it need not), pieces placed LPT where they cost least; "
          "then tables on the busiest device change option while that lowers it; any oracle", splits=True,
          replans=True)
def split_greedy_solver(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    result = split_greedy(problem.candidates, problem.chooses_options, budget.deadline())
    if not isinstance(result, Assembly):
        return stuck_result(problem.candidates, result)
    return SolveResult(Status.FEASIBLE, plan=result.plan())


@register("local-search", "iterated local search (moves, swaps, option changes, random kicks) from the split-aware "
          "greedy; any oracle", stochastic=True, splits=True,
          replans=True)
def local_search(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    assembly, failure, stats = searched(problem, budget, seed, budget.deadline())
    if failure is not None:
        return failure
    return SolveResult(Status.FEASIBLE, plan=assembly.plan(), stats=stats)


@register("random-search", "best of up to 1000 random memory-feasible plans (AutoShard §5.3)", stochastic=True)
def random_search(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    instance = problem.instance
    deadline = budget.deadline()
    rng = np.random.default_rng(seed)
    best, best_value, samples, dead_ends = None, np.inf, 0, 0
    limit = budget.max_rounds if budget.max_rounds is not None else RANDOM_SEARCH_SAMPLES
    priced = problem.table_wise
    while samples < limit and (samples == 0 or time.monotonic() < deadline):
        samples += 1
        result = random_assignment(instance, rng, priced.storage, problem.table_kernels)
        if result.plan is None:
            dead_ends += 1
            continue
        value = max(c.total for c in priced.device_costs(np.asarray(result.plan.assignment)))
        if value < best_value:
            best, best_value = result.plan, value
    stats = {"samples": samples, "dead_ends": dead_ends}
    if best is None:
        return SolveResult(Status.NO_PLAN, reason=f"all {samples} random samples hit a memory dead end (not a proof)",
                           stats=stats, no_plan=NoPlan(Cause.SAMPLING, samples=samples))
    return SolveResult(Status.FEASIBLE, plan=best, stats=stats)
