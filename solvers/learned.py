"""Registers the learned policies (solvers.rl) without importing torch until one of them is asked for."""
from __future__ import annotations

from costmodels import Oracle
from instances import Instance

from .base import Budget, SolveResult, register


def _policy_solver(algorithm: str, polish: bool):
    def solve(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
        from .rl import solve_with_policy

        return solve_with_policy(algorithm, polish, instance, oracle, budget, seed)
    return solve


for _algorithm in ("autoshard", "dreamshard"):
    register(f"{_algorithm}-rl", f"{_algorithm} policy (shipped weights), greedy argmax inference; the plan "
             "ignores the given oracle")(_policy_solver(_algorithm, False))
    register(f"{_algorithm}-rl+ls", f"the {_algorithm} policy's plan handed to local search on the given oracle",
             stochastic=True)(_policy_solver(_algorithm, True))
