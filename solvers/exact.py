"""Exact placement for additive oracles: CP-SAT on integer-scaled costs and a MILP through PuLP (CBC or
HiGHS). Both minimise the max device cost under memory, start from the best heuristic plan (a complete
hint / MIP start), break the symmetry of identical devices, and report the bound they proved; a plan
is called optimal only when that bound meets it."""
from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodels import Oracle
from instances import Instance, Plan

from .base import (
    OPTIMALITY_TOLERANCE,
    TIME_LIMIT_SLACK,
    Budget,
    Cause,
    NoPlan,
    SolveResult,
    Status,
    infeasible,
    order_by_cost,
    register,
)
from .bounds import best_additive_lower_bound
from .greedy import best_greedy
from .search import improve

SCALED_TOTAL = 1e13          # integer cost units of all tables together (int64-safe, ~1e-10 rounding)
MILP_BOUND_SLACK = 1e-7      # MILP bounds hold up to the solvers' feasibility tolerances: give that back
MILP_FEASIBILITY_TOLERANCE = 1e-6  # CBC's and HiGHS's default: how far a row may exceed its bound
HEURISTIC_SHARE = 0.1        # share of the budget spent on the heuristic start before the exact model


@dataclass(frozen=True)
class ExactStart:
    """What an exact model starts from: the heuristic plan (or None), the tables in symmetry-breaking
    order, and the combinatorial lower bound."""

    assignment: tuple[int, ...] | None
    order: np.ndarray
    lower_bound: float

    def proven(self, instance: Instance, oracle: Oracle) -> bool:
        """The heuristic plan already meets the bound: nothing is left for the model to prove."""
        return (self.assignment is not None
                and oracle.plan_cost(instance, Plan.table_wise(instance, self.assignment))
                <= self.lower_bound * (1 + OPTIMALITY_TOLERANCE))


