"""Bytes a re-shard moves, and the previous plan a replan starts from. The one rule: a shard of the new plan
receives the part of its rectangle that its device did not hold under the old plan, with the optimizer state
beside it (instances.memory's `stored_bytes`). A shard that stays on its device moves nothing, one whose
device changes moves all its bytes (what TorchRec's reshard sends), a data-parallel table that stays
replicated moves nothing, and a table the old plan did not have is placed anew and moves nothing."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from .kernels import KERNELS
from .memory import stored_bytes
from .model import MAX_MEMORY_BYTES, SHARDING_TYPES, Instance, InstanceError, PlanError
from .sharding import GRID_SHARD, TABLE_COLUMN_WISE, TABLE_ROW_WISE, Plan, TableSharding, plan_from_dict

# Sharding types a replan does not plan: TorchRec's reshard moves no shard of theirs, and the exact model
# counts no bytes moved for their node-bound pieces. An old table of one of them changes type (with type
# changes allowed) or is refused.
NOT_REPLANNED = (TABLE_COLUMN_WISE, GRID_SHARD)


@dataclass(frozen=True)
class Previous:
    """The plan a replan starts from, over the new instance: per table (in the instance's order) its old
    sharding, or None for a table the old plan did not have; the move budget in bytes (None: unlimited);
    whether every old table keeps its sharding type, shard count, compute kernel and cache load factor (and
    a table-row-wise table its node) so that only ranks change — what TorchRec's reshard supports — or may
    change them (a checkpoint-and-reload re-shard); and the old plan's tables the instance dropped, whose
    memory is free."""

    shardings: tuple[TableSharding | None, ...]
    budget: int | None = None
    keep_types: bool = True
    dropped: tuple[str, ...] = ()

    @property
    def added(self) -> int:
        """Tables the old plan did not have."""
        return sum(old is None for old in self.shardings)

    @property
    def same_tables(self) -> bool:
        """Whether the instance has exactly the old plan's tables (a running job can then reshard into it)."""
        return not self.dropped and not self.added


# ---------------------------------------------------------------- the rule


def held(previous: Previous, table, row_start, row_end, col_start,
         col_end) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each rectangle of a table (arrays, one entry per rectangle) was held under the previous plan:
    (rectangle, device, elements held there), one entry per device that held part of it, summed over
    that device's old shards (each old replica of a data-parallel table holds all of it)."""
    table = np.asarray(table, dtype=np.int64)
    bounds = [np.asarray(a, dtype=np.int64) for a in (row_start, row_end, col_start, col_end)]
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    order = np.argsort(table, kind="stable")
    tables, starts = np.unique(table[order], return_index=True)
    for t, members in zip(tables.tolist(), np.split(order, starts[1:])):
        old = previous.shardings[t]
        if old is None:
            continue
        r0, r1, c0, c1 = (b[members] for b in bounds)
        for shard in old.shards:
            rows = np.minimum(r1, shard.rows[1]) - np.maximum(r0, shard.rows[0])
            cols = np.minimum(c1, shard.cols[1]) - np.maximum(c0, shard.cols[0])
            area = np.where((rows > 0) & (cols > 0), rows * cols, 0)
            hit = area > 0
            found.append((members[hit], np.full(int(hit.sum()), shard.device, dtype=np.int64), area[hit]))
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    index, device, area = (np.concatenate(parts) for parts in zip(*found))
    # Old shards of one table never overlap but on replicas; on one device their overlaps add up.
    keys, inverse = np.unique(np.stack([index, device]), axis=1, return_inverse=True)
    return keys[0], keys[1], np.bincount(np.ravel(inverse), weights=area, minlength=keys.shape[1]).astype(np.int64)


def moved_bytes(stored, area, held_area) -> np.ndarray:
    """The one rule, per shard on a device: its `stored` bytes (weights and optimizer state) for the share
    of its `area` (elements) that the device did not hold — all of them when it held none, none when it
    held all; a share where a type change cuts the old shards across (rounded up)."""
    stored = np.asarray(stored, dtype=np.int64)
    area = np.asarray(area, dtype=np.int64)
    missing = np.maximum(area - np.asarray(held_area, dtype=np.int64), 0)
    share = np.ceil(stored * (missing / np.maximum(area, 1))).astype(np.int64)
    return np.where(missing == 0, 0, np.where(missing >= area, stored, share))


def rectangle_bytes(instance: Instance, table, rows, width) -> np.ndarray:
    """What a rectangle of a table stores, weights and optimizer state (instances.memory.stored_bytes)."""
    dtype = np.array([t.dtype_bytes for t in instance.tables], dtype=np.int64)[np.asarray(table, dtype=np.int64)]
    return np.asarray(stored_bytes(np.asarray(rows, dtype=np.int64), np.asarray(width, dtype=np.int64), dtype,
                                   instance.workload.optimizer), dtype=np.int64)


def shard_moves(instance: Instance, previous: Previous, plan: Plan) -> np.ndarray:
    """Per table, the bytes its new shards move from the previous plan."""
    shards = [(t, s) for t, sharding in enumerate(plan.tables) for s in sharding.shards]
    table = np.array([t for t, _ in shards], dtype=np.int64)
    r0, r1, c0, c1, device = (np.array(column, dtype=np.int64) for column in
                              zip(*[(*s.rows, *s.cols, s.device) for _, s in shards]))
    index, where, area = held(previous, table, r0, r1, c0, c1)
    mine = where == device[index]
    here = np.zeros(table.size, dtype=np.int64)
    np.add.at(here, index[mine], area[mine])
    known = np.array([previous.shardings[t] is not None for t in table], dtype=bool)
    moved = np.where(known, moved_bytes(rectangle_bytes(instance, table, r1 - r0, c1 - c0), (r1 - r0) * (c1 - c0),
                                        here), 0)
    return np.bincount(table, weights=moved, minlength=instance.num_tables).astype(np.int64)


def plan_moved_bytes(instance: Instance, previous: Previous, plan: Plan) -> int:
    """The bytes a re-shard from the previous plan to `plan` moves."""
    return int(shard_moves(instance, previous, plan).sum())


# ---------------------------------------------------------------- what a replan must keep


def kept_option_problem(instance: Instance, old: TableSharding, new: TableSharding) -> str | None:
    """Why `new` is not `old` with only its ranks changed (None when it is): the same sharding type, shard
    count, compute kernel and cache load factor, and for table-row-wise the same node."""
    if (new.sharding_type, len(new.shards), new.compute_kernel, new.cache_load_factor) != \
            (old.sharding_type, len(old.shards), old.compute_kernel, old.cache_load_factor):
        return (f"changes from {_label(old)} to {_label(new)}; a reshard changes ranks only (allow type changes "
                "for a checkpoint-and-reload re-shard)")
    per_node = instance.topology.devices_per_node
    if new.sharding_type == TABLE_ROW_WISE and new.shards[0].device // per_node != old.shards[0].device // per_node:
        return "moves to another node; TorchRec's reshard moves table-wise and column-wise shards only"
    return None


def _label(sharding: TableSharding) -> str:
    factor = f"@{sharding.cache_load_factor:g}" if sharding.cache_load_factor is not None else ""
    return f"{sharding.sharding_type} × {len(sharding.shards)} ({sharding.compute_kernel}{factor})"


def check_replan(instance: Instance, previous: Previous, plan: Plan) -> int:
    """The bytes `plan` moves from the previous plan; PlanError, naming the table, where it changes what it
    must keep, or where it moves more than the budget."""
    if previous.keep_types:
        for table, old, new in zip(instance.tables, previous.shardings, plan.tables):
            problem = None if old is None else kept_option_problem(instance, old, new)
            if problem:
                raise PlanError(f"table {table.name}: {problem}")
    moved = plan_moved_bytes(instance, previous, plan)
    if previous.budget is not None and moved > previous.budget:
        raise PlanError(f"the plan moves {moved} B, more than the move budget of {previous.budget} B")
    return moved


def kept_plan(instance: Instance, previous: Previous) -> Plan | None:
    """The previous plan itself, where the instance has exactly its tables (else None)."""
    if not previous.same_tables:
        return None
    return Plan(instance.id, tuple(previous.shardings))


# ---------------------------------------------------------------- reading the old plan


# How a replan's arguments are named in messages: Python's keyword arguments unless an entry point (the CLI)
# names them its own way.
PYTHON_NAMES = {"previous_plan": "previous_plan", "move_budget": "move_budget"}


def previous_plan(instance: Instance, shardings: Mapping[str, TableSharding], budget: int | None = None,
                  keep_types: bool = True, dropped: tuple[str, ...] = (),
                  names: Mapping[str, str] = PYTHON_NAMES) -> Previous:
    """The previous plan over `instance` from the old plan's tables by name (tables it lacks are new; the
    tables of the old plan the instance lacks are `dropped`). Each old table's shards must tile it on this
    topology as TorchRec cuts it; where types are kept, its old type and kernel must still be allowed.
    Errors name the argument (`names`)."""
    where = names["previous_plan"]
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0):
        raise InstanceError(names["move_budget"], f"must be a non-negative number of bytes, got {budget!r}")
    for table in instance.tables:
        if set(instance.allowed_types(table)) <= set(NOT_REPLANNED):
            raise InstanceError("sharding_types", f"table {table.name} allows only {', '.join(NOT_REPLANNED)}, "
                                "which a replan does not plan")
    kept = [t for t in instance.tables if t.name in shardings]
    if not kept:
        raise InstanceError(where, f"shares no table with instance {instance.id!r}")
    # Shapes and cuts alone: memory, types and kernels the new instance narrows are the replan's business.
    roomy = unbounded(replace(instance, tables=tuple(kept)))
    try:
        Plan(roomy.id, tuple(shardings[t.name] for t in kept)).validate(roomy)
    except PlanError as exc:
        raise InstanceError(where, f"does not fit instance {instance.id!r}: {exc}") from exc
    if keep_types:
        for table in kept:
            old = shardings[table.name]
            if old.sharding_type in NOT_REPLANNED:
                raise InstanceError(where, f"table {table.name}: its {_label(old)} cannot be kept, as TorchRec's "
                                    "reshard moves table-wise and column-wise shards only (allow type changes to "
                                    "re-shard it from a checkpoint)")
            if old.sharding_type not in instance.allowed_types(table) or \
                    old.compute_kernel not in instance.allowed_kernels(table, old.sharding_type):
                raise InstanceError(where, f"table {table.name}: its {_label(old)} is no longer allowed, and a "
                                    "reshard keeps it (allow type changes)")
    return Previous(tuple(shardings.get(t.name) for t in instance.tables), None if budget is None else int(budget),
                    keep_types, tuple(dropped))


