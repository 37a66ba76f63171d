"""Sharded plans: the five sharding types with TorchRec's meanings, the rules that cut a table into shards
(TorchRec's own row and column cuts, so that an exported plan is the plan we priced), the plan itself
(every table one sharding type and compute kernel, every shard one device), its validation, and its JSON:
schema 3, with schema 2 (no kernels: HBM) and schema 1 (a device per table) still loading."""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Sequence

import numpy as np

from .kernels import KERNEL_CODE, default_kernel, kernel_problem
from .memory import format_bytes, format_sizes, over_capacity, storage, tier_label
from .model import (
    COLUMN_ALIGNMENT,
    SHARDING_TYPES,
    Instance,
    InstanceError,
    PlanError,
    _check_version,
    _expect_mapping,
    _is_int,
    _require,
    _short,
    _string,
    _take,
    is_column_cut,
    torchrec_column_count,
)

TABLE_WISE, COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, DATA_PARALLEL, TABLE_COLUMN_WISE, GRID_SHARD = SHARDING_TYPES
COLUMN_BLOCKS = (COLUMN_WISE, TABLE_COLUMN_WISE)  # the types that cut a table into column blocks of every row
PLAN_SCHEMA_VERSION = 3  # 3 added each table's compute kernel and cache load factor
# What `shardbench solve -o` writes beside a version-1 plan: a report of the run, ignored on loading.
V1_REPORT_KEYS = ("solver", "oracle", "status", "seed", "time_limit", "objective", "lower_bound", "gap",
                  "device_costs", "memory_per_device")


# ---------------------------------------------------------------- cutting rules


def row_cuts(rows: int, parts: int) -> tuple[tuple[int, int], ...]:
    """TorchRec's row-wise cut: every part but the tail gets ceil(rows / parts) rows, one part the
    remainder, the rest none (10 rows on 4 devices: 3, 3, 3, 1; 5 on 4: 2, 2, 1, 0)."""
    block = math.ceil(rows / parts)
    full = rows // block
    sizes = [block if p < full else rows - block * full if p == full else 0 for p in range(parts)]
    starts = accumulate(sizes[:-1], initial=0)
    return tuple((s, s + n) for s, n in zip(starts, sizes))


def column_cuts(dim: int, parts: int) -> tuple[tuple[int, int], ...]:
    """Equal column blocks; the caller checks `is_column_cut` first."""
    width = dim // parts
    return tuple((p * width, (p + 1) * width) for p in range(parts))


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Shard:
    """A rectangle of a table — rows [start, end) × cols [start, end) — on one device."""

    device: int
    rows: tuple[int, int]
    cols: tuple[int, int]

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def width(self) -> int:
        return self.cols[1] - self.cols[0]


@dataclass(frozen=True)
class TableSharding:
    """One table's sharding choice, its shards, and the compute kernel that serves them (None: the type's
    HBM kernel) with its cache load factor (fused_uvm_caching only)."""

    sharding_type: str
    shards: tuple[Shard, ...]
    compute_kernel: str | None = None
    cache_load_factor: float | None = None

    def __post_init__(self):
        if self.compute_kernel is None:  # plans from before kernels: HBM, as they were priced
            object.__setattr__(self, "compute_kernel", default_kernel(self.sharding_type))

    @classmethod
    def whole(cls, table_rows: int, dim: int, device: int) -> "TableSharding":
        return cls(TABLE_WISE, (Shard(device, (0, table_rows), (0, dim)),))

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(s.device for s in self.shards)


