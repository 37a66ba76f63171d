"""TorchRec at the edge of the suite: a TorchRec model's tables, topology and constraints imported as an
instance; a plan exported as the ShardingPlan TorchRec runs (built with its own helpers, so shards are
cut by its rules and must equal ours); a ShardingPlan read back as a plan; TorchRec's shard estimators
as the `torchrec` oracle (its perf per shard, summed per rank as its planner rates plans, and its HBM
storage per shard as memory); and TorchRec's planner as a peer solver. torchrec loads only when one of
these is used.

Units: TorchRec's bandwidths are bytes per millisecond and its perf milliseconds; instances keep bytes
per second, so bandwidths are converted at the edge. Compute kernels: `fused` (HBM) for the model-parallel
types and `dense` for data-parallel — the planner peer is held to them too, since instances model device
memory only."""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from costmodels.base import AdditiveOracle, AdditivePriced, Priced
from instances import (
    Instance,
    InstanceError,
    Plan,
    Shard,
    Table,
    TableSharding,
    Topology,
    Workload,
)
from instances.model import SHARDING_TYPES
from instances.pieces import Pieces

STORAGE_RESERVE = 0.15  # TorchRec's default share of HBM kept back; the instance's capacity is the rest
MS = 1000.0             # TorchRec's bandwidths are per millisecond
DATA_TYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
KERNEL = {"data_parallel": "dense"}  # every other type: "fused"
IMPORTED_BINS = (1.0,) + (0.0,) * 16  # unknown reuse: every accessed index once (read by measured/neural only)


def _torchrec():
    warnings.filterwarnings("ignore", module="torchrec")
    warnings.filterwarnings("ignore", module="fbgemm_gpu")
    import logging

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    import torchrec

    return torchrec


def kernel(sharding_type: str) -> str:
    return KERNEL.get(sharding_type, "fused")


# ---------------------------------------------------------------- import


def _data_type_bytes(data_type: Any, path: str) -> int:
    name = getattr(data_type, "name", data_type)
    key = str(name).lower()
    if key not in DATA_TYPES:
        raise InstanceError(path, f"data type must be one of {tuple(DATA_TYPES)}, got {data_type!r}")
    return DATA_TYPES[key]


def from_torchrec(tables, topology, constraints: Mapping[str, Any] | None = None, batch_size: int = 512,
                  instance_id: str = "torchrec") -> Instance:
    """An instance from TorchRec's own objects: EmbeddingBagConfig / EmbeddingConfig list or an
    EmbeddingBagCollection / EmbeddingCollection, a planner Topology, ParameterConstraints per table
    (pooling factors, allowed sharding types) and the batch size per rank."""
    torchrec = _torchrec()
    if isinstance(tables, torchrec.EmbeddingBagCollection):
        configs, pooled = tables.embedding_bag_configs(), True
    elif isinstance(tables, torchrec.EmbeddingCollection):
        configs, pooled = tables.embedding_configs(), False
    else:
        configs = list(tables)
        pooled = None
    constraints = constraints or {}
    out = []
    for i, config in enumerate(configs):
        path = f"tables[{i}]"
        is_pooled = pooled if pooled is not None else isinstance(config, torchrec.EmbeddingBagConfig)
        constraint = constraints.get(config.name)
        factors = list(getattr(constraint, "pooling_factors", None) or [1.0])
        pooling = float(sum(factors))  # one table may serve several features: their lookups add up
        types = getattr(constraint, "sharding_types", None)
        if types is not None:
            bad = [t for t in types if t not in SHARDING_TYPES]
            if bad:
                raise InstanceError(f"{path}.sharding_types", f"{bad[0]!r} is not one of {SHARDING_TYPES}")
        out.append(Table(name=config.name, rows=config.num_embeddings, dim=config.embedding_dim,
                         dtype_bytes=_data_type_bytes(config.data_type, f"{path}.data_type"),
                         pooling_factor=pooling, reuse_bins=IMPORTED_BINS if pooling > 0 else (0.0,) * 17,
                         pooled=is_pooled, sharding_types=tuple(types) if types is not None else None))
    world, local = topology.world_size, topology.local_world_size
    if world % local:
        raise InstanceError("local_world_size", f"{local} does not divide world_size {world}")
    hbm = min(device.storage.hbm for device in topology.devices)  # devices here are alike: the smallest rules
    topo = Topology(nodes=world // local, devices_per_node=local, memory_bytes=int(hbm * (1 - STORAGE_RESERVE)),
                    intra_node_a2a_bw=topology.intra_host_bw * MS, inter_node_a2a_bw=topology.inter_host_bw * MS,
                    device_kind="gpu" if topology.compute_device == "cuda" else topology.compute_device)
    return Instance(instance_id, tuple(out), topo, Workload(batch_size=batch_size, dtype="fp32"),
                    provenance="imported from TorchRec").validate()


