"""`shardbench plan`: the recommended solvers and `best-greedy` run side by side, a process each, within
the budget; the best validated plan is kept with the best bound any of them proved. A proven optimum
stops the rest at once."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from costmodels import get_oracle
from instances import Instance
from instances.sharding import Plan, expand
from solvers import get_solver

from .analysis import INSTANCE_SETTING, TABLE_WISE_SETTING
from .metrics import gap_to_bound
from .runner import Cell, kill_deadline, run_cells

SAFETY_NET = "best-greedy"  # always in the portfolio: the plan is never worse than its


@dataclass(frozen=True)
class PortfolioResult:
    plan: Plan | None
    solver: str | None          # the member whose plan was kept
    objective: float | None
    bound: float | None         # the best lower bound any member proved or computed
    wall_s: float
    records: tuple[dict, ...] = field(default_factory=tuple)  # one per member that finished
    stopped_early: bool = False

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        return gap_to_bound(self.objective, self.bound)


def run_portfolio(instance: Instance, oracle_name: str, budget: float, solvers: list[str], seed: int = 0) -> PortfolioResult:
    """Every member at once, each in its own process under the suites' cell deadline (budget × 1.5 + 10 s):
    on large instances pricing the options runs past small budgets, and a member killed early would lose
    its plan. The evidence the choice rests on was run under the same deadline."""
    oracle = get_oracle(oracle_name)
    members = list(dict.fromkeys([*solvers, SAFETY_NET]))
    cells = []
    for name in members:
        info = get_solver(name)
        if info.needs_additive and not oracle.additive:
            continue
        setting = INSTANCE_SETTING if info.splits else TABLE_WISE_SETTING
        cells.append(Cell(instance, name, oracle_name, budget, seed, oracle_name, setting, kill_deadline(budget)))
    # A whole-table member's optimum (or bound) is one of the whole-table problem only: below it a split
    # plan may lie, so it neither stops the others nor bounds the posed problem.
    whole_only = not instance.allows_splits

    def posed(record: dict) -> bool:
        return whole_only or record["sharding"] == INSTANCE_SETTING

    records: list[dict] = []
    started = time.monotonic()
    run_cells(cells, len(cells), records.append, stop=lambda r: r["status"] == "optimal" and posed(r))
    wall = time.monotonic() - started
    with_plan = [r for r in records if r.get("plan") is not None and r.get("objective") is not None]
    bounds = [b for r in records if posed(r) for b in (r.get("lower_bound"), r.get("instance_bound")) if b is not None]
    bound = max(bounds) if bounds else None
    stopped = any(r["status"] == "optimal" and posed(r) for r in records) and len(records) < len(cells)
    if not with_plan:
        return PortfolioResult(None, None, None, bound, wall, tuple(records), stopped)
    best = min(with_plan, key=lambda r: (r["objective"], members.index(r["solver"])))
    plan = expand(best["plan"], instance).validate(instance)
    objective = oracle.plan_cost(instance, plan)  # priced again here: the plan we hand over is the plan we rate
    return PortfolioResult(plan, best["solver"], objective, min(bound, objective) if bound is not None else None,
                           wall, tuple(records), stopped)