@dataclass(frozen=True)
class Plan:
    """Every table of an instance (in its order) with its sharding type and shards."""

    instance_id: str
    tables: tuple[TableSharding, ...]

    @classmethod
    def table_wise(cls, instance: Instance, assignment: Sequence[int],
                   kernels: Sequence[tuple[str, float | None]] | None = None) -> "Plan":
        """Table i whole on device assignment[i], served by kernels[i] (kernel, cache load factor; default:
        in HBM)."""
        kernels = kernels or [(None, None)] * instance.num_tables
        return cls(instance.id, tuple(TableSharding(TABLE_WISE, (Shard(int(d), (0, t.rows), (0, t.dim)),), kernel, factor)
                                      for t, d, (kernel, factor) in zip(instance.tables, assignment, kernels)))

    @property
    def is_table_wise(self) -> bool:
        return all(t.sharding_type == TABLE_WISE for t in self.tables)

    @property
    def assignment(self) -> tuple[int, ...]:
        """The device of every table of a table-wise plan."""
        if not self.is_table_wise:
            raise PlanError("the plan splits tables: it has no single device per table")
        return tuple(t.shards[0].device for t in self.tables)

    def sharding_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tables:
            counts[t.sharding_type] = counts.get(t.sharding_type, 0) + 1
        return counts

    def kernels(self) -> dict[str, int]:
        """Tables per compute kernel."""
        counts: dict[str, int] = {}
        for t in self.tables:
            counts[t.compute_kernel] = counts.get(t.compute_kernel, 0) + 1
        return counts

    def storage_per_device(self, instance: Instance) -> np.ndarray:
        """What each device stores in each tier (HBM, host), shape (devices, 2)."""
        # Per table its shards' fields, then repeated per shard: a data-parallel table at 512 ranks has 512.
        held = [(t, sharding) for t, sharding in enumerate(self.tables) if sharding.shards]
        counts = np.array([len(sharding.shards) for _, sharding in held], dtype=np.int64)
        fields = np.array([(s.device, s.rows[1] - s.rows[0], s.cols[1] - s.cols[0])
                           for _, sharding in held for s in sharding.shards], dtype=np.int64).reshape(-1, 3)
        table = np.repeat(np.array([t for t, _ in held], dtype=np.int64), counts)
        kind = np.repeat([SHARDING_TYPES.index(sharding.sharding_type) for _, sharding in held], counts)
        kernel = np.repeat([KERNEL_CODE[sharding.compute_kernel] for _, sharding in held], counts)
        factor = np.repeat([sharding.cache_load_factor or 0.0 for _, sharding in held], counts)
        element = np.repeat([instance.tables[t].dtype_bytes for t, _ in held], counts)
        rows, width = fields[:, 1], fields[:, 2]
        io = instance.io_bytes(table, kind, rows, width)
        per_shard = storage(rows, width, element, instance.workload.optimizer, kernel, factor, io).reshape(-1, 2)
        used = np.zeros((instance.num_devices, 2), dtype=np.int64)
        np.add.at(used, fields[:, 0], per_shard)
        return used

    def validate(self, instance: Instance) -> "Plan":
        """Every table's shards tile it exactly once as TorchRec cuts it (equal column blocks; row blocks by
        `row_cuts` in device order; data-parallel: one full replica per device), with a sharding type the
        instance allows for it, on devices that exist, and no device over its memory. Errors name the table
        and the reason. Export and pricing rely on this: TorchRec makes no other cut."""
        if self.instance_id != instance.id:
            raise PlanError(f"plan is for instance {self.instance_id!r}, not {instance.id!r}")
        if len(self.tables) != instance.num_tables:
            raise PlanError(f"plan covers {len(self.tables)} tables, instance has {instance.num_tables}")
        for table, sharding in zip(instance.tables, self.tables):
            problem = _tiling_problem(instance, table.rows, table.dim, sharding)
            if problem is None and sharding.sharding_type not in instance.allowed_types(table):
                problem = f"sharding type {sharding.sharding_type} is not allowed for this table"
            if problem is None:
                problem = kernel_problem(sharding.sharding_type, sharding.compute_kernel, sharding.cache_load_factor)
            if problem is None and sharding.compute_kernel not in instance.allowed_kernels(table, sharding.sharding_type):
                problem = (f"compute kernel {sharding.compute_kernel} is not allowed for this table"
                           + ("" if instance.topology.host_memory_bytes else " (the devices have no host memory)"))
            if problem is None and None not in (table.cache_load_factor, sharding.cache_load_factor) and \
                    sharding.cache_load_factor != table.cache_load_factor:
                problem = (f"cache load factor {sharding.cache_load_factor:g} is not the {table.cache_load_factor:g} "
                           "the instance fixes for this table")
            if problem:
                raise PlanError(f"table {table.name}: {problem}")
        check_capacity(self.storage_per_device(instance), instance)
        return self


