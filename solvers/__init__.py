"""Solvers: a registry of named placement methods with their metadata (solvers.base); importing this
package registers them all."""
from . import balance, baselines, cpsat, global_lf, greedy, learned, milp, peers, search  # noqa: F401  (registration happens on import)
from .base import (
                   MAX_SEED,
                   MAX_TIME_LIMIT,
                   Budget,
                   BudgetError,
                   Cause,
                   ClaimError,
                   NoPlan,
                   SolveResult,
                   SolverInfo,
                   SolverOracleMismatch,
                   Status,
                   UnknownSolverError,
                   check_no_plan,
                   check_seed,
                   get_solver,
                   run_solver,
                   solver_names,
)
from .bounds import (
                   additive_lower_bounds,
                   best_additive_lower_bound,
                   best_option_bound,
                   lp_bound,
                   option_bounds,
)
from .candidates import Candidates, Problem

__all__ = [
    "MAX_SEED", "MAX_TIME_LIMIT", "Budget", "BudgetError", "Cause", "ClaimError", "NoPlan", "SolveResult", "SolverInfo", "SolverOracleMismatch", "Status", "UnknownSolverError",
    "Candidates", "Problem", "additive_lower_bounds", "best_option_bound", "check_no_plan", "check_seed", "lp_bound",
    "option_bounds", "best_additive_lower_bound", "get_solver", "run_solver", "solver_names",
]
