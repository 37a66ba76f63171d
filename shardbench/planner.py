"""`ShardbenchPlanner`: TorchRec's planner interface (`plan`, `collective_plan`) over shardbench's
portfolio, so that TorchRec code (DistributedModelParallel included) takes its ShardingPlan as its own."""
from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, StorageReservation, Topology
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

from instances import Instance, InstanceError
from instances.kernels import HOST_KERNELS, KERNELS, kernels_for
from instances.memory import format_bytes
from instances.model import DEFAULT_SHARDING_TYPES, SHARDING_TYPES
from interop.common import ShardableModule
from interop.export import to_torchrec_model
from interop.common import STORAGE_RESERVE
from interop.importer import assumes_default_ddr, cache_load_factor, from_torchrec, host_memory_bytes

from .pipeline import DEFAULT_ORACLE, longer_budget_note, plan_request, run
from .portfolio import PortfolioResult

MODELLED = (EmbeddingBagCollection, EmbeddingCollection, FeatureProcessedEmbeddingBagCollection)
# The sharding types TorchRec's enumerator offers a feature-processed module's tables only when the
# constraints name them (its GUARDED_SHARDING_TYPES_FOR_FP_MODULES).
FEATURE_PROCESSED_GUARDED = ("row_wise", "table_row_wise", "grid_shard")


@dataclass(frozen=True)
class _Found:
    """A shardable module of the model with its sharder and its tables' configs; the tables whose inputs
    carry weights, and whether the module is feature-processed (TorchRec then guards its row-wise types)."""

    path: str
    module: nn.Module
    sharder: ModuleSharder
    configs: tuple
    weighted: frozenset = frozenset()
    processed: bool = False


