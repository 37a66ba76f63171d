"""`global-lf`: the TorchRec-style baseline of ours — every cached table at one global cache load factor
(TorchRec's default 0.2), tier, sharding and devices then chosen by the split-aware local search, so that
what per-table load factors gain is measured apart from the rest of the search."""
from __future__ import annotations

from dataclasses import replace

from instances.kernels import TORCHREC_LOAD_FACTOR

from .base import Budget, SolveResult, register
from .candidates import Problem
from .search import local_search

GLOBAL_LOAD_FACTOR = TORCHREC_LOAD_FACTOR


def at_global_load_factor(problem: Problem, load_factor: float = GLOBAL_LOAD_FACTOR) -> Problem:
    """The same problem with every table's cache fixed at `load_factor` (a table that fixes its own keeps it)."""
    instance = problem.instance
    tables = tuple(t if t.cache_load_factor is not None else replace(t, cache_load_factor=load_factor)
                   for t in instance.tables)
    return Problem(replace(instance, tables=tables), problem.oracle)


@register("global-lf", f"local search with every cached table at one global load factor {GLOBAL_LOAD_FACTOR} "
          "(TorchRec's default) instead of one per table; any oracle", stochastic=True, splits=True)
def global_lf(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return local_search(at_global_load_factor(problem), budget, seed)