def exact_start(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> ExactStart:
    deadline = time.monotonic() + HEURISTIC_SHARE * budget.time_limit
    costs = oracle.table_costs(instance)
    bound = best_additive_lower_bound(costs, instance.num_devices)
    start = best_greedy(instance, oracle)
    assignment = start.plan.assignment if start.plan is not None else None
    if assignment is not None and oracle.plan_cost(instance, start.plan) > bound * (1 + OPTIMALITY_TOLERANCE):
        assignment = improve(instance, oracle, assignment, deadline, seed)[0]
    return ExactStart(assignment, order_by_cost(costs), bound)


def allowed_devices(position: int, num_devices: int) -> range:
    """Identical devices are interchangeable, so label them by first use in table order: the table at
    position p can only be on devices 0..p. Every plan has such a relabelling."""
    return range(min(position + 1, num_devices))


def relabel(assignment, order: np.ndarray) -> tuple[int, ...]:
    """The same plan with devices numbered by first use in `order` (so that it satisfies the symmetry
    breaking and can serve as a hint)."""
    labels: dict[int, int] = {}
    for table in order:
        labels.setdefault(int(assignment[table]), len(labels))
    return tuple(labels[int(d)] for d in assignment)


def _finish(instance: Instance, oracle: Oracle, assignment, bound: float, fallback, stats: dict,
            failure: NoPlan | None = None) -> SolveResult:
    """Picks the better of the solver's plan and the heuristic start, and certifies optimality only when
    the proven bound meets the plan's true objective. Without either plan, `failure` says why."""
    candidates = [a for a in (assignment, fallback) if a is not None]
    if not candidates:
        if failure is None or failure.cause == Cause.TIME_LIMIT:
            return SolveResult(Status.NO_PLAN, lower_bound=bound, reason="no plan found within the time limit",
                               stats=stats, no_plan=NoPlan(Cause.TIME_LIMIT))
        return SolveResult(Status.NO_PLAN, lower_bound=bound, stats=stats, no_plan=failure, reason=(
            "the only plan the solver found overflows memory (by its feasibility tolerance); no valid plan "
            "was found"))
    plans = [Plan.table_wise(instance, a) for a in candidates]
    best = min(plans, key=lambda p: oracle.plan_cost(instance, p))
    objective = oracle.plan_cost(instance, best)
    if bound <= objective * (1 + OPTIMALITY_TOLERANCE):
        # Only rounding can put a valid bound a hair above the plan; anything more is left for run_solver
        # to reject, so that a wrong bound is never turned into an "optimal".
        bound = min(bound, objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    status = Status.OPTIMAL if gap <= OPTIMALITY_TOLERANCE else Status.FEASIBLE
    return SolveResult(status, plan=best, lower_bound=bound, stats={**stats, "certified_gap": gap})


# ---------------------------------------------------------------- CP-SAT


@register("cpsat", "CP-SAT (ortools) on integer-scaled costs with memory, symmetry breaking and a complete hint",
          exact=True, needs_additive=True)
def cpsat(instance: Instance, oracle: Oracle, budget: Budget, seed: int, workers: int | None = None) -> SolveResult:
    from ortools.sat.python import cp_model

    started = time.monotonic()
    start = exact_start(instance, oracle, budget, seed)
    if start.proven(instance, oracle):
        return _finish(instance, oracle, start.assignment, start.lower_bound, None, {"note": "the heuristic start "
                       "meets the lower bound"})
    costs = oracle.table_costs(instance)
    n, k = instance.num_tables, instance.num_devices
    integer = IntegerCosts.of(costs)
    scaled = integer.scaled
    memory = instance.table_memory()
    capacity = instance.topology.memory_bytes

    model = cp_model.CpModel()
    x: dict[tuple[int, int], object] = {}
    for position, table in enumerate(start.order):
        for d in allowed_devices(position, k):
            x[int(table), d] = model.NewBoolVar(f"x{table}_{d}")
    for table in range(n):
        model.AddExactlyOne(x[table, d] for d in range(k) if (table, d) in x)
    hint = relabel(start.assignment, start.order) if start.assignment is not None else None
    upper = int(max(np.bincount(hint, weights=scaled, minlength=k))) if hint else int(scaled.sum())
    lower = int(min(best_additive_lower_bound(scaled.astype(float), k), upper))
    makespan = model.NewIntVar(lower, upper, "makespan")
    loads = []
    for d in range(k):
        members = [int(t) for t in start.order[d:]]  # exactly the tables allowed on d
        load = model.NewIntVar(0, upper, f"load{d}")
        model.Add(load == sum(int(scaled[t]) * x[t, d] for t in members))
        model.Add(load <= makespan)
        loads.append(load)
        if sum(memory) > capacity:  # Python ints: exact whatever the sizes
            model.Add(sum(memory[t] * x[t, d] for t in members) <= capacity)
    model.Minimize(makespan)
    if hint:
        for (t, d), var in x.items():
            model.AddHint(var, hint[t] == d)
        hinted = np.bincount(hint, weights=scaled, minlength=k).astype(np.int64)
        for d, load in enumerate(loads):
            model.AddHint(load, int(hinted[d]))
        model.AddHint(makespan, upper)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, budget.time_limit - (time.monotonic() - started))
    solver.parameters.num_workers = workers or os.cpu_count() or 1
    solver.parameters.random_seed = seed
    if len(x) > 20000:
        solver.parameters.cp_model_probing_level = 0  # probing stalls on large models with few cores
    code = solver.Solve(model)
    stats = {"cpsat_status": solver.StatusName(code), "scale": integer.unit / integer.top,
             "rounding_slack_units": integer.slack, "rounding_error_bound": integer.to_cost(integer.slack),
             "variables": len(x),
             "wall_time": solver.WallTime()}
    if code == cp_model.INFEASIBLE and not hint:
        return infeasible("CP-SAT proved that no placement fits the memory capacity")
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {model.Validate()}")
    found = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = tuple(next(d for d in range(k) if (t, d) in x and solver.Value(x[t, d])) for t in range(n))
    proven = integer.to_cost(solver.BestObjectiveBound() - integer.slack)
    return _finish(instance, oracle, found, max(start.lower_bound, proven), start.assignment, stats)


@dataclass(frozen=True)
class IntegerCosts:
    """Costs as integers for CP-SAT: cost / top × unit, rounded, where all costs together make SCALED_TOTAL
    units. Dividing by the largest cost first makes tiny and huge costs scale alike. A device's true load
    in units differs from its integer load by at most `slack` (the sum of the positive rounding errors),
    which a proven bound must give back. All-zero costs give a pure feasibility model."""

    scaled: np.ndarray
    unit: float
    top: float
    slack: float

    @classmethod
    def of(cls, costs: np.ndarray) -> "IntegerCosts":
        costs = np.asarray(costs, dtype=float)
        top = float(costs.max(initial=0.0))
        if top <= 0:
            return cls(np.zeros(costs.size, dtype=np.int64), 1.0, 1.0, 0.0)
        relative = costs / top
        unit = SCALED_TOTAL / relative.sum()
        scaled = np.rint(relative * unit).astype(np.int64)
        return cls(scaled, unit, top, float(np.clip(scaled - relative * unit, 0, None).sum()))

    def to_cost(self, units: float) -> float:
        return units / self.unit * self.top


# ---------------------------------------------------------------- MILP via PuLP


def _highs_with_start(time_limit: float, use_start: bool):
    import highspy
    import pulp

    class HiGHSWithStart(pulp.HiGHS):
        """PuLP's HiGHS, also handing HiGHS the MIP start (the variables' initial values) and keeping
        its proven dual bound."""

        def callSolver(self, lp):
            if use_start:
                solution = highspy.HighsSolution()
                solution.col_value = [var.varValue or 0.0 for var in lp.variables()]
                solution.value_valid = True
                lp.solverModel.setSolution(solution)
            lp.solverModel.run()
            self.dual_bound = lp.solverModel.getInfo().mip_dual_bound

    return HiGHSWithStart(msg=False, timeLimit=time_limit, gapRel=0.0, threads=1)


_CBC_BEST_POSSIBLE = re.compile(r"best possible ([-+0-9.eE]+)")


@dataclass(frozen=True)
class MilpRun:
    """One backend run: the plan it returned (if any), its proven bound in model units, PuLP's statuses."""

    found: tuple[int, ...] | None
    raw_bound: float | None
    infeasible: bool
    stats: dict


def _milp_run(instance: Instance, start: ExactStart, c: np.ndarray, upper: float, unit: float, hint, backend: str,
              time_limit: float, seed: int, memory_room: float) -> MilpRun:
    """Builds and solves the placement MILP with every device's memory (in units of its capacity) held
    to `memory_room`."""
    import pulp

    n, k = instance.num_tables, instance.num_devices
    memory = np.array(instance.table_memory(), dtype=float) / instance.topology.memory_bytes
    problem = pulp.LpProblem("placement", pulp.LpMinimize)
    makespan = problem.add_variable("makespan", lowBound=min(start.lower_bound / unit, upper), upBound=upper)
    x = {}
    for position, table in enumerate(start.order):
        for d in allowed_devices(position, k):
            x[int(table), d] = problem.add_variable(f"x_{table}_{d}", cat="Binary")
    problem += makespan
    for table in range(n):
        problem += pulp.lpSum(x[table, d] for d in range(k) if (table, d) in x) == 1
    for d in range(k):
        members = [int(t) for t in start.order[d:]]  # exactly the tables allowed on d
        problem += pulp.lpSum(float(c[t]) * x[t, d] for t in members) <= makespan
        if sum(instance.table_memory()) > instance.topology.memory_bytes:
            problem += pulp.lpSum(float(memory[t]) * x[t, d] for t in members) <= memory_room
    if hint:
        for (t, d), var in x.items():
            var.setInitialValue(1.0 if hint[t] == d else 0.0)
        makespan.setInitialValue(upper)
    if backend == "highs":
        solver = _highs_with_start(time_limit, bool(hint))
        problem.solve(solver)
        raw_bound = solver.dual_bound
    else:
        with tempfile.TemporaryDirectory() as scratch:
            log = Path(scratch) / "cbc.log"
            with warnings.catch_warnings():
                # PuLP 3.3 flags its bundled CBC for removal in 4.0; pyproject keeps PuLP below 3.4.
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=0.0, warmStart=bool(hint),
                                           threads=1, logPath=str(log), options=[f"randomSeed {seed + 1}"])
            problem.solve(solver)
            text = log.read_text() if log.exists() else ""
        # CBC's summary prints "Lower bound" rounded to 3 decimals, which can round *up* past the truth;
        # its progress lines carry "best possible" to 7 significant digits (covered by MILP_BOUND_SLACK).
        progress = _CBC_BEST_POSSIBLE.findall(text)
        if problem.sol_status == pulp.LpSolutionOptimal:
            raw_bound = makespan.varValue
        else:
            raw_bound = float(progress[-1]) if progress else None
    stats = {"pulp_status": pulp.LpStatus[problem.status], "solution_status": pulp.LpSolution[problem.sol_status],
             "variables": len(x)}
    # CBC reports a proven infeasibility in the problem status while the solution status only says
    # "no solution"; HiGHS sets both.
    infeasible_model = problem.sol_status == pulp.LpSolutionInfeasible or problem.status == pulp.LpStatusInfeasible
    found = None
    if problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        values = {key: var.varValue or 0.0 for key, var in x.items()}
        found = tuple(max((d for d in range(k) if (t, d) in x), key=lambda d: values[t, d]) for t in range(n))
    return MilpRun(found, raw_bound, infeasible_model, stats)


