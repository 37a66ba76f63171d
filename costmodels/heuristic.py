"""The four heuristic per-table costs of the papers (DreamShard appendix D.1, AutoShard §5.1), as
additive oracles: size, dim, lookup (dim × pooling factor) and size-lookup (dim × pooling × log10 rows).
Pooling factors stay real-valued: truncating them to integers would zero out the 144 sub-1 tables."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from instances import Instance, Table

from .base import AdditiveOracle

TableCost = Callable[[Table], float]

HEURISTIC_COSTS: dict[str, tuple[TableCost, str]] = {
    "size": (lambda t: float(t.rows * t.dim), "rows × dim (table size in elements)"),
    "dim": (lambda t: float(t.dim), "embedding dimension (drives all-to-all volume)"),
    "lookup": (lambda t: t.dim * t.pooling_factor, "dim × pooling factor (lookup work)"),
    "size-lookup": (lambda t: t.dim * t.pooling_factor * math.log10(t.rows), "dim × pooling factor × log10(rows)"),
}


def heuristic_costs(instance: Instance, kind: str) -> np.ndarray:
    cost = HEURISTIC_COSTS[kind][0]
    return np.array([cost(t) for t in instance.tables], dtype=float)


class HeuristicOracle(AdditiveOracle):
    unit = "proxy units"

    def __init__(self, kind: str):
        self.kind = kind
        self.name = kind
        self.description = HEURISTIC_COSTS[kind][1]

    def table_costs(self, instance: Instance) -> np.ndarray:
        return heuristic_costs(instance, self.kind)