class ShardbenchPlanner(ShardingPlanner):
    """Plans every EmbeddingBagCollection (weighted or not), FeatureProcessedEmbeddingBagCollection and
    EmbeddingCollection of a model jointly with shardbench's planning pipeline (the best validated plan of
    its portfolio within `budget` seconds, with the best bound any member proved over the enumerated
    options) and returns TorchRec's ShardingPlan, keyed by each module's path.

    Built like TorchRec's EmbeddingShardingPlanner from a `Topology`, the `batch_size` per rank,
    `constraints` (ParameterConstraints by table name) and a `storage_reservation` (TorchRec's default,
    HeuristicalStorageReservation(0.15), when not given: 15 % of HBM and room for the dense parameters and
    input batches, reserved on the real model), plus `budget` (seconds), `oracle` (the cost model the
    solvers optimise; `torchrec`, TorchRec's own estimator, by default), `solvers` (default: the recommended
    portfolio), `seed`, `gap` (stop once a plan is certified within this fraction of its bound; default
    0) and `resize_caches` (offer caches the load factors the LP over every load factor picks, and re-size
    the kept plan's caches off the options' grid of load factors; default True; the certificate over the
    options is the plan's before re-sizing, the one over every load factor the plan's as handed over). After `plan`, `result` holds the PortfolioResult (objective, bound, gap, winning solver, members,
    notes) and `instance` the instance planned (a table that shares its name with another module's, or has
    a ".", is renamed there after its module's path).

    Every table is priced as TorchRec prices it on this model: each of its features' pooling factors (one
    input and one pooled output each, as its constraints give them), weighted inputs (a weighted EBC or a
    feature processor) and its module's kind. On a cuda Topology its DDR is host memory where tables may
    live (`fused_uvm`, `fused_uvm_caching`), as in TorchRec's planner: TorchRec's default of 128 GiB per rank
    where no ddr_cap was given, which `result.notes` and the log then say.

    Constraints are honoured, not ignored: `sharding_types` narrow a table's types (together with what its
    sharder supports on the topology's compute device; a feature-processed module's tables take row-wise
    types only where the constraints name them, as TorchRec's enumerator has it); `pooling_factors` set its
    inputs; `compute_kernels` narrow its kernels to those its sharder allows, they allow and shardbench models
    (`fused`, `fused_uvm`, `fused_uvm_caching`, `dense`), and its types to those left a kernel;
    `cache_params.load_factor` fixes its cache size (else one is chosen per table). A table whose
    constraints leave no modelled kernel, or that sets other CacheParams fields (`stats` aside, which
    nothing at run time reads), `num_poolings` or `batch_sizes`, is refused with an error naming it. A
    cpu topology plans in its DDR as device memory, as TorchRec does.

    In an initialised process group, `plan` plans on rank 0 and broadcasts its ShardingPlan, as TorchRec's
    `collective_plan` does, so every rank gets the same plan whatever each rank's clock would have given;
    `result` is then set on rank 0 only.

    Given `previous_plan` (the ShardingPlan the job runs now), `plan` replans from it: the best plan that
    moves at most `move_budget` bytes of shards with their optimizer state (a number or a size such as
    "20GiB"; None: unlimited; 0 keeps it), every old table keeping its sharding type, shard count and kernel
    unless `allow_type_changes`; `result.moved_bytes` says what it moves, and `reshard_delta` holds what
    `DistributedModelParallel.reshard` takes to get there (None where tables were added or dropped, or types
    may change: then re-shard from a checkpoint)."""

    def __init__(self, topology: Topology, batch_size: int | None = None,
                 constraints: dict[str, ParameterConstraints] | None = None, budget: float = 10.0,
                 oracle: str = DEFAULT_ORACLE, solvers: list[str] | None = None, seed: int = 0, gap: float = 0.0,
                 storage_reservation: StorageReservation | None = None, previous_plan: ShardingPlan | None = None,
                 move_budget: int | str | None = None, allow_type_changes: bool = False,
                 resize_caches: bool = True) -> None:
        from .replanning import move_budget_bytes

        self._topology = topology
        self._batch_size = batch_size if batch_size else BATCH_SIZE
        self._constraints = dict(constraints or {})
        self._budget, self._oracle, self._solvers, self._seed, self._gap = budget, oracle, solvers, seed, gap
        self._reservation = storage_reservation
        self._previous, self._keep_types = previous_plan, not allow_type_changes
        self._move_budget = move_budget_bytes(move_budget)
        self._resize_caches = resize_caches
        self.result: PortfolioResult | None = None
        self.instance: Instance | None = None
        self.reshard_delta: dict | None = None

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None) -> ShardingPlan:
        """The ShardingPlan of every shardable module of `module` (found by `sharders`, TorchRec's
        defaults when not given), planned jointly — on rank 0 and broadcast when a process group is
        initialised (a replan's `reshard_delta` then set on every rank). Raises PlannerError when no member
        finds a plan."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            plan = self.collective_plan(module, sharders)
        else:
            plan = self._plan_here(module, sharders)
        self.reshard_delta = self._delta(plan)
        return plan

    def collective_plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None,
                        pg: dist.ProcessGroup | None = None) -> ShardingPlan:
        """The plan made on rank 0 of `pg` (the default group when not given), broadcast to every rank;
        `result` is set on rank 0 only."""
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result

        if pg is None:
            if not dist.is_initialized():
                raise PlannerError("collective_plan needs an initialised process group; use plan() on one process")
            pg = dist.GroupMember.WORLD
        return invoke_on_rank_and_broadcast_result(pg, 0, self._plan_here, module, sharders)

    def _plan_here(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None) -> ShardingPlan:
        sharders = sharders if sharders is not None else get_default_sharders()
        found = _shardable_modules(module, sharders)
        if not found:
            raise PlannerError("shardbench: the model has no module its sharders shard")
        names = _instance_names(found)
        instance, notes = self._instance(found, names, module, sharders)
        for note in notes:
            logging.getLogger("shardbench").warning("shardbench: %s", note)
        self.instance = instance
        previous = self._previous_over(instance, names)
        self.result = run(plan_request(instance, self._oracle, budget=self._budget, solvers=self._solvers,
                                       seed=self._seed, gap=self._gap, notes=notes, previous=previous,
                                       resize_caches=self._resize_caches)).result
        if self.result.plan is None:
            raise PlannerError(f"shardbench found no plan within {self._budget} s: {self.result.no_plan_reason}")
        if self.result.core_later:
            logging.getLogger("shardbench").warning("shardbench: %s",
                                                    longer_budget_note(instance, self.result.core_later))
        modules = [ShardableModule(f.path, f.module, f.sharder,
                                   tuple((c.name, names[f.path, c.name]) for c in f.configs)) for f in found]
        return to_torchrec_model(instance, self.result.plan, modules, device_type=self._topology.compute_device)

    def _delta(self, plan: ShardingPlan) -> dict | None:
        """What DistributedModelParallel.reshard takes from the previous plan to `plan`, where a running job can
        reshard into it (a replan keeping types, of the same tables), else None."""
        from interop.export import reshard_delta, same_tables

        if self._previous is None or not self._keep_types or not same_tables(self._previous, plan):
            return None
        return reshard_delta(self._previous, plan)

    def _previous_over(self, instance: Instance, names: dict[tuple[str, str], str]):
        """The previous ShardingPlan over the instance's tables (a replan), or None."""
        if self._previous is None:
            return None
        from interop.export import tables_from_torchrec
        from instances.moves import previous_plan

        tables, dropped = tables_from_torchrec(instance, self._previous, names=names)
        return previous_plan(instance, tables, self._move_budget, self._keep_types, dropped)

    def _reserved(self, module: nn.Module, sharders: list) -> Topology:
        """The Topology with the storage reservation taken off, as TorchRec's planner reserves it on the model."""
        reservation = self._reservation
        if reservation is None:
            with warnings.catch_warnings():  # its advice to pick another policy: this one is TorchRec's default
                warnings.simplefilter("ignore", FutureWarning)
                reservation = HeuristicalStorageReservation(percentage=STORAGE_RESERVE)
        return reservation.reserve(self._topology, self._batch_size, module, sharders, self._constraints)

    def _instance(self, found: list[_Found], names: dict[tuple[str, str], str], model: nn.Module,
                  sharders: list) -> tuple[Instance, tuple[str, ...]]:
        """One instance of every table of every module, under its instance name, with its constraints
        narrowed to what shardbench models; with the assumptions it rests on."""
        import dataclasses

        configs, constraints, weighted, given_as = [], {}, [], {}
        device = self._topology.compute_device
        host = host_memory_bytes(self._topology) > 0
        for f in found:
            supported = f.sharder.sharding_types(device)
            for config in f.configs:
                name = names[f.path, config.name]
                given_as[name] = config.name
                configs.append(dataclasses.replace(config, name=name))
                if config.name in f.weighted:
                    weighted.append(name)
                given = self._constraints.get(config.name) or ParameterConstraints()
                kinds = supported if given.sharding_types or not f.processed else \
                    [k for k in supported if k not in FEATURE_PROCESSED_GUARDED]
                kernels = _allowed_kernels(config.name, given, kinds, host,
                                           lambda kind, s=f.sharder: s.compute_kernels(kind, device))
                allowed = tuple(k for k in KERNELS if any(k in ks for ks in kernels.values()))
                load_factor = cache_load_factor(given.cache_params, f"constraints[{config.name!r}].cache_params",
                                                config.name)
                constraints[name] = ParameterConstraints(
                    sharding_types=list(kernels), pooling_factors=given.pooling_factors,
                    compute_kernels=list(allowed),
                    cache_params=CacheParams(load_factor=load_factor) if load_factor is not None else None)
        try:
            instance = from_torchrec(
                configs, self._reserved(model, sharders), constraints, self._batch_size, instance_id="torchrec-model",
                weighted=weighted, reserved=True,
                load_factor_field=lambda _, n: f"constraints[{given_as[n]!r}].cache_params.load_factor")
        except InstanceError as error:  # named as the user named it: the table's constraints, not our index
            match = re.fullmatch(r"tables\[(\d+)\]\.(\w+)", error.field)
            if match is None:
                raise
            given = given_as[configs[int(match.group(1))].name]
            raise InstanceError(f"constraints[{given!r}].{match.group(2)}", error.reason) from error
        notes = ()
        if host and assumes_default_ddr(self._topology):
            notes = (f"host memory: the Topology gives no ddr_cap, so TorchRec's default of "
                     f"{format_bytes(instance.topology.host_memory_bytes)} per rank was assumed, as its planner "
                     "assumes it; pass ddr_cap to plan with the host memory you have",)
        return instance, notes


