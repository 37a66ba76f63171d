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

    def fits_at(self, option: int, devices: np.ndarray) -> bool:
        """Whether the option's pieces, on `devices` (one per piece), fit the memory left there in every tier."""
        need = np.zeros_like(self.free)
        np.add.at(need, devices, self.memory[self.c.members(option)])
        return bool((need <= self.free).all())

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
            fixed = -1 if self.moves is None else int(self.moves.fixed_node[option])
            nodes = np.arange(self.k // self.per_node) if fixed < 0 else np.array([fixed])
            return self._best_node(option, members, need, self.c.devices(option, node=nodes[:, None]))
        if placement == "node_free":
            rows, costs, stuck, over_budget = [], [], None, False
            for node in range(self.k // self.per_node):
                devices = self._spread(members, need, np.arange(node * self.per_node, (node + 1) * self.per_node))
                if devices is None:
                    over_budget = True
                elif isinstance(devices, Stuck):
                    stuck = stuck or devices
                else:
                    rows.append(devices)
                    # Priced here, not after every spread: a spread's add and undo may leave float noise.
                    costs.append(self.state.costs_with(members, devices))
            return self._best_node(option, members, need, np.array(rows, dtype=np.int64).reshape(-1, members.size),
                                   stuck, over_budget, np.array(costs).reshape(-1, self.k))
        if placement == "grid":
            return self._grid(option, members, need)
        devices = self._spread(members, need, np.arange(self.k))
        if devices is None or isinstance(devices, Stuck):
            return devices
        return Trial(option, devices, self.state.costs_with(members, devices))

    def _spread(self, members: np.ndarray, need: np.ndarray, allowed: np.ndarray) -> np.ndarray | Stuck | None:
        """Free pieces one by one, each on the device among `allowed` with room (and, in a replan, within what
        the move budget has left) where the cost after adding it is lowest (nothing changes); None where
        the budget leaves a piece no device with room."""
        devices = np.empty(members.size, dtype=np.int64)
        free = self.free.copy()
        left = self.allowance()
        for i, piece in enumerate(members):
            room = allowed[(free[allowed] >= need[i]).all(axis=1)]
            if self.moves is not None:
                affordable = room[self.moves.moved(np.full(room.size, piece), room) <= left]
                if room.size and affordable.size == 0:
                    self.state.remove_many(members[:i], devices[:i])
                    return None
                room = affordable
            if room.size == 0:
                self.state.remove_many(members[:i], devices[:i])
                tier, most_free = shortfall(need[i], free[allowed])
                return Stuck(int(piece), int(need[i, tier]), most_free, tier)
            after = self.state.costs_if_added(int(piece), room)
            devices[i] = room[int(np.argmin(after))]
            self.state.add(int(piece), int(devices[i]))
            free[devices[i]] -= need[i]
            left -= self.moved_by(members[i:i + 1], devices[i:i + 1])
        self.state.remove_many(members, devices)
        return devices

    def _best_node(self, option: int, members: np.ndarray, need: np.ndarray, rows: np.ndarray,
                   stuck: Stuck | None = None, over_budget: bool = False,
                   costs: np.ndarray | None = None) -> Trial | Stuck | None:
        """Of the candidate placements `rows` (a device per piece, one row per node, in node order; `costs`:
        every device's cost with each, where already known), the first whose busiest touched device ends
        lowest among those with room within the move budget; else why the first node short of room found
        none (or `stuck`, a reason found earlier), or None where the move budget rules out every node with
        room (or `over_budget` says it ruled out another)."""
        if self.moves is not None and len(rows):
            within = np.array([self.moved_by(members, row) <= self.allowance() for row in rows], dtype=bool)
            over_budget = over_budget or not within.all()
            rows, costs = rows[within], None if costs is None else costs[within]
        if len(rows):
            each = np.arange(len(rows))[:, None]
            used = np.zeros((len(rows), self.k, need.shape[1]), dtype=np.int64)
            np.add.at(used, (each, rows), need)  # pieces sharing a device need their sum there
            short = (self.free[rows] < used[each, rows]).any(axis=2)
            fits = ~short.any(axis=1)
            if stuck is None and not fits.all():
                first = int(np.argmin(fits))
                p = int(np.argmax(short[first]))
                stuck = _short_on(int(members[p]), need[p], self.free[rows[first, p]])
            rows, costs = rows[fits], None if costs is None else costs[fits]
        if len(rows) == 0:
            return None if over_budget and stuck is None else stuck
        costs = self.state.rows_with(members, rows) if costs is None else costs
        best = int(np.argmin(costs[np.arange(len(rows))[:, None], rows].max(axis=1)))
        return Trial(option, rows[best], costs[best])

    def _grid(self, option: int, members: np.ndarray, need: np.ndarray) -> Trial | Stuck | None:
        """A grid's column blocks one by one, each on the node whose busiest device ends lowest with it (None
        where the move budget leaves a block no node)."""
        blocks = self.c.options.block[members]
        nodes = np.zeros(int(blocks.max()) + 1, dtype=np.int64)
        placed: list[tuple[np.ndarray, np.ndarray]] = []  # each block's pieces and devices, held while the rest fit
        outcome: Trial | Stuck | None = None
        for b in range(nodes.size):
            part = members[blocks == b]
            rows = np.arange(self.k // self.per_node)[:, None] * self.per_node + self.c.options.pin[part]
            trial = self._best_node(option, part, self.memory[part], rows)  # the block on each node
            if not isinstance(trial, Trial):  # no room (Stuck) or none within the move budget (None)
                outcome = trial
                break
            nodes[b] = trial.devices[0] // self.per_node
            placed.append((part, trial.devices))
            self.state.add_many(part, trial.devices)
            self.moved += self.moved_by(part, trial.devices)
            np.subtract.at(self.free, trial.devices, self.memory[part])
        if len(placed) == nodes.size:
            outcome = Trial(option, self.c.devices(option, node=nodes), self.state.costs())
        for part, devices in placed:
            self.state.remove_many(part, devices)
            self.moved -= self.moved_by(part, devices)
            np.add.at(self.free, devices, self.memory[part])
        return outcome


def construct(candidates: Candidates, order: np.ndarray, chosen: np.ndarray, weight: np.ndarray) -> Assembly | Stuck:
    """Places the chosen option of every table: pinned options first (they have no choice), then the rest
    in `order`, each fitted where its pieces cost least. An option that finds no room gives way to the
    table's other options, lightest first. With one option per table this is the greedy skeleton of
    `solvers.greedy`."""
    assembly = Assembly(candidates)
    pinned = [t for t in order if candidates.placement(int(chosen[t])) == "pinned"]
    for table in pinned + [t for t in order if candidates.placement(int(chosen[t])) != "pinned"]:
        placed, stuck = place_table(assembly, table, int(chosen[table]), weight)
        if not placed:
            return stuck
    return assembly


def place_table(assembly: Assembly, table: int, first: int, weight: np.ndarray) -> tuple[bool, Stuck | None]:
    """Fits option `first` of `table` where its pieces cost least, or, where it finds no room, the table's
    other options, lightest first. Whether one was placed, and where none was, the first dead end (None
    where the move budget stopped every option)."""
    others = sorted((int(o) for o in assembly.c.by_table[table] if o != first), key=lambda o: weight[o])
    stuck = None
    for option in [first, *others]:
        result = assembly.fit(option)
        if isinstance(result, Trial):
            assembly.put(option, result.devices)
            return True, None
        stuck = stuck or result
    return False, stuck
