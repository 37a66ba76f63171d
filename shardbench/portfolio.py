"""The portfolio behind `plan` (the race and certify stages of shardbench.pipeline): the members run side
by side, each in its own process within the budget; the best validated plan is kept with the best bound any
of them proved for the problem as posed; the members' plans are then tidied within their makespan and their
caches re-sized off the grid of load factors, and the lowest handed over.
A proven optimum of that problem stops the rest at once."""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field, replace

from instances import Instance
from instances.memory import format_bytes
from instances.moves import Previous, check_replan
from instances import PlanError
from instances.sharding import Plan
from solvers import Budget, SolveResult, Status, get_solver, run_solver
from solvers.base import fits_every_tier, past, wall_limit
from solvers.bounds import gap_to_bound
from solvers.cache_sizes import resize_caches
from solvers.candidates import Problem
from solvers.tidy import Tidied, tidy_plan

from .isolation import Job, Outcome, run_isolated

# Kept back from the promised wall time for what the parent does after its members: re-pricing and
# validating the chosen plan, and re-sizing the plans' caches (solvers.cache_sizes prices at most 25,000
# pieces a plan, about 0.25 s under TorchRec's estimator).
PARENT_MARGIN_S = 0.5
RESIZE_FLOOR_S = 0.25  # what re-sizing and tidying the members' plans may take past the promise where the members
# took it all
RESIZE_GAIN = 1e-9     # the least relative saving a re-sized plan is handed over for (not float noise)


def first_plan_allowance(budget: float) -> float:
    """What a member is given, whatever pricing took, to build its first plan: when pricing alone runs
    past the promised wall time, a late plan is worth more than none."""
    return 1.0 + 0.5 * budget

SAFETY_NET = "best-greedy"  # always in the portfolio: the plan is never worse than its
# A replan's: `split-greedy` starts from the previous plan, so the plan is never worse than keeping it.
REPLAN_SAFETY_NET = "split-greedy"
# The recommender has no evidence on replans: local search from the previous plan, and (additive oracles)
# CP-SAT with its moved-bytes row, which proves the bound over the plans within the budget.
REPLAN_PORTFOLIO = ("local-search", "cpsat")


@dataclass(frozen=True)
class Member:
    """One member's run: its result (None when it crashed or was killed, `error` says how), its wall
    time, and whether it solved the problem as posed — a solver of whole tables on an instance that may
    split solves a narrower problem, so its optimum and bound are of whole tables only."""

    solver: str
    result: SolveResult | None
    seconds: float
    posed: bool
    error: str | None = None

    @property
    def status(self) -> str:
        if self.result is not None:
            return self.result.status.value
        return "timeout" if self.error and self.error.startswith("killed") else "error"

    @property
    def problem(self) -> str:
        return "as posed" if self.posed else "whole tables only"

    @property
    def objective(self) -> float | None:
        return self.result.objective if self.result is not None else None

    @property
    def verdict(self) -> str:
        """The status with the problem it is about: `optimal (whole tables only)` is no claim about the
        split plans of the problem as posed."""
        return f"{self.status} ({self.problem})"

    @property
    def why(self) -> str | None:
        """Why the member has no plan (None when it has one)."""
        if self.result is None:
            return self.error
        return None if self.result.plan is not None else self.result.reason or self.status