SPEC_FIELDS = ("tables", "world_size", "hbm_cap", "batch_size")
SPEC_OPTIONAL = ("local_world_size", "intra_host_bw", "inter_host_bw", "id")
TABLE_FIELDS = ("name", "num_embeddings", "embedding_dim")
TABLE_OPTIONAL = ("data_type", "pooling_factors", "sharding_types", "pooled")


def _positive(value, path: str, kind=int) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
    if not ok or not math.isfinite(value) or value <= 0:
        raise InstanceError(path, f"must be a positive {'integer' if kind is int else 'number'}, got {value!r}")
    return value


def _fields(data: Any, path: str, required, optional) -> dict:
    if not isinstance(data, Mapping):
        raise InstanceError(path or "spec", "must be an object")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise InstanceError(f"{path}.{unknown[0]}" if path else unknown[0], "unknown field")
    for key in required:
        if key not in data:
            raise InstanceError(f"{path}.{key}" if path else key, "missing")
    return dict(data)


def instance_from_spec(spec: Any) -> Instance:
    """An instance from a small spec in TorchRec's field names (see README), through TorchRec's objects."""
    torchrec = _torchrec()
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner import Topology as TorchRecTopology

    spec = _fields(spec, "", SPEC_FIELDS, SPEC_OPTIONAL)
    if not isinstance(spec["tables"], list) or not spec["tables"]:
        raise InstanceError("tables", "must be a non-empty list")
    world = _positive(spec["world_size"], "world_size")
    local = _positive(spec.get("local_world_size", world), "local_world_size")
    configs, constraints = [], {}
    data_types = {"fp32": torchrec.DataType.FP32, "fp16": torchrec.DataType.FP16, "bf16": torchrec.DataType.BF16,
                  "int8": torchrec.DataType.INT8}
    for i, entry in enumerate(spec["tables"]):
        path = f"tables[{i}]"
        entry = _fields(entry, path, TABLE_FIELDS, TABLE_OPTIONAL)
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise InstanceError(f"{path}.name", "must be a non-empty string")
        rows = _positive(entry["num_embeddings"], f"{path}.num_embeddings")
        dim = _positive(entry["embedding_dim"], f"{path}.embedding_dim")
        data_type = str(entry.get("data_type", "fp32")).lower()
        if data_type not in data_types:
            raise InstanceError(f"{path}.data_type", f"must be one of {tuple(data_types)}, got {entry.get('data_type')!r}")
        factors = entry.get("pooling_factors", [1.0])
        if not isinstance(factors, list) or not factors:
            raise InstanceError(f"{path}.pooling_factors", "must be a non-empty list of numbers")
        for j, f in enumerate(factors):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f < 0:
                raise InstanceError(f"{path}.pooling_factors[{j}]", f"must be a finite number >= 0, got {f!r}")
        types = entry.get("sharding_types")
        if types is not None and (not isinstance(types, list) or not types
                                  or any(t not in SHARDING_TYPES for t in types)):
            raise InstanceError(f"{path}.sharding_types", f"must be a non-empty list of {SHARDING_TYPES}, got {types!r}")
        pooled = entry.get("pooled", True)
        if not isinstance(pooled, bool):
            raise InstanceError(f"{path}.pooled", f"must be a boolean, got {pooled!r}")
        config_type = torchrec.EmbeddingBagConfig if pooled else torchrec.EmbeddingConfig
        configs.append(config_type(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[name],
                                   data_type=data_types[data_type]))
        constraints[name] = ParameterConstraints(pooling_factors=[float(f) for f in factors], sharding_types=types)
    hbm = _positive(spec["hbm_cap"], "hbm_cap")
    bandwidths = {key: _positive(spec[key], key, float) / MS for key in ("intra_host_bw", "inter_host_bw") if key in spec}
    topology = TorchRecTopology(world_size=world, local_world_size=local, compute_device="cuda", hbm_cap=hbm,
                                **bandwidths)
    instance_id = spec.get("id", "torchrec")
    if not isinstance(instance_id, str) or not instance_id:
        raise InstanceError("id", "must be a non-empty string")
    return from_torchrec(configs, topology, constraints, _positive(spec["batch_size"], "batch_size"), instance_id)


# ---------------------------------------------------------------- TorchRec's objects for an instance


def torchrec_topology(instance: Instance, compute_device: str = "cuda"):
    from torchrec.distributed.planner import Topology as TorchRecTopology

    topo = instance.topology
    return TorchRecTopology(world_size=instance.num_devices, local_world_size=topo.devices_per_node,
                            compute_device=compute_device, hbm_cap=int(topo.memory_bytes / (1 - STORAGE_RESERVE)),
                            intra_host_bw=topo.intra_node_a2a_bw / MS, inter_host_bw=topo.inter_node_a2a_bw / MS)


