"""The exact model (solvers.exact_model) as a MILP through PuLP, solved by CBC or HiGHS with the heuristic
as MIP start; the proven bound is read back from each solver and loosened by its tolerances."""
from __future__ import annotations

import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from instances.moves import plan_moved_bytes

from .base import TIME_LIMIT_SLACK, Budget, Cause, NoPlan, SolveResult, infeasible, register
from .candidates import Problem
from .exact_model import LinearModel, build_model, decode, finish, prelude
from .quiet import c_stdout_silenced

# MILP bounds hold only up to the solvers' feasibility and integrality tolerances (1e-6 per row and per
# variable): a CBC "optimum" on a split model lay 3.5e-6 above a plan CP-SAT found. Give back 5e-6
# (half of OPTIMALITY_TOLERANCE, so that a MILP optimum still certifies itself).
MILP_BOUND_SLACK = 5e-6
MILP_FEASIBILITY_TOLERANCE = 1e-6  # CBC's and HiGHS's default: how far a row may exceed its bound


def _highs_with_start(time_left, use_start: bool, gap: float):
    import highspy
    import pulp

    class HiGHSWithStart(pulp.HiGHS):
        """PuLP's HiGHS, also handing HiGHS the MIP start (the variables' initial values), keeping its
        proven dual bound, and setting its time limit once the model is handed over (a second on large
        tiered models, which the limit must not grant again)."""

        def callSolver(self, lp):
            if use_start:
                solution = highspy.HighsSolution()
                solution.col_value = [var.varValue or 0.0 for var in lp.variables()]
                solution.value_valid = True
                lp.solverModel.setSolution(solution)
            lp.solverModel.setOptionValue("time_limit", float(time_left()))
            with c_stdout_silenced():
                lp.solverModel.run()
            self.dual_bound = lp.solverModel.getInfo().mip_dual_bound

    return HiGHSWithStart(msg=False, timeLimit=time_left(), gapRel=gap, threads=1)


_CBC_BEST_POSSIBLE = re.compile(r"best possible ([-+0-9.eE]+)")


@dataclass(frozen=True)
class MilpRun:
    """One backend run: the solution values (if any), its proven bound in model units, PuLP's statuses."""

    values: list[float] | None
    raw_bound: float | None
    infeasible: bool
    stats: dict


def _milp_run(model: LinearModel, unit: float, lower: float, backend: str, time_left, seed: int,
              memory_room: float, use_start: bool, gap: float, move_room: float = 1.0) -> MilpRun:
    """Solves the model with costs in units of `unit`, every device's memory (in units of its capacity) held
    to `memory_room` and the bytes moved to `move_room` of what the budget leaves, stopping at a relative
    `gap` to its bound (0: proven optimal). `time_left()` is asked once the model is built: building it
    takes seconds on large tiered instances, which the backend's limit must not grant again."""
    import pulp

    problem = pulp.LpProblem("plan", pulp.LpMinimize)
    # A hair of room above the hint: CBC's presolve otherwise can round the hint itself out of the model.
    upper = (model.makespan_hint / unit if use_start else
             sum(max(c, default=0.0) for _, c in model.costs) / unit + 1.0) * (1 + 1e-7)
    makespan = problem.add_variable("makespan", lowBound=min(lower / unit, upper), upBound=upper)
    variables = [problem.add_variable(name, lowBound=lo, upBound=hi, cat="Binary" if hi == 1 else "Integer")
                 for name, lo, hi in zip(model.names, model.lower, model.upper)]
    problem += makespan
    for terms, coefficients, rhs in model.choices:
        problem += pulp.lpSum(c * variables[v] for v, c in zip(terms, coefficients)) == rhs
    for terms, costs in model.costs:
        problem += pulp.lpSum(c / unit * variables[v] for v, c in zip(terms, costs)) <= makespan
    for terms, needs, capacity in model.memory:
        problem += pulp.lpSum(n / capacity * variables[v] for v, n in zip(terms, needs)) <= memory_room
    for terms, coefficients, rhs in model.links:
        problem += pulp.lpSum(c * variables[v] for v, c in zip(terms, coefficients)) <= rhs
    if model.moves is not None:
        # In units of the bytes the budget leaves (at least one), held to `move_room` of them.
        terms, moved, rhs = model.moves
        scale = max(abs(rhs), 1)
        problem += pulp.lpSum(b / scale * variables[v] for v, b in zip(terms, moved)) <= rhs / scale - (1 - move_room)
    if use_start:
        for var, value in zip(variables, model.hint):
            var.setInitialValue(value)
        makespan.setInitialValue(upper)
    if backend == "highs":
        solver = _highs_with_start(time_left, use_start, gap)
        problem.solve(solver)
        raw_bound = solver.dual_bound
    else:
        with tempfile.TemporaryDirectory() as scratch:
            log = Path(scratch) / "cbc.log"
            with warnings.catch_warnings():
                # PuLP 3.3 flags its bundled CBC for removal in 4.0; pyproject keeps PuLP below 3.4.
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_left(), gapRel=gap, warmStart=use_start,
                                           threads=1, logPath=str(log), options=[f"randomSeed {seed + 1}"])
            problem.solve(solver)
            text = log.read_text() if log.exists() else ""
        # CBC's summary prints "Lower bound" rounded to 3 decimals, which can round *up* past the truth;
        # its progress lines carry "best possible" to 7 significant digits (covered by MILP_BOUND_SLACK).
        progress = _CBC_BEST_POSSIBLE.findall(text)
        if problem.sol_status == pulp.LpSolutionOptimal and gap == 0:
            raw_bound = makespan.varValue
        elif problem.sol_status == pulp.LpSolutionOptimal and not progress:
            # CBC calls a solution within gapRel "optimal": its stopping rule is what proves the bound.
            raw_bound = makespan.varValue * (1 - gap)
        else:
            raw_bound = float(progress[-1]) if progress else None
    stats = {"pulp_status": pulp.LpStatus[problem.status], "solution_status": pulp.LpSolution[problem.sol_status],
             "variables": len(variables)}
    # CBC reports a proven infeasibility in the problem status while the solution status only says
    # "no solution"; HiGHS sets both.
    infeasible_model = problem.sol_status == pulp.LpSolutionInfeasible or problem.status == pulp.LpStatusInfeasible
    values = None
    if problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        values = [var.varValue or 0.0 for var in variables]
    return MilpRun(values, raw_bound, infeasible_model, stats)


