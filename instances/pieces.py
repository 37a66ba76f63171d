"""Pieces: the rectangles of tables that devices hold, as arrays (one entry per piece: its table, sharding
type, rows and columns, compute kernel and cache load factor), so that pricing millions of them is vector
arithmetic. A table-wise layout has
one piece per table; a plan's shards become pieces one for one. Oracles price pieces; solvers place them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import DENSE, FUSED, FUSED_UVM, FUSED_UVM_CACHING, KERNEL_CODE, KERNELS
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
    kernel: np.ndarray       # index into instances.kernels.KERNELS
    load_factor: np.ndarray  # the HBM cache's share of the piece's rows (fused_uvm_caching), else 0

    @classmethod
    def of(cls, table, kind, row_start, row_end, col_start, col_end, kernel=None, load_factor=None) -> "Pieces":
        """Without kernels, every piece takes its type's default (HBM) kernel and no cache."""
        arrays = [np.asarray(a, dtype=np.int64) for a in (table, kind, row_start, row_end, col_start, col_end)]
        if kernel is None:
            kernel = np.where(arrays[1] == KIND_CODE[DATA_PARALLEL], KERNEL_CODE[DENSE], KERNEL_CODE[FUSED])
        arrays.append(np.asarray(kernel, dtype=np.int64))
        arrays.append(np.zeros(arrays[0].size) if load_factor is None else np.asarray(load_factor, dtype=float))
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
        rows = [(t, KIND_CODE[sharding.sharding_type], *s.rows, *s.cols, s.device, KERNEL_CODE[sharding.compute_kernel])
                for t, sharding in enumerate(plan.tables) for s in sharding.shards]
        columns = np.array(rows, dtype=np.int64).reshape(-1, 8).T
        load_factor = [sharding.cache_load_factor or 0.0 for sharding in plan.tables for _ in sharding.shards]
        return cls.of(*columns[:6], kernel=columns[7], load_factor=load_factor), columns[6].copy()

    @classmethod
    def concat(cls, parts: list["Pieces"]) -> "Pieces":
        return cls.of(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                        ("table", "kind", "row_start", "row_end", "col_start", "col_end", "kernel", "load_factor")))

    def is_kernel(self, kernel: str) -> np.ndarray:
        return self.kernel == KERNEL_CODE[kernel]

    def kernel_names(self) -> list[tuple[str, float | None]]:
        """Each piece's kernel by name, with its cache's load factor (None but for fused_uvm_caching)."""
        return [(KERNELS[k], float(f) if KERNELS[k] == FUSED_UVM_CACHING else None)
                for k, f in zip(self.kernel.tolist(), self.load_factor.tolist())]

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

    def hit_rates(self, instance: Instance) -> np.ndarray:
        """The share of each piece's lookups its HBM serves: all for a piece in HBM, none for one read over
        UVM, and for a cached piece what its cache of the hottest `load_factor` of its rows serves, by the
        table's access curve (instances.access) — over the piece's own rows where the table ranks its rows
        by frequency, the whole curve where a piece's rows are a uniform slice of the table."""
        from .access import access_curve

        rates = np.where(self.is_kernel(FUSED_UVM), 0.0, 1.0)
        cached = np.flatnonzero(self.is_kernel(FUSED_UVM_CACHING))
        cached = cached[np.argsort(self.table[cached], kind="stable")]
        tables, starts = np.unique(self.table[cached], return_index=True)
        for t, members in zip(tables.tolist(), np.split(cached, starts[1:])):
            table = instance.tables[t]
            curve, factor = access_curve(table), self.load_factor[members].astype(np.float64)
            if table.row_distribution is None:
                rates[members] = curve.hit_rate(factor)
                continue
            start, end = self.row_start[members].astype(np.int64), self.row_end[members].astype(np.int64)
            held = start + np.minimum(end - start, np.ceil(factor * (end - start)).astype(np.int64))
            low, top, high = (curve.hit_rate(edge / table.rows) for edge in (start, held, end))
            rates[members] = np.where(high > low, (top - low) / np.where(high > low, high - low, 1.0), 1.0)
        return rates

    def lookup_share(self, instance: Instance) -> np.ndarray:
        """The share of the table's lookups (over the global batch) each piece serves: its rows' share, and
        for a data-parallel replica only its own device's samples, 1 / devices."""
        share = self.row_share(instance)
        return np.where(self.is_kind(DATA_PARALLEL), share / instance.num_devices, share)

    def storage(self, instance: Instance) -> np.ndarray:
        """What each piece stores in each tier (HBM, host), shape (pieces, 2): `instances.memory.storage`, with
        the input and output buffers where the instance counts them."""
        dtype = np.array([t.dtype_bytes for t in instance.tables], dtype=np.int64)[self.table]
        io = instance.io_bytes(self.table, self.kind, self.rows, self.width)
        return storage(self.rows, self.width, dtype, instance.workload.optimizer, self.kernel, self.load_factor, io)

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