def torchrec_module(instance: Instance, device: str = "meta"):
    """The EmbeddingBagCollection (pooled tables) or EmbeddingCollection (sequence tables) of the instance,
    one feature per table, named like the table."""
    torchrec = _torchrec()
    import torch

    pooled = {t.pooled for t in instance.tables}
    if len(pooled) > 1:
        raise InstanceError("tables", "the TorchRec adapter takes all-pooled or all-sequence tables, not a mix")
    types = {4: torchrec.DataType.FP32, 2: torchrec.DataType.FP16, 1: torchrec.DataType.INT8}
    if pooled == {True}:
        configs = [torchrec.EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                               feature_names=[t.name], data_type=types[t.dtype_bytes])
                   for t in instance.tables]
        return torchrec.EmbeddingBagCollection(tables=configs, device=torch.device(device))
    configs = [torchrec.EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[t.name],
                                        data_type=types[t.dtype_bytes]) for t in instance.tables]
    return torchrec.EmbeddingCollection(tables=configs, device=torch.device(device))


def torchrec_sharder(module):
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder() if isinstance(module, EmbeddingBagCollection) else EmbeddingCollectionSharder()


def torchrec_constraints(instance: Instance) -> dict:
    from torchrec.distributed.planner import ParameterConstraints

    return {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor], sharding_types=list(instance.allowed_types(t)),
                                         compute_kernels=["fused", "dense"]) for t in instance.tables}


# ---------------------------------------------------------------- export and back


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


# ---------------------------------------------------------------- TorchRec's estimator as an oracle


@dataclass
class _Estimates:
    """TorchRec's estimators for an instance with the sharder data they read, and each table's
    table-wise option (from TorchRec's enumerator) as the template every other option is made from."""

    estimators: list
    sharder_data: Any
    templates: dict  # table name -> table-wise ShardingOption

    def estimate(self, options: list) -> None:
        for estimator in self.estimators:
            estimator.estimate(options, sharder_data_map=self.sharder_data)


