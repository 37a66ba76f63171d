"""TorchRec's planner as a peer solver (`torchrec-planner`): its EmbeddingShardingPlanner plans with its
own estimator and storage model, and its plan is read back as ours."""
from __future__ import annotations

from instances import Instance, Plan

from .common import STORAGE_RESERVE, load_torchrec, torchrec_constraints, torchrec_module, torchrec_sharder, torchrec_topology
from .export import from_torchrec_plan


def plan_with_torchrec(instance: Instance) -> tuple[Plan, list[float]]:
    """TorchRec's EmbeddingShardingPlanner with its default proposers, on the instance's tables, topology,
    batch and allowed types (HBM kernels only; the reserve as the instance's memory says): our plan of its
    best plan, and its own per-rank totals (Σ shard perf.total)."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )

    load_torchrec()
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
