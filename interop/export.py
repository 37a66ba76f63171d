"""A plan as the ShardingPlan TorchRec runs, built with TorchRec's own helpers (so shards are cut by its
rules and must equal ours, with the kernel we priced), for one module or every shardable module of a
model; a ShardingPlan read back as a plan, re-rated by TorchRec's own enumerator and estimators, and its
readable per-table form; and for a replan, an old ShardingPlan's tables and the delta that
DistributedModelParallel.reshard takes."""
from __future__ import annotations

from typing import Mapping

from instances import Instance, InstanceError, Plan, Shard, Table, TableSharding
from instances.sharding import check_capacity
from instances.kernels import FUSED_UVM_CACHING, TORCHREC_LOAD_FACTOR, kernel_problem
from instances.model import SHARDING_TYPES

from .common import (
    ShardableModule,
    torchrec_constraints,
    torchrec_model,
    torchrec_modules,
    torchrec_sharders,
    torchrec_topology,
)


def _generator(instance: Instance, sharding: TableSharding):
    from torchrec.distributed import sharding_plan as sp

    kind = sharding.sharding_type
    per_node = instance.topology.devices_per_node
    if kind == "table_wise":
        generator = sp.table_wise(rank=sharding.shards[0].device)
    elif kind in ("column_wise", "table_column_wise"):  # TorchRec has no table_column_wise helper: its blocks
        ordered = sorted(sharding.shards, key=lambda s: s.cols[0])  # are column-wise's, on one node's ranks
        generator = sp.column_wise(ranks=[s.device for s in ordered])
    elif kind == "row_wise":
        generator = sp.row_wise()
    elif kind == "table_row_wise":
        generator = sp.table_row_wise(host_index=sharding.shards[0].device // per_node)
    elif kind == "grid_shard":  # each column block's node, in column order (TorchRec's own cut)
        first_rows = sorted((s for s in sharding.shards if s.device % per_node == 0), key=lambda s: s.cols[0])
        generator = sp.grid_shard(host_indexes=[s.device // per_node for s in first_rows])
    else:
        generator = sp.data_parallel()
    return _with_kernel(generator, kind, sharding.compute_kernel, sharding.cache_load_factor)


def _with_kernel(generator, kind: str, compute_kernel: str, load_factor: float | None):
    """A ParameterSharding generator whose output carries the sharding type and kernel we priced, and the
    cache load factor for a cached table. TorchRec's helpers default to "dense" unless told (table_row_wise
    takes no kernel at all): a kernel TorchRec's planner never proposes there, which runs and is priced far
    slower."""
    import dataclasses

    from torchrec.distributed.types import CacheParams

    cache = CacheParams(load_factor=load_factor) if load_factor is not None else None

    def generate(*args, **kwargs):
        return dataclasses.replace(generator(*args, **kwargs), sharding_type=kind, compute_kernel=compute_kernel,
                                   cache_params=cache)

    return generate


def to_torchrec(instance: Instance, plan: Plan, device_type: str = "cuda", path: str = ""):
    """The ShardingPlan TorchRec runs for a validated plan of the instance's modules (interop.common's
    torchrec_modules; tables by name), keyed by `path`, the module's path in the model (with one module per
    kind below it where the tables live in modules of several kinds)."""
    return to_torchrec_model(instance, plan, torchrec_modules(instance, path=path), device_type)


def to_torchrec_model(instance: Instance, plan: Plan, modules: list[ShardableModule], device_type: str = "cuda"):
    """The ShardingPlan TorchRec runs for a validated plan of a model's shardable modules, one entry per
    module path, built with TorchRec's helpers; every shard TorchRec cuts must be the shard we planned
    (else the plan is not cut the way TorchRec cuts)."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    plan.validate(instance)
    check_torchrec_storage(instance, plan)
    index = {t.name: i for i, t in enumerate(instance.tables)}
    out = {}
    for entry in modules:
        generators = {name: _generator(instance, plan.tables[index[ours]]) for name, ours in entry.tables}
        module_plan = construct_module_sharding_plan(entry.module, generators, sharder=entry.sharder,
                                                     local_size=instance.topology.devices_per_node,
                                                     world_size=instance.num_devices, device_type=device_type)
        for name, ours in entry.tables:
            table, planned = instance.tables[index[ours]], plan.tables[index[ours]]
            theirs = _table_sharding(instance, table, module_plan[name])
            if sorted(planned.shards, key=_order) != sorted(theirs.shards, key=_order):
                raise InstanceError(f"plan: table {table.name}", f"its {planned.sharding_type} shards are not cut the "
                                    "way TorchRec cuts them (row blocks of ceil(rows / parts), equal column blocks)")
        out[entry.path] = module_plan
    return ShardingPlan(out)


def check_torchrec_storage(instance: Instance, plan: Plan) -> None:
    """Raises PlanError where a device would hold more than its memory by TorchRec's own storage estimate
    (interop.formulas, equal to its estimator: weights, caches and each shard's input and output buffers):
    a plan TorchRec's planner would call out of memory is not handed to it."""
    from .oracle import TorchRecOracle

    check_capacity(TorchRecOracle().storage_per_device(instance, plan), instance, " by TorchRec's storage estimate")


def _order(shard: Shard):
    return (shard.device, shard.rows, shard.cols)


def _table_sharding(instance: Instance, table: Table, sharding) -> TableSharding:
    kind = sharding.sharding_type
    if kind not in SHARDING_TYPES:
        raise InstanceError(f"plan: table {table.name}", f"sharding type {kind} has no counterpart here")
    if kind == "data_parallel":
        shards = tuple(Shard(d, (0, table.rows), (0, table.dim)) for d in range(instance.num_devices))
    else:
        shards = tuple(Shard(int(meta.placement.rank()),
                             (int(meta.shard_offsets[0]), int(meta.shard_offsets[0] + meta.shard_sizes[0])),
                             (int(meta.shard_offsets[1]), int(meta.shard_offsets[1] + meta.shard_sizes[1])))
                       for meta in sharding.sharding_spec.shards)
    if kind in ("column_wise", "table_column_wise") and len(shards) == 1:
        # TorchRec cuts a narrow table into one column shard, priced and stored as table-wise by its
        # estimators; our column-wise means two shards or more.
        if "table_wise" not in instance.allowed_types(table):
            raise InstanceError(f"plan: table {table.name}", "TorchRec placed it whole as one column shard, "
                                "but table_wise is not allowed for it")
        kind = "table_wise"
    if kind == "grid_shard" and all(s.cols == (0, table.dim) for s in shards):
        # A grid of one column block is table-row-wise under another name (TorchRec prices it so).
        if "table_row_wise" not in instance.allowed_types(table):
            raise InstanceError(f"plan: table {table.name}", "TorchRec placed it as a grid of one column block, "
                                "but table_row_wise is not allowed for it")
        kind = "table_row_wise"
    kernel = sharding.compute_kernel
    load_factor = None
    if kernel == FUSED_UVM_CACHING:
        # Without a load factor of its own, TorchRec sizes (and prices) the cache at its default ratio.
        given = sharding.cache_params.load_factor if sharding.cache_params is not None else None
        load_factor = float(given) if given is not None else TORCHREC_LOAD_FACTOR
    problem = kernel_problem(kind, kernel, load_factor)
    if problem:
        raise InstanceError(f"plan: table {table.name}", problem)
    return TableSharding(kind, shards, kernel, load_factor)


def _table_plans(sharding_plan, path: str | None) -> dict:
    """Every table's ParameterSharding in a ShardingPlan (or a module plan): of its modules at `path` or
    below it (every module when not given), by table name."""
    if not hasattr(sharding_plan, "plan"):
        return dict(sharding_plan)
    found = {}
    for where, module_plan in sharding_plan.plan.items():
        if path is None or where == path or where.startswith(f"{path}." if path else ""):
            found.update(module_plan)
    if not found:
        raise InstanceError("plan", f"the ShardingPlan has no module at path {path!r} (it has {sorted(sharding_plan.plan)})")
    return found


def from_torchrec_plan(instance: Instance, sharding_plan, path: str | None = None) -> Plan:
    """Our plan for a TorchRec ShardingPlan of the instance's modules (tables by name) at or below `path`
    (every module of the plan when not given)."""
    table_plans = _table_plans(sharding_plan, path)
    tables = []
    for table in instance.tables:
        if table.name not in table_plans:
            raise InstanceError(f"plan: table {table.name}", "missing from the TorchRec plan")
        tables.append(_table_sharding(instance, table, table_plans[table.name]))
    return Plan(instance.id, tuple(tables))


def rate_with_torchrec(instance: Instance, sharding_plan, path: str | None = None) -> list[float]:
    """TorchRec's own rating of an exported ShardingPlan of the instance's modules: per rank, the sum of
    its shards' perf.total (ms), as its planner rates a plan."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan

    table_plans = _table_plans(sharding_plan, path)
    plan = ShardingPlan({entry.path: EmbeddingModuleShardingPlan({name: table_plans[name] for name, _ in entry.tables})
                         for entry in torchrec_modules(instance)})
    return torchrec_rating(torchrec_model(instance), torchrec_sharders(), plan, torchrec_topology(instance),
                           instance.workload.batch_size, torchrec_constraints(instance))


def torchrec_rating(model, sharders: list, sharding_plan, topology, batch_size: int,
                    constraints: Mapping[str, object] | None = None) -> list[float]:
    """Per rank, the sum of perf.total (ms) of the shards a ShardingPlan puts there, as TorchRec's planner
    rates a plan: its EmbeddingEnumerator and default estimators on `model`, each table restricted to its
    planned sharding type, kernel and column block, each shard on its planned rank. `constraints` give the
    pooling factors (and the rest TorchRec reads); their types and kernels are replaced."""
    import dataclasses

    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    planned = {(path, name): sharding for path, module_plan in sharding_plan.plan.items()
               for name, sharding in module_plan.items()}
    narrowed: dict[str, ParameterConstraints] = {}
    for (path, name), sharding in planned.items():
        base = narrowed.get(name) or (constraints or {}).get(name) or ParameterConstraints()
        width = _column_block(sharding)
        if width is not None and base.min_partition not in (None, width):
            raise InstanceError(f"plan: table {name}", "two modules cut it into different column blocks; TorchRec's "
                                "constraints, keyed by table name, cannot rate both")
        narrowed[name] = dataclasses.replace(
            base, sharding_types=sorted({*(base.sharding_types if name in narrowed else ()), sharding.sharding_type}),
            compute_kernels=sorted({*(base.compute_kernels if name in narrowed else ()), sharding.compute_kernel}),
            cache_params=sharding.cache_params if sharding.cache_params is not None else base.cache_params,
            min_partition=width if width is not None else base.min_partition)
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch_size, constraints=narrowed)
    options = enumerator.enumerate(model, sharders)
    totals = [0.0] * topology.world_size
    for (path, name), sharding in planned.items():
        option = _matching_option(options, path, name, sharding)
        ranks = _ranks(sharding, option)
        for shard, rank in zip(option.shards, ranks):
            totals[rank] += shard.perf.total
    return totals


def _column_block(sharding) -> int | None:
    """The width of a plan's column blocks, which TorchRec's enumerator cuts only as its min_partition says."""
    if sharding.sharding_type not in ("column_wise", "table_column_wise", "grid_shard"):
        return None
    return int(sharding.sharding_spec.shards[0].shard_sizes[1])


def _cut(sharding) -> set | None:
    """The (offsets, sizes) of a planned ParameterSharding's shards (None for data-parallel: no spec)."""
    if sharding.sharding_spec is None:
        return None
    return {(tuple(m.shard_offsets), tuple(m.shard_sizes)) for m in sharding.sharding_spec.shards}


def _matching_option(options: list, path: str, name: str, sharding):
    for option in options:
        if (option.path, option.name, option.sharding_type, option.compute_kernel) != \
                (path, name, sharding.sharding_type, sharding.compute_kernel):
            continue
        cut = _cut(sharding)
        if cut is None or cut == {(tuple(s.offset), tuple(s.size)) for s in option.shards}:
            return option
    raise InstanceError(f"plan: table {name}" + (f" of {path}" if path else ""),
                        f"TorchRec's enumerator proposes no {sharding.sharding_type} / {sharding.compute_kernel} option "
                        "cut as the plan cuts it")


def _ranks(sharding, option) -> list[int]:
    """The rank of each of the option's shards, as the plan places them."""
    if sharding.sharding_spec is None:
        return list(sharding.ranks)
    rank_of = {tuple(m.shard_offsets): int(m.placement.rank()) for m in sharding.sharding_spec.shards}
    return [rank_of[tuple(s.offset)] for s in option.shards]


def readable(sharding_plan) -> dict:
    """Per table (named `path.table` for a module below the model's root): sharding type, compute kernel,
    cache load factor (null where the kernel keeps no cache), ranks and each shard's offsets, sizes and
    placement."""
    out = {}
    for path, module_plan in sharding_plan.plan.items():
        for name, sharding in module_plan.items():
            shards = ([] if sharding.sharding_spec is None else
                      [{"offsets": list(m.shard_offsets), "sizes": list(m.shard_sizes), "placement": str(m.placement)}
                       for m in sharding.sharding_spec.shards])
            out[f"{path}.{name}" if path else name] = {
                "sharding_type": sharding.sharding_type, "compute_kernel": sharding.compute_kernel,
                "cache_load_factor": getattr(sharding.cache_params, "load_factor", None),
                "ranks": list(sharding.ranks or []), "shards": shards}
    return out


def tables_from_torchrec(instance: Instance, sharding_plan, path: str | None = None,
                         names: Mapping[tuple[str, str], str] | None = None) -> tuple[dict, tuple[str, ...]]:
    """A TorchRec ShardingPlan's tables as our shardings by instance table name, split into the instance's
    tables and the names of the others (dropped). Tables are named as in the plan (of its modules at or below
    `path`, every module when not given), or through `names`: (module path, table) → instance name."""
    if names is None:
        found = {name: (name, sharding) for name, sharding in _table_plans(sharding_plan, path).items()}
    else:
        found = {f"{where}.{name}" if where else name: (names.get((where, name)), sharding)
                 for where, module_plan in sharding_plan.plan.items() for name, sharding in module_plan.items()}
    by_name = {t.name: t for t in instance.tables}
    kept = {ours: _table_sharding(instance, by_name[ours], sharding) for ours, sharding in found.values()
            if ours in by_name}
    if not kept:
        raise InstanceError("plan", f"the ShardingPlan shares no table with instance {instance.id!r}")
    return kept, tuple(sorted(label for label, (ours, _) in found.items() if ours not in by_name))


def same_tables(old_plan, new_plan) -> bool:
    """Whether two ShardingPlans shard the same tables of the same modules (a running job can then reshard
    from one to the other)."""
    return sorted(old_plan.plan) == sorted(new_plan.plan) and all(
        sorted(module_plan) == sorted(new_plan.plan[path]) for path, module_plan in old_plan.plan.items())


def reshard_delta(old_plan, new_plan) -> dict:
    """What DistributedModelParallel.reshard takes to go from one ShardingPlan to another: per module path,
    (TorchRec's own estimate of the data volume in MB, the ParameterShardings whose ranks change), from
    TorchRec's `output_sharding_plans_delta`. The two plans must shard the same modules and tables."""
    from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plans_delta

    if not same_tables(old_plan, new_plan):
        raise InstanceError("plan", "the previous ShardingPlan's modules and tables are not the new plan's; a running "
                            "job reshards the tables it has")
    return output_sharding_plans_delta(old_plan.plan, new_plan.plan, return_data_volume=True)
