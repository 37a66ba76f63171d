"""The cost-oracle protocol. An oracle binds once to an instance and the pieces that devices may hold
(`bind`), and the bound oracle serves what solvers and judges ask: each piece's memory, a device's cost
breakdown, an incremental device state for greedy, local search and RL, and — for additive oracles — each
piece's cost, whose sums are device costs (what exact solvers need). Whole plans and table-wise questions
are conveniences on top."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from instances import Instance, Plan
from instances.pieces import Pieces


@dataclass(frozen=True)
class DeviceCost:
    """One device's cost. Oracles that model time fill the components (seconds) and total is their sum;
    proxy oracles (unitless heuristics) have no breakdown and fill total alone."""

    total: float
    forward_compute: float = 0.0
    backward_compute: float = 0.0
    forward_comm: float = 0.0
    backward_comm: float = 0.0

    @classmethod
    def from_parts(cls, forward_compute: float, backward_compute: float, forward_comm: float,
                   backward_comm: float) -> "DeviceCost":
        return cls(total=forward_compute + backward_compute + forward_comm + backward_comm,
                   forward_compute=forward_compute, backward_compute=backward_compute,
                   forward_comm=forward_comm, backward_comm=backward_comm)


class NotAdditiveError(TypeError):
    """Raised when a solver asks a non-additive oracle for per-piece costs."""


class Oracle(ABC):
    """Judges plans. A device's cost depends only on the pieces placed on it."""

    name: str = ""
    description: str = ""
    unit: str = ""
    additive: bool = False
    has_breakdown: bool = False
    own_memory: bool = False  # counts memory its own way: its plans must fit that too, not only the instance's
    prices_tiers: bool = False  # prices pieces kept in host memory (fused_uvm, fused_uvm_caching) by their kernel
    costly: bool = False  # building it loads a library or weights (seconds): questions about it ask the class
    # Prices a piece by its table, sharding type, kernel, load factor and shape alone, not by which of the
    # table's rows it holds (so pieces of one shape may be priced once).
    shape_priced: bool = False

    def bind(self, instance: Instance, pieces: Pieces) -> "Priced":
        return RecomputingPriced(self, instance, pieces)

    def convex_in_load_factor(self, instance: Instance) -> bool:
        """Whether on `instance` each cached piece's cost is convex and non-increasing in its load factor over
        [0, 1] (at 0 its limit from above), and its bytes per tier convex in it up to rounding to whole cache
        slots: what a bound over every load factor rests on (solvers.cache_bound). False unless an oracle
        knows it of its own formulas."""
        return False

    @abstractmethod
    def price_device(self, instance: Instance, pieces: Pieces, members: Sequence[int]) -> DeviceCost:
        """Cost of one device holding `members` (indices into `pieces`)."""

    # ------------------------------------------------------------ whole plans

    def device_costs(self, instance: Instance, plan: Plan) -> tuple[DeviceCost, ...]:
        pieces, devices = Pieces.of_plan(instance, plan)
        return self.bind(instance, pieces).device_costs(devices)

    def plan_cost(self, instance: Instance, plan: Plan) -> float:
        return max(c.total for c in self.device_costs(instance, plan))

    def storage_per_device(self, instance: Instance, plan: Plan) -> np.ndarray:
        """Bytes per device and tier (devices × 2) under the oracle's storage model."""
        pieces, devices = Pieces.of_plan(instance, plan)
        used = np.zeros((instance.num_devices, 2), dtype=np.int64)
        np.add.at(used, devices, self.bind(instance, pieces).storage)
        return used

    # ------------------------------------------------------------ table-wise conveniences

    def table_wise(self, instance: Instance) -> "Priced":
        return self.bind(instance, Pieces.table_wise(instance))

    def table_costs(self, instance: Instance) -> np.ndarray:
        """Per-table costs whose sum is a device's cost; only additive oracles have them."""
        return self.table_wise(instance).costs

    def single_table_costs(self, instance: Instance) -> np.ndarray:
        """Each table's cost alone on a device (what greedy orders sort by)."""
        return self.table_wise(instance).single_costs()

    def device_cost(self, instance: Instance, tables: Sequence[int]) -> DeviceCost:
        """Cost of a device holding these whole tables."""
        return self.table_wise(instance).device_cost(tables)

    def new_state(self, instance: Instance) -> "DeviceState":
        return self.table_wise(instance).new_state()


