"""The shared instance format: immutable tables, topology, workload, instances and placement plans,
with validation that names the offending field, and JSON (de)serialisation with a schema version."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .kernels import FUSED_UVM_CACHING, HOST_KERNELS, KERNELS, kernels_for
from .memory import Storage, format_sizes, io_bytes, storage, stored_bytes
# 2 added host memory and compute kernels, 3 each table's inputs (pooling factor per feature) and weights;
# files of versions 1 and 2 still load.
SCHEMA_VERSION = 3
NUM_REUSE_BINS = 17
BINS_TOLERANCE = 1e-6
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
ROW_DISTRIBUTION_KINDS = ("power_law", "empirical")
BUCKET_MAPPINGS = ("interleave", "chunk")
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
# TorchRec's meanings: a whole table on one device; column blocks, each on any device; rows split over all
# devices; rows split over the devices of one node; a full replica on every device; column blocks, each on a
# device of one node; column blocks, each split by rows over the devices of a node of its own (a grid).
SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel", "table_column_wise",
                  "grid_shard")
# What an instance allows unless it says otherwise: every type TorchRec's enumerator offers by default (it
# offers grid_shard only where constraints name it). Files of schema 1 and 2 knew the first five.
DEFAULT_SHARDING_TYPES = SHARDING_TYPES[:6]
LEGACY_SHARDING_TYPES = SHARDING_TYPES[:5]
COLUMN_ALIGNMENT = 4  # column shard widths are multiples of this (TorchRec's rule for column-wise blocks)
# The types whose shards split a table's rows: over every device (row-wise), then over a node's (the rest).
ROW_SPLIT_CODES = (SHARDING_TYPES.index("row_wise"), SHARDING_TYPES.index("table_row_wise"),
                   SHARDING_TYPES.index("grid_shard"))
MIN_COLUMN_BLOCK = 128  # TorchRec's MIN_CW_DIM: its column cut's smallest block where nothing sets one
# Ranges far beyond any real model, chosen so that every byte count and cost stays exact in int64 / finite
# in float64 (a table's memory is at most 2^40 rows × 2^15 dims × 12 B < 2^59; an instance's total is
# checked against MAX_TOTAL_BYTES).
MAX_ROWS = 2**40
MAX_DIM = 2**15
MAX_POOLING = 1e6
MAX_DEVICES_PER_AXIS = 2**16
# What one machine plans: a row-wise or data-parallel option puts a piece of its table on every device,
# and options, pricing and solver state hold arrays over pieces — measured, split-greedy on 64 tables ×
# 65,536 devices (2^22 table-device pairs) peaks at 2.7 GB (~650 B a pair). Beyond these a solve runs out
# of memory (65,536 × 65,536 devices asked 32 GiB of `solve`) instead of saying why.
MAX_DEVICES = 2**16
MAX_TABLE_DEVICE_CELLS = 2**22
MAX_MEMORY_BYTES = 2**56
MAX_TOTAL_BYTES = 2**62
MAX_BATCH = 2**31
MAX_BUCKETS = 2**20  # `buckets` holds a few arrays over buckets and, for interleave, 64 rows per bucket
BANDWIDTH_RANGE = (1.0, 1e18)  # bytes per second
MAX_ALPHA = 100.0  # a power law this steep already puts every access on the first row


class InstanceError(ValueError):
    """Bad input: `field` is the dotted path of the offending value, `reason` says what is wrong."""

    def __init__(self, field_path: str, reason: str):
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


class PlanError(ValueError):
    """A plan that does not fit its instance (tables missing, device out of range, memory exceeded)."""


def _require(condition: bool, field_path: str, reason: str) -> None:
    if not condition:
        raise InstanceError(field_path, reason)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _positive_int(value: Any, path: str, maximum: int | None = None) -> int:
    _require(_is_int(value), path, f"must be an integer, got {_short(value)}")
    _require(value > 0, path, f"must be > 0, got {value}")
    if maximum is not None:
        _require(value <= maximum, path, f"must be <= {maximum}, got {_short(value)}")
    return value


def _finite(value: Any, path: str, minimum: float | None = None, strict: bool = False,
            maximum: float | None = None) -> float:
    _require(_is_number(value), path, f"must be a finite number, got {_short(value)}")
    if minimum is not None:
        ok = value > minimum if strict else value >= minimum
        _require(ok, path, f"must be {'>' if strict else '>='} {minimum}, got {value}")
    if maximum is not None:
        _require(value <= maximum, path, f"must be <= {maximum:g}, got {_short(value)}")
    return float(value)


def _string(value: Any, path: str, empty_ok: bool = False) -> str:
    _require(isinstance(value, str), path, f"must be a string, got {_short(value)}")
    _require(empty_ok or value != "", path, "must be a non-empty string")
    return value


@dataclass(frozen=True)
class RowDistribution:
    """Per-row access probabilities of a table, compactly: a power law p_i ∝ i^-alpha over the rows in
    descending frequency, or an explicit empirical list of per-row probabilities (descending not required)."""

    kind: str
    alpha: float | None = None
    probabilities: tuple[float, ...] | None = None

    def validate(self, path: str) -> None:
        _require(self.kind in ROW_DISTRIBUTION_KINDS, f"{path}.kind",
                 f"must be one of {ROW_DISTRIBUTION_KINDS}, got {self.kind!r}")
        if self.kind == "power_law":
            _finite(self.alpha, f"{path}.alpha", 0.0, maximum=MAX_ALPHA)
            _require(self.probabilities is None, f"{path}.probabilities", "not allowed for power_law")
        else:
            _require(self.probabilities is not None and len(self.probabilities) > 0,
                     f"{path}.probabilities", "required and non-empty for an empirical distribution")
            for i, p in enumerate(self.probabilities):
                _finite(p, f"{path}.probabilities[{i}]", 0.0)
                _require(p <= 1.0, f"{path}.probabilities[{i}]", f"a probability must be <= 1, got {p}")
            _require(sum(self.probabilities) > 0, f"{path}.probabilities", "must not be all zero")


@dataclass(frozen=True)
class BucketSpec:
    """How a collision-free table's ids map to buckets (RFC): `count` buckets, interleave or chunk."""

    count: int
    mapping: str
    rows_per_bucket: int | None = None

    def validate(self, path: str) -> None:
        _positive_int(self.count, f"{path}.count", MAX_BUCKETS)
        _require(self.mapping in BUCKET_MAPPINGS, f"{path}.mapping",
                 f"must be one of {BUCKET_MAPPINGS}, got {self.mapping!r}")
        if self.rows_per_bucket is not None:
            _positive_int(self.rows_per_bucket, f"{path}.rows_per_bucket", MAX_ROWS)


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    dtype_bytes: int
    pooling_factor: float
    reuse_bins: tuple[float, ...]
    pooled: bool = True
    row_distribution: RowDistribution | None = None
    buckets: BucketSpec | None = None
    sharding_types: tuple[str, ...] | None = None  # the types this table allows (None: the instance's)
    compute_kernels: tuple[str, ...] | None = None  # the kernels this table allows (None: the instance's)
    cache_load_factor: float | None = None  # a cache size fixed by the user (None: chosen per table)
    # The table's inputs, as TorchRec's `pooling_factors`: each feature it serves looks up this many rows per
    # sample on average and gets its own pooled output; they add up to `pooling_factor` (None: one input).
    pooling_factors: tuple[float, ...] | None = None
    weighted: bool = False  # its ids come with per-sample weights (weighted features, a feature processor)

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.dim * self.dtype_bytes

    @property
    def inputs(self) -> tuple[float, ...]:
        """Each input's mean lookups per sample."""
        return self.pooling_factors if self.pooling_factors is not None else (self.pooling_factor,)

    @classmethod
    def of_inputs(cls, pooling_factors, **fields) -> "Table":
        """A table whose inputs look up `pooling_factors` rows per sample each (its pooling factor their sum)."""
        factors = tuple(float(f) for f in pooling_factors)
        return cls(pooling_factor=math.fsum(factors), pooling_factors=factors if len(factors) > 1 else None, **fields)

    def validate(self, path: str) -> None:
        _string(self.name, f"{path}.name")
        # TorchRec names a table's module after it and forbids dots there: such a plan could not be exported.
        _require("." not in self.name, f"{path}.name", f"must not contain '.' (TorchRec forbids it), got {self.name!r}")
        _positive_int(self.rows, f"{path}.rows", MAX_ROWS)
        _positive_int(self.dim, f"{path}.dim", MAX_DIM)
        _require(_is_int(self.dtype_bytes) and self.dtype_bytes in DTYPE_BYTES.values(), f"{path}.dtype_bytes",
                 f"must be one of {sorted(set(DTYPE_BYTES.values()))}, got {_short(self.dtype_bytes)}")
        _finite(self.pooling_factor, f"{path}.pooling_factor", 0.0, maximum=MAX_POOLING)
        _require(isinstance(self.pooled, bool), f"{path}.pooled", f"must be a boolean, got {_short(self.pooled)}")
        bins_path = f"{path}.reuse_bins"
        _require(isinstance(self.reuse_bins, tuple), bins_path, "must be a list")
        _require(len(self.reuse_bins) == NUM_REUSE_BINS, bins_path,
                 f"must have {NUM_REUSE_BINS} values, got {len(self.reuse_bins)}")
        for i, share in enumerate(self.reuse_bins):
            _finite(share, f"{bins_path}[{i}]", 0.0)
        total = sum(self.reuse_bins)
        if self.pooling_factor == 0.0:
            _require(total == 0.0 or abs(total - 1.0) <= BINS_TOLERANCE, bins_path,
                     f"must sum to 1 (or be all zero for a table without lookups), got {total}")
        else:
            _require(abs(total - 1.0) <= BINS_TOLERANCE, bins_path,
                     f"must sum to 1 within {BINS_TOLERANCE}, got {total}")
        if self.row_distribution is not None:
            _require(isinstance(self.row_distribution, RowDistribution), f"{path}.row_distribution", "must be an object")
            self.row_distribution.validate(f"{path}.row_distribution")
            probs = self.row_distribution.probabilities
            _require(probs is None or len(probs) <= self.rows, f"{path}.row_distribution.probabilities",
                     f"has {0 if probs is None else len(probs)} rows, table has {self.rows}")
        if self.buckets is not None:
            _require(isinstance(self.buckets, BucketSpec), f"{path}.buckets", "must be an object")
            self.buckets.validate(f"{path}.buckets")
        if self.sharding_types is not None:
            _sharding_types(self.sharding_types, f"{path}.sharding_types")
        if self.compute_kernels is not None:
            _compute_kernels(self.compute_kernels, f"{path}.compute_kernels")
        if self.cache_load_factor is not None:
            value = _finite(self.cache_load_factor, f"{path}.cache_load_factor", 0.0, strict=True, maximum=1.0)
            _require(value > 0, f"{path}.cache_load_factor", "must be in (0, 1]")
        if self.pooling_factors is not None:
            factors_path = f"{path}.pooling_factors"
            _require(isinstance(self.pooling_factors, tuple) and len(self.pooling_factors) > 0, factors_path,
                     "must be a non-empty list (one pooling factor per input)")
            for i, factor in enumerate(self.pooling_factors):
                _finite(factor, f"{factors_path}[{i}]", 0.0, maximum=MAX_POOLING)
            total = math.fsum(self.pooling_factors)
            _require(abs(total - self.pooling_factor) <= 1e-9 * max(1.0, total), factors_path,
                     f"add up to {total:g}, not to the table's pooling_factor {self.pooling_factor:g}")
        _require(isinstance(self.weighted, bool), f"{path}.weighted", f"must be a boolean, got {_short(self.weighted)}")
        _require(not (self.weighted and not self.pooled), f"{path}.weighted",
                 "a sequence table (pooled false) takes no weights: TorchRec's EmbeddingCollection has none")