@dataclass(frozen=True)
class PortfolioResult:
    plan: Plan | None
    solver: str | None          # the member whose plan was kept
    objective: float | None
    bound: float | None         # the best lower bound any member proved for the problem as posed
    wall_s: float
    members: tuple[Member, ...] = field(default_factory=tuple)  # every member that finished or was killed
    stopped_early: bool = False
    skipped: tuple[str, ...] = ()  # members that cannot plan under this oracle, with the reason
    pricing_s: float = 0.0      # spent pricing the options before the members started (part of the budget)
    refused: str | None = None  # the proof that no plan fits memory, when the pipeline therefore ran no member
    notes: tuple[str, ...] = ()  # what the request assumed on the user's behalf (e.g. TorchRec's default DDR)
    moved_bytes: int | None = None  # in a replan, the bytes the plan moves from the previous plan
    # The kept member's plan's cost — tidied, where `tidied` says so — where its caches were then re-sized off the
    # grid of load factors (None: they were not); the bound covers that grid only, so the certificate is that plan's.
    grid_objective: float | None = None
    # A bound over every cache load factor in (0, 1] (solvers.cache_bound), which holds for the plan handed over
    # whether or not its caches were re-sized; None with the reason where there is none.
    every_lf_bound: float | None = None
    guided: int = 0  # cache load factors offered beside the grid's, where the LP over every load factor put caches
    # The tables whose caches were offered shardbench.pipeline.FINE_LOAD_FACTORS too (budgets of at least
    # shardbench.pipeline.CORE_BUDGET_S, where no core is named).
    fine: tuple[int, ...] = ()
    # Tables offered shardbench.pipeline.CORE_LOAD_FACTORS (`price`), which CP-SAT, where it runs, plans alone first.
    core: tuple[int, ...] = ()
    # The core a budget of shardbench.pipeline.CORE_BUDGET_S would have named, where this one was shorter.
    core_later: tuple[int, ...] = ()
    every_lf_seconds: float = 0.0
    every_lf_why: str | None = None
    # The kept member's plan on the grid tidied (solvers.tidy), before its caches were re-sized, where the plan
    # handed over is that one.
    tidied: Tidied | None = None

    @property
    def no_plan_reason(self) -> str | None:
        """Why there is no plan (None when there is one): a member's proof that the problem as posed is
        infeasible, or else each member's own cause."""
        if self.plan is not None:
            return None
        if self.refused is not None:
            return f"infeasible: {self.refused}"
        proof = next((m.result.reason for m in self.members if m.posed and m.result is not None
                      and m.result.status == Status.INFEASIBLE and m.result.reason), None)
        if proof:
            return f"infeasible: {proof}"
        causes = [f"{m.solver}: {m.why}" for m in self.members] + list(self.skipped)
        if self.members and all(m.result is None and m.status == "error" for m in self.members):
            return "every member failed: " + "; ".join(causes)
        return f"no member found one within {self.wall_s:.1f} s: " + ("; ".join(causes) or "no member ran")

    @property
    def gap(self) -> float | None:
        """Relative excess over the bound (0: proven optimal over the enumerated options) of the plan on
        those options: the plan handed over, or where its caches were re-sized off the grid, the plan before
        (which costs no less)."""
        objective = self.grid_objective if self.grid_objective is not None else self.objective
        if objective is None or self.bound is None:
            return None
        return gap_to_bound(objective, self.bound)

    @property
    def every_lf_gap(self) -> float | None:
        """The plan's excess over the bound over every load factor (None where there is none)."""
        if self.objective is None or self.every_lf_bound is None:
            return None
        return gap_to_bound(self.objective, self.every_lf_bound)

    @property
    def every_lf_line(self) -> str | None:
        """The certificate over every load factor, for people (None where the plan keeps no open cache)."""
        if self.every_lf_bound is not None:
            return (f"over every cache load factor in (0, 1]: gap {self.every_lf_gap:.4%} to the bound "
                    f"{self.every_lf_bound:.6g} ({self.every_lf_seconds:.1f} s)")
        return f"over every cache load factor in (0, 1]: no bound ({self.every_lf_why})" if self.every_lf_why else None

    def tidied_line(self, instance: Instance) -> str | None:
        """What tidying the plan did, for people (None where it was not tidied)."""
        if self.tidied is None:
            return None
        (peak, low), (before, after), (shards, now) = self.tidied.peak, self.tidied.work, self.tidied.shards
        count, names = len(self.tidied.tables), [instance.tables[t].name for t in self.tidied.tables]
        change = f" ({after / before - 1:+.2%})" if before > 0 else ""
        lower = f"max device cost {peak:.6g} -> {low:.6g}, " if low < peak * (1 - RESIZE_GAIN) else ""
        return (f"tidied within the max device cost: {count} table{'s' if count != 1 else ''} "
                f"({', '.join(names[:6])}{', …' if count > 6 else ''}) in options of less work or fewer shards; "
                f"{lower}work summed over devices {before:.6g} -> {after:.6g}{change}, shards {shards} -> {now}")

    def after_race_lines(self, instance: Instance) -> list[str]:
        """What tidying and re-sizing did to the plan, for people, in that order (the lines that apply)."""
        return [line for line in (self.tidied_line(instance), self.resized_line) if line is not None]

    @property
    def resized_line(self) -> str | None:
        """What re-sizing the caches did, for people (None where they were not re-sized)."""
        if self.grid_objective is None:
            return None
        return (f"caches re-sized off the grid of load factors: max device cost {self.grid_objective:.6g} -> "
                f"{self.objective:.6g} ({self.objective / self.grid_objective - 1:+.2%})")


