"""Cost oracles: one protocol (costmodels.base), registered by name so that solvers and suites can
pick them without knowing what they are; the registry resolves each name only when it is asked for."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

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


@dataclass(frozen=True)
class OracleEntry:
    """Where an oracle lives, by name: its class ("module:Class", whose attributes state its capabilities
    once — additive, prices_tiers, costly), and the factory that builds it ("module:function" called with
    `args`; None: the class itself). Entries are resolved only when asked for, so an oracle whose module
    sits above this package (TorchRec's estimator, in interop) or loads a library is found whatever was
    imported before, and its capabilities are read without building it."""

    cls: str
    factory: str | None = None
    args: tuple = ()


def _resolve(path: str):
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


_ENTRIES: dict[str, OracleEntry] = {
    **{name: OracleEntry("costmodels.heuristic:HeuristicOracle", args=(name,)) for name in HEURISTIC_COSTS},
    "analytic": OracleEntry("costmodels.analytic:AnalyticOracle"),
    "measured": OracleEntry("costmodels.measured:MeasuredOracle"),
    **{name: OracleEntry("costmodels.neural:NeuralOracle", "costmodels.neural:load_shipped", (name,))
       for name in ("neural-autoshard", "neural-dreamshard", "neural-autoshard-h200", "neural-dreamshard-h200")},
    "torchrec": OracleEntry("interop.oracle:TorchRecOracle"),
}


def register_oracle(name: str, entry: OracleEntry) -> None:
    """Adds (or replaces) an oracle under `name`."""
    _ENTRIES[name] = entry


def _entry(name: str) -> OracleEntry:
    if name not in _ENTRIES:
        raise UnknownOracleError(f"unknown oracle {name!r}; available: {', '.join(oracle_names())}")
    return _ENTRIES[name]


def oracle_class(name: str) -> type[Oracle]:
    """The oracle's class, whose attributes state what it can do; importing it builds nothing."""
    return _resolve(_entry(name).cls)


def is_costly(name: str) -> bool:
    """Building this oracle loads libraries or weights (seconds): ask `oracle_is_additive` instead."""
    return oracle_class(name).costly


def oracle_is_additive(name: str) -> bool:
    return oracle_class(name).additive


def oracle_prices_tiers(name: str) -> bool:
    """Whether the oracle prices pieces kept in host memory by their kernel."""
    return oracle_class(name).prices_tiers


def oracle_names() -> list[str]:
    return sorted(_ENTRIES)


def get_oracle(name: str) -> Oracle:
    entry = _entry(name)
    return _resolve(entry.factory or entry.cls)(*entry.args)


__all__ = [
    "AdditiveOracle", "AnalyticOracle", "DeviceCost", "DeviceState", "HEURISTIC_COSTS", "HeuristicOracle", "NotAdditiveError",
    "Oracle", "OracleEntry", "Priced", "UnknownOracleError", "get_oracle", "heuristic_costs", "is_costly",
    "oracle_class", "oracle_is_additive", "oracle_names", "oracle_prices_tiers", "register_oracle",
]