class Priced(ABC):
    """An oracle bound to an instance and a set of pieces. `storage` is what each piece needs on its device
    in each tier (pieces × 2: HBM, host) under the oracle's storage model (by default the instance's)."""

    additive = False

    def __init__(self, instance: Instance, pieces: Pieces, storage: np.ndarray | None = None):
        self.instance, self.pieces = instance, pieces
        self.storage = pieces.storage(instance) if storage is None else np.asarray(storage, dtype=np.int64).reshape(-1, 2)

    @property
    def num_devices(self) -> int:
        return self.instance.num_devices

    @property
    def costs(self) -> np.ndarray:
        raise NotAdditiveError("this oracle is not additive: it has no per-piece costs")

    @abstractmethod
    def device_cost(self, members: Sequence[int]) -> DeviceCost: ...

    def device_costs(self, devices: np.ndarray) -> tuple[DeviceCost, ...]:
        """Every device's cost when piece p sits on devices[p] (-1: not placed)."""
        devices = np.asarray(devices)
        return tuple(self.device_cost(np.flatnonzero(devices == d)) for d in range(self.num_devices))

    def single_costs(self) -> np.ndarray:
        return np.array([self.device_cost([p]).total for p in range(len(self.pieces))])

    def new_state(self) -> "DeviceState":
        return RecomputingDeviceState(self)


class AdditivePriced(Priced):
    """A device's cost is the sum of its pieces' costs (with their breakdown where the oracle has one)."""

    additive = True

    def __init__(self, instance: Instance, pieces: Pieces, breakdown: np.ndarray | None = None,
                 costs: np.ndarray | None = None, storage: np.ndarray | None = None):
        super().__init__(instance, pieces, storage)
        self.breakdown = breakdown
        self._costs = breakdown.sum(axis=1) if breakdown is not None else np.asarray(costs, dtype=float)

    @property
    def costs(self) -> np.ndarray:
        return self._costs

    def device_cost(self, members: Sequence[int]) -> DeviceCost:
        members = list(members)
        if self.breakdown is None:
            return DeviceCost(total=float(self._costs[members].sum()))
        return DeviceCost.from_parts(*(float(x) for x in self.breakdown[members].sum(axis=0)))

    def device_costs(self, devices: np.ndarray) -> tuple[DeviceCost, ...]:
        devices = np.asarray(devices, dtype=np.int64)
        placed = devices >= 0
        k = self.num_devices
        if self.breakdown is None:
            loads = np.bincount(devices[placed], weights=self._costs[placed], minlength=k)
            return tuple(DeviceCost(total=float(x)) for x in loads)
        parts = [np.bincount(devices[placed], weights=self.breakdown[placed, j], minlength=k) for j in range(4)]
        return tuple(DeviceCost.from_parts(*(float(parts[j][d]) for j in range(4))) for d in range(k))

    def single_costs(self) -> np.ndarray:
        return self._costs

    def new_state(self) -> "DeviceState":
        return AdditiveDeviceState(self._costs, self.num_devices)


