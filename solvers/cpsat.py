"""The exact model (solvers.exact_model) on CP-SAT (ortools), with costs scaled to integers and the rounding
given back in the proven bound."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .base import Budget, SolveResult, infeasible, register
from .candidates import Candidates, Problem
from .exact_model import build_model, decode, finish, model_size, prelude, too_large

SCALED_TOTAL = 1e13          # integer cost units of all tables together (int64-safe, ~1e-10 rounding)


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


@register("cpsat", "CP-SAT (ortools): option per table and devices together, on integer-scaled costs with memory, "
          "symmetry breaking and a complete hint", exact=True, needs_additive=True, splits=True,
          replans=True)
def cpsat(problem: Problem, budget: Budget, seed: int, workers: int | None = None) -> SolveResult:
    from ortools.sat.python import cp_model

    start, done = prelude(problem, budget, seed, "cpsat")
    if done is not None:
        return done
    candidates = problem.candidates
    oversized = too_large(problem, start, "cpsat", model_size(candidates))
    if oversized is not None:
        return oversized
    model = build_model(candidates, start)
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
    solver.parameters.max_time_in_seconds = max(0.05, budget.remaining())
    solver.parameters.relative_gap_limit = budget.backend_gap
    solver.parameters.num_workers = workers or os.cpu_count() or 1
    solver.parameters.random_seed = seed
    if len(variables) > 20000:
        solver.parameters.cp_model_probing_level = 0  # probing stalls on large models with few cores
    code = solver.Solve(cp)
    stats = {"backend": "cpsat", "cpsat_status": solver.StatusName(code), "scale": integer.unit / integer.top,
             "rounding_slack_units": slack, "rounding_error_bound": integer.to_cost(slack),
             "variables": len(variables), "wall_time": solver.WallTime()}
    if code == cp_model.INFEASIBLE and start.assembly is None:
        return infeasible("CP-SAT proved that no plan over the enumerated options fits the memory capacity")
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {cp.Validate()}")
    found = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = decode(candidates, model, [solver.Value(v) for v in variables])
    proven = integer.to_cost(solver.BestObjectiveBound() - slack)
    return finish(problem, found, max(start.lower_bound, proven), start, stats)
