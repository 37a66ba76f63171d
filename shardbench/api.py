"""The Python API for users without TorchRec objects: plan an instance with the recommended portfolio (or
the solvers given) and get the typed result back."""
from __future__ import annotations

from pathlib import Path

from costmodels import oracle_is_additive, oracle_prices_tiers
from instances import Instance
from solvers import SolverOracleMismatch, get_solver
from solvers.base import incompatibility

from .portfolio import PortfolioResult, run_portfolio
from .recommend import Rules


def choose_portfolio(instance: Instance, oracle: str, budget: float, rules: str | Path | None = None) -> list[str]:
    """The solvers the shipped (or given) planner-choice rules recommend for this instance, best first."""
    from .workloads import workload_features

    loaded = Rules.load(Path(rules)) if rules else Rules.load()
    return loaded.portfolio(workload_features(instance, oracle, budget))


def check_oracle(instance: Instance, oracle: str) -> None:
    """Raises SolverOracleMismatch when no solver can plan the instance under this oracle (it does not price
    tables kept in host memory), and UnknownOracleError for an unknown name — without building a costly
    oracle."""
    mismatch = incompatibility(None, oracle_is_additive(oracle), oracle_prices_tiers(oracle), instance.uses_host_memory)
    if mismatch:
        raise SolverOracleMismatch(f"oracle {oracle!r}: {mismatch}")


def plan(instance: Instance, oracle: str = "analytic", budget: float = 10.0, solvers: list[str] | None = None,
         seed: int = 0, rules: str | Path | None = None, gap: float = 0.0) -> PortfolioResult:
    """The best validated plan any member of the portfolio finds within `budget` seconds, with the best
    bound any of them proved; `solvers` replaces the recommendation (best-greedy always runs too); a plan
    certified within `gap` (a fraction) of its bound stops the search early."""
    check_oracle(instance, oracle)
    if solvers is not None:
        for name in solvers:
            get_solver(name)
    members = list(solvers) if solvers is not None else choose_portfolio(instance, oracle, budget, rules)
    return run_portfolio(instance.validate(), oracle, budget, members, seed, gap)
