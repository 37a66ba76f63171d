"""`ShardbenchPlanner`: TorchRec's planner interface (`plan`, `collective_plan`) over shardbench's
portfolio, so that TorchRec code (DistributedModelParallel included) takes its ShardingPlan as its own."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingPlanner
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from instances import Instance, InstanceError
from instances.kernels import default_kernel
from instances.model import SHARDING_TYPES
from interop.export import ShardableModule, to_torchrec_model
from interop.importer import from_torchrec

from .api import plan as plan_instance
from .portfolio import PortfolioResult

MODELLED = (EmbeddingBagCollection, EmbeddingCollection)


@dataclass(frozen=True)
class _Found:
    """A shardable module of the model with its sharder and its tables' configs."""

    path: str
    module: nn.Module
    sharder: ModuleSharder
    configs: tuple


class ShardbenchPlanner(ShardingPlanner):
    """Plans every EmbeddingBagCollection and EmbeddingCollection of a model jointly with shardbench's
    portfolio (the best validated plan of its members within `budget` seconds, with the best bound any
    proved over the enumerated options) and returns TorchRec's ShardingPlan, keyed by each module's path.

    Built like TorchRec's EmbeddingShardingPlanner from a `Topology`, the `batch_size` per rank and
    `constraints` (ParameterConstraints by table name), plus `budget` (seconds), `oracle` (the cost
    model the solvers optimise; `torchrec` is TorchRec's own estimator), `solvers` (default: the
    recommended portfolio) and `seed`. After `plan`, `result` holds the PortfolioResult (objective,
    bound, gap, winning solver, members) and `instance` the instance planned (a table that shares its
    name with another module's, or has a ".", is renamed there after its module's path).

    Constraints are honoured, not ignored: `sharding_types` narrow a table's types (together with what its
    sharder supports on the topology's compute device); `pooling_factors` set its lookups per sample.
    shardbench models HBM only: the `fused` kernel for the model-parallel types and `dense` for
    data_parallel, so `compute_kernels` narrow the types to those whose kernel they allow, and a table
    whose constraints leave no modelled kernel, or that sets `cache_params`, `num_poolings` or
    `batch_sizes` (not modelled until memory tiers land), is refused with an error naming it. A cpu
    topology plans in its DDR, as TorchRec does.

    Known limit: a table serving several features is planned with their lookups summed into one pooling
    factor; TorchRec's estimator also sends one pooled output per feature, so for such tables its rating
    of the plan can exceed `result.objective` (single-feature tables rate equal)."""

    def __init__(self, topology: Topology, batch_size: int | None = None,
                 constraints: dict[str, ParameterConstraints] | None = None, budget: float = 10.0,
                 oracle: str = "torchrec", solvers: list[str] | None = None, seed: int = 0) -> None:
        self._topology = topology
        self._batch_size = batch_size if batch_size else BATCH_SIZE
        self._constraints = dict(constraints or {})
        self._budget, self._oracle, self._solvers, self._seed = budget, oracle, solvers, seed
        self.result: PortfolioResult | None = None
        self.instance: Instance | None = None

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None) -> ShardingPlan:
        """The ShardingPlan of every shardable module of `module` (found by `sharders`, TorchRec's
        defaults when not given), planned jointly. Raises PlannerError when no member finds a plan."""
        found = _shardable_modules(module, sharders if sharders is not None else get_default_sharders())
        if not found:
            raise PlannerError("shardbench: the model has no module its sharders shard")
        names = _instance_names(found)
        instance = self._instance(found, names)
        if self._oracle == "torchrec" and len({t.pooled for t in instance.tables}) > 1:
            raise PlannerError("shardbench: the torchrec oracle prices a model of pooled (EmbeddingBagCollection) or "
                               "sequence (EmbeddingCollection) tables, not both; plan this one with oracle='analytic'")
        self.instance = instance
        self.result = plan_instance(instance, oracle=self._oracle, budget=self._budget, solvers=self._solvers,
                                    seed=self._seed)
        if self.result.plan is None:
            raise PlannerError(f"shardbench found no plan within {self._budget} s: {_why(self.result)}")
        modules = [ShardableModule(f.path, f.module, f.sharder,
                                   tuple((c.name, names[f.path, c.name]) for c in f.configs)) for f in found]
        return to_torchrec_model(instance, self.result.plan, modules, device_type=self._topology.compute_device)

    def collective_plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]] | None = None,
                        pg: dist.ProcessGroup | None = None) -> ShardingPlan:
        """`plan` on rank 0 of `pg` (the default group when not given), its ShardingPlan broadcast to every
        rank; `result` is set on rank 0 only."""
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result

        if pg is None:
            if not dist.is_initialized():
                raise PlannerError("collective_plan needs an initialised process group; use plan() on one process")
            pg = dist.GroupMember.WORLD
        return invoke_on_rank_and_broadcast_result(pg, 0, self.plan, module,
                                                   sharders if sharders is not None else get_default_sharders())

    def _instance(self, found: list[_Found], names: dict[tuple[str, str], str]) -> Instance:
        """One instance of every table of every module, under its instance name, with its constraints
        narrowed to what shardbench models."""
        import dataclasses

        configs, constraints = [], {}
        device = self._topology.compute_device
        for f in found:
            supported = f.sharder.sharding_types(device)
            for config in f.configs:
                name = names[f.path, config.name]
                configs.append(dataclasses.replace(config, name=name))
                given = self._constraints.get(config.name) or ParameterConstraints()
                types = _allowed_types(config.name, given, supported,
                                       lambda kind, s=f.sharder: s.compute_kernels(kind, device))
                constraints[name] = ParameterConstraints(sharding_types=list(types),
                                                         pooling_factors=list(given.pooling_factors))
        return from_torchrec(configs, self._topology, constraints, self._batch_size, instance_id="torchrec-model")


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
                               "EmbeddingBagCollection and EmbeddingCollection only")
        configs = module.embedding_bag_configs() if isinstance(module, EmbeddingBagCollection) else module.embedding_configs()
        shardable = set(sharder.shardable_parameters(module))
        found.append(_Found(path, module, sharder, tuple(c for c in configs if c.name in shardable)))
    return found


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