def check_capacity(used: np.ndarray, instance: Instance, model: str = "") -> None:
    """Raises PlanError naming the devices and tiers where `used` (devices × 2 bytes) exceeds capacity;
    `model` names whose storage model counted the bytes, when not the instance's."""
    capacity = instance.topology.capacity.as_array()
    over = over_capacity(used, capacity)
    if over:
        detail = ", ".join(f"device {d} uses {format_sizes(used[d, t], capacity[t])[0]} of {tier_label(t)}"
                           for d, t in over[:5])
        limits = " and ".join(f"{tier_label(t)} {format_bytes(capacity[t])}" for t in sorted({t for _, t in over}))
        raise PlanError(f"memory capacity ({limits} per device) exceeded{model}: {detail}")


def _tiling_problem(instance: Instance, rows: int, dim: int, sharding: TableSharding) -> str | None:
    kind, shards = sharding.sharding_type, sharding.shards
    topo = instance.topology
    if kind not in SHARDING_TYPES:
        return f"unknown sharding type {kind!r}"
    if not shards:
        return "has no shards"
    k = topo.num_devices
    for shard in shards:
        device = shard.device
        if not ((type(device) is int or _is_int(device)) and 0 <= device < k):
            return f"device {device!r} is not in 0..{k - 1}"
        (r0, r1), (c0, c1) = shard.rows, shard.cols
        if not (0 <= r0 <= r1 <= rows and 0 <= c0 < c1 <= dim):
            return f"shard rows [{r0}, {r1}) × cols [{c0}, {c1}) is not inside the table ({rows} × {dim})"
    full_rows = all(s.rows == (0, rows) for s in shards)
    full_cols = all(s.cols == (0, dim) for s in shards)
    devices = sorted(s.device for s in shards)
    if kind == TABLE_WISE:
        return None if len(shards) == 1 and full_rows and full_cols else "table_wise needs one shard of the whole table"
    if kind == DATA_PARALLEL:
        if not (full_rows and full_cols):
            return "data_parallel shards must each be the whole table"
        return None if devices == list(range(topo.num_devices)) else "data_parallel needs one replica on every device"
    if kind in COLUMN_BLOCKS:
        if not full_rows:
            return f"{kind} shards must hold every row"
        if not is_column_cut(dim, len(shards)):
            return (f"{kind} cuts dim {dim} into equal blocks whose widths are multiples of {COLUMN_ALIGNMENT}; "
                    f"{len(shards)} blocks are not such a cut")
        cut = column_cuts(dim, len(shards))
        blocks = sorted(s.cols for s in shards)
        if blocks != list(cut):
            return f"{kind} blocks {_ranges(blocks)} are not TorchRec's equal cut {_ranges(cut)}"
        if kind == TABLE_COLUMN_WISE and len({d // topo.devices_per_node for d in devices}) > 1:
            return "table_column_wise puts every block on the devices of one node"
        return None
    if kind == GRID_SHARD:
        return _grid_problem(instance, rows, dim, shards)
    if not full_cols:
        return f"{kind} shards must hold every column"
    if kind == ROW_WISE:
        first, parts = 0, topo.num_devices
    else:
        first, parts = shards[0].device // topo.devices_per_node * topo.devices_per_node, topo.devices_per_node
    if devices != list(range(first, first + parts)):
        return (f"{kind} needs one shard on every device" if kind == ROW_WISE else
                "table_row_wise needs one shard on every device of one node")
    cut = row_cuts(rows, parts)
    by_rank = [s.rows for s in sorted(shards, key=lambda s: s.device)]
    if by_rank != list(cut):
        return f"{kind} rows by device {_ranges(by_rank)} are not TorchRec's cut {_ranges(cut)}"
    return None


def _grid_problem(instance: Instance, rows: int, dim: int, shards: tuple[Shard, ...]) -> str | None:
    """A grid is TorchRec's column cut of the table, each block cut by rows over the devices of one node
    (TorchRec's row cut, in local-rank order)."""
    per_node = instance.topology.devices_per_node
    blocks = torchrec_column_count(dim)
    if blocks < 2 or len(shards) != blocks * per_node:
        return (f"grid_shard cuts dim {dim} into TorchRec's {blocks} column block(s), each into {per_node} row "
                f"blocks: {blocks * per_node} shards, not {len(shards)}")
    cut = row_cuts(rows, per_node)
    for cols in column_cuts(dim, blocks):
        block = sorted((s for s in shards if s.cols == cols), key=lambda s: s.device)
        first = block[0].device // per_node * per_node if block else 0
        if [s.device for s in block] != list(range(first, first + per_node)) or [s.rows for s in block] != list(cut):
            return (f"grid_shard block of cols [{cols[0]}, {cols[1]}) must be TorchRec's row cut {_ranges(cut)} over the "
                    "devices of one node")
    return None


def _ranges(ranges) -> str:
    """A few [start, end) ranges, for messages."""
    text = ", ".join(f"[{a}, {b})" for a, b in list(ranges)[:6])
    return text + (", ..." if len(ranges) > 6 else "")


# ---------------------------------------------------------------- JSON


def plan_to_dict(plan: Plan, instance: Instance, report: dict | None = None) -> dict:
    out = {"schema_version": PLAN_SCHEMA_VERSION, "kind": "placement", "instance_id": plan.instance_id,
           "tables": [{"name": table.name, "sharding_type": sharding.sharding_type,
                       "compute_kernel": sharding.compute_kernel,
                       **({"cache_load_factor": sharding.cache_load_factor}
                          if sharding.cache_load_factor is not None else {}),
                       "shards": [{"device": s.device, "rows": list(s.rows), "cols": list(s.cols)}
                                  for s in sharding.shards]}
                      for table, sharding in zip(instance.tables, plan.tables)]}
    if report:
        out["report"] = report
    return out


def _pair(value: Any, path: str) -> tuple[int, int]:
    _require(isinstance(value, list) and len(value) == 2 and all(_is_int(v) for v in value), path,
             f"must be [start, end) as two integers, got {_short(value)}")
    return int(value[0]), int(value[1])


def plan_from_dict(data: Any, instance: Instance) -> Plan:
    """Reads a plan for `instance` (tables by name, in any order; a version-1 plan is all table-wise).
    The result is not validated against the instance yet: call `validate`."""
    data = _expect_mapping(data, "plan")
    version = _check_version(data, (1, 2, PLAN_SCHEMA_VERSION))
    if version == 1:
        values = _take(data, "", ("schema_version", "instance_id", "assignment"), ("kind", *V1_REPORT_KEYS))
    else:
        values = _take(data, "", ("schema_version", "instance_id", "tables"), ("kind", "report"))
        _expect_mapping(values.get("report", {}), "report")
    _require(values.get("kind", "placement") == "placement", "kind", f"unsupported plan kind {_short(values.get('kind'))}")
    instance_id = _string(values["instance_id"], "instance_id")
    if version == 1:
        assignment = values["assignment"]
        _require(isinstance(assignment, list), "assignment", "must be a list of device indices")
        _require(len(assignment) == instance.num_tables, "assignment",
                 f"places {len(assignment)} tables, instance {instance.id!r} has {instance.num_tables}")
        for i, device in enumerate(assignment):
            _require(_is_int(device), f"assignment[{i}]", f"must be a device index, got {_short(device)}")
        return Plan(instance_id, tuple(TableSharding.whole(t.rows, t.dim, d) for t, d in zip(instance.tables, assignment)))
    tables = values["tables"]
    _require(isinstance(tables, list), "tables", "must be a list")
    by_name: dict[str, TableSharding] = {}
    for i, entry in enumerate(tables):
        path = f"tables[{i}]"
        entry = _take(_expect_mapping(entry, path), path, ("name", "sharding_type", "shards"),
                      ("compute_kernel", "cache_load_factor") if version >= 3 else ())
        name = _string(entry["name"], f"{path}.name")
        _require(name not in by_name, f"{path}.name", f"table {name!r} appears twice")
        _require(isinstance(entry["sharding_type"], str) and entry["sharding_type"] in SHARDING_TYPES,
                 f"{path}.sharding_type", f"must be one of {SHARDING_TYPES}, got {_short(entry['sharding_type'])}")
        _require(isinstance(entry["shards"], list) and entry["shards"], f"{path}.shards", "must be a non-empty list")
        shards = []
        for j, shard in enumerate(entry["shards"]):
            spath = f"{path}.shards[{j}]"
            shard = _take(_expect_mapping(shard, spath), spath, ("device", "rows", "cols"))
            _require(_is_int(shard["device"]), f"{spath}.device", f"must be a device index, got {_short(shard['device'])}")
            shards.append(Shard(shard["device"], _pair(shard["rows"], f"{spath}.rows"), _pair(shard["cols"], f"{spath}.cols")))
        kernel = entry.get("compute_kernel", default_kernel(entry["sharding_type"]))
        load_factor = entry.get("cache_load_factor")
        problem = kernel_problem(entry["sharding_type"], kernel, load_factor)
        _require(problem is None, f"{path}.{'cache_load_factor' if 'load factor' in (problem or '') else 'compute_kernel'}",
                 problem or "")
        by_name[name] = TableSharding(entry["sharding_type"], tuple(shards), kernel,
                                      None if load_factor is None else float(load_factor))
    names = [t.name for t in instance.tables]
    unknown = sorted(set(by_name) - set(names))
    _require(not unknown, "tables", f"table {unknown[0]!r} is not in instance {instance.id!r}" if unknown else "")
    missing = [n for n in names if n not in by_name]
    _require(not missing, "tables", f"table {missing[0]!r} of instance {instance.id!r} has no sharding" if missing else "")
    return Plan(instance_id, tuple(by_name[n] for n in names))


def compact(plan: Plan, instance: Instance) -> list[list]:
    """A plan cut by the standard rules as [type, devices...] per table (table-wise: its device; column-
    and table-column-wise: each column block's device; table-row-wise: its node; grid: each column block's
    node; row-wise and data-parallel: nothing), for results stores."""
    out = []
    per_node = instance.topology.devices_per_node
    for table, sharding in zip(instance.tables, plan.tables):
        kind = sharding.sharding_type
        if kind in (TABLE_WISE, *COLUMN_BLOCKS):
            entry = [kind, *sharding.devices]
        elif kind == TABLE_ROW_WISE:
            entry = [kind, sharding.shards[0].device // per_node]
        elif kind == GRID_SHARD:  # the node of each column block
            entry = [kind, *(s.device // per_node for s in sorted(sharding.shards, key=lambda s: (s.cols, s.rows))
                             if s.rows[0] == 0 and s.device % per_node == 0)]
        else:
            entry = [kind]
        if sharding.compute_kernel != default_kernel(kind):  # stores from before kernels read on unchanged
            entry.append({"kernel": sharding.compute_kernel, "load_factor": sharding.cache_load_factor})
        out.append(entry)
    if expand(out, instance) != plan:
        raise InstanceError("plan", "is not cut by the standard rules; store it with plan_to_dict")
    return out


def expand(entries: list[list], instance: Instance) -> Plan:
    """The plan that `compact` wrote."""
    topo = instance.topology
    tables = []
    for table, (kind, *devices) in zip(instance.tables, entries):
        kernel = devices.pop() if devices and isinstance(devices[-1], dict) else {}
        full_rows, full_cols = (0, table.rows), (0, table.dim)
        if kind == TABLE_WISE:
            shards = (Shard(devices[0], full_rows, full_cols),)
        elif kind in COLUMN_BLOCKS:
            shards = tuple(Shard(d, full_rows, c) for d, c in zip(devices, column_cuts(table.dim, len(devices))))
        elif kind == GRID_SHARD:
            shards = tuple(Shard(node * topo.devices_per_node + i, r, cols)
                           for node, cols in zip(devices, column_cuts(table.dim, len(devices)))
                           for i, r in enumerate(row_cuts(table.rows, topo.devices_per_node)))
        elif kind == ROW_WISE:
            shards = tuple(Shard(d, r, full_cols) for d, r in enumerate(row_cuts(table.rows, topo.num_devices)))
        elif kind == TABLE_ROW_WISE:
            first = devices[0] * topo.devices_per_node
            shards = tuple(Shard(first + i, r, full_cols)
                           for i, r in enumerate(row_cuts(table.rows, topo.devices_per_node)))
        else:
            shards = tuple(Shard(d, full_rows, full_cols) for d in range(topo.num_devices))
        tables.append(TableSharding(kind, shards, kernel.get("kernel"), kernel.get("load_factor")))
    return Plan(instance.id, tuple(tables))