def unbounded(instance: Instance) -> Instance:
    """The instance with memory to spare and every sharding type and kernel allowed: where an old plan is
    checked for its cuts alone, or exported as the ShardingPlan a job runs now (whatever the new workload
    would need)."""
    tables = tuple(replace(t, sharding_types=None, compute_kernels=None) for t in instance.tables)
    topology = replace(instance.topology, memory_bytes=MAX_MEMORY_BYTES, host_memory_bytes=MAX_MEMORY_BYTES)
    return replace(instance, tables=tables, topology=topology, sharding_types=SHARDING_TYPES, compute_kernels=KERNELS)


def tables_from_dict(data: Any, instance: Instance) -> tuple[dict[str, TableSharding], tuple[str, ...]]:
    """A plan file's tables by name (as `save_plan` writes them, any instance's), split into those of
    `instance` and the names of the others (dropped): errors name the field."""
    if not isinstance(data, dict) or data.get("schema_version") == 1:
        raise InstanceError("schema_version", "a version-1 plan names no tables; a replan reads plans of version 2 "
                            "or later (save the plan again with `shardbench solve` or `plan`)")
    if "topology" in data:
        raise InstanceError("topology", "this file is an instance, not a plan")
    names = {t.name for t in instance.tables}
    entries = data.get("tables")
    dropped: list[str] = []
    if isinstance(entries, list):
        dropped = [e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)
                   and e["name"] not in names]
        entries = [e for e in entries if not (isinstance(e, dict) and e.get("name") in dropped)]
    present = {e.get("name") for e in entries if isinstance(e, dict)} if isinstance(entries, list) else names
    kept = tuple(t for t in instance.tables if t.name in present)
    if not kept:
        raise InstanceError("tables", f"the plan shares no table with instance {instance.id!r}")
    plan = plan_from_dict({**data, "tables": entries}, replace(instance, tables=kept))
    return {t.name: s for t, s in zip(kept, plan.tables)}, tuple(dropped)