def optimal_over(instance: Instance, previous: Previous | None = None) -> str:
    """What a bound of the problem as posed, and so a gap or a proven optimum, is over: cache load factors
    are each table's enumerated ones, not every value in (0, 1]; a replan's, the plans within its move budget."""
    tiers = " × compute kernels × the enumerated cache load factors" if instance.uses_host_memory else ""
    if instance.allows_splits:
        over = f"the enumerated options (sharding types × shard counts{tiers})"
    else:
        over = f"whole-table plans ({tiers[3:]})" if tiers else "whole-table plans"
    if previous is None:
        return over
    within = "an unlimited move budget" if previous.budget is None else f"a move budget of {format_bytes(previous.budget)}"
    kept = ", every old table keeping its sharding type, shard count and kernel" if previous.keep_types else ""
    return f"{over}, within {within}{kept}"


def _solve(name: str, problem: Problem, budget: Budget, seed: int) -> SolveResult:
    return run_solver(name, problem.instance, problem.oracle, budget, seed, problem=problem)


@dataclass(frozen=True)
class Race:
    """How the members ran: each one's outcome, in the order they finished, whether a proven (or
    good-enough) plan stopped the rest, and the wall time from the clock's start."""

    names: tuple[str, ...]      # the members as entered (ties between equal plans go to the first)
    members: tuple[Member, ...]
    stopped: bool
    wall_s: float


def race_members(problem: Problem, clock: Budget, pricing: float, names: tuple[str, ...], seed: int) -> Race:
    """Every member at once, each in its own process, on the priced (sealed) problem. A member still running
    when the promised wall time (less the parent's margin) is up is killed, or, when pricing took the
    budget, once it has had `first_plan_allowance` to build a first plan. A member of the problem as posed
    whose plan is proven optimal, or certified within the clock's gap of its bound, stops the rest."""
    instance = problem.instance
    posed = {name: get_solver(name).splits or not instance.allows_splits for name in names}
    kill = max(wall_limit(clock.time_limit) - PARENT_MARGIN_S - pricing, first_plan_allowance(clock.time_limit))
    jobs = [Job(name, functools.partial(_solve, name, problem, clock, seed), kill) for name in names]
    members: list[Member] = []

    def finished(outcome: Outcome) -> None:
        name = outcome.job.key
        if outcome.kind == "ok":
            members.append(Member(name, outcome.value, outcome.elapsed, posed[name]))
            return
        error = {"error": lambda: str(outcome.value).splitlines()[0],
                 "died": lambda: f"process died (exit code {outcome.value})",
                 "killed": lambda: f"killed after {outcome.elapsed:.1f} s"}[outcome.kind]()
        members.append(Member(name, None, outcome.elapsed, posed[name], error))

    def proven(_: Outcome) -> bool:
        last = members[-1]
        return last.posed and last.result is not None and (last.result.status == Status.OPTIMAL or (
            last.result.plan is not None and clock.good_enough(last.result.objective, last.result.lower_bound)))

    stopped = run_isolated(jobs, len(jobs), finished, proven)
    return Race(tuple(names), tuple(members), stopped, clock.elapsed())


