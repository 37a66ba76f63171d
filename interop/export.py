"""A plan as the ShardingPlan TorchRec runs, built with TorchRec's own helpers (so shards are cut by its
rules and must equal ours, with the kernel we priced), a ShardingPlan read back as a plan, and its
readable per-table form."""
from __future__ import annotations

from instances import Instance, InstanceError, Plan, Shard, Table, TableSharding
from instances.model import SHARDING_TYPES

from .common import kernel, torchrec_module, torchrec_sharder


def _generator(instance: Instance, table: Table, sharding: TableSharding):
    from torchrec.distributed import sharding_plan as sp

    kind = sharding.sharding_type
    if kind == "table_wise":
        return sp.table_wise(rank=sharding.shards[0].device, compute_kernel=kernel(kind))
    if kind == "column_wise":
        ordered = sorted(sharding.shards, key=lambda s: s.cols[0])
        return sp.column_wise(ranks=[s.device for s in ordered], compute_kernel=kernel(kind))
    if kind == "row_wise":
        return sp.row_wise(compute_kernel=kernel(kind))
    if kind == "table_row_wise":
        # TorchRec 1.8's table_row_wise helper takes no kernel and falls back to "dense", which its planner
        # never proposes for this type and which runs (and is priced) far slower than the "fused" we price.
        return _with_kernel(sp.table_row_wise(host_index=sharding.shards[0].device // instance.topology.devices_per_node),
                            kernel(kind))
    return sp.data_parallel()


def _with_kernel(generator, compute_kernel: str):
    """A ParameterSharding generator whose output carries `compute_kernel`."""
    import dataclasses

    def generate(*args, **kwargs):
        return dataclasses.replace(generator(*args, **kwargs), compute_kernel=compute_kernel)

    return generate


def to_torchrec(instance: Instance, plan: Plan, device_type: str = "cuda", module=None):
    """The ShardingPlan TorchRec runs for a validated plan, built with TorchRec's helpers; every shard
    TorchRec cuts must be the shard we planned (else the plan is not cut the way TorchRec cuts)."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    plan.validate(instance)
    module = module if module is not None else torchrec_module(instance)
    generators = {t.name: _generator(instance, t, s) for t, s in zip(instance.tables, plan.tables)}
    module_plan = construct_module_sharding_plan(module, generators, sharder=torchrec_sharder(module),
                                                 local_size=instance.topology.devices_per_node,
                                                 world_size=instance.num_devices, device_type=device_type)
    sharding_plan = ShardingPlan({"": module_plan})
    back = from_torchrec_plan(instance, sharding_plan)
    for table, ours, theirs in zip(instance.tables, plan.tables, back.tables):
        if sorted(ours.shards, key=_order) != sorted(theirs.shards, key=_order):
            raise InstanceError(f"plan: table {table.name}", f"its {ours.sharding_type} shards are not cut the way "
                                "TorchRec cuts them (row blocks of ceil(rows / parts), equal column blocks)")
    return sharding_plan


def _order(shard: Shard):
    return (shard.device, shard.rows, shard.cols)


def from_torchrec_plan(instance: Instance, sharding_plan) -> Plan:
    """Our plan for a TorchRec ShardingPlan of the instance's module (tables by name)."""
    module_plan = sharding_plan.plan[""] if hasattr(sharding_plan, "plan") else sharding_plan
    tables = []
    for table in instance.tables:
        if table.name not in module_plan:
            raise InstanceError(f"plan: table {table.name}", "missing from the TorchRec plan")
        sharding = module_plan[table.name]
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
        if kind == "column_wise" and len(shards) == 1:
            # TorchRec cuts a narrow table into one column shard, priced and stored as table-wise by its
            # estimators; our column-wise means two shards or more.
            if "table_wise" not in instance.allowed_types(table):
                raise InstanceError(f"plan: table {table.name}", "TorchRec placed it whole as one column shard, "
                                    "but table_wise is not allowed for it")
            kind = "table_wise"
        tables.append(TableSharding(kind, shards))
    return Plan(instance.id, tuple(tables))


def readable(sharding_plan) -> dict:
    """Per table: sharding type, compute kernel, ranks and each shard's offsets, sizes and placement."""
    out = {}
    for name, sharding in sharding_plan.plan[""].items():
        shards = ([] if sharding.sharding_spec is None else
                  [{"offsets": list(m.shard_offsets), "sizes": list(m.shard_sizes), "placement": str(m.placement)}
                   for m in sharding.sharding_spec.shards])
        out[name] = {"sharding_type": sharding.sharding_type, "compute_kernel": sharding.compute_kernel,
                     "ranks": list(sharding.ranks or []), "shards": shards}
    return out
