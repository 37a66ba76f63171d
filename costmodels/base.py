"""The cost-oracle protocol: the per-device cost breakdown of a plan, an additive per-table fast path
for exact solvers, and an incremental device state for greedy, local search and RL."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from instances import Instance


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
    """Raised when a solver asks a non-additive oracle for per-table costs."""


class Oracle(ABC):
    """Judges plans. A device's cost depends only on the tables placed on it."""

    name: str = ""
    description: str = ""
    unit: str = ""
    additive: bool = False
    has_breakdown: bool = False

    @abstractmethod
    def device_cost(self, instance: Instance, tables: Sequence[int]) -> DeviceCost:
        """Cost of one device holding `tables` (indices into instance.tables)."""

    def device_costs(self, instance: Instance, assignment: Sequence[int]) -> tuple[DeviceCost, ...]:
        groups: list[list[int]] = [[] for _ in range(instance.num_devices)]
        for table, device in enumerate(assignment):
            groups[device].append(table)
        return tuple(self.device_cost(instance, g) for g in groups)

    def plan_cost(self, instance: Instance, assignment: Sequence[int]) -> float:
        return max(c.total for c in self.device_costs(instance, assignment))

    def table_costs(self, instance: Instance) -> np.ndarray:
        """Per-table costs whose sum is a device's cost; only additive oracles have them."""
        raise NotAdditiveError(f"oracle {self.name!r} is not additive: it has no per-table costs")

    def single_table_costs(self, instance: Instance) -> np.ndarray:
        """Each table's cost alone on a device (what greedy orders sort by)."""
        return np.array([self.device_cost(instance, [t]).total for t in range(instance.num_tables)])

    def new_state(self, instance: Instance) -> "DeviceState":
        return RecomputingDeviceState(self, instance)


class AdditiveOracle(Oracle):
    """A device's cost is the sum of its tables' costs."""

    additive = True

    @abstractmethod
    def table_costs(self, instance: Instance) -> np.ndarray: ...

    def device_cost(self, instance: Instance, tables: Sequence[int]) -> DeviceCost:
        return DeviceCost(total=float(self.table_costs(instance)[list(tables)].sum()))

    def device_costs(self, instance: Instance, assignment: Sequence[int]) -> tuple[DeviceCost, ...]:
        loads = np.bincount(np.asarray(assignment, dtype=np.int64), weights=self.table_costs(instance),
                            minlength=instance.num_devices)
        return tuple(DeviceCost(total=float(x)) for x in loads)

    def single_table_costs(self, instance: Instance) -> np.ndarray:
        return self.table_costs(instance)

    def new_state(self, instance: Instance) -> "DeviceState":
        return AdditiveDeviceState(self.table_costs(instance), instance.num_devices)


class DeviceState(ABC):
    """Which tables sit on which device, with each device's cost kept current as tables move."""

    @abstractmethod
    def add(self, table: int, device: int) -> None: ...

    @abstractmethod
    def remove(self, table: int, device: int) -> None: ...

    @abstractmethod
    def cost(self, device: int) -> float: ...

    @abstractmethod
    def cost_if_added(self, table: int, device: int) -> float: ...

    @property
    @abstractmethod
    def num_devices(self) -> int: ...

    def costs(self) -> np.ndarray:
        return np.array([self.cost(d) for d in range(self.num_devices)])

    def costs_if_added(self, table: int, devices: np.ndarray) -> np.ndarray:
        return np.array([self.cost_if_added(table, int(d)) for d in devices])

    @abstractmethod
    def cost_if_exchanged(self, device: int, out_table: int | None, in_table: int | None) -> float:
        """Cost of `device` after taking `out_table` off it and putting `in_table` on it (either may be None)."""

    def costs_if_swapped(self, table: int, device: int, others: np.ndarray, other_devices: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """For each (u, e) in zip(others, other_devices): the costs of `device` and of e after `table`
        and u trade places."""
        here = np.array([self.cost_if_exchanged(device, table, int(u)) for u in others])
        there = np.array([self.cost_if_exchanged(int(e), int(u), table) for u, e in zip(others, other_devices)])
        return here, there


class AdditiveDeviceState(DeviceState):
    def __init__(self, table_costs: np.ndarray, num_devices: int):
        self.table_costs = np.asarray(table_costs, dtype=float)
        self.loads = np.zeros(num_devices)

    @property
    def num_devices(self) -> int:
        return self.loads.size

    def add(self, table: int, device: int) -> None:
        self.loads[device] += self.table_costs[table]

    def remove(self, table: int, device: int) -> None:
        self.loads[device] -= self.table_costs[table]

    def cost(self, device: int) -> float:
        return float(self.loads[device])

    def cost_if_added(self, table: int, device: int) -> float:
        return float(self.loads[device] + self.table_costs[table])

    def costs(self) -> np.ndarray:
        return self.loads.copy()

    def costs_if_added(self, table: int, devices: np.ndarray) -> np.ndarray:
        return self.loads[devices] + self.table_costs[table]

    def cost_if_exchanged(self, device: int, out_table: int | None, in_table: int | None) -> float:
        out_cost = 0.0 if out_table is None else self.table_costs[out_table]
        in_cost = 0.0 if in_table is None else self.table_costs[in_table]
        return float(self.loads[device] - out_cost + in_cost)

    def costs_if_swapped(self, table: int, device: int, others: np.ndarray, other_devices: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        delta = self.table_costs[others] - self.table_costs[table]
        return self.loads[device] + delta, self.loads[other_devices] - delta


class RecomputingDeviceState(DeviceState):
    """Generic state for any oracle: re-evaluates only the device that changed."""

    def __init__(self, oracle: Oracle, instance: Instance):
        self.oracle, self.instance = oracle, instance
        self.tables: list[set[int]] = [set() for _ in range(instance.num_devices)]
        self._costs = [oracle.device_cost(instance, []).total] * instance.num_devices

    @property
    def num_devices(self) -> int:
        return len(self.tables)

    def _refresh(self, device: int) -> None:
        self._costs[device] = self.oracle.device_cost(self.instance, sorted(self.tables[device])).total

    def add(self, table: int, device: int) -> None:
        self.tables[device].add(table)
        self._refresh(device)

    def remove(self, table: int, device: int) -> None:
        self.tables[device].discard(table)
        self._refresh(device)

    def cost(self, device: int) -> float:
        return self._costs[device]

    def cost_if_added(self, table: int, device: int) -> float:
        return self.cost_if_exchanged(device, None, table)

    def cost_if_exchanged(self, device: int, out_table: int | None, in_table: int | None) -> float:
        tables = (self.tables[device] - {out_table}) | ({in_table} if in_table is not None else set())
        return self.oracle.device_cost(self.instance, sorted(tables)).total
