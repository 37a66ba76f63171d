"""The registered policy solvers (solvers.learned): a shipped policy's greedy plan, optionally handed to
local search on the given oracle."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from instances import Instance, Plan

from ..base import Budget, Cause, NoPlan, SolveResult, Status, planned
from ..candidates import Problem
from .mdp import ShardingMDP
from .policies import play
from .storage import load_policy, shipped_policy_path


def policy_plan(instance: Instance, path: Path) -> SolveResult:
    algorithm, policy, model, _ = load_policy(path)
    episode = play(ShardingMDP(instance, model), policy, algorithm, None)
    if episode.overflow > 0:  # any byte over capacity makes this positive
        return SolveResult(Status.NO_PLAN, reason=f"the policy's plan overflows memory by {episode.overflow:.1%} on "
                                                 "its worst device (no legal device was left for a table)",
                           no_plan=NoPlan(Cause.OVERFLOW, plan=Plan.table_wise(instance, episode.assignment)))
    return planned(instance, episode.assignment)


def solve_with_policy(algorithm: str, polish: bool, problem: Problem, budget: Budget, seed: int) -> SolveResult:
    instance = problem.instance
    path = shipped_policy_path(algorithm)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no trained {algorithm} policy shipped; run `shardbench train policy`")
    result = policy_plan(instance, path)
    if not polish or result.plan is None:
        return result
    from ..assembly import Assembly
    from ..search import improve, target_bound

    candidates = problem.whole_tables.candidates
    assembly = Assembly(candidates)
    for table, device in enumerate(result.plan.assignment):
        assembly.put(int(candidates.by_table[table][0]), np.array([device]))
    stats = improve(assembly, budget.deadline(), seed, budget.max_rounds, False,
                    target_bound(candidates) * (1 + budget.gap))
    return SolveResult(Status.FEASIBLE, plan=assembly.plan(), stats=stats)
