"""Cost oracles: one protocol (costmodels.base), registered by name so that solvers and suites can
pick them without knowing what they are."""
from __future__ import annotations

from typing import Callable

from .analytic import AnalyticOracle
from .base import (
    AdditiveOracle,
    DeviceCost,
    DeviceState,
    NotAdditiveError,
    Oracle,
    Priced,
)
from .heuristic import HEURISTIC_COSTS, HeuristicOracle, heuristic_costs


class UnknownOracleError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


_FACTORIES: dict[str, Callable[[], Oracle]] = {
    name: (lambda n=name: HeuristicOracle(n)) for name in HEURISTIC_COSTS
}
_FACTORIES["analytic"] = AnalyticOracle


def _measured() -> Oracle:
    from .measured import (
        MeasuredOracle,  # torch and fbgemm load only when this oracle is asked for
    )
    return MeasuredOracle()


_FACTORIES["measured"] = _measured


def _neural(name: str) -> Callable[[], Oracle]:
    def load() -> Oracle:
        from .neural import load_shipped
        return load_shipped(name)
    return load


for _name in ("neural-autoshard", "neural-dreamshard"):
    _FACTORIES[_name] = _neural(_name)


def register_oracle(name: str, factory: Callable[[], Oracle]) -> None:
    _FACTORIES[name] = factory


def oracle_names() -> list[str]:
    return sorted(_FACTORIES)


def get_oracle(name: str) -> Oracle:
    if name not in _FACTORIES:
        raise UnknownOracleError(f"unknown oracle {name!r}; available: {', '.join(oracle_names())}")
    return _FACTORIES[name]()


__all__ = [
    "AdditiveOracle", "AnalyticOracle", "DeviceCost", "DeviceState", "HEURISTIC_COSTS", "HeuristicOracle", "NotAdditiveError",
    "Oracle", "Priced", "UnknownOracleError", "get_oracle", "heuristic_costs", "oracle_names", "register_oracle",
]