def milp(instance: Instance, oracle: Oracle, budget: Budget, seed: int, backend: str) -> SolveResult:
    started = time.monotonic()
    start = exact_start(instance, oracle, budget, seed)
    if start.proven(instance, oracle):
        return _finish(instance, oracle, start.assignment, start.lower_bound, None, {"backend": backend, "note":
                       "the heuristic start meets the lower bound"})
    costs = oracle.table_costs(instance)
    k = instance.num_devices
    unit = costs.sum() / k if costs.sum() > 0 else 1.0  # costs in units of the average load keep the LP well scaled
    c = costs / unit
    hint = relabel(start.assignment, start.order) if start.assignment is not None else None
    # A hair of room above the hint: CBC's presolve otherwise can round the hint itself out of the model.
    upper = (float(np.bincount(hint, weights=c, minlength=k).max()) if hint else float(c.sum())) * (1 + 1e-7)
    capacity = instance.topology.memory_bytes

    def remaining() -> float:
        return max(1.0, budget.time_limit - (time.monotonic() - started))

    run = _milp_run(instance, start, c, upper, unit, hint, backend, remaining(), seed, 1.0)
    stats = {"backend": backend, **run.stats}
    if run.infeasible and not hint:
        return infeasible(f"{backend} proved that no placement fits the memory capacity")
    if run.infeasible:
        stats["note"] = "solver called the model infeasible although the heuristic start satisfies it"
    found, raw_bound, failure = run.found, run.raw_bound, None
    if found is not None:
        over = max(Plan.table_wise(instance, found).memory_per_device(instance)) - capacity
        if over > 0:
            # The backend's feasibility tolerance let a device exceed its memory by a hair: solve again with
            # that much less room. The first run's bound stays valid (it relaxed memory, never tightened it).
            stats["first_plan_overflow_bytes"] = int(over)
            failure = NoPlan(Cause.OVERFLOW, plan=Plan.table_wise(instance, found))
            retry = _milp_run(instance, start, c, upper, unit, hint, backend, remaining(), seed,
                              1.0 - 2.0 * max(over / capacity, MILP_FEASIBILITY_TOLERANCE))
            stats["retry_status"] = retry.stats["solution_status"]
            found = retry.found
            if found is not None and max(Plan.table_wise(instance, found).memory_per_device(instance)) > capacity:
                found = None
    usable = raw_bound is not None and np.isfinite(raw_bound)
    proven = raw_bound * unit * (1 - MILP_BOUND_SLACK) if usable else 0.0
    stats["solver_bound"] = proven
    ran_out = time.monotonic() - started >= TIME_LIMIT_SLACK * budget.time_limit
    if found is None and hint is None and failure is None and not ran_out:
        raise RuntimeError(f"{backend} stopped after {time.monotonic() - started:.2f} s without a plan or a "
                           f"verdict (status {stats['pulp_status']}, solution {stats['solution_status']})")
    return _finish(instance, oracle, found, max(start.lower_bound, proven), start.assignment, stats, failure)


@register("milp-cbc", "MILP via PuLP with CBC, MIP start from the best heuristic", exact=True, needs_additive=True)
def milp_cbc(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    return milp(instance, oracle, budget, seed, "cbc")


@register("milp-highs", "MILP via PuLP with HiGHS (highspy), MIP start from the best heuristic", exact=True,
          needs_additive=True)
def milp_highs(instance: Instance, oracle: Oracle, budget: Budget, seed: int) -> SolveResult:
    return milp(instance, oracle, budget, seed, "highs")
