"""The four heuristic per-table costs of the papers (DreamShard appendix D.1, AutoShard §5.1), as
additive oracles: size, dim, lookup (dim × pooling factor) and size-lookup (dim × pooling × log10 rows).
A piece of a table costs what its rows, its columns and its share of the lookups make of the same formula.
Pooling factors stay real-valued: truncating them to integers would zero out the 144 sub-1 tables."""
from __future__ import annotations

from typing import Callable

import numpy as np

from instances import Instance
from instances.pieces import Pieces

from .base import AdditiveOracle

# Each cost from (rows, width, lookups per sample) of the pieces.
PieceCost = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

HEURISTIC_COSTS: dict[str, tuple[PieceCost, str]] = {
    "size": (lambda rows, width, lookups: (rows * width).astype(float), "rows × dim (table size in elements)"),
    "dim": (lambda rows, width, lookups: width.astype(float), "embedding dimension (drives all-to-all volume)"),
    "lookup": (lambda rows, width, lookups: width * lookups, "dim × pooling factor (lookup work)"),
    "size-lookup": (lambda rows, width, lookups: width * lookups * np.log10(np.maximum(rows, 1)),
                    "dim × pooling factor × log10(rows)"),
}


def heuristic_piece_costs(instance: Instance, pieces: Pieces, kind: str) -> np.ndarray:
    pooling = np.array([t.pooling_factor for t in instance.tables])[pieces.table]
    return HEURISTIC_COSTS[kind][0](pieces.rows, pieces.width, pooling * pieces.lookup_share(instance))


def heuristic_costs(instance: Instance, kind: str) -> np.ndarray:
    """Per whole table."""
    return heuristic_piece_costs(instance, Pieces.table_wise(instance), kind)


class HeuristicOracle(AdditiveOracle):
    unit = "proxy units"

    def __init__(self, kind: str):
        self.kind = kind
        self.name = kind
        self.description = HEURISTIC_COSTS[kind][1]

    def piece_costs(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        return heuristic_piece_costs(instance, pieces, self.kind)
