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

# Oracles that are slow to build (they load torch, weights or another library): whether they are additive
# and whether they price host-memory kernels, known without building them, so that a question about them
# can be answered quickly. The measured oracle times HBM kernels on this machine's device; the neural
# ones learned from those timings.
_COSTLY_ADDITIVE: dict[str, bool] = {"measured": False, "neural-autoshard": False, "neural-dreamshard": False}
_COSTLY_TIERS: dict[str, bool] = {"measured": False, "neural-autoshard": False, "neural-dreamshard": False}


def register_oracle(name: str, factory: Callable[[], Oracle], costly_additive: bool | None = None,
                    costly_tiers: bool = False) -> None:
    """`costly_additive`: for an oracle that is slow to build, whether it is additive; `costly_tiers`,
    whether it prices host-memory kernels."""
    _FACTORIES[name] = factory
    if costly_additive is not None:
        _COSTLY_ADDITIVE[name] = costly_additive
        _COSTLY_TIERS[name] = costly_tiers


def is_costly(name: str) -> bool:
    """Building this oracle loads libraries or weights (seconds): ask `oracle_is_additive` instead."""
    return name in _COSTLY_ADDITIVE


def oracle_is_additive(name: str) -> bool:
    if name in _COSTLY_ADDITIVE:
        return _COSTLY_ADDITIVE[name]
    return get_oracle(name).additive


def oracle_prices_tiers(name: str) -> bool:
    """Whether the oracle prices pieces kept in host memory by their kernel."""
    if name in _COSTLY_TIERS:
        return _COSTLY_TIERS[name]
    return get_oracle(name).prices_tiers


def oracle_names() -> list[str]:
    return sorted(_FACTORIES)


def get_oracle(name: str) -> Oracle:
    if name not in _FACTORIES:
        raise UnknownOracleError(f"unknown oracle {name!r}; available: {', '.join(oracle_names())}")
    return _FACTORIES[name]()


__all__ = [
    "AdditiveOracle", "AnalyticOracle", "DeviceCost", "DeviceState", "HEURISTIC_COSTS", "HeuristicOracle", "NotAdditiveError",
    "Oracle", "Priced", "UnknownOracleError", "get_oracle", "heuristic_costs", "is_costly", "oracle_is_additive",
    "oracle_names", "oracle_prices_tiers", "register_oracle",
]
