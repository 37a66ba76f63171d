"""Sharding options: every way a table may be cut under the instance's allowed sharding types, and the
pieces each option puts on devices. This is the one place that knows the types' rules:
- table_wise: one free piece (the solver picks its device);
- column_wise: c equal column blocks (c = 2, 4, 8, ... while widths stay multiples of 4 and c fits the
  devices), each a free piece;
- row_wise: TorchRec's row cut over all K devices, piece d pinned to device d;
- table_row_wise: TorchRec's row cut over the W devices of one node, piece i pinned to local rank i of
  the node the solver picks;
- data_parallel: a full replica pinned to every device;
- table_column_wise: the column blocks of column-wise, every one on a device of the node the solver picks;
- grid_shard: TorchRec's column blocks, each cut by rows over the W devices of a node the solver picks for
  that block (piece i of a block pinned to local rank i).
Options that are the same plan as a cheaper type (row-wise or data-parallel on one device, table-row-wise
with one device per node) are not enumerated. The piece counts come from `model.option_parts`, which
instance validation asks too, so that a valid instance gives every table an option."""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .kernels import FUSED, FUSED_UVM_CACHING, KERNEL_CODE, default_kernel, load_factor_choices
from .model import SHARDING_TYPES, Instance, option_parts
from .pieces import KIND_CODE, Pieces
from .sharding import (
    COLUMN_BLOCKS,
    COLUMN_WISE,
    DATA_PARALLEL,
    GRID_SHARD,
    ROW_WISE,
    TABLE_COLUMN_WISE,
    TABLE_ROW_WISE,
    TABLE_WISE,
    Plan,
    Shard,
    TableSharding,
)

# How an option's pieces get their devices: each its own (free), fixed ones (pinned), a node's local ranks
# (node), any devices of one node (node_free), a node's local ranks for each column block (grid).
FREE, PINNED, NODE, NODE_FREE, GRID = "free", "pinned", "node", "node_free", "grid"
_PLACEMENT = {TABLE_WISE: FREE, COLUMN_WISE: FREE, TABLE_ROW_WISE: NODE, TABLE_COLUMN_WISE: NODE_FREE,
              GRID_SHARD: GRID}


@dataclass(frozen=True)
class Option:
    """A table cut by `sharding_type` into `parts` pieces, served by `kernel` (with an HBM cache of
    `load_factor` of its rows for fused_uvm_caching)."""

    table: int
    sharding_type: str
    parts: int
    kernel: str = FUSED
    load_factor: float | None = None

    @property
    def placement(self) -> str:
        return _PLACEMENT.get(self.sharding_type, PINNED)

    @property
    def label(self) -> str:
        cut = f"{self.sharding_type}×{self.parts}" if self.sharding_type in COLUMN_BLOCKS else self.sharding_type
        if self.kernel == default_kernel(self.sharding_type):
            return cut
        return f"{cut} {self.kernel}" + (f"@{self.load_factor:g}" if self.load_factor is not None else "")


def kernel_choices(instance: Instance, table_index: int, sharding_type: str,
                   extra: tuple[float, ...] = ()) -> list[tuple[str, float | None]]:
    """(kernel, load factor) pairs a table may take under a sharding type: each allowed kernel, a cached one
    at each of the table's load factors (the grid, the bends of its access curve and any `extra` ones)."""
    from .access import access_curve

    table = instance.tables[table_index]
    choices: list[tuple[str, float | None]] = []
    for kernel in instance.allowed_kernels(table, sharding_type):
        if kernel == FUSED_UVM_CACHING:
            fixed = table.cache_load_factor
            factors = (fixed,) if fixed is not None else load_factor_choices((*access_curve(table).bends(), *extra))
            choices += [(kernel, f) for f in factors]
        else:
            choices.append((kernel, None))
    return choices


def enumerate_options(instance: Instance, load_factors: Mapping[int, tuple[float, ...]] | None = None) -> list[Option]:
    """Every option of every table, tables in order, table-wise first where allowed, then each cut with
    each kernel (HBM first); a table in `load_factors` offers its cache those load factors too."""
    options = []
    extra = load_factors or {}
    for t, table in enumerate(instance.tables):
        allowed = instance.allowed_types(table)
        options += [Option(t, kind, parts, kernel, load_factor) for kind in SHARDING_TYPES if kind in allowed
                    for parts in option_parts(kind, table.dim, instance.topology)
                    for kernel, load_factor in kernel_choices(instance, t, kind, extra.get(t, ()))]
    return options


