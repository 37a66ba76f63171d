"""What every solver shares: the result type with an honest status, the time budget, the registry of
solvers with their metadata, and the final check that validates a plan before anyone reports it."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping, Sequence

import numpy as np

from costmodels import Oracle
from instances import Instance, Plan

from .bounds import best_additive_lower_bound

BOUND_MATCH_TOLERANCE = 1e-12  # float summation noise between a bound and an objective of the same tables


class Status(str, Enum):
    OPTIMAL = "optimal"        # proven optimal under the oracle
    FEASIBLE = "feasible"      # a valid plan, optimality not proven
    INFEASIBLE = "infeasible"  # proven: no valid plan exists (reason says why)
    NO_PLAN = "no_plan"        # the solver found no plan (heuristic stuck, or out of time); proves nothing


@dataclass(frozen=True)
class Budget:
    """Wall-clock seconds; `max_rounds` optionally caps a search's iterations so that its result depends
    on the seed alone and not on how fast the machine is."""

    time_limit: float = 10.0
    max_rounds: int | None = None

    def deadline(self) -> float:
        return time.monotonic() + self.time_limit


@dataclass(frozen=True)
class SolveResult:
    status: Status
    assignment: tuple[int, ...] | None = None
    objective: float | None = None
    lower_bound: float | None = None
    reason: str = ""
    stats: Mapping[str, float | int | str] = field(default_factory=dict)

    @property
    def has_plan(self) -> bool:
        return self.assignment is not None


SolveFn = Callable[[Instance, Oracle, Budget, int], SolveResult]


@dataclass(frozen=True)
class SolverInfo:
    name: str
    solve: SolveFn
    description: str
    kinds: tuple[str, ...] = ("placement",)
    exact: bool = False
    needs_additive: bool = False
    stochastic: bool = False


class UnknownSolverError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


class SolverOracleMismatch(ValueError):
    """A solver that needs per-table costs was given an oracle without them."""


_REGISTRY: dict[str, SolverInfo] = {}


def register(name: str, description: str, **meta) -> Callable[[SolveFn], SolveFn]:
    def decorate(fn: SolveFn) -> SolveFn:
        _REGISTRY[name] = SolverInfo(name=name, solve=fn, description=description, **meta)
        return fn
    return decorate


def solver_names() -> list[str]:
    return sorted(_REGISTRY)


def get_solver(name: str) -> SolverInfo:
    if name not in _REGISTRY:
        raise UnknownSolverError(f"unknown solver {name!r}; available: {', '.join(solver_names())}")
    return _REGISTRY[name]


def run_solver(name: str, instance: Instance, oracle: Oracle, budget: Budget, seed: int = 0) -> SolveResult:
    """The one entry point: checks solver/oracle compatibility, and re-validates and re-prices whatever
    plan comes back so that no solver can report a plan or an objective the instance does not support."""
    info = get_solver(name)
    if info.needs_additive and not oracle.additive:
        raise SolverOracleMismatch(f"solver {name!r} needs an additive oracle; {oracle.name!r} is not additive")
    proof = memory_infeasibility(instance) if "placement" in info.kinds else None
    if proof:
        return infeasible(proof)
    result = info.solve(instance, oracle, budget, seed)
    if result.assignment is None:
        return result
    Plan(instance.id, result.assignment).validate(instance)
    objective = oracle.plan_cost(instance, result.assignment)
    if result.lower_bound is not None and result.lower_bound > objective * (1 + 1e-9) + 1e-12:
        raise AssertionError(f"solver {name!r} claims bound {result.lower_bound} above its objective {objective}")
    status, reason = result.status, result.reason
    if status == Status.FEASIBLE and oracle.additive:
        # Any plan that meets a valid lower bound is optimal, whoever found it.
        bound = best_additive_lower_bound(oracle.table_costs(instance), instance.num_devices)
        if objective <= bound * (1 + BOUND_MATCH_TOLERANCE):
            status, reason = Status.OPTIMAL, (reason + "; " if reason else "") + "meets the combinatorial lower bound"
    return SolveResult(status=status, assignment=result.assignment, objective=objective,
                       lower_bound=result.lower_bound, reason=reason, stats=result.stats)


# ---------------------------------------------------------------- memory


def memory_infeasibility(instance: Instance) -> str | None:
    """A proof that no plan fits, from two necessary conditions, or None when neither fires."""
    capacity = instance.topology.memory_bytes
    memory = instance.table_memory()
    for table, need in zip(instance.tables, memory):
        if need > capacity:
            return f"table {table.name} needs {need} B, more than a device's capacity {capacity} B"
    total, room = sum(memory), capacity * instance.num_devices
    if total > room:
        return f"tables need {total} B in all, more than {instance.num_devices} devices × {capacity} B = {room} B"
    return None


class MemoryTracker:
    """Free memory per device while a solver places tables one at a time."""

    def __init__(self, instance: Instance):
        self.need = np.array(instance.table_memory(), dtype=np.int64)
        self.free = np.full(instance.num_devices, instance.topology.memory_bytes, dtype=np.int64)

    def fits(self, table: int) -> np.ndarray:
        return self.free >= self.need[table]

    def place(self, table: int, device: int) -> None:
        self.free[device] -= self.need[table]

    def unplace(self, table: int, device: int) -> None:
        self.free[device] += self.need[table]


def stuck(instance: Instance, table: int, tracker: MemoryTracker) -> SolveResult:
    name = instance.tables[table].name
    return SolveResult(Status.NO_PLAN, reason=(
        f"table {name} ({int(tracker.need[table])} B) fits on no device: the most free memory left is "
        f"{int(tracker.free.max())} B (a heuristic dead end, not a proof of infeasibility)"))


def infeasible(reason: str) -> SolveResult:
    return SolveResult(Status.INFEASIBLE, reason=reason)


def order_by_cost(costs: Sequence[float]) -> np.ndarray:
    """Descending cost, ties by table index, so orders are deterministic."""
    costs = np.asarray(costs, dtype=float)
    return np.lexsort((np.arange(costs.size), -costs))
