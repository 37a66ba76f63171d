"""The Python API for users without TorchRec objects: plan an instance with the recommended portfolio (or
the solvers given) and get the typed result back; load an exported TorchRec ShardingPlan safely."""
from __future__ import annotations

from pathlib import Path

from costmodels import oracle_is_additive
from instances import Instance
from solvers import get_solver

from .portfolio import PortfolioResult, run_portfolio
from .recommend import Rules


def choose_portfolio(instance: Instance, oracle: str, budget: float, rules: str | Path | None = None) -> list[str]:
    """The solvers the shipped (or given) planner-choice rules recommend for this instance, best first."""
    from .workloads import workload_features

    loaded = Rules.load(Path(rules)) if rules else Rules.load()
    return loaded.portfolio(workload_features(instance, oracle, budget))


def plan(instance: Instance, oracle: str = "analytic", budget: float = 10.0, solvers: list[str] | None = None,
         seed: int = 0, rules: str | Path | None = None) -> PortfolioResult:
    """The best validated plan any member of the portfolio finds within `budget` seconds, with the best
    bound any of them proved; `solvers` replaces the recommendation (best-greedy always runs too)."""
    oracle_is_additive(oracle)  # an unknown name fails here, without building a costly oracle
    if solvers is not None:
        for name in solvers:
            get_solver(name)
    members = list(solvers) if solvers is not None else choose_portfolio(instance, oracle, budget, rules)
    return run_portfolio(instance.validate(), oracle, budget, members, seed)


def _plan_classes() -> dict:
    """The classes a TorchRec ShardingPlan is made of, by name: all that load_plan lets a file build."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torch.distributed.remote_device import _remote_device

    from interop.common import load_torchrec

    load_torchrec()
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    return {c.__name__: c for c in (ShardingPlan, EmbeddingModuleShardingPlan, ParameterSharding,
                                    EnumerableShardingSpec, ShardMetadata, _remote_device)}


def save_sharding_plan(sharding_plan, path: str | Path) -> None:
    """torch.save of a TorchRec ShardingPlan in a form `load_plan` reads under weights_only: a module plan
    (a dict subclass, whose items the safe unpickler will not set) is stored as its class called on a
    plain dict."""
    import pickle
    import types

    import torch

    module_plan = _plan_classes()["EmbeddingModuleShardingPlan"]

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if type(obj) is module_plan:
                return module_plan, (dict(obj),)
            return NotImplemented

    pickler = types.ModuleType("shardbench_plan_pickle")  # torch.save takes a pickle module
    pickler.Pickler = Pickler
    torch.save(sharding_plan, path, pickle_module=pickler)


def load_plan(path: str | Path):
    """A TorchRec ShardingPlan written by `export-torchrec`, `plan --torchrec-out` or `save_sharding_plan`,
    loaded under torch.load's safe default (weights_only), with only the classes a ShardingPlan is made of
    allowed. Plain `torch.load(path)` refuses such a file (torch >= 2.6); for a file you trust,
    `torch.load(path, weights_only=False)` works too."""
    import torch

    with torch.serialization.safe_globals(list(_plan_classes().values())):
        return torch.load(path, weights_only=True)
