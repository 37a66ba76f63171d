"""Registers the learned policies (solvers.rl) without importing torch until one of them is asked for."""
from __future__ import annotations

from .base import Budget, SolveResult, register
from .candidates import Problem


def _policy_solver(algorithm: str, polish: bool):
    def solve(problem: Problem, budget: Budget, seed: int) -> SolveResult:
        from .rl.solving import solve_with_policy

        return solve_with_policy(algorithm, polish, problem, budget, seed)
    return solve


for _algorithm in ("autoshard", "dreamshard"):
    register(f"{_algorithm}-rl", f"{_algorithm} policy (shipped weights), greedy argmax inference, whole tables; the "
             "plan ignores the given oracle")(_policy_solver(_algorithm, False))
    register(f"{_algorithm}-rl+ls", f"the {_algorithm} policy's plan handed to local search on the given oracle, "
             "whole tables", stochastic=True)(_policy_solver(_algorithm, True))