class AdditiveOracle(Oracle):
    """A device's cost is the sum of its pieces' costs. Subclasses give `piece_costs`, or `piece_breakdown`
    (forward/backward compute and communication per piece) when they model time."""

    additive = True

    def piece_costs(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        return self.piece_breakdown(instance, pieces).sum(axis=1)

    def piece_breakdown(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        raise NotImplementedError

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        if self.has_breakdown:
            return AdditivePriced(instance, pieces, breakdown=self.piece_breakdown(instance, pieces))
        return AdditivePriced(instance, pieces, costs=self.piece_costs(instance, pieces))

    def price_device(self, instance: Instance, pieces: Pieces, members: Sequence[int]) -> DeviceCost:
        return self.bind(instance, pieces).device_cost(members)


class RecomputingPriced(Priced):
    """Any oracle: a device's cost is asked of the oracle for the pieces it holds."""

    def __init__(self, oracle: Oracle, instance: Instance, pieces: Pieces):
        super().__init__(instance, pieces)
        self.oracle = oracle

    def device_cost(self, members: Sequence[int]) -> DeviceCost:
        return self.oracle.price_device(self.instance, self.pieces, sorted(int(m) for m in members))


# ---------------------------------------------------------------- incremental device states


class DeviceState(ABC):
    """Which pieces sit on which device, with each device's cost kept current as pieces move."""

    @abstractmethod
    def add(self, piece: int, device: int) -> None: ...

    @abstractmethod
    def remove(self, piece: int, device: int) -> None: ...

    @abstractmethod
    def cost(self, device: int) -> float: ...

    @abstractmethod
    def cost_if_added(self, piece: int, device: int) -> float: ...

    @property
    @abstractmethod
    def num_devices(self) -> int: ...

    def costs(self) -> np.ndarray:
        return np.array([self.cost(d) for d in range(self.num_devices)])

    def costs_if_added(self, piece: int, devices: np.ndarray) -> np.ndarray:
        return np.array([self.cost_if_added(piece, int(d)) for d in devices])

    def add_many(self, pieces: np.ndarray, devices: np.ndarray) -> None:
        for p, d in zip(pieces, devices):
            self.add(int(p), int(d))

    def remove_many(self, pieces: np.ndarray, devices: np.ndarray) -> None:
        for p, d in zip(pieces, devices):
            self.remove(int(p), int(d))

    def costs_with(self, pieces: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """Every device's cost if these pieces were added (nothing changes)."""
        self.add_many(pieces, devices)
        try:
            return self.costs()
        finally:
            self.remove_many(pieces, devices)

    def rows_with(self, pieces: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """For each row of `rows` (a device per piece): every device's cost if the pieces were added on
        that row's devices (nothing changes), rows × devices."""
        return np.array([self.costs_with(pieces, row) for row in rows]).reshape(len(rows), self.num_devices)

    @abstractmethod
    def cost_if_exchanged(self, device: int, out_piece: int | None, in_piece: int | None) -> float:
        """Cost of `device` after taking `out_piece` off it and putting `in_piece` on it (either may be None)."""

    def costs_if_swapped(self, piece: int, device: int, others: np.ndarray, other_devices: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """For each (u, e) in zip(others, other_devices): the costs of `device` and of e after `piece`
        and u trade places."""
        here = np.array([self.cost_if_exchanged(device, piece, int(u)) for u in others])
        there = np.array([self.cost_if_exchanged(int(e), int(u), piece) for u, e in zip(others, other_devices)])
        return here, there


class AdditiveDeviceState(DeviceState):
    def __init__(self, piece_costs: np.ndarray, num_devices: int):
        self.piece_costs = np.asarray(piece_costs, dtype=float)
        self.loads = np.zeros(num_devices)

    @property
    def num_devices(self) -> int:
        return self.loads.size

    def add(self, piece: int, device: int) -> None:
        self.loads[device] += self.piece_costs[piece]

    def remove(self, piece: int, device: int) -> None:
        self.loads[device] -= self.piece_costs[piece]

    def cost(self, device: int) -> float:
        return float(self.loads[device])

    def cost_if_added(self, piece: int, device: int) -> float:
        return float(self.loads[device] + self.piece_costs[piece])

    def costs(self) -> np.ndarray:
        return self.loads.copy()

    def costs_if_added(self, piece: int, devices: np.ndarray) -> np.ndarray:
        return self.loads[devices] + self.piece_costs[piece]

    def cost_if_exchanged(self, device: int, out_piece: int | None, in_piece: int | None) -> float:
        out_cost = 0.0 if out_piece is None else self.piece_costs[out_piece]
        in_cost = 0.0 if in_piece is None else self.piece_costs[in_piece]
        return float(self.loads[device] - out_cost + in_cost)

    def costs_if_swapped(self, piece: int, device: int, others: np.ndarray, other_devices: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        delta = self.piece_costs[others] - self.piece_costs[piece]
        return self.loads[device] + delta, self.loads[other_devices] - delta

    def add_many(self, pieces: np.ndarray, devices: np.ndarray) -> None:
        np.add.at(self.loads, devices, self.piece_costs[pieces])

    def remove_many(self, pieces: np.ndarray, devices: np.ndarray) -> None:
        np.subtract.at(self.loads, devices, self.piece_costs[pieces])

    def costs_with(self, pieces: np.ndarray, devices: np.ndarray) -> np.ndarray:
        return self.loads + np.bincount(devices, weights=self.piece_costs[pieces], minlength=self.loads.size)

    def rows_with(self, pieces: np.ndarray, rows: np.ndarray) -> np.ndarray:
        added = np.zeros((len(rows), self.loads.size))
        np.add.at(added, (np.arange(len(rows))[:, None], rows), self.piece_costs[pieces])
        return self.loads + added


class RecomputingDeviceState(DeviceState):
    """State for any oracle: re-evaluates only the device that changed."""

    def __init__(self, priced: Priced):
        self.priced = priced
        self.members: list[set[int]] = [set() for _ in range(priced.num_devices)]
        self._costs = [priced.device_cost([]).total] * priced.num_devices

    @property
    def num_devices(self) -> int:
        return len(self.members)

    def _refresh(self, device: int) -> None:
        self._costs[device] = self.priced.device_cost(sorted(self.members[device])).total

    def add(self, piece: int, device: int) -> None:
        self.members[device].add(piece)
        self._refresh(device)

    def remove(self, piece: int, device: int) -> None:
        self.members[device].discard(piece)
        self._refresh(device)

    def cost(self, device: int) -> float:
        return self._costs[device]

    def cost_if_added(self, piece: int, device: int) -> float:
        return self.cost_if_exchanged(device, None, piece)

    def cost_if_exchanged(self, device: int, out_piece: int | None, in_piece: int | None) -> float:
        members = (self.members[device] - {out_piece}) | ({in_piece} if in_piece is not None else set())
        return self.priced.device_cost(sorted(members)).total
