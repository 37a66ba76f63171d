"""Cost oracles: one protocol (costmodels.base), registered by name so that solvers and suites can
pick them without knowing what they are."""
from __future__ import annotations

from typing import Callable

from .base import AdditiveOracle, DeviceCost, DeviceState, NotAdditiveError, Oracle
from .heuristic import HEURISTIC_COSTS, HeuristicOracle, heuristic_costs


class UnknownOracleError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


_FACTORIES: dict[str, Callable[[], Oracle]] = {
    name: (lambda n=name: HeuristicOracle(n)) for name in HEURISTIC_COSTS
}


def register_oracle(name: str, factory: Callable[[], Oracle]) -> None:
    _FACTORIES[name] = factory


def oracle_names() -> list[str]:
    return sorted(_FACTORIES)


def get_oracle(name: str) -> Oracle:
    if name not in _FACTORIES:
        raise UnknownOracleError(f"unknown oracle {name!r}; available: {', '.join(oracle_names())}")
    return _FACTORIES[name]()


__all__ = [
    "AdditiveOracle", "DeviceCost", "DeviceState", "HEURISTIC_COSTS", "HeuristicOracle", "NotAdditiveError",
    "Oracle", "UnknownOracleError", "get_oracle", "heuristic_costs", "oracle_names", "register_oracle",
]
