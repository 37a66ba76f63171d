"""A sharded plan under construction or change, over the priced candidates: an option per table, a device
per piece of the chosen options, free memory per device, the oracle's incremental device state and, in a
replan, the bytes moved from the previous plan. On it, the split-aware greedy skeleton: fit an option's
pieces where they cost least (free pieces one by one on the device with room whose cost after adding is
lowest; a node option on the node whose busiest device ends lowest; pinned pieces where they are pinned),
and construct a plan table by table."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances.memory import HBM, shortfall

from .candidates import Candidates

RELATIVE_STEP = 1e-12  # an improvement must beat the current cost by more than float noise


@dataclass(frozen=True)
class Trial:
    """Option `option` fitted: its pieces' devices, and every device's cost with it in place."""

    option: int
    devices: np.ndarray
    costs: np.ndarray

    @property
    def peak(self) -> float:
        return float(self.costs.max())


@dataclass(frozen=True)
class Stuck:
    """Why an option found no room: its piece `piece` needs `need` bytes of memory tier `tier`, and the
    devices it may take (any for a free piece, its own for a pinned one, its rank's on the nodes tried for
    a node option) had at most `most_free` there."""

    piece: int
    need: int
    most_free: int
    tier: int = HBM


def _short_on(piece: int, need: np.ndarray, free: np.ndarray) -> Stuck:
    """A pinned piece's shortfall on its own device."""
    tier = int(np.argmax(free < need))
    return Stuck(piece, int(need[tier]), int(free[tier]), tier)