def settle(problem: Problem, race: Race, skipped: tuple[str, ...], pricing: float,
           resize: Budget | None = None) -> PortfolioResult:
    """The best member's plan, validated and priced again here (the plan handed over is the plan rated), with
    the best bound any member proved for the problem as posed (never above a plan on the grid); given the
    race's clock (`resize`), the lowest plan once the members' plans are re-sized off the grid of load
    factors (`resized_caches`, the best on the grid first, within what the clock leaves), each as it came and
    then tidied (`tidied_plan`, while the clock leaves time; kept where it costs no more), and the wall time
    taken to the end of that. Without the clock, the best plan tidied where time is left."""
    started = time.monotonic()
    instance, members = problem.instance, race.members
    # Every member's option bound is over the posed problem's options (run_solver computes it there).
    bounds = [b for m in members if m.result is not None
              for b in (m.result.lower_bound if m.posed else None, m.result.stats.get("option_bound"))
              if b is not None]
    bound = max(bounds) if bounds else None
    with_plan = [m for m in members if m.result is not None and m.result.plan is not None]
    if not with_plan:
        return PortfolioResult(None, None, None, bound, race.wall_s, members, race.stopped, skipped, pricing)

    def on_grid(member: Member) -> tuple[Plan, float]:
        plan = member.result.plan.validate(instance)
        return plan, problem.oracle.plan_cost(instance, plan)

    ranked = sorted(with_plan, key=lambda m: (m.result.objective, race.names.index(m.solver)))
    best = ranked[0]
    first = on_grid(best)
    plan, objective = first
    moved = check_replan(instance, problem.previous, plan) if problem.previous is not None else None
    lowest_grid, grid_objective, kept = objective, None, None
    until = max(resize.deadline() if resize is not None else 0.0, time.monotonic() + RESIZE_FLOOR_S)
    # Every member's plan re-sized, best on the grid first (the others while the clock leaves time): one a little
    # dearer on the grid may re-size lower (the zoo's dlrm-criteo with HBM short: pair-balance's 34.52 on the grid
    # to 32.17, CP-SAT's 33.53 to 33.12). In a replan caches keep their size.
    came: list[tuple[Member, tuple[Plan, float]]] = []
    for member in ranked if resize is not None and problem.previous is None else ranked[:1]:
        if came and time.monotonic() >= until:
            break
        if any(member.result.plan == other.result.plan for other, _ in came):
            continue
        came.append((member, first if member is ranked[0] else on_grid(member)))
        lower = resized_caches(problem, *came[-1][1], until) if resize is not None else None
        if lower is not None and lower[1] < objective * (1 - RESIZE_GAIN):
            (plan, objective), grid_objective, best = lower, came[-1][1][1], member
    # Then each of them tidied and re-sized again, in the same order, with what the clock leaves: tidied, a plan
    # may re-size lower or higher than as it came (the same tables: 32.17 against 32.99, and 33.63 against 33.54);
    # a tie goes to the tidied. Without the clock only the best plan is tidied.
    for member, (grid_plan, grid_cost) in came:
        tidied = tidied_plan(problem, grid_plan, grid_cost, until)
        if tidied is None:
            continue
        lowest_grid = min(lowest_grid, tidied.peak[1])
        after = resized_caches(problem, tidied.plan, tidied.peak[1], until) if resize is not None else None
        final = after if after is not None else (tidied.plan, tidied.peak[1])
        if final[1] <= objective:
            plan, objective = final
            grid_objective, best, kept = (tidied.peak[1] if after is not None else None), member, tidied
    wall = resize.elapsed() if resize is not None else race.wall_s + time.monotonic() - started
    return PortfolioResult(plan, best.solver, objective, min(bound, lowest_grid) if bound is not None else None,
                           wall, members, race.stopped, skipped, pricing, moved_bytes=moved,
                           grid_objective=grid_objective, tidied=kept)


def tidied_plan(problem: Problem, plan: Plan, objective: float, deadline: float) -> Tidied | None:
    """The plan tidied within its makespan (solvers.tidy, by `deadline`), validated on every tier and priced
    again (`Tidied.peak`: `objective`, the plan's cost as it came, and the tidied plan's), where that changes
    some table and costs no more than `objective`; None elsewhere, under oracles that are not additive, where
    `deadline` passes before the plan's options are found, and in a replan (a table changed would move bytes
    the move budget has to price). As `resized_caches`, a tidied plan that fails validation is a defect: it is
    logged and the plan as it came handed over."""
    if problem.previous is not None or not problem.oracle.additive or past(deadline):
        return None
    tidied = tidy_plan(problem.candidates, plan, deadline)
    if tidied is None:
        return None
    cost = _checked_cost(problem, tidied.plan, "plan not tidied, the tidied plan failed")
    return replace(tidied, peak=(objective, cost)) if cost is not None and cost <= objective else None


def resized_caches(problem: Problem, plan: Plan, objective: float, deadline: float) -> tuple[Plan, float] | None:
    """The plan with its caches re-sized off the grid of load factors (solvers.cache_sizes, by `deadline`),
    validated on every tier (the instance's count and the oracle's own) and priced, with its cost, where that
    is lower; None elsewhere and in a replan (by default each old table keeps its option, cache included, as
    TorchRec's reshard keeps it). A re-sized plan that fails validation is a defect of the re-sizing: it is
    logged and the plan on the grid handed over."""
    if problem.previous is not None:
        return None
    resized = resize_caches(problem.instance, problem.oracle, plan, deadline)
    if resized is None:
        return None
    cost = _checked_cost(problem, resized, "caches not re-sized, the re-sized plan failed")
    return (resized, cost) if cost is not None and cost < objective * (1 - RESIZE_GAIN) else None


def _checked_cost(problem: Problem, plan: Plan, refusal: str) -> float | None:
    """The cost of a plan derived here from a member's (re-sized or tidied), once it fits every tier (the
    instance's count and the oracle's own); None, with `refusal` and the reason logged, where it does not: a
    defect of what derived it, so the plan it came from is handed over instead."""
    try:
        fits_every_tier(problem.instance, problem.oracle, plan)
    except PlanError as error:
        logging.getLogger("shardbench").error("shardbench: %s: %s", refusal, error)
        return None
    return problem.oracle.plan_cost(problem.instance, plan)