@dataclass(frozen=True)
class Topology:
    """nodes × devices_per_node identical devices, each with `memory_bytes` of HBM and `host_memory_bytes`
    of host memory (DDR; 0: none). Bandwidths in bytes per second."""

    nodes: int
    devices_per_node: int
    memory_bytes: int
    intra_node_a2a_bw: float = 150e9
    inter_node_a2a_bw: float = 12.5e9
    allreduce_global_bw: float = 12.5e9
    allreduce_cross_node_bw: float = 12.5e9
    device_kind: str = "gpu"
    host_memory_bytes: int = 0
    host_link_bw: float = 32 * 2**30  # HBM <-> host memory (UVM over PCIe); TorchRec's HBM_TO_DDR_MEM_BW

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def capacity(self) -> Storage:
        """What one device holds in each tier."""
        return Storage(self.memory_bytes, self.host_memory_bytes)

    def validate(self, path: str) -> None:
        _positive_int(self.nodes, f"{path}.nodes", MAX_DEVICES_PER_AXIS)
        _positive_int(self.devices_per_node, f"{path}.devices_per_node", MAX_DEVICES_PER_AXIS)
        _positive_int(self.memory_bytes, f"{path}.memory_bytes", MAX_MEMORY_BYTES)
        _require(_is_int(self.host_memory_bytes) and 0 <= self.host_memory_bytes <= MAX_MEMORY_BYTES,
                 f"{path}.host_memory_bytes", f"must be an integer in 0..{MAX_MEMORY_BYTES} (0: no host memory), "
                 f"got {_short(self.host_memory_bytes)}")
        low, high = BANDWIDTH_RANGE
        for name in ("intra_node_a2a_bw", "inter_node_a2a_bw", "allreduce_global_bw", "allreduce_cross_node_bw",
                     "host_link_bw"):
            _finite(getattr(self, name), f"{path}.{name}", low, maximum=high)
        _string(self.device_kind, f"{path}.device_kind")