class Assembly:
    def __init__(self, candidates: Candidates):
        self.c = candidates
        instance = candidates.instance
        self.k = instance.num_devices
        self.per_node = instance.topology.devices_per_node
        self.state = candidates.priced.new_state()
        self.memory = np.asarray(candidates.storage, dtype=np.int64)
        self.free = np.array(instance.capacity, dtype=np.int64)
        self.chosen = np.full(instance.num_tables, -1, dtype=np.int64)
        self.device = np.full(len(candidates.options.pieces), -1, dtype=np.int64)
        self.moves = candidates.moves
        self.moved = 0  # bytes the placed pieces move from a replan's previous plan

    # ------------------------------------------------------------ reading

    def costs(self) -> np.ndarray:
        return self.state.costs()

    def objective(self) -> float:
        return float(self.costs().max())

    def placed(self) -> np.ndarray:
        """The pieces of the chosen options."""
        return np.flatnonzero(self.device >= 0)

    def on(self, device: int) -> np.ndarray:
        return np.flatnonzero(self.device == device)

    def allowance(self) -> float:
        """Bytes the move budget has left (infinite where there is no budget)."""
        return np.inf if self.moves is None else self.moves.budget - self.moved

    def moved_by(self, pieces: np.ndarray, devices: np.ndarray) -> int:
        """Bytes these pieces move from the previous plan on these devices (0 when not replanning)."""
        return 0 if self.moves is None else int(self.moves.moved(pieces, devices).sum())

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.chosen.copy(), self.device.copy()

    def plan(self):
        return self.c.plan([int(o) for o in self.chosen], self.device)

    # ------------------------------------------------------------ changing

    def put(self, option: int, devices: np.ndarray) -> None:
        members = self.c.members(option)
        self.state.add_many(members, devices)
        self.moved += self.moved_by(members, devices)
        np.subtract.at(self.free, devices, self.memory[members])
        self.device[members] = devices
        self.chosen[self.c.options.options[option].table] = option

    def take(self, table: int) -> tuple[int, np.ndarray]:
        """Removes the table's option; returns it with its devices, so that it can be put back."""
        option = int(self.chosen[table])
        members = self.c.members(option)
        devices = self.device[members].copy()
        self.state.remove_many(members, devices)
        self.moved -= self.moved_by(members, devices)
        np.add.at(self.free, devices, self.memory[members])
        self.device[members] = -1
        self.chosen[table] = -1
        return option, devices

    def move(self, piece: int, device: int) -> None:
        source = int(self.device[piece])
        if self.moves is not None:
            self.moved += self.moved_by(np.array([piece]), np.array([device])) - \
                self.moved_by(np.array([piece]), np.array([source]))
        self.state.remove(piece, source)
        self.free[source] += self.memory[piece]
        self.state.add(piece, device)
        self.free[device] -= self.memory[piece]
        self.device[piece] = device

    def load(self, chosen: np.ndarray, device: np.ndarray) -> None:
        """Rebuilds the state for a snapshot."""
        self.__init__(self.c)
        for option in chosen:
            if option >= 0:
                self.put(int(option), device[self.c.members(int(option))])

    # ------------------------------------------------------------ fitting an option

    def fit(self, option: int) -> Trial | Stuck | None:
        """Devices for the option's pieces given what is placed now (nothing changes); None where every
        placement with room would move more bytes than the move budget has left."""
        members = self.c.members(option)
        need = self.memory[members]
        placement = self.c.placement(option)
        if placement == "pinned":
            devices = self.c.devices(option)
            short = np.flatnonzero((self.free[devices] < need).any(axis=1))
            if short.size:
                p = int(short[0])
                return _short_on(int(members[p]), need[p], self.free[devices[p]])
            if self.moved_by(members, devices) > self.allowance():
                return None
            return Trial(option, devices, self.state.costs_with(members, devices))
        if placement == "node":
            best, stuck = None, None
            fixed = -1 if self.moves is None else int(self.moves.fixed_node[option])
            for node in range(self.k // self.per_node) if fixed < 0 else (fixed,):
                devices = self.c.devices(option, node=node)
                if self.moved_by(members, devices) > self.allowance():
                    continue
                short = np.flatnonzero((self.free[devices] < need).any(axis=1))
                if short.size:
                    p = int(short[0])
                    stuck = stuck or _short_on(int(members[p]), need[p], self.free[devices[p]])
                    continue
                trial = Trial(option, devices, self.state.costs_with(members, devices))
                if best is None or trial.costs[devices].max() < best.costs[best.devices].max():
                    best = trial
            return best if best is not None else stuck
        devices = np.empty(members.size, dtype=np.int64)
        free = self.free.copy()
        left = self.allowance()
        for i, piece in enumerate(members):
            room = np.flatnonzero((free >= need[i]).all(axis=1))
            if self.moves is not None:
                affordable = room[self.moves.moved(np.full(room.size, piece), room) <= left]
                if room.size and affordable.size == 0:
                    self.state.remove_many(members[:i], devices[:i])
                    return None
                room = affordable
            if room.size == 0:
                self.state.remove_many(members[:i], devices[:i])
                tier, most_free = shortfall(need[i], free)
                return Stuck(int(piece), int(need[i, tier]), most_free, tier)
            after = self.state.costs_if_added(int(piece), room)
            devices[i] = room[int(np.argmin(after))]
            self.state.add(int(piece), int(devices[i]))
            free[devices[i]] -= need[i]
            left -= self.moved_by(members[i:i + 1], devices[i:i + 1])
        costs = self.state.costs()
        self.state.remove_many(members, devices)
        return Trial(option, devices, costs)


# Of the memory left once every table takes its leanest option, the shares that replicas, larger caches and
# other memory-hungry options may use; the rest is slack for packing. Which share packs best depends on how
# large pieces are against a device: half suits splits under tight memory, while tables kept in host memory
# want nearly all of HBM for their caches (at half alone, the best 30 s plans of the tiers suites under
# TorchRec's estimator came out a median 1.1-1.9x worse). The greedy tries each, the first one first.
MEMORY_SHARES = (0.5, 0.7, 0.85, 0.95, 1.0)


def choose_options(candidates: Candidates, level: float, weight: np.ndarray,
                   memory_share: float = MEMORY_SHARES[0]) -> np.ndarray:
    """Per table, the lightest option (by `weight`, then memory) whose largest piece stays at or below
    `level`, failing that the option with the smallest largest piece; then, while the choices need more
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


def piece_peaks(candidates: Candidates) -> np.ndarray:
    """Per option, its largest piece's cost alone on a device (for oracles without per-piece costs)."""
    return np.maximum.reduceat(candidates.single_costs, candidates.options.first)


def construct(candidates: Candidates, order: np.ndarray, chosen: np.ndarray, weight: np.ndarray) -> Assembly | Stuck:
    """Places the chosen option of every table: pinned options first (they have no choice), then the rest
    in `order`, each fitted where its pieces cost least. An option that finds no room gives way to the
    table's other options, lightest first. With one option per table this is the greedy skeleton of
    `solvers.greedy`."""
    assembly = Assembly(candidates)
    pinned = [t for t in order if candidates.placement(int(chosen[t])) == "pinned"]
    for table in pinned + [t for t in order if candidates.placement(int(chosen[t])) != "pinned"]:
        first = int(chosen[table])
        others = sorted((int(o) for o in candidates.by_table[table] if o != first), key=lambda o: weight[o])
        stuck = None
        for option in [first, *others]:
            result = assembly.fit(option)
            if isinstance(result, Trial):
                assembly.put(option, result.devices)
                break
            stuck = stuck or result
        else:
            return stuck
    return assembly
