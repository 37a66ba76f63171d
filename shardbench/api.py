"""The Python API for users without TorchRec objects: plan an instance with the recommended portfolio (or
the solvers given) through the planning pipeline and get the typed result back."""
from __future__ import annotations

from pathlib import Path

from instances import Instance

from .pipeline import plan_request, run
from .portfolio import PortfolioResult


def plan(instance: Instance, oracle: str | None = None, budget: float = 10.0, solvers: list[str] | None = None,
         seed: int = 0, rules: str | Path | None = None, gap: float = 0.0, resize_caches: bool = True) -> PortfolioResult:
    """The best validated plan any member of the portfolio finds within `budget` seconds under `oracle`
    (None: shardbench.pipeline's default, TorchRec's estimator where TorchRec can be imported), with the
    best bound any of them proved; `solvers` replaces the recommendation (best-greedy always runs too); a
    plan certified within `gap` (a fraction of the bound, as everywhere) stops the search early; the
    members' plans' caches are re-sized off the options' grid of load factors — and, under TorchRec's estimator, caches
    offered the load factors the LP over every load factor picks — unless `resize_caches` is False."""
    return run(plan_request(instance, oracle, budget=budget, solvers=solvers, seed=seed, rules=rules, gap=gap,
                            resize_caches=resize_caches)).result