def _row_ranges(rows: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """TorchRec's row cut (instances.sharding.row_cuts), vectorised."""
    block = -(-rows // parts)
    starts = np.minimum(block * np.arange(parts, dtype=np.int64), rows)
    return starts, np.minimum(starts + block, rows)


@dataclass(frozen=True, eq=False)
class OptionPieces:
    """The pieces of many options side by side: `option[p]` is the index of piece p's option, `pin[p]`
    its device (pinned pieces), local rank in the node (node and grid pieces) or -1 (free and node_free
    pieces), `block[p]` its column block in a grid (0 elsewhere); option o's pieces are first[o] ..
    first[o] + options[o].parts - 1 (a grid's block by block)."""

    options: tuple[Option, ...]
    pieces: Pieces
    option: np.ndarray
    pin: np.ndarray
    first: np.ndarray
    block: np.ndarray

    @classmethod
    def build(cls, instance: Instance, options: list[Option]) -> "OptionPieces":
        columns: list[list[np.ndarray]] = [[] for _ in range(8)]
        kernels, load_factors, blocks = [], [], []
        per_node = instance.topology.devices_per_node
        for o, option in enumerate(options):
            table = instance.tables[option.table]
            n = option.parts
            rows, dim = table.rows, table.dim
            full_rows = (np.zeros(n, dtype=np.int64), np.full(n, rows, dtype=np.int64))
            full_cols = (np.zeros(n, dtype=np.int64), np.full(n, dim, dtype=np.int64))
            block = np.zeros(n, dtype=np.int64)
            if option.sharding_type in COLUMN_BLOCKS:
                width = dim // n
                starts = width * np.arange(n, dtype=np.int64)
                row_range, col_range, pin = full_rows, (starts, starts + width), np.full(n, -1)
            elif option.sharding_type == GRID_SHARD:  # block by block, each TorchRec's row cut over a node
                count = n // per_node
                width = dim // count
                block = np.repeat(np.arange(count, dtype=np.int64), per_node)
                starts, ends = _row_ranges(rows, per_node)
                row_range = (np.tile(starts, count), np.tile(ends, count))
                col_range, pin = (block * width, (block + 1) * width), np.tile(np.arange(per_node), count)
            elif option.sharding_type in (ROW_WISE, TABLE_ROW_WISE):
                row_range, col_range, pin = _row_ranges(rows, n), full_cols, np.arange(n)
            else:
                pin = np.arange(n) if option.sharding_type == DATA_PARALLEL else np.full(n, -1)
                row_range, col_range = full_rows, full_cols
            for column, values in zip(columns, (np.full(n, option.table), np.full(n, KIND_CODE[option.sharding_type]),
                                                *row_range, *col_range, np.full(n, o), pin)):
                column.append(np.asarray(values, dtype=np.int64))
            kernels.append(np.full(n, KERNEL_CODE[option.kernel]))
            load_factors.append(np.full(n, option.load_factor or 0.0))
            blocks.append(block)
        arrays = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in columns]
        counts = np.array([o.parts for o in options], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]) if options else np.zeros(0, dtype=np.int64)
        kernel = np.concatenate(kernels) if kernels else np.zeros(0, dtype=np.int64)
        load_factor = np.concatenate(load_factors) if load_factors else np.zeros(0)
        block = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
        return cls(tuple(options), Pieces.of(*arrays[:6], kernel=kernel, load_factor=load_factor), arrays[6],
                   arrays[7], first, block)

    def members(self, o: int) -> np.ndarray:
        return np.arange(self.first[o], self.first[o] + self.options[o].parts)

    def devices(self, o: int, free_devices=None, node=None, per_node: int = 1) -> np.ndarray:
        """The devices of option o's pieces, given the devices of free and node_free pieces, or the node (one
        per column block for a grid)."""
        option = self.options[o]
        if option.placement in (FREE, NODE_FREE):
            return np.asarray(free_devices, dtype=np.int64)
        members = self.members(o)
        pins = self.pin[members]
        if option.placement == PINNED:
            return pins
        if option.placement == GRID:
            return np.asarray(node, dtype=np.int64)[self.block[members]] * per_node + pins
        return node * per_node + pins


def plan_from_choice(instance: Instance, options: OptionPieces, chosen: list[int], devices: np.ndarray) -> Plan:
    """The plan that gives table t its option chosen[t], piece p of it on devices[p]."""
    tables = []
    pieces = options.pieces
    # The chosen pieces' fields as Python ints at once: converting numpy scalars piece by piece dominated
    # at 700,000 pieces.
    parts = [options.options[o].parts for o in chosen]
    members = np.concatenate([np.zeros(0, dtype=np.int64), *(options.members(o) for o in chosen)])
    fields = zip(*(np.asarray(values)[members].tolist() for values in
                   (devices, pieces.row_start, pieces.row_end, pieces.col_start, pieces.col_end)))
    for t, (o, count) in enumerate(zip(chosen, parts)):
        option = options.options[o]
        if option.table != t:
            raise ValueError(f"option {o} belongs to table {option.table}, not {t}")
        shards = tuple(Shard(device, (r0, r1), (c0, c1)) for device, r0, r1, c0, c1 in itertools.islice(fields, count))
        tables.append(TableSharding(option.sharding_type, shards, option.kernel, option.load_factor))
    return Plan(instance.id, tuple(tables))
