"""The embedded DLRM table pool (856 real tables of Meta's synthetic dataset, see data/PROVENANCE.md)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .model import NUM_REUSE_BINS, Table


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


def pool_entry_from_record(index: int, record: dict) -> PoolTable:
    return PoolTable(index=index, rows=int(record["row"]), pooling_factor=float(record["pooling_factor"]),
                     reuse_bins=tuple(float(record[f"bin_{b}"]) for b in range(NUM_REUSE_BINS)))


@lru_cache(maxsize=1)
def dlrm_pool() -> tuple[PoolTable, ...]:
    text = resources.files("instances").joinpath("data/dlrm_t856_tables.json").read_text()
    return tuple(pool_entry_from_record(i, rec) for i, rec in enumerate(json.loads(text)))
