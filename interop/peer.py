"""TorchRec's planner as peer solvers: `torchrec-planner` (its EmbeddingShardingPlanner with its default
proposers, kernels and load factor), `torchrec-planner-timeout` (the same with its `timeout_seconds` set to
the budget), `torchrec-dp` (its DynamicProgrammingProposer) and `torchrec-offload` (its
EmbeddingOffloadScaleupProposer sizing each table's cache from our access curves as CacheStatistics). Each
plans with TorchRec's own estimator and storage model, and its plan is read back as ours."""
from __future__ import annotations

import math
import time

from instances import Instance, Plan
from instances.kernels import FUSED_UVM_CACHING

from .cache_stats import cache_statistics
from .common import STORAGE_RESERVE, load_torchrec, torchrec_constraints, torchrec_model, torchrec_sharders, torchrec_topology
from .export import from_torchrec_plan

# The offload proposer's starting cache, the smallest of our load-factor grid: it only ever grows caches
# from there, and a start that does not fit leaves it no plan at all.
OFFLOAD_START_LOAD_FACTOR = 0.05


def plan_with_torchrec(instance: Instance, constraints: dict | None = None, proposer=None,
                       timeout_seconds: int | None = None) -> tuple[Plan, list[float]]:
    """TorchRec's EmbeddingShardingPlanner on the instance's tables, topology (HBM and host memory), batch
    and allowed types and kernels (the reserve as the instance's memory says), with its default proposers
    or the one given, and its own time limit if given (it stops proposing past it; enumerating and
    estimating the options come first and are not limited): our plan of its best plan, and its own per-rank
    totals (Σ shard perf.total)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    load_torchrec()
    planner = EmbeddingShardingPlanner(topology=torchrec_topology(instance), batch_size=instance.workload.batch_size,
                                       constraints=constraints or torchrec_constraints(instance), proposer=proposer,
                                       storage_reservation=FixedPercentageStorageReservation(STORAGE_RESERVE),
                                       timeout_seconds=timeout_seconds, debug=False)
    sharding_plan = planner.plan(torchrec_model(instance), torchrec_sharders())
    totals = [0.0] * instance.num_devices
    for option in planner._best_plan or []:
        for shard in option.shards:
            totals[shard.rank] += shard.perf.total
    return from_torchrec_plan(instance, sharding_plan), totals


def offload_constraints(instance: Instance) -> dict:
    """The offload proposer's inputs: every table that may live in host memory cached (LRU, starting at
    OFFLOAD_START_LOAD_FACTOR unless the table fixes its own) with our curve as its CacheStatistics; the
    others as torchrec_constraints has them."""
    from torchrec.distributed.types import CacheAlgorithm, CacheParams

    constraints = torchrec_constraints(instance)
    for table in instance.tables:
        kept = constraints[table.name]
        if FUSED_UVM_CACHING not in kept.compute_kernels:
            continue
        kept.sharding_types = [t for t in kept.sharding_types if t != "data_parallel"]
        kept.compute_kernels = [FUSED_UVM_CACHING]
        kept.cache_params = CacheParams(algorithm=CacheAlgorithm.LRU,
                                        load_factor=table.cache_load_factor or OFFLOAD_START_LOAD_FACTOR,
                                        stats=cache_statistics(instance, table))
    return constraints


def offload_plan(instance: Instance, budget) -> tuple[Plan, list[float]]:
    from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer

    return plan_with_torchrec(instance, offload_constraints(instance), EmbeddingOffloadScaleupProposer())


def default_plan(instance: Instance, budget) -> tuple[Plan, list[float]]:
    return plan_with_torchrec(instance)


def timed_plan(instance: Instance, budget) -> tuple[Plan, list[float]]:
    """TorchRec takes whole seconds, at least one."""
    return plan_with_torchrec(instance, timeout_seconds=max(1, math.floor(budget.time_limit)))


def dp_plan(instance: Instance, budget) -> tuple[Plan, list[float]]:
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer

    return plan_with_torchrec(instance, proposer=DynamicProgrammingProposer())


def _peer(planning):
    """A peer solver from a planning function of (instance, budget): TorchRec plans with its own estimator,
    whatever oracle guides the others; its planning time (after importing torchrec) and its own rating of
    the plan are kept in the stats."""
    def solve(problem, budget, seed):
        load_torchrec()
        from torchrec.distributed.planner.types import PlannerError

        from solvers.base import Cause, NoPlan, SolveResult, Status

        started = time.monotonic()
        try:
            plan, totals = planning(problem.instance, budget)
        except PlannerError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return SolveResult(Status.NO_PLAN, reason=f"TorchRec's planner found no plan under its own model: {first}",
                               no_plan=NoPlan(Cause.PEER_MODEL),
                               stats={"planning_seconds": time.monotonic() - started})
        return SolveResult(Status.FEASIBLE, plan=plan, stats={"planning_seconds": time.monotonic() - started,
                                                              "torchrec_rating": max(totals)})
    return solve


planner_solver = _peer(default_plan)
timeout_solver = _peer(timed_plan)
dp_solver = _peer(dp_plan)
offload_solver = _peer(offload_plan)
