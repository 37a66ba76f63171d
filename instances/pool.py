"""The embedded DLRM table pool (856 real tables of Meta's synthetic dataset, see data/PROVENANCE.md)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .model import (
    MAX_POOLING,
    MAX_ROWS,
    NUM_REUSE_BINS,
    Table,
    _finite,
    _positive_int,
    _require,
)


@dataclass(frozen=True)
class PoolTable:
    """A pool entry: what the dataset says of a table, before a dimension and dtype are chosen."""

    index: int
    rows: int
    pooling_factor: float
    reuse_bins: tuple[float, ...]

    def as_table(self, dim: int, dtype_bytes: int) -> Table:
        return Table(name=f"dlrm{self.index:03d}", rows=self.rows, dim=dim, dtype_bytes=dtype_bytes,
                     pooling_factor=self.pooling_factor, reuse_bins=self.reuse_bins)


POOL_FIELDS = ("row", "pooling_factor", *(f"bin_{b}" for b in range(NUM_REUSE_BINS)))


def pool_entry_from_record(index: int, record: dict, path: str = "pool") -> PoolTable:
    """One pool record (the dataset's field names), checked field by field; the 17 bins are checked as a
    table's when a task is built from it."""
    where = f"{path}[{index}]"
    _require(isinstance(record, dict), where, "must be a JSON object")
    for key in POOL_FIELDS:
        _require(key in record, f"{where}.{key}", "missing")
    _positive_int(record["row"], f"{where}.row", MAX_ROWS)
    _finite(record["pooling_factor"], f"{where}.pooling_factor", 0.0, maximum=MAX_POOLING)
    for b in range(NUM_REUSE_BINS):
        _finite(record[f"bin_{b}"], f"{where}.bin_{b}", 0.0, maximum=1.0)
    return PoolTable(index=index, rows=record["row"], pooling_factor=float(record["pooling_factor"]),
                     reuse_bins=tuple(float(record[f"bin_{b}"]) for b in range(NUM_REUSE_BINS)))


@lru_cache(maxsize=1)
def dlrm_pool() -> tuple[PoolTable, ...]:
    text = resources.files("instances").joinpath("data/dlrm_t856_tables.json").read_text()
    return tuple(pool_entry_from_record(i, rec) for i, rec in enumerate(json.loads(text)))