@dataclass(frozen=True)
class Workload:
    """batch_size is per device; dtype is that of the embedding outputs sent over the network;
    `io_buffers`: each shard's input and output buffers count towards HBM, as TorchRec's storage estimator
    counts them (models imported from TorchRec; the papers' sampled tasks count weights and optimizer
    state alone)."""

    batch_size: int = 65536
    optimizer: str = "sgd"
    dtype: str = "fp16"
    io_buffers: bool = False

    def validate(self, path: str) -> None:
        _positive_int(self.batch_size, f"{path}.batch_size", MAX_BATCH)
        _require(isinstance(self.optimizer, str) and self.optimizer in OPTIMIZERS, f"{path}.optimizer",
                 f"must be one of {OPTIMIZERS}, got {_short(self.optimizer)}")
        _require(isinstance(self.dtype, str) and self.dtype in DTYPE_BYTES, f"{path}.dtype",
                 f"must be one of {tuple(DTYPE_BYTES)}, got {_short(self.dtype)}")
        _require(isinstance(self.io_buffers, bool), f"{path}.io_buffers", f"must be a boolean, got {_short(self.io_buffers)}")


def is_column_cut(dim: int, parts: int) -> bool:
    """Whether TorchRec cuts `dim` columns into `parts` equal blocks: widths whole multiples of 4."""
    return parts >= 2 and dim % parts == 0 and (dim // parts) % COLUMN_ALIGNMENT == 0


def torchrec_column_count(dim: int) -> int:
    """How many blocks TorchRec's enumerator cuts `dim` columns into where nothing sets the block: blocks of
    the smallest width of at least MIN_COLUMN_BLOCK that divides dim and is a multiple of 4 (dim itself, one
    block, where none does)."""
    block = next((w for w in range(MIN_COLUMN_BLOCK, dim) if dim % w == 0 and w % COLUMN_ALIGNMENT == 0), dim)
    return dim // block


def column_counts(dim: int, num_devices: int) -> tuple[int, ...]:
    """The column-wise shard counts we enumerate: c = 2, 4, 8, ... while c is a cut of dim and fits the
    devices, and TorchRec's own cut (blocks of 128 and up: 3 blocks of a 384-wide table, 16 of a 2048-wide
    one, however many devices there are) where it cuts at all."""
    counts, c = [], 2
    while c <= num_devices and is_column_cut(dim, c):
        counts.append(c)
        c *= 2
    theirs = torchrec_column_count(dim)
    return tuple(sorted({*counts, theirs} if theirs > 1 else counts))


def option_parts(kind: str, dim: int, topology: "Topology") -> tuple[int, ...]:
    """The piece counts of the options a table of width `dim` has under sharding type `kind` (none: the
    type gives it no option). Row-wise and data-parallel on one device, or table-row-wise on one device
    per node, are table-wise under another name and give none. Enumeration and validation both ask here."""
    k, per_node = topology.num_devices, topology.devices_per_node
    if kind == "table_wise":
        return (1,)
    if kind == "column_wise":
        return column_counts(dim, k)
    if kind == "table_column_wise":  # one device per node: every block on that device, a table-wise table
        return column_counts(dim, k) if per_node > 1 else ()
    if kind == "table_row_wise":
        return (per_node,) if per_node > 1 else ()
    if kind == "grid_shard":  # TorchRec's column cut (its grid helper's), each block row-wise on a node
        blocks = torchrec_column_count(dim)
        return (blocks * per_node,) if blocks > 1 and per_node > 1 and topology.nodes > 1 else ()
    return (k,) if k > 1 else ()


def _no_option_reason(kind: str, dim: int, topology: Topology) -> str:
    if kind in ("column_wise", "table_column_wise") and (kind == "column_wise" or topology.devices_per_node > 1):
        return (f"{kind} cannot cut dim {dim} into 2, 4, 8, ... equal blocks whose widths are multiples of "
                f"{COLUMN_ALIGNMENT}, at most one per device ({topology.num_devices}), nor into TorchRec's blocks of "
                f"{MIN_COLUMN_BLOCK} and more")
    if kind in ("table_row_wise", "table_column_wise"):
        return f"{kind} needs more than one device per node"
    if kind == "grid_shard":
        return (f"grid_shard needs more than one node of more than one device, and TorchRec's cut of dim {dim} into "
                f"blocks of {MIN_COLUMN_BLOCK} and more to give two blocks or more")
    return f"{kind} needs more than one device"


def _compute_kernels(value: Any, path: str) -> tuple[str, ...]:
    _require(isinstance(value, tuple) and len(value) > 0, path, f"must be a non-empty list of {KERNELS}")
    for i, kernel in enumerate(value):
        _require(isinstance(kernel, str) and kernel in KERNELS, f"{path}[{i}]", f"must be one of {KERNELS}, got {_short(kernel)}")
    _require(len(set(value)) == len(value), path, "lists a compute kernel twice")
    return value


def _sharding_types(value: Any, path: str) -> tuple[str, ...]:
    _require(isinstance(value, tuple) and len(value) > 0, path, f"must be a non-empty list of {SHARDING_TYPES}")
    for i, kind in enumerate(value):
        _require(isinstance(kind, str) and kind in SHARDING_TYPES, f"{path}[{i}]",
                 f"must be one of {SHARDING_TYPES}, got {_short(kind)}")
    _require(len(set(value)) == len(value), path, "lists a sharding type twice")
    return value


@dataclass(frozen=True)
class Instance:
    id: str
    tables: tuple[Table, ...]
    topology: Topology
    workload: Workload = field(default_factory=Workload)
    provenance: str = ""
    sharding_types: tuple[str, ...] = DEFAULT_SHARDING_TYPES
    compute_kernels: tuple[str, ...] = KERNELS

    def allowed_kernels(self, table: Table, sharding_type: str) -> tuple[str, ...]:
        """The kernels that may serve `table` as `sharding_type`: those the type takes, the instance and the
        table allow, and — for kernels in host memory — that the devices have host memory for."""
        return tuple(k for k in kernels_for(sharding_type) if k in self.compute_kernels
                     and (table.compute_kernels is None or k in table.compute_kernels)
                     and (k not in HOST_KERNELS or self.topology.host_memory_bytes > 0))

    def cache_problem(self, table: Table) -> str | None:
        """Why `table`'s fixed cache load factor has no use here, or None: the rule every way in (instance
        files, specs, TorchRec's constraints) is held to. A load factor sizes the HBM cache of a table kept in
        host memory (fused_uvm_caching), so the devices need host memory and the table that kernel."""
        if table.cache_load_factor is None:
            return None
        if not self.topology.host_memory_bytes:
            return ("a cache load factor sizes the HBM cache of a table kept in host memory, and the devices have "
                    "none (give host_memory_bytes, or ddr_cap in a spec or a Topology)")
        kernels = {k for kind in self.allowed_types(table) for k in self.allowed_kernels(table, kind)}
        if FUSED_UVM_CACHING not in kernels:
            return (f"a cache load factor is for {FUSED_UVM_CACHING} only, which its allowed kernels "
                    f"({', '.join(k for k in KERNELS if k in kernels)}) leave out")
        return None

    @property
    def uses_host_memory(self) -> bool:
        """Whether some table may live in host memory (the devices have some and a host kernel is allowed)."""
        return any(k in HOST_KERNELS for t in self.tables for kind in self.allowed_types(t)
                   for k in self.allowed_kernels(t, kind))

    def restricted_to_kernels(self, kernels: Sequence[str] | None) -> "Instance":
        """The same instance allowing only those of its compute kernels that are in `kernels` (None: as is).
        Not validated: a table left with no option is for the caller to report."""
        if kernels is None:
            return self
        return replace(self, compute_kernels=tuple(k for k in self.compute_kernels if k in kernels))

    def allowed_types(self, table: Table) -> tuple[str, ...]:
        """The sharding types `table` may take: the instance's, narrowed by the table's own list."""
        if table.sharding_types is None:
            return self.sharding_types
        return tuple(t for t in self.sharding_types if t in table.sharding_types)

    def may_split(self, table: Table) -> bool:
        """Whether `table` may take another sharding type than table-wise."""
        return any(t != "table_wise" for t in self.allowed_types(table))

    @property
    def allows_splits(self) -> bool:
        return any(self.may_split(t) for t in self.tables)

    def restricted_to(self, types: Sequence[str] | None) -> "Instance":
        """The same instance allowing only those of its sharding types that are in `types` (None: as is).
        Not validated: a table left with no type is for the solver to report."""
        if types is None:
            return self
        return replace(self, sharding_types=tuple(t for t in self.sharding_types if t in types))

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_devices(self) -> int:
        return self.topology.num_devices

    def io_bytes(self, table, kind, rows, width) -> np.ndarray | None:
        """Per shard (its table's index, sharding type's index in SHARDING_TYPES, rows, width): the input and
        output buffers TorchRec keeps for it in HBM (instances.memory.io_bytes), or None where the workload
        does not count them."""
        if not self.workload.io_buffers:
            return None
        batch = self.workload.batch_size
        table, kind = np.asarray(table, dtype=np.int64), np.asarray(kind, dtype=np.int64)
        # Per table, as TorchRec sums them: lookups per device's batch, and pooled outputs (an input that
        # looks up less than once per sample gives that share of a vector) or one per lookup.
        inputs = np.array([sum(f * 1.0 * batch for f in t.inputs) for t in self.tables])[table]
        outputs = np.array([sum(min(1.0, f) * 1.0 * batch for f in t.inputs) if t.pooled else
                            sum(f * 1.0 * batch for f in t.inputs) for t in self.tables])[table]
        pooled = np.array([t.pooled for t in self.tables])[table]
        element = np.array([t.dtype_bytes for t in self.tables])[table]
        world, group = self.num_devices, self.topology.devices_per_node
        divisor = np.select([kind == ROW_SPLIT_CODES[0], np.isin(kind, ROW_SPLIT_CODES[1:])], [world, group], 1)
        reach = np.where(kind == SHARDING_TYPES.index("data_parallel"), 1, world)
        return io_bytes(rows, width, inputs, outputs, pooled, element, reach, divisor)

    def table_storage(self) -> np.ndarray:
        """Per whole table (table-wise), its storage vector (HBM, host), shape (tables, 2)."""
        tables = self.tables
        count = len(tables)
        rows, dims = [t.rows for t in tables], [t.dim for t in tables]
        io = self.io_bytes(np.arange(count), np.zeros(count, dtype=np.int64), rows, dims)
        return storage(rows, dims, [t.dtype_bytes for t in tables], self.workload.optimizer, io=io)

    def total_storage(self) -> np.ndarray:
        """What all tables, whole, store in each tier (the need a plan's capacity is measured against)."""
        return self.table_storage().sum(axis=0)

    @property
    def capacity(self) -> np.ndarray:
        """Per device, the capacity of each tier, shape (devices, 2)."""
        return np.tile(self.topology.capacity.as_array(), (self.num_devices, 1))

    def validate(self) -> "Instance":
        _string(self.id, "id")
        _string(self.provenance, "provenance", empty_ok=True)
        _require(len(self.tables) > 0, "tables", "must hold at least one table")
        seen: set[str] = set()
        for i, table in enumerate(self.tables):
            _require(isinstance(table, Table), f"tables[{i}]", "must be an object")
            table.validate(f"tables[{i}]")
            _require(table.name not in seen, f"tables[{i}].name", f"duplicate table name {table.name!r}")
            seen.add(table.name)
        self.topology.validate("topology")
        self.workload.validate("workload")
        _sharding_types(self.sharding_types, "sharding_types")
        _compute_kernels(self.compute_kernels, "compute_kernels")
        devices = self.num_devices
        _require(devices <= MAX_DEVICES, "topology", f"{self.topology.nodes} × {self.topology.devices_per_node} = "
                 f"{devices} devices, more than the {MAX_DEVICES} this tool plans")
        cells = devices * len(self.tables)
        _require(cells <= MAX_TABLE_DEVICE_CELLS, "tables", f"{len(self.tables)} tables × {devices} devices = {cells}, "
                 f"more than the {MAX_TABLE_DEVICE_CELLS} table-device pairs this tool plans in memory")
        for i, table in enumerate(self.tables):
            allowed = self.allowed_types(table)
            _require(len(allowed) > 0, f"tables[{i}].sharding_types", "allows none of the instance's sharding types")
            _require(any(option_parts(kind, table.dim, self.topology) for kind in allowed), f"tables[{i}].sharding_types",
                     f"table {table.name} has no sharding option: "
                     + "; ".join(_no_option_reason(kind, table.dim, self.topology) for kind in allowed))
            _require(any(self.allowed_kernels(table, kind) for kind in allowed), f"tables[{i}].compute_kernels",
                     f"table {table.name} has no compute kernel for its sharding types "
                     f"({', '.join(allowed)})" + ("" if self.topology.host_memory_bytes else
                                                  "; fused_uvm and fused_uvm_caching need host memory"))
            problem = self.cache_problem(table)
            _require(problem is None, f"tables[{i}].cache_load_factor", f"table {table.name}: {problem}")
        total = sum(stored_bytes(t.rows, t.dim, t.dtype_bytes, self.workload.optimizer) for t in self.tables)
        _require(total <= MAX_TOTAL_BYTES, "tables", "need {} in all, more than the {} this tool handles "
                 "exactly".format(*format_sizes(total, MAX_TOTAL_BYTES)))
        return self


# ---------------------------------------------------------------- JSON


def _expect_mapping(data: Any, path: str) -> Mapping[str, Any]:
    _require(isinstance(data, Mapping), path, f"must be a JSON object, got {type(data).__name__}")
    return data


def _check_version(data: Mapping[str, Any], supported: tuple[int, ...]) -> int:
    """The schema version comes first: a file of another version is reported as that, not as a missing field."""
    _require("schema_version" in data, "schema_version", "missing")
    version = data["schema_version"]
    _require(_is_int(version) and version in supported, "schema_version",
             f"unsupported version {_short(version)} (supported: {', '.join(map(str, supported))})")
    return version


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _take(data: Mapping[str, Any], path: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    unknown = sorted(set(data) - set(required) - set(optional))
    _require(not unknown, _join(path, unknown[0]) if unknown else path, "unknown field")
    for key in required:
        _require(key in data, _join(path, key), "missing")
    return {k: data[k] for k in (*required, *optional) if k in data}


def _table_from_dict(data: Any, path: str, version: int) -> Table:
    data = _expect_mapping(data, path)
    values = _take(data, path, ("name", "rows", "dim", "dtype_bytes", "pooling_factor", "reuse_bins"),
                   ("pooled", "row_distribution", "buckets", "sharding_types", "compute_kernels", "cache_load_factor",
                    *(("pooling_factors", "weighted") if version >= 3 else ())))
    bins = values["reuse_bins"]
    _require(isinstance(bins, list), f"{path}.reuse_bins", "must be a list")
    values["reuse_bins"] = tuple(bins)
    for key in ("sharding_types", "compute_kernels", "pooling_factors"):
        if values.get(key) is not None:
            _require(isinstance(values[key], list), f"{path}.{key}", "must be a list")
            values[key] = tuple(values[key])
    if values.get("row_distribution") is not None:
        rd_path = f"{path}.row_distribution"
        rd = _take(_expect_mapping(values["row_distribution"], rd_path), rd_path, ("kind",), ("alpha", "probabilities"))
        if rd.get("probabilities") is not None:
            _require(isinstance(rd["probabilities"], list), f"{rd_path}.probabilities", "must be a list")
            rd["probabilities"] = tuple(rd["probabilities"])
        values["row_distribution"] = RowDistribution(**rd)
    if values.get("buckets") is not None:
        b_path = f"{path}.buckets"
        values["buckets"] = BucketSpec(**_take(_expect_mapping(values["buckets"], b_path), b_path,
                                               ("count", "mapping"), ("rows_per_bucket",)))
    return Table(**values)


def _table_to_dict(table: Table) -> dict:
    out: dict[str, Any] = {
        "name": table.name, "rows": table.rows, "dim": table.dim, "dtype_bytes": table.dtype_bytes,
        "pooling_factor": table.pooling_factor, "reuse_bins": list(table.reuse_bins), "pooled": table.pooled,
    }
    if table.row_distribution is not None:
        rd = table.row_distribution
        out["row_distribution"] = {"kind": rd.kind, "alpha": rd.alpha,
                                   "probabilities": None if rd.probabilities is None else list(rd.probabilities)}
    if table.buckets is not None:
        out["buckets"] = {"count": table.buckets.count, "mapping": table.buckets.mapping,
                          "rows_per_bucket": table.buckets.rows_per_bucket}
    if table.sharding_types is not None:
        out["sharding_types"] = list(table.sharding_types)
    if table.compute_kernels is not None:
        out["compute_kernels"] = list(table.compute_kernels)
    if table.cache_load_factor is not None:
        out["cache_load_factor"] = table.cache_load_factor
    if table.pooling_factors is not None:
        out["pooling_factors"] = list(table.pooling_factors)
    if table.weighted:
        out["weighted"] = True
    return out


_TOPOLOGY_FIELDS = ("nodes", "devices_per_node", "memory_bytes")
_TOPOLOGY_OPTIONAL = ("intra_node_a2a_bw", "inter_node_a2a_bw", "allreduce_global_bw",
                      "allreduce_cross_node_bw", "device_kind", "host_memory_bytes", "host_link_bw")


def schema_version_of(instance: Instance) -> int:
    """The oldest schema version that says all of the instance, so that readers of that version read it."""
    newer_types = set(SHARDING_TYPES) - set(LEGACY_SHARDING_TYPES)
    uses_newer_types = newer_types & {*instance.sharding_types, *(k for t in instance.tables for k in t.sharding_types or ())}
    return 3 if instance.workload.io_buffers or uses_newer_types or any(
        t.pooling_factors is not None or t.weighted for t in instance.tables) else 2


def instance_to_dict(instance: Instance) -> dict:
    topo, work = instance.topology, instance.workload
    return {
        "schema_version": schema_version_of(instance),
        "id": instance.id,
        "provenance": instance.provenance,
        "topology": {k: getattr(topo, k) for k in (*_TOPOLOGY_FIELDS, *_TOPOLOGY_OPTIONAL)},
        "workload": {"batch_size": work.batch_size, "optimizer": work.optimizer, "dtype": work.dtype,
                     **({"io_buffers": True} if work.io_buffers else {})},
        "sharding_types": list(instance.sharding_types),
        "compute_kernels": list(instance.compute_kernels),
        "tables": [_table_to_dict(t) for t in instance.tables],
    }


def instance_from_dict(data: Any) -> Instance:
    """Parse and validate; raises InstanceError naming the first bad field."""
    data = _expect_mapping(data, "instance")
    version = _check_version(data, (1, 2, SCHEMA_VERSION))
    values = _take(data, "", ("schema_version", "id", "topology", "tables"),
                   ("workload", "provenance", "sharding_types", *(("compute_kernels",) if version >= 2 else ())))
    optional = _TOPOLOGY_OPTIONAL if version >= 2 else tuple(k for k in _TOPOLOGY_OPTIONAL
                                                             if k not in ("host_memory_bytes", "host_link_bw"))
    topo = _take(_expect_mapping(values["topology"], "topology"), "topology", _TOPOLOGY_FIELDS, optional)
    work_raw = values.get("workload", {})
    work = _take(_expect_mapping(work_raw, "workload"), "workload", (),
                 ("batch_size", "optimizer", "dtype", *(("io_buffers",) if version >= 3 else ())))
    tables = values["tables"]
    _require(isinstance(tables, list), "tables", "must be a list")
    types = values.get("sharding_types", list(DEFAULT_SHARDING_TYPES if version >= 3 else LEGACY_SHARDING_TYPES))
    _require(isinstance(types, list), "sharding_types", "must be a list")
    kernels = values.get("compute_kernels", list(KERNELS))
    _require(isinstance(kernels, list), "compute_kernels", "must be a list")
    instance = Instance(
        id=values["id"],
        tables=tuple(_table_from_dict(t, f"tables[{i}]", version) for i, t in enumerate(tables)),
        topology=Topology(**topo),
        workload=Workload(**work),
        provenance=values.get("provenance", ""),
        sharding_types=tuple(types),
        compute_kernels=tuple(kernels),
    )
    return instance.validate()


@dataclass(frozen=True)
class TieringPlan:
    """Row tiering: per table, rows in descending access probability, the first `dp_rows[i]` replicated
    (DP), the next `flex_rows[i]` Flex-sharded, the rest row-wise (RW)."""

    instance_id: str
    tables: tuple[str, ...]
    dp_rows: tuple[int, ...]
    flex_rows: tuple[int, ...]
    kind: str = "row_tiering"

    def validate(self, instance: Instance, memory_per_gpu: float | None = None) -> "TieringPlan":
        if self.instance_id != instance.id:
            raise PlanError(f"plan is for instance {self.instance_id!r}, not {instance.id!r}")
        by_name = {t.name: t for t in instance.tables}
        if not len(self.tables) == len(self.dp_rows) == len(self.flex_rows):
            raise PlanError("tables, dp_rows and flex_rows must have one entry per table")
        for name, dp, flex in zip(self.tables, self.dp_rows, self.flex_rows):
            if name not in by_name:
                raise PlanError(f"table {name!r} is not in instance {instance.id!r}")
            if not (0 <= dp and 0 <= flex and dp + flex <= by_name[name].rows):
                raise PlanError(f"table {name}: dp_rows {dp} + flex_rows {flex} must be within 0..{by_name[name].rows}")
        if memory_per_gpu is not None and memory_per_gpu > instance.topology.memory_bytes:
            raise PlanError("predicted memory {} per GPU exceeds the capacity {}".format(
                *format_sizes(memory_per_gpu, instance.topology.memory_bytes)))
        return self


@dataclass(frozen=True)
class BucketPlan:
    """Bucket ranges: trainer `trainer_of_range[j]` owns buckets boundaries[j]..boundaries[j+1]-1."""

    instance_id: str
    table: str
    boundaries: tuple[int, ...]
    trainer_of_range: tuple[int, ...]
    kind: str = "buckets"

    def validate(self, instance: Instance) -> "BucketPlan":
        table = next((t for t in instance.tables if t.name == self.table), None)
        if table is None or table.buckets is None:
            raise PlanError(f"table {self.table!r} of {instance.id!r} has no bucket spec")
        b = self.boundaries
        if len(b) < 2 or b[0] != 0 or b[-1] != table.buckets.count or any(x > y for x, y in zip(b, b[1:])):
            raise PlanError(f"boundaries must rise from 0 to {table.buckets.count}")
        if len(self.trainer_of_range) != len(b) - 1 or len(set(self.trainer_of_range)) != len(b) - 1:
            raise PlanError("each range needs its own trainer")
        return self