def _allowed_types(table: str, given: ParameterConstraints, supported: list[str], kernels) -> tuple[str, ...]:
    """The sharding types shardbench may choose for a table: its constrained types its sharder supports,
    whose modelled kernel the constraints and the sharder allow. Anything it cannot honour is refused."""
    field = f"constraints[{table!r}]"
    for unmodelled in ("cache_params", "num_poolings", "batch_sizes"):
        if getattr(given, unmodelled, None) is not None:
            raise InstanceError(f"{field}.{unmodelled}", "is not modelled yet (shardbench plans HBM tables with the "
                                "fused kernel, or dense for data_parallel); drop it or plan with TorchRec's planner")
    types = [t for t in SHARDING_TYPES if t in supported and (given.sharding_types is None or t in given.sharding_types)]
    if not types:
        raise InstanceError(f"{field}.sharding_types", f"leave none of the types shardbench plans {SHARDING_TYPES} "
                            f"that its sharder supports ({supported})")
    types = [t for t in types if default_kernel(t) in kernels(t)
             and (given.compute_kernels is None or default_kernel(t) in given.compute_kernels)]
    if not types:
        raise InstanceError(f"{field}.compute_kernels", f"{given.compute_kernels} exclude the kernels shardbench models "
                            "(fused for the model-parallel types, dense for data_parallel; no UVM, caching or "
                            "key-value kernels until memory tiers land)")
    return tuple(types)


def _why(result: PortfolioResult) -> str:
    reasons = [m.result.reason if m.result is not None else m.error for m in result.members]
    reasons = [r for r in reasons if r]
    return reasons[0] if reasons else "no member returned a plan"