def milp(problem: Problem, budget: Budget, seed: int, backend: str) -> SolveResult:
    start, done = prelude(problem, budget, seed, backend)
    if done is not None:
        return done
    candidates = problem.candidates
    model = build_model(candidates, start)
    k = candidates.num_devices
    heaviest = sum(float(candidates.work[ids].max()) for ids in candidates.by_table)
    unit = heaviest / k if heaviest > 0 else 1.0  # costs in units of the average load keep the LP well scaled
    capacity = candidates.instance.capacity
    use_start = start.assembly is not None

    def overflow(found: tuple[list[int], np.ndarray]) -> np.ndarray:
        """Bytes over capacity per device and tier (negative: room left)."""
        return candidates.plan(*found).storage_per_device(candidates.instance) - capacity

    def over_budget(found: tuple[list[int], np.ndarray]) -> int:
        """Bytes the plan moves beyond the move budget (≤ 0: within it, or no budget)."""
        previous = problem.previous
        if previous is None or previous.budget is None:
            return 0
        return plan_moved_bytes(candidates.instance, previous, candidates.plan(*found)) - previous.budget

    def remaining() -> float:
        return max(0.1, budget.remaining())

    run = _milp_run(model, unit, start.lower_bound, backend, remaining, seed, 1.0, use_start, budget.backend_gap)
    stats = {"backend": backend, **run.stats}
    if run.infeasible and not use_start:
        return infeasible(f"{backend} proved that no plan over the enumerated options fits the memory capacity")
    if run.infeasible:
        stats["note"] = "solver called the model infeasible although the heuristic start satisfies it"
    found, failure = None, None
    if run.values is not None:
        found = decode(candidates, model, run.values)
        over, moved_over = overflow(found), over_budget(found)
        if over.max() > 0 or moved_over > 0:
            # The backend's feasibility tolerance let a device exceed its memory (or the plan its move budget)
            # by a hair: solve again with that much less room. The first run's bound stays valid (it relaxed
            # memory and the budget, never tightened them).
            if over.max() > 0:
                stats["first_plan_overflow_bytes"] = int(over.max())
                failure = NoPlan(Cause.OVERFLOW, plan=candidates.plan(*found))
            if moved_over > 0:
                stats["first_plan_over_move_budget_bytes"] = moved_over
            retry = _milp_run(model, unit, start.lower_bound, backend, remaining, seed,
                              1.0 - 2.0 * max(float((over / np.maximum(capacity, 1)).max()), MILP_FEASIBILITY_TOLERANCE),
                              use_start, budget.backend_gap,
                              1.0 - 2.0 * max(moved_over / max(model.moves[2], 1) if model.moves else 0.0,
                                              MILP_FEASIBILITY_TOLERANCE))
            stats["retry_status"] = retry.stats["solution_status"]
            found = decode(candidates, model, retry.values) if retry.values is not None else None
            if found is not None and (overflow(found).max() > 0 or over_budget(found) > 0):
                found = None
    raw_bound = run.raw_bound
    usable = raw_bound is not None and np.isfinite(raw_bound)
    proven = raw_bound * unit * (1 - MILP_BOUND_SLACK) if usable else 0.0
    stats["solver_bound"] = proven
    ran_out = budget.elapsed() >= TIME_LIMIT_SLACK * budget.time_limit
    if found is None and not use_start and failure is None and not ran_out:
        raise RuntimeError(f"{backend} stopped after {budget.elapsed():.2f} s without a plan or a "
                           f"verdict (status {stats['pulp_status']}, solution {stats['solution_status']})")
    return finish(problem, found, max(start.lower_bound, proven), start, stats, failure)


@register("milp-cbc", "MILP via PuLP with CBC: option per table and devices together, MIP start from the heuristic",
          exact=True, needs_additive=True, splits=True, lp_bounded=True, replans=True, backends=("pulp",))
def milp_cbc(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return milp(problem, budget, seed, "cbc")


@register("milp-highs", "MILP via PuLP with HiGHS (highspy): option per table and devices together, MIP start from "
          "the heuristic", exact=True, needs_additive=True, splits=True, lp_bounded=True,
          replans=True, backends=("highspy", "pulp"))
def milp_highs(problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return milp(problem, budget, seed, "highs")