def _shardable_modules(model: nn.Module, sharders: list) -> list[_Found]:
    """The modules the sharders shard, walked as TorchRec's enumerator walks (a sharded module's
    children are its own), each with its sharder and the configs of its shardable tables."""
    by_type = {sharder_name(s.module_type): s for s in sharders}
    found, queue = [], [("", model)]
    while queue:
        path, module = queue.pop(0)
        sharder = by_type.get(sharder_name(type(module)))
        if sharder is None:
            queue.extend((f"{path}.{n}" if path else n, child) for n, child in module.named_children())
            continue
        if type(module) not in MODELLED:
            raise PlannerError(f"shardbench: module {path or '(root)'} is a {type(module).__name__}; shardbench plans "
                               "EmbeddingBagCollection, FeatureProcessedEmbeddingBagCollection and EmbeddingCollection "
                               "modules only")
        processed = isinstance(module, FeatureProcessedEmbeddingBagCollection)
        bags = module._embedding_bag_collection if processed else module
        configs = bags.embedding_bag_configs() if isinstance(bags, EmbeddingBagCollection) else bags.embedding_configs()
        shardable = set(sharder.shardable_parameters(module))
        configs = tuple(c for c in configs if c.name in shardable)
        found.append(_Found(path, module, sharder, configs, _weighted(module, configs), processed))
    return found


