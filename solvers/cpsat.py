"""The exact model (solvers.exact_model) on CP-SAT (ortools), with costs scaled to integers and the rounding
given back in the proven bound; where a few tables do most of the work, the model over them alone first (its
bound kept), and where tables trade HBM for cost, its neighbourhoods."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .base import Budget, SolveResult, infeasible, past, register
from .candidates import Candidates, Problem
from .exact_model import (
    NEIGHBOURHOOD_SHARE,
    ExactStart,
    build_model,
    centre_of,
    completed,
    core_tables,
    decode,
    finish,
    neighbourhoods,
    prelude,
)
from .quiet import RejectedLns, with_stderr_sorted

SCALED_TOTAL = 1e13          # integer cost units of all tables together (int64-safe, ~1e-10 rounding)
# Where a few tables do most of the work (`core_tables`), the model over them alone may run until this share of
# the budget is spent; a neighbourhood whose share is spent by then is left out.
CORE_UNTIL = 0.7


@dataclass(frozen=True)
class IntegerCosts:
    """Cost coefficients as integers for CP-SAT: cost / top × unit, rounded, where the tables' heaviest
    options together make SCALED_TOTAL units. Dividing by the largest cost first makes tiny and huge costs
    scale alike. All-zero costs give a pure feasibility model."""

    unit: float
    top: float

    @classmethod
    def of(cls, candidates: Candidates) -> "IntegerCosts":
        live = np.concatenate([candidates.members(int(o)) for o in np.flatnonzero(candidates.live)])
        top = float(candidates.priced.costs[live].max(initial=0.0))
        heaviest = sum(float(candidates.work[ids].max()) for ids in candidates.by_table)
        if top <= 0 or heaviest <= 0:
            return cls(1.0, 1.0)
        return cls(SCALED_TOTAL / (heaviest / top), top)

    def scale(self, cost: float) -> int:
        return int(round(cost / self.top * self.unit))

    def to_cost(self, units: float) -> float:
        return units / self.unit * self.top


@dataclass(frozen=True)
class CpRun:
    """One CP-SAT run over some candidates: its plan (options and devices) if any, the bound it proved (in
    cost units, rounding given back), CP-SAT's status code and the run's stats."""

    found: tuple[list[int], np.ndarray] | None
    proven: float
    code: int
    stats: dict


@register("cpsat", "CP-SAT (ortools): option per table and devices together, on integer-scaled costs with memory, "
          "symmetry breaking and a complete hint; where a few tables do most of the work, first over them alone "
          "(a bound for all), and where tables trade HBM for cost, over a neighbourhood of the summed-memory "
          "knapsack's options", exact=True, needs_additive=True, splits=True, lp_bounded=True, plans_core=True,
          replans=True, backends=("ortools.sat.python.cp_model",))
def cpsat(problem: Problem, budget: Budget, seed: int, workers: int | None = None) -> SolveResult:
    from ortools.sat.python import cp_model

    start, done = prelude(problem, budget, seed, "cpsat", widens=True)
    if done is not None:
        return done
    candidates = problem.candidates
    centre, core_stats = centre_of(candidates, budget), {}
    core = core_tables(problem, centre)
    if core is not None:
        start, core_stats = _core_first(candidates, start, core, budget.share(CORE_UNTIL), seed, workers)
        if start.proven(budget.gap):
            rejected = core_stats["core"]["lns_fragments_rejected"]
            return finish(problem, None, start.lower_bound, start,
                          {"backend": "cpsat", **core_stats, "lns_fragments_rejected": rejected})
    widening, near = [], ExactStart(None, start.lower_bound)
    cuts = neighbourhoods(candidates, centre)
    for i, cut in enumerate(cuts):
        until = budget.share(NEIGHBOURHOOD_SHARE * (i + 1) / len(cuts))
        if past(until):
            continue
        # The narrowest unhinted: hinted with a start far from the knapsack, CP-SAT stays near that start (on
        # tiers-80x8 at HBM 0.5 it ended a median 5 % worse than without the hint). Each wider one starts
        # from the best plan of those before it, which lies within it.
        run = _run(cut, near, until, budget.backend_gap, seed, workers)
        near = near.improved(candidates, run.found)
        widening.append({"options": int(cut.live.sum()), "cpsat_status": run.stats["cpsat_status"],
                         "best_so_far": near.objective() if near.assembly is not None else None,
                         "lns_fragments_rejected": run.stats["lns_fragments_rejected"]})
    if near.objective() < start.objective():
        start = ExactStart(near.assembly, start.lower_bound, start.failure)
    run = _run(candidates, start, budget.deadline(), budget.backend_gap, seed, workers)
    if run.code == cp_model.INFEASIBLE and start.assembly is None:
        return infeasible("CP-SAT proved that no plan over the enumerated options fits the memory capacity")
    stats = {**run.stats, **core_stats, **({"neighbourhoods": widening} if widening else {})}
    # Over every run of this solve: the model over the core, the neighbourhoods and the whole.
    stats["lns_fragments_rejected"] = sum(part["lns_fragments_rejected"] for part in
                                          (run.stats, *core_stats.values(), *widening))
    return finish(problem, run.found, max(start.lower_bound, run.proven), start, stats)


def _core_first(candidates: Candidates, start: ExactStart, core: np.ndarray, deadline: float, seed: int,
                workers: int | None) -> tuple[ExactStart, dict]:
    """The model over the `core` tables alone until proven or `deadline`: the bound it proves holds for every
    table (`core_tables`), and its plan with the other tables fitted (`completed`) replaces the start where
    that costs less."""
    from ortools.sat.python import cp_model

    run = _run(candidates, start, deadline, 0.0, seed, workers, tables=core)
    proven = run.proven if run.code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    whole = completed(candidates, run.found) if run.found is not None else None
    assembly = whole if whole is not None and whole.objective() < start.objective() else start.assembly
    stats = {"core": {"tables": int(core.size), "cpsat_status": run.stats["cpsat_status"], "bound": proven,
                      "plan": None if whole is None else whole.objective(), "wall_time": run.stats["wall_time"],
                      "lns_fragments_rejected": run.stats["lns_fragments_rejected"]}}
    return ExactStart(assembly, max(start.lower_bound, proven or 0.0), start.failure), stats


def _run(candidates: Candidates, start: ExactStart, deadline: float, gap: float, seed: int,
         workers: int | None, tables: np.ndarray | None = None) -> CpRun:
    """The exact model over `candidates` (over `tables` alone where given: its plan then leaves the others out),
    hinted with the start, until `deadline` (time.monotonic(); building the model spends it too) or until
    within `gap` of its own bound."""
    from ortools.sat.python import cp_model

    model = build_model(candidates, start, tables)
    integer = IntegerCosts.of(candidates)
    cp = cp_model.CpModel()
    variables = [cp.NewIntVar(int(lo), int(hi), name) for lo, hi, name in zip(model.lower, model.upper, model.names)]
    for terms, coefficients, rhs in model.choices:
        cp.Add(sum(c * variables[v] for v, c in zip(terms, coefficients)) == rhs)
    # A device's true load × scale differs from its integer load by at most the sum, over its terms, of
    # the term's largest multiplicity × its positive rounding error: the proven bound gives that back.
    slack, rows = 0.0, []
    for terms, costs in model.costs:
        scaled = [integer.scale(c) for c in costs]
        errors = [max(0.0, s - c / integer.top * integer.unit) * model.upper[v] for v, s, c in zip(terms, scaled, costs)]
        slack = max(slack, float(sum(errors)))
        rows.append((terms, scaled))
    hinted = [sum(s * model.hint[v] for v, s in zip(terms, scaled)) for terms, scaled in rows]
    # Without a start, the most any device could carry bounds the makespan.
    upper = int(max(hinted) if start.assembly is not None else
                max(sum(s * model.upper[v] for v, s in zip(terms, scaled)) for terms, scaled in rows))
    lower = int(min(max(0.0, np.floor(start.lower_bound / integer.top * integer.unit - slack)), upper))
    makespan = cp.NewIntVar(lower, upper, "makespan")
    loads = []
    for d, (terms, scaled) in enumerate(rows):
        load = cp.NewIntVar(0, upper, f"load{d}")
        cp.Add(load == sum(s * variables[v] for v, s in zip(terms, scaled)))
        cp.Add(load <= makespan)
        loads.append(load)
    for terms, needs, capacity in model.memory:
        cp.Add(sum(n * variables[v] for v, n in zip(terms, needs)) <= capacity)
    for terms, coefficients, rhs in model.links:
        cp.Add(sum(c * variables[v] for v, c in zip(terms, coefficients)) <= rhs)
    if model.moves is not None:
        terms, moved, rhs = model.moves
        cp.Add(sum(b * variables[v] for v, b in zip(terms, moved)) <= rhs)
    cp.Minimize(makespan)
    if start.assembly is not None:
        for var, value in zip(variables, model.hint):
            cp.AddHint(var, int(round(value)))
        for load, value in zip(loads, hinted):
            cp.AddHint(load, int(value))
        cp.AddHint(makespan, upper)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, deadline - time.monotonic())
    solver.parameters.relative_gap_limit = gap
    solver.parameters.num_workers = workers or os.cpu_count() or 1
    solver.parameters.random_seed = seed
    if len(variables) > 20000:
        solver.parameters.cp_model_probing_level = 0  # probing stalls on large models with few cores
    rejected = RejectedLns()
    code = with_stderr_sorted(lambda: solver.Solve(cp), rejected)
    stats = {"backend": "cpsat", "cpsat_status": solver.StatusName(code), "scale": integer.unit / integer.top,
             "rounding_slack_units": slack, "rounding_error_bound": integer.to_cost(slack),
             "variables": len(variables), "wall_time": solver.WallTime(), "lns_fragments_rejected": rejected.count}
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {cp.Validate()}")
    found = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = decode(candidates, model, [solver.Value(v) for v in variables], tables)
    return CpRun(found, integer.to_cost(solver.BestObjectiveBound() - slack), code, stats)
