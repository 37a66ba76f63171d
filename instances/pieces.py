"""Pieces: the rectangles of tables that devices hold, as arrays (one entry per piece: its table, sharding
type, rows and columns), so that pricing millions of them is vector arithmetic. A table-wise layout has
one piece per table; a plan's shards become pieces one for one. Oracles price pieces; solvers place them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .memory import storage
from .model import SHARDING_TYPES, Instance, Table
from .rowdist import row_source
from .sharding import DATA_PARALLEL, Plan

KIND_CODE = {kind: code for code, kind in enumerate(SHARDING_TYPES)}


@dataclass(frozen=True, eq=False)
class Pieces:
    table: np.ndarray       # index into instance.tables
    kind: np.ndarray        # index into SHARDING_TYPES
    row_start: np.ndarray
    row_end: np.ndarray
    col_start: np.ndarray
    col_end: np.ndarray

    @classmethod
    def of(cls, table, kind, row_start, row_end, col_start, col_end) -> "Pieces":
        arrays = [np.asarray(a, dtype=np.int64) for a in (table, kind, row_start, row_end, col_start, col_end)]
        for a in arrays:
            a.flags.writeable = False
        return cls(*arrays)

    @classmethod
    def table_wise(cls, instance: Instance) -> "Pieces":
        n = instance.num_tables
        return cls.of(np.arange(n), np.full(n, KIND_CODE["table_wise"]), np.zeros(n),
                      [t.rows for t in instance.tables], np.zeros(n), [t.dim for t in instance.tables])

    @classmethod
    def of_plan(cls, instance: Instance, plan: Plan) -> tuple["Pieces", np.ndarray]:
        """The plan's shards as pieces, with the device of each."""
        rows = [(t, KIND_CODE[sharding.sharding_type], *s.rows, *s.cols, s.device)
                for t, sharding in enumerate(plan.tables) for s in sharding.shards]
        columns = np.array(rows, dtype=np.int64).reshape(-1, 7).T
        return cls.of(*columns[:6]), columns[6].copy()

    @classmethod
    def concat(cls, parts: list["Pieces"]) -> "Pieces":
        return cls.of(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                        ("table", "kind", "row_start", "row_end", "col_start", "col_end")))

    def __len__(self) -> int:
        return int(self.table.size)

    @property
    def rows(self) -> np.ndarray:
        return self.row_end - self.row_start

    @property
    def width(self) -> np.ndarray:
        return self.col_end - self.col_start

    def is_kind(self, kind: str) -> np.ndarray:
        return self.kind == KIND_CODE[kind]

    def row_share(self, instance: Instance) -> np.ndarray:
        """The share of the table's lookups that hit each piece's rows: from the table's row distribution
        (rows indexed in descending access frequency) where it has one, in proportion to rows otherwise."""
        tables = instance.tables
        total_rows = np.array([t.rows for t in tables], dtype=float)[self.table]
        share = self.rows / total_rows
        for t in np.unique(self.table):
            if tables[t].row_distribution is None:
                continue
            source = row_source(tables[t])
            mass = float(source.mass([0], [tables[t].rows])[0])
            members = np.flatnonzero(self.table == t)
            share[members] = source.mass(self.row_start[members], self.row_end[members]) / mass if mass > 0 else 0.0
        return share

    def lookup_share(self, instance: Instance) -> np.ndarray:
        """The share of the table's lookups (over the global batch) each piece serves: its rows' share, and
        for a data-parallel replica only its own device's samples, 1 / devices."""
        share = self.row_share(instance)
        return np.where(self.is_kind(DATA_PARALLEL), share / instance.num_devices, share)

    def storage(self, instance: Instance) -> np.ndarray:
        """What each piece stores in each tier (HBM, host), shape (pieces, 2): `instances.memory.storage`."""
        dtype = np.array([t.dtype_bytes for t in instance.tables], dtype=np.int64)[self.table]
        return storage(self.rows, self.width, dtype, instance.workload.optimizer)

    def as_tables(self, instance: Instance) -> list[Table]:
        """Each piece as the table it is to a device: its rows, its columns, its share of the lookups (as
        pooling per sample of the batch), the table's reuse bins."""
        from dataclasses import replace

        share = self.lookup_share(instance)
        rows, width = self.rows.tolist(), self.width.tolist()
        out = []
        for p, t in enumerate(self.table.tolist()):
            table = instance.tables[t]
            out.append(replace(table, name=f"{table.name}#{p}", rows=max(1, rows[p]), dim=width[p],
                               pooling_factor=table.pooling_factor * float(share[p]), row_distribution=None,
                               buckets=None, sharding_types=None))
        return out