class TorchRecOracle(AdditiveOracle):
    """Each shard priced by TorchRec's EmbeddingPerfEstimator (its `perf.total`, ms) and stored as its
    EmbeddingStorageEstimator says (HBM bytes, input and output buffers included); a device's cost is the
    sum over its shards, as TorchRec's planner rates a plan. Shards must be TorchRec's cuts. TorchRec
    estimates a shard from its size alone, so equal shards of an option are estimated once."""

    name = "torchrec"
    description = "TorchRec 1.8's shard perf and storage estimators, per-rank sum (ms; HBM storage as memory)"
    unit = "ms"
    has_breakdown = True
    own_memory = True

    def __init__(self):
        self._cache: tuple[Instance, _Estimates] | None = None  # the last instance priced and its estimators

    def _estimates(self, instance: Instance) -> _Estimates:
        if self._cache is None or self._cache[0] is not instance:
            from torchrec.distributed.planner import ParameterConstraints
            from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
            from torchrec.distributed.planner.shard_estimators import (
                EmbeddingPerfEstimator,
                EmbeddingStorageEstimator,
            )
            from torchrec.distributed.planner.utils import (
                build_sharder_data_map,
                sharder_name,
            )

            _torchrec()
            topology = torchrec_topology(instance)
            constraints = torchrec_constraints(instance)
            estimators = [EmbeddingPerfEstimator(topology, constraints), EmbeddingStorageEstimator(topology, constraints)]
            templates_only = {name: ParameterConstraints(pooling_factors=c.pooling_factors, sharding_types=["table_wise"],
                                                         compute_kernels=["fused"]) for name, c in constraints.items()}
            enumerator = EmbeddingEnumerator(topology=topology, batch_size=instance.workload.batch_size,
                                             constraints=templates_only, estimator=[])
            module = torchrec_module(instance)
            sharders = [torchrec_sharder(module)]
            options = enumerator.enumerate(module, sharders)
            sharder_data = build_sharder_data_map({sharder_name(s.module_type): s for s in sharders})
            self._cache = (instance, _Estimates(estimators, sharder_data, {o.name: o for o in options}))
        return self._cache[1]

    def _option(self, instance: Instance, table: Table, kind: str, width: int):
        """TorchRec's option for its cut of `table` as `kind` (column blocks of `width`), with one shard per
        distinct shard size, and the offsets of every shard of the full cut."""
        from torchrec.distributed.planner.enumerators import get_partition_by_type
        from torchrec.distributed.planner.types import Shard as TorchRecShard

        from instances.sharding import column_cuts, row_cuts

        k, per_node = instance.num_devices, instance.topology.devices_per_node
        if kind == "column_wise":
            cuts = [((0, table.rows), c) for c in column_cuts(table.dim, table.dim // width)]
        elif kind in ("row_wise", "table_row_wise"):
            cuts = [(r, (0, table.dim)) for r in row_cuts(table.rows, k if kind == "row_wise" else per_node)]
        else:
            cuts = [((0, table.rows), (0, table.dim))] * (k if kind == "data_parallel" else 1)
        sizes = {}
        for r, c in cuts:
            sizes.setdefault((r[1] - r[0], c[1] - c[0]), (r[0], c[0]))
        option = copy.copy(self._estimates(instance).templates[table.name])  # shallow: module and tensor shared
        option.sharding_type, option.compute_kernel = kind, kernel(kind)
        option.partition_by = get_partition_by_type(kind)
        option.shards = [TorchRecShard(size=list(size), offset=list(offset)) for size, offset in sizes.items()]
        return option, {(r[0], c[0]) for r, c in cuts}

    def bind(self, instance: Instance, pieces: Pieces) -> Priced:
        rows, width = pieces.rows.tolist(), pieces.width.tolist()
        row_start, col_start = pieces.row_start.tolist(), pieces.col_start.tolist()
        groups: dict[tuple, list[int]] = {}
        for p, key in enumerate(zip(pieces.table.tolist(), pieces.kind.tolist(), width)):
            groups.setdefault(key, []).append(p)
        options = {key: self._option(instance, instance.tables[key[0]], SHARDING_TYPES[key[1]], key[2]) for key in groups}
        self._estimates(instance).estimate([option for option, _ in options.values()])
        breakdown = np.zeros((len(pieces), 4))
        memory = np.zeros(len(pieces), dtype=np.int64)
        for key, members in groups.items():
            table, kind = instance.tables[key[0]], SHARDING_TYPES[key[1]]
            option, offsets = options[key]
            by_size = {tuple(s.size): (s.perf, s.storage.hbm) for s in option.shards}
            for p in members:
                if (row_start[p], col_start[p]) not in offsets:
                    raise InstanceError(f"table {table.name}", f"a {kind} shard at rows {row_start[p]}, cols "
                                        f"{col_start[p]} is not one TorchRec cuts: the torchrec oracle prices "
                                        "TorchRec's own cuts")
                perf, hbm = by_size[(rows[p], width[p])]
                breakdown[p] = (perf.fwd_compute, perf.bwd_compute + perf.prefetch_compute, perf.fwd_comms,
                                perf.bwd_comms)
                memory[p] = hbm
        return AdditivePriced(instance, pieces, breakdown=breakdown, memory=memory)

    def piece_breakdown(self, instance: Instance, pieces: Pieces) -> np.ndarray:
        return self.bind(instance, pieces).breakdown


# ---------------------------------------------------------------- TorchRec's planner as a peer


def plan_with_torchrec(instance: Instance) -> tuple[Plan, list[float]]:
    """TorchRec's EmbeddingShardingPlanner with its default proposers, on the instance's tables, topology,
    batch and allowed types (HBM kernels only; the reserve as the instance's memory says): our plan of its
    best plan, and its own per-rank totals (Σ shard perf.total)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    _torchrec()
    module = torchrec_module(instance)
    planner = EmbeddingShardingPlanner(topology=torchrec_topology(instance), batch_size=instance.workload.batch_size,
                                       constraints=torchrec_constraints(instance),
                                       storage_reservation=FixedPercentageStorageReservation(STORAGE_RESERVE),
                                       debug=False)
    sharding_plan = planner.plan(module, [torchrec_sharder(module)])
    totals = [0.0] * instance.num_devices
    for option in planner._best_plan or []:
        for shard in option.shards:
            totals[shard.rank] += shard.perf.total
    return from_torchrec_plan(instance, sharding_plan), totals


def planner_solver(problem, budget, seed):
    """The `torchrec-planner` peer: TorchRec plans with its own estimator, whatever oracle guides the
    others; its planning time and its own rating of the plan are kept in the stats."""
    import time

    from torchrec.distributed.planner.types import PlannerError

    from solvers.base import Cause, NoPlan, SolveResult, Status

    started = time.monotonic()
    try:
        plan, totals = plan_with_torchrec(problem.instance)
    except PlannerError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return SolveResult(Status.NO_PLAN, reason=f"TorchRec's planner found no plan under its own model: {first}",
                           no_plan=NoPlan(Cause.PEER_MODEL),
                           stats={"planning_seconds": time.monotonic() - started})
    return SolveResult(Status.FEASIBLE, plan=plan, stats={"planning_seconds": time.monotonic() - started,
                                                          "torchrec_rating": max(totals)})