def _weighted(module: nn.Module, configs: tuple) -> frozenset:
    """The tables whose inputs TorchRec's estimator prices as weighted: all of a weighted bag collection's, and
    those a feature processor of the module processes (its feature_processor_modules, keyed by table)."""
    if isinstance(module, EmbeddingBagCollection) and module.is_weighted():
        return frozenset(c.name for c in configs)
    processors = getattr(getattr(module, "_feature_processor", None), "feature_processor_modules", None)
    if isinstance(processors, nn.ModuleDict):
        return frozenset(c.name for c in configs if c.name in processors.keys())
    return frozenset()


def _instance_names(found: list[_Found]) -> dict[tuple[str, str], str]:
    """A unique instance table name per (module path, table name): the table's own name where it is unique
    and has no "." (TorchRec forbids it in a module name), else one made from the path and the name."""
    counts: dict[str, int] = {}
    for f in found:
        for c in f.configs:
            counts[c.name] = counts.get(c.name, 0) + 1
    names = {(f.path, c.name): c.name for f in found for c in f.configs if counts[c.name] == 1 and "." not in c.name}
    taken = set(names.values())
    for f in found:
        for c in f.configs:
            if (f.path, c.name) in names:
                continue
            base = re.sub(r"[^A-Za-z0-9_]", "_", f"{f.path}__{c.name}" if f.path else c.name)
            name, n = base, 1
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            taken.add(name)
            names[f.path, c.name] = name
    return names


def _allowed_kernels(table: str, given: ParameterConstraints, supported: list[str], host: bool,
                     kernels) -> dict[str, tuple[str, ...]]:
    """The kernels shardbench may choose for a table, by sharding type: of its constrained types that its
    sharder supports, the kernels the sharder allows, the constraints allow and shardbench models (the
    host-memory ones only where the Topology has host memory); types left with none are dropped. Anything
    it cannot honour is refused."""
    field = f"constraints[{table!r}]"
    for unmodelled in ("num_poolings", "batch_sizes"):
        if getattr(given, unmodelled, None) is not None:
            raise InstanceError(f"{field}.{unmodelled}", "is not modelled (shardbench plans one pooling factor per "
                                "table at the planner's batch size); drop it or plan with TorchRec's planner")
    # As TorchRec's enumerator: grid_shard only where the constraints name it.
    types = [t for t in SHARDING_TYPES if t in supported and (t in given.sharding_types if given.sharding_types
                                                             else t in DEFAULT_SHARDING_TYPES)]
    if not types:
        raise InstanceError(f"{field}.sharding_types", f"leave none of the types shardbench plans {SHARDING_TYPES} "
                            f"that its sharder supports ({supported})")
    allowed = {t: tuple(k for k in kernels_for(t) if k in kernels(t)
                        and (given.compute_kernels is None or k in given.compute_kernels)
                        and (host or k not in HOST_KERNELS)) for t in types}
    allowed = {t: ks for t, ks in allowed.items() if ks}
    if not allowed:
        raise InstanceError(f"{field}.compute_kernels", f"{given.compute_kernels} leave none of the kernels shardbench "
                            f"models ({', '.join(KERNELS)}) that the sharder allows for the types {types}"
                            + ("" if host else "; fused_uvm and fused_uvm_caching need the Topology's ddr_cap"))
    return allowed
