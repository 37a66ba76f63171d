"""The one planning pipeline behind every entry point (`shardbench plan`, `shardbench.plan`,
`ShardbenchPlanner.plan`, `demo`, `replan`): a frozen request runs named stages in TorchRec's order — narrow
→ admit → choose → price → race → certify → report — each returning an immutable value. A request with a
previous plan replans: its members start from that plan and keep within its move budget."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from textwrap import shorten
from pathlib import Path
from typing import Callable, Mapping

from costmodels import Oracle, get_oracle, oracle_is_additive, oracle_prices_tiers
from instances import Instance, InstanceError
from instances.kernels import LOAD_FACTOR_DIGITS
from instances.memory import format_bytes
from instances.moves import Previous
from solvers import Budget, Problem, SolverOracleMismatch, check_seed, get_solver
from solvers.base import incompatibility, load_backends, memory_infeasibility
from solvers.bounds import LPOutOfTime, solve_lp_within
from solvers.cache_bound import POINTS as CURVE_POINTS
from solvers.cache_bound import (
    Guide,
    carry_bound,
    curve_pieces,
    every_load_factor_bound,
    guided_load_factors,
    has_every_load_factor_bound,
    load_factor_points,
    open_caches,
)
from solvers.candidates import Candidates
from solvers.exact_model import core_of, cut_down_settles

from .portfolio import (
    REPLAN_PORTFOLIO,
    REPLAN_SAFETY_NET,
    SAFETY_NET,
    PortfolioResult,
    Race,
    first_plan_allowance,
    optimal_over,
    race_members,
    settle,
)
from .recommend import Rules

# The cost model every entry point plans under unless told otherwise (the CLI's --oracle, the oracle= of
# shardbench.plan and ShardbenchPlanner): TorchRec's own estimator, so that a plan is judged as TorchRec
# judges it.
DEFAULT_ORACLE = "torchrec"
# Where TorchRec cannot be imported, the analytic bandwidth model stands in (and the result's notes say so).
FALLBACK_ORACLE = "analytic"
# A member's reason beside its verdict is cut to this many characters, at a word (the record keeps it whole).
REASON_WIDTH = 160
LISTED_LOAD_FACTORS = 8  # a report lists the cache load factors up to this many, else their range
LP_SHARE = 0.2  # of the budget, the most the price stage gives the LP over options before the members start
# The bound over every load factor comes after the race, on top of the budget: its LP gets this share of the
# budget, at least the floor (pricing its curves comes first: 0.6 s at 80 × 8, 2.7 s at 200 × 16).
CERTIFY_SHARE = 0.25
CERTIFY_FLOOR_S = 1.0
# The load factors the LP over every load factor chooses are found within this share of the budget, where
# pricing the curves (CURVE_POINTS per cached layout; about this many pieces a second here) takes at most half.
GUIDE_SHARE = 0.35
CURVE_PIECES_PER_S = 200_000
# Where a few tables do most of the LP's work (solvers.exact_model.core_of), their caches are offered these
# load factors too and the exact model plans them alone first, on budgets of at least CORE_BUDGET_S: on the
# MLPerf Criteo-1TB tables with HBM short under TorchRec's estimator, `plan` then ended at 29.91-30.01 ms at 20
# and 30 s over six runs, against 31.73-33.36 without; at 15 s (3 runs of 3) and 10 s CP-SAT's model over them
# found nothing in time and the searches, offered them too, did worse (45.2-59.2 ms against 31.9-33.4). It needs
# about 10 s there; at 30 s it has twice that (docs/bounds.md). Its 40 load factors lie between 0.05 and 0.86
# (0.052-0.833), denser where caches are small (load_factor_points), as in those runs.
CORE_LOAD_FACTORS = tuple(sorted({round(float(f), LOAD_FACTOR_DIGITS) for f in load_factor_points(58)
                                  if 0.05 <= f <= 0.86}))
# On those budgets, where no core is named (`fine_tables`), every cache is offered these, where the LP over every
# load factor caches some table: the grid's steps decide which tables share a device's HBM, and re-sizing a
# plan's caches afterwards keeps that choice
# (tiers-80x8 under TorchRec's estimator at 30 s, `plan` seed 0: within 1 % of the bound over every load factor on
# 26 of 30 tasks, at most 1.85 %, against 24-26 at stops 49-60 and six tasks at 1.18-2.90 % at stop 61 on the
# grid; with the core's 40 instead, 25, 1.90 %: one or two tasks apart run to run; docs/memory-tiers.md, stop 62).
# Where they would make more than FINE_OPTIONS options, the grid stays: at 200 x 16 (57,000 options against
# 13,000) `pair-balance` found no start within 25 s and `plan` ended 3.5-10 % above the bound on 4 of 11 tasks;
# offered to the caches that LP opens alone (about 20,000), plans were no lower than on the grid (14/15 within
# 1 % either way). Below CORE_BUDGET_S the grid stays too: at 10 s the searches, slower over four times the
# options, did worse (80 x 8: within 2 % on 27 of 30, against 28).
FINE_LOAD_FACTORS = tuple(sorted({round(float(f), LOAD_FACTOR_DIGITS) for f in load_factor_points(58)
                                  if 0.02 <= f <= 0.95}))
FINE_OPTIONS = 30_000
CORE_BUDGET_S = 30.0
NO_GUIDE = Guide({})  # where there is no LP over every load factor to suggest anything
BOUND_SLACK = 1e-9  # relative: a plan this far below a bound is float noise, not a defect of the bound
# How the request's fields are named in messages: Python's keyword arguments unless an entry point (the
# CLI) names them its own way.
PYTHON_NAMES = {"sharding_types": "sharding_types", "compute_kernels": "compute_kernels", "solvers": "solvers",
                "budget": "budget"}


def default_oracle() -> tuple[str, tuple[str, ...]]:
    """The oracle for a request that names none, with what that assumed: DEFAULT_ORACLE where TorchRec can
    be imported, else FALLBACK_ORACLE and a note saying so."""
    from interop.common import load_torchrec

    try:
        load_torchrec()
    except (ImportError, OSError) as exc:
        return FALLBACK_ORACLE, (f"oracle: TorchRec cannot be imported here ({' '.join(str(exc).split())}), so "
                                 f"{FALLBACK_ORACLE} prices the plan; name an oracle to choose another",)
    return DEFAULT_ORACLE, ()


@dataclass(frozen=True)
class PlanRequest:
    """What to plan and how: the instance, the oracle the members optimise, the budget (seconds, pricing
    included), the gap (a fraction of the bound that stops the search early), the members (None: the
    recommended portfolio; `best-greedy` always runs too), the seed of stochastic members, the sharding
    types and compute kernels to plan with (None: the instance's), a rules file for the recommender, for a
    replan the previous plan with its move budget, and whether caches may leave the options' grid of load
    factors (`resize_caches`: offered the load factors the LP over every load factor picks — and on budgets of
    at least CORE_BUDGET_S finer ones or, where a core is named, the core its own (`price`) — and the members'
    plans re-sized, the lowest kept; never in a replan)."""

    instance: Instance
    oracle: str
    budget: float = 10.0
    gap: float = 0.0
    solvers: tuple[str, ...] | None = None
    seed: int = 0
    sharding_types: tuple[str, ...] | None = None
    compute_kernels: tuple[str, ...] | None = None
    rules: str | Path | None = None
    names: Mapping[str, str] = field(default_factory=lambda: dict(PYTHON_NAMES))
    notes: tuple[str, ...] = ()  # what the request assumed on the user's behalf, said with the result
    previous: Previous | None = None  # a replan: the previous plan over the instance, with its move budget
    resize_caches: bool = True


@dataclass(frozen=True)
class Admitted:
    """The narrowed instance the pipeline may plan, with the members that cannot plan it under the oracle
    (and why), and — when the instance cannot fit memory at all — the proof, so that no member runs."""

    instance: Instance
    skipped: tuple[str, ...] = ()
    unfit: str | None = None


@dataclass(frozen=True)
class Priced:
    """The problem with its options priced once, before any member forks (members read these prices and
    price nothing again), the clock that started when the oracle was built, and the seconds pricing took."""

    problem: Problem
    clock: Budget
    seconds: float
    guided: int = 0  # load factors offered beside the grid's (`guided`)
    core_later: tuple[int, ...] = ()  # the core a budget of CORE_BUDGET_S would name, where this one is shorter
    fine: tuple[int, ...] = ()  # the caches offered FINE_LOAD_FACTORS too, where no core is named (`fine_tables`)


@dataclass(frozen=True)
class PlanReport:
    """What the pipeline hands back: the result, the lines it printed (or would have), and the record a
    plan file keeps beside the plan."""

    instance: Instance            # as planned (narrowed to the request's types and kernels)
    result: PortfolioResult
    members: tuple[str, ...]
    lines: tuple[str, ...]
    record: dict


# ------------------------------------------------------------------ narrow


def narrow(request: PlanRequest) -> Instance:
    """The instance, validated, planned with only the request's sharding types and compute kernels; every
    table must keep an option, and a table's fixed cache load factor its use (Instance.cache_problem)."""
    instance = request.instance.validate()
    restricted = instance.restricted_to(request.sharding_types)
    for table in restricted.tables:
        if not restricted.allowed_types(table):
            raise InstanceError(request.names["sharding_types"], f"leaves table {table.name} no sharding type it "
                                f"allows (it allows {', '.join(instance.allowed_types(table))})")
        if problem := restricted.cache_problem(table):
            raise InstanceError(request.names["sharding_types"], f"table {table.name}: {problem}")
    restricted = restricted.restricted_to_kernels(request.compute_kernels)
    for table in restricted.tables:
        if not any(restricted.allowed_kernels(table, kind) for kind in restricted.allowed_types(table)):
            raise InstanceError(request.names["compute_kernels"], f"leaves table {table.name} no compute kernel for "
                                f"its sharding types ({', '.join(restricted.allowed_types(table))})")
        if problem := restricted.cache_problem(table):
            raise InstanceError(request.names["compute_kernels"], f"table {table.name}: {problem}")
    return restricted


# ------------------------------------------------------------------ admit


def check_oracle(instance: Instance, oracle: str) -> None:
    """Raises SolverOracleMismatch when no solver can plan the instance under this oracle (it does not price
    tables kept in host memory), and UnknownOracleError for an unknown name — without building the oracle."""
    mismatch = incompatibility(None, oracle_is_additive(oracle), oracle_prices_tiers(oracle), instance.uses_host_memory)
    if mismatch:
        raise SolverOracleMismatch(f"oracle {oracle!r}: {mismatch}")


def cannot_fit(instance: Instance) -> str | None:
    """Why no plan of the instance fits memory, by the solvers' own proof (memory_infeasibility over the
    options, priced by the cheap lookup oracle: memory is the instance's, whatever the oracle), or None.
    Whole tables that each fit a device and fit the devices in all cannot trip that proof, which spares
    large instances building their options."""
    stored, capacity = instance.table_storage(), instance.topology.capacity.as_array()
    if (stored.sum(axis=0) <= capacity * instance.num_devices).all() and all(
            "table_wise" in instance.allowed_types(table) and (need <= capacity).all()
            for table, need in zip(instance.tables, stored)):
        return None
    return memory_infeasibility(Problem(instance, get_oracle("lookup")))


def safety_net(request: PlanRequest) -> str:
    """The member that always runs: `best-greedy`, or in a replan `split-greedy`, which starts from the
    previous plan (so the result is never worse than keeping it)."""
    return SAFETY_NET if request.previous is None else REPLAN_SAFETY_NET


def admit(request: PlanRequest, instance: Instance) -> Admitted:
    """Whether the request can be planned at all: its budget, gap and seed in range, its members known, its
    oracle known and able to price the instance, and the instance able to fit memory (else the proof);
    the members the oracle (or a replan) rules out are named with the reason."""
    Budget(request.budget, gap=request.gap)
    check_seed(request.seed)
    if request.solvers is not None and not request.solvers:
        raise InstanceError(request.names["solvers"], "names no solver (leave it out for the recommended portfolio)")
    for name in request.solvers or ():
        get_solver(name)
    check_oracle(instance, request.oracle)
    members = dict.fromkeys([*(request.solvers or ()), safety_net(request)])
    additive, tiers = oracle_is_additive(request.oracle), oracle_prices_tiers(request.oracle)
    skipped = tuple(f"{name}: {why}" for name in members
                    if (why := incompatibility(get_solver(name), additive, tiers, instance.uses_host_memory,
                                               request.previous is not None)))
    return Admitted(instance, skipped, cannot_fit(instance))


# ------------------------------------------------------------------ choose


def recommended(instance: Instance, oracle: str, budget: float, rules: str | Path | None = None) -> list[str]:
    """The solvers the shipped (or given) planner-choice rules recommend for this instance, best first."""
    from .workloads import workload_features

    loaded = Rules.load(Path(rules)) if rules else Rules.load()
    return loaded.portfolio(workload_features(instance, oracle, budget))


def choose(request: PlanRequest, admitted: Admitted) -> tuple[str, ...]:
    """The portfolio: the request's solvers, or the recommended ones for this workload; in a replan (on which
    the recommender has no evidence) local search and, under an additive oracle, CP-SAT with its moved-bytes
    row."""
    if request.solvers is not None:
        return tuple(request.solvers)
    if request.previous is not None:
        return REPLAN_PORTFOLIO if oracle_is_additive(request.oracle) else REPLAN_PORTFOLIO[:1]
    return tuple(recommended(admitted.instance, request.oracle, request.budget, request.rules))


def runnable(admitted: Admitted, portfolio: tuple[str, ...], net: str = SAFETY_NET) -> tuple[str, ...]:
    """The members that run: the portfolio and the safety net, less those the oracle rules out."""
    ruled_out = {entry.split(":", 1)[0] for entry in admitted.skipped}
    return tuple(name for name in dict.fromkeys([*portfolio, net]) if name not in ruled_out)


# ------------------------------------------------------------------ price


def price(instance: Instance, oracle: Oracle, budget: Budget, whole_tables: bool,
          previous: Previous | None = None, lp: bool = False, guide: bool = False,
          plans_core: bool = False) -> Priced:
    """The options priced once, here — and, for solvers of whole tables, the whole-table restriction's too;
    in a replan, what each piece moves from the previous plan — so that every member shares them; with `guide`,
    each cache offered the load factors the LP over every load factor chose too (`guided`); with `lp` (some
    member bounds its plan by it), the LP over those options as well where it takes at most LP_SHARE of
    the budget, which each such member would otherwise solve again in its own process (3.4 s at 800 × 128 with
    memory tiers) while every member waits for it here. Where a few tables do most of the work (`core_found`),
    they are the problem's core on budgets of at least CORE_BUDGET_S, and on shorter ones — where some member
    `plans_core` — what the report names as a longer budget's; on those budgets the caches of `fine_tables` are
    offered FINE_LOAD_FACTORS too. The budget's clock starts now (building the oracle, which may load a library,
    is start-up, not planning)."""
    clock = budget.begun()
    base, found = guided(instance, oracle, clock) if guide and previous is None else (None, NO_GUIDE)
    found_core = core_found(base, found)
    long = clock.time_limit >= CORE_BUDGET_S
    named, later = (found_core, ()) if long else ((), found_core if plans_core else ())
    fine = fine_tables(base, found, named) if long else ()
    factors = offered(found, named, fine)
    problem = Problem.priced(instance, oracle, whole_tables, previous, factors or None,
                             candidates=None if factors else base, core=named)
    if base is not None and factors:
        carry_bound(base, problem.candidates)
    if lp and oracle.additive and problem.chooses_options:
        solve_lp_within(problem.candidates, LP_SHARE * budget.time_limit)
    return Priced(problem, clock, clock.elapsed(), sum(map(len, found.load_factors.values())), later, fine)


def guided(instance: Instance, oracle: Oracle, clock: Budget) -> tuple[Candidates | None, Guide]:
    """The options on the grid and what the LP over every load factor suggests (solvers.cache_bound.Guide: per
    table, the load factors at which it caches it, and its work there), within GUIDE_SHARE of the budget: on
    tiered tasks at 80 × 8 under TorchRec's estimator those load factors took `pair-balance`'s plans up to 1.6 %
    lower at 10 s (docs/bounds.md). No options (None) where the oracle does not promise the convexity that LP
    rests on; no load factors where no cache is open, pricing the curves would take more than half that share
    (CURVE_PIECES_PER_S) or the LP the rest."""
    if not (oracle.additive and instance.uses_host_memory and oracle.convex_in_load_factor(instance)):
        return None, NO_GUIDE
    share = GUIDE_SHARE * clock.time_limit
    base = Candidates.build(instance, oracle)
    pieces = curve_pieces(base, oracle)
    if not pieces or pieces / CURVE_PIECES_PER_S > share / 2:
        return base, NO_GUIDE
    try:
        return base, guided_load_factors(base, oracle, max(share - clock.elapsed(), 1e-3))
    except LPOutOfTime:
        return base, NO_GUIDE


def core_found(base: Candidates | None, guide: Guide) -> tuple[int, ...]:
    """The tables that do most of the LP's work (`core_of`), where a model cut down to them settles
    (`cut_down_settles`); none without the guide's LP."""
    if base is None or guide.work is None or not cut_down_settles(base):
        return ()
    found = core_of(guide.work, base.num_devices)
    return () if found is None else tuple(map(int, found))


def fine_tables(base: Candidates | None, guide: Guide, core: tuple[int, ...]) -> tuple[int, ...]:
    """The tables whose caches are offered FINE_LOAD_FACTORS on budgets of at least CORE_BUDGET_S: every table
    with a cache whose load factor is open (`open_caches` of the options on the grid, `base`), where the guide
    caches some table, no `core` is named and the options, with the guide's load factors and those, number at
    most FINE_OPTIONS. Where a core is named, CP-SAT plans it alone over CORE_LOAD_FACTORS first, the way the
    Criteo-1TB tables were measured (29.9-30.0 ms at 30 s, stop 59); with every cache offered these too, they
    ended at 28.8-36.2 ms over six runs (the zoo's four HBM-short cells and two seeds, stop 62)."""
    if base is None or not guide.load_factors or core:
        return ()
    options = base.options.options
    layouts = open_caches(base)
    more = sum(len({*FINE_LOAD_FACTORS, *guide.load_factors.get(table, ())} - {options[o].load_factor for o in ids})
               for (table, _, _), ids in layouts.items())
    return tuple(sorted({table for table, _, _ in layouts})) if len(options) + more <= FINE_OPTIONS else ()


def offered(guide: Guide, core: tuple[int, ...], fine: tuple[int, ...]) -> dict:
    """The load factors offered beside the grid's: the guide's and, for each table of the `core` (named on
    budgets of at least CORE_BUDGET_S), CORE_LOAD_FACTORS, and for each of `fine`, FINE_LOAD_FACTORS."""
    factors = dict(guide.load_factors)
    for tables, more in ((core, CORE_LOAD_FACTORS), (fine, FINE_LOAD_FACTORS)):
        for table in tables:
            factors[table] = tuple(sorted({*factors.get(table, ()), *more}))
    return factors


# ------------------------------------------------------------------ race and certify


RESCUE = "cpsat"  # the exact model: where every heuristic dead-ends, it finds a plan whenever one fits


def race(priced: Priced, members: tuple[str, ...], seed: int) -> Race:
    """The members side by side, each in its own process on the priced problem (shardbench.portfolio). Where
    none of them found a plan or proved there is none, and the oracle is additive, the exact model runs
    after them on its own clock of `first_plan_allowance(budget)` seconds (so `plan` can then take longer
    than its promise): `plan` never says "no plan" where one of its solvers can prove there is one."""
    problem = priced.problem
    run = race_members(problem, priced.clock, priced.seconds, members, seed)
    settled = any(m.result is not None and (m.result.plan is not None or m.posed and m.status == "infeasible")
                  for m in run.members)
    if settled or RESCUE in members or not problem.oracle.additive:
        return run
    rescue = race_members(problem, Budget(first_plan_allowance(priced.clock.time_limit)).begun(), 0.0, (RESCUE,),
                          seed)
    return Race((*run.names, RESCUE), (*run.members, *rescue.members), run.stopped, priced.clock.elapsed())


def certify(priced: Priced, run: Race, skipped: tuple[str, ...], resize: bool = True) -> PortfolioResult:
    """The best member's plan validated against the instance and priced again (the plan handed over is the
    plan rated) and tidied within its makespan, or where `resize`, the lowest of the members' plans, as they
    came and tidied, with their caches re-sized off the grid (shardbench.portfolio.settle), with the best bound
    any member proved for the problem as posed and the bound over every load factor (`every_load_factor`)."""
    settled = settle(priced.problem, run, skipped, priced.seconds, priced.clock if resize else None)
    # Finer load factors are worth a longer budget only where the plan caches one of those tables (where HBM
    # holds them, as for the Criteo-1TB tables on 80 GB, 30 s planned them within 0.1 % of 10 s).
    cached = settled.plan is not None and any(settled.plan.tables[t].cache_load_factor is not None
                                              for t in priced.core_later)
    return every_load_factor(priced, replace(settled, guided=priced.guided, fine=priced.fine,
                                             core=priced.problem.core, core_later=priced.core_later if cached else ()))


def every_load_factor(priced: Priced, result: PortfolioResult) -> PortfolioResult:
    """The result with the bound over every cache load factor in (0, 1] (solvers.cache_bound) where the plan
    keeps a cache whose load factor the instance leaves open: TorchRec runs any, so a bound over the grid
    alone does not say how far a plan is from the best TorchRec can run. Computed after the race, its LP
    within CERTIFY_SHARE of the budget (at least CERTIFY_FLOOR_S); where the oracle does not promise the
    convexity it rests on, or the LP runs out of time, the reason instead. A plan below it would be a defect
    of the bound: logged, and the bound not reported."""
    problem, plan = priced.problem, result.plan
    if plan is None or problem.previous is not None or not any(
            t.cache_load_factor is not None and problem.instance.tables[i].cache_load_factor is None
            for i, t in enumerate(plan.tables)):
        return result
    if not problem.oracle.additive or not problem.oracle.convex_in_load_factor(problem.instance):
        return replace(result, every_lf_why=f"the {problem.oracle.name} oracle does not promise a cost convex in "
                                            "the load factor, which the bound rests on")
    started = time.monotonic()
    limit = max(CERTIFY_FLOOR_S, CERTIFY_SHARE * priced.clock.time_limit)
    if not has_every_load_factor_bound(problem.candidates):
        pricing = curve_pieces(problem.candidates, problem.oracle) / CURVE_PIECES_PER_S
        if pricing > limit / 2:
            return replace(result, every_lf_why=f"pricing its curves would take about {pricing:.0f} s, more than "
                                                f"half of the {limit:.1f} s it may take after a budget of "
                                                f"{priced.clock.time_limit:g} s")
    try:
        bound = every_load_factor_bound(problem.candidates, problem.oracle, time_limit=limit)
    except LPOutOfTime as error:
        return replace(result, every_lf_why=str(error), every_lf_seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    if bound is not None and result.objective < bound * (1 - BOUND_SLACK):
        logging.getLogger("shardbench").error("shardbench: the plan (%.9g) lies below the bound over every load "
                                              "factor (%.9g): bound not reported", result.objective, bound)
        bound = None
    why = None if bound is not None else "not proven"
    return replace(result, every_lf_bound=bound, every_lf_seconds=seconds, every_lf_why=why,
                   wall_s=result.wall_s + seconds)


# ------------------------------------------------------------------ report


def _load_factors(result: PortfolioResult) -> str:
    factors = list(dict.fromkeys(sorted(t.cache_load_factor for t in result.plan.tables
                                        if t.cache_load_factor is not None)))
    if len(factors) > LISTED_LOAD_FACTORS:
        return f" (cache load factors {factors[0]:g}–{factors[-1]:g}, {len(factors)} distinct)"
    return f" (cache load factors {', '.join(f'{f:g}' for f in factors)})" if factors else ""


def _core_planned(result: PortfolioResult) -> bool:
    """Whether a member planned the core alone first (`cpsat`): the others only see its options."""
    return any(get_solver(m.solver).plans_core for m in result.members)


def _names(instance: Instance, tables: tuple[int, ...]) -> str:
    return ", ".join(instance.tables[t].name for t in tables)


def longer_budget_note(instance: Instance, core_later: tuple[int, ...], budget_name: str = "budget") -> str:
    """What a budget of CORE_BUDGET_S would do with the tables that do most of the work, and how to ask for it
    (`budget_name`: the entry point's name for the budget, "--budget" or "budget")."""
    ask = f"{budget_name} {CORE_BUDGET_S:g}" if budget_name.startswith("-") else f"{budget_name}={CORE_BUDGET_S:g}"
    one = len(core_later) == 1
    tables, cached, them = (("1 table does", "it", "it") if one else
                            (f"{len(core_later)} tables do", "some of them", "them"))
    return (f"{tables} most of the work ({_names(instance, core_later)}), and the plan caches {cached}; with a "
            f"budget of at least {CORE_BUDGET_S:g} s ({ask}) CP-SAT plans {them} alone first over up to "
            f"{len(CORE_LOAD_FACTORS)} more cache load factors each: on the MLPerf Criteo-1TB tables with HBM short "
            "that gave 29.9-30.0 ms against a median 32.9 at 10 s (docs/bounds.md, stops 59-60)")


def _offered(instance: Instance, result: PortfolioResult) -> str:
    """The load factors offered beside the grid's: the guide's, the fine ones or the core's (never both:
    `fine_tables`)."""
    said = (f", with {result.guided} cache load factors beside the grid's, where the LP over every load factor "
            "caches tables" if result.guided else "")
    if result.fine:
        said += (f"; {len(result.fine)} tables' caches offered up to {len(FINE_LOAD_FACTORS)} more "
                 f"({FINE_LOAD_FACTORS[0]:g}–{FINE_LOAD_FACTORS[-1]:g}) on a budget of at least {CORE_BUDGET_S:g} s")
    if result.core:
        alone = " and planned alone first" if _core_planned(result) else ""
        said += (f"; the {len(result.core)} tables that do most of its work ({_names(instance, result.core)}) offered "
                 f"up to {len(CORE_LOAD_FACTORS)} more each{alone}")
    return said


def report_lines(request: PlanRequest, instance: Instance, result: PortfolioResult, unit: str) -> list[str]:
    """What `plan` prints once the race is over: each member's verdict (the kept one first), what was
    skipped or stopped, and — with a plan — its cost, types, kernels, certificate and, in a replan, the
    bytes it moves."""
    lines = [f"  options priced once in {result.pricing_s:.2f} s" + (
        ", past the budget: each member had its first plan's time alone" if result.pricing_s >= request.budget else "")
        + _offered(instance, result)]
    kept = [m for m in result.members if m.solver == result.solver]
    others = sorted((m for m in result.members if m.solver != result.solver),
                    key=lambda m: (m.objective is None, m.objective or 0))
    for m in kept + others:
        line = f"  {m.solver:<16} {m.verdict:<30} {m.seconds:7.2f} s"
        if m.objective is not None:
            line += f"  objective {m.objective:.6g}" + ("  <- kept" if m in kept else "")
        lines.append(line + (f"  ({shorten(m.why, REASON_WIDTH, placeholder=' …')})" if m.why else ""))
    lines += [f"  skipped {skipped}" for skipped in result.skipped]
    if result.stopped_early:
        lines.append("  a proven optimum stopped the others" if request.gap == 0 else
                     f"  a plan certified within {100 * request.gap:g} % (or a proven optimum) stopped the others")
    if result.plan is None:
        return lines
    types = result.plan.sharding_types()
    lines += [f"best plan: {result.solver}, max device cost {result.objective:.6g} {unit}; {result.wall_s:.1f} s",
              "  sharding types: " + ", ".join(f"{k} {v} table{'s' if v != 1 else ''}" for k, v in types.items()),
              "  compute kernels: " + ", ".join(f"{k} {v}" for k, v in result.plan.kernels().items())
              + _load_factors(result)]
    lines += [f"  {line}" for line in result.after_race_lines(instance)]
    gap = result.gap
    over = optimal_over(instance, request.previous) + (" and those beside them" if result.guided or result.core else "")
    before = ", of the plan before its caches were re-sized" if result.grid_objective is not None else ""
    lines.append(f"  certificate: gap {gap:.4%} to the best bound {result.bound:.6g}, over {over}{before}"
                 if gap is not None else "  certificate: none (no member proved a bound)")
    if result.every_lf_line is not None:
        lines.append(f"  {result.every_lf_line}")
    if request.previous is not None:
        lines.append("  " + moved_line(request.previous, result.moved_bytes))
    if result.core_later:
        lines.append(f"note: {longer_budget_note(instance, result.core_later, request.names['budget'])}")
    return lines


def moved_line(previous: Previous, moved: int) -> str:
    """How many bytes a replan moves, against its budget, and what it added and dropped."""
    budget = "an unlimited budget" if previous.budget is None else f"a budget of {format_bytes(previous.budget)}"
    changes = [f"{previous.added} new table{'s' if previous.added != 1 else ''} placed"] if previous.added else []
    changes += [f"{len(previous.dropped)} dropped"] if previous.dropped else []
    exact = f" ({moved} B)" if moved >= 1024 else ""
    return (f"moves {format_bytes(moved)}{exact} from the previous plan, within {budget}"
            + (f" ({', '.join(changes)}; neither counts as moved)" if changes else ""))


def report_record(request: PlanRequest, instance: Instance, result: PortfolioResult, members: tuple[str, ...]) -> dict:
    """The report a plan file keeps beside the plan."""
    return {
        "solver": result.solver, "portfolio": list(members), "oracle": request.oracle, "budget": request.budget,
        "seed": request.seed, "gap_target": request.gap, "objective": result.objective,
        "grid_objective": result.grid_objective, "lower_bound": result.bound,
        "gap": result.gap, "optimal_over": optimal_over(instance, request.previous),
        "guided_load_factors": result.guided,
        "fine_load_factors": ({"tables": list(result.fine), "load_factors": list(FINE_LOAD_FACTORS)}
                              if result.fine else None), "core_tables": list(result.core),
        "core_tables_from_budget": ({"tables": list(result.core_later), "budget": CORE_BUDGET_S}
                                    if result.core_later else None),
        "every_load_factor_bound": result.every_lf_bound, "every_load_factor_gap": result.every_lf_gap,
        "every_load_factor_seconds": result.every_lf_seconds, "every_load_factor_why": result.every_lf_why,
        "tidied": ({"tables": [instance.tables[t].name for t in result.tidied.tables],
                    "objective": list(result.tidied.peak), "work": list(result.tidied.work),
                    "shards": list(result.tidied.shards)}
                   if result.tidied is not None else None),
        "sharding_type_counts": result.plan.sharding_types() if result.plan is not None else None,
        "kernel_counts": result.plan.kernels() if result.plan is not None else None, "wall_seconds": result.wall_s,
        "pricing_seconds": result.pricing_s, "sharding_types": list(instance.sharding_types),
        "members": [{"solver": m.solver, "status": m.status, "problem": m.problem, "objective": m.objective,
                     "seconds": m.seconds, "reason": m.why} for m in result.members],
        **(replan_record(request.previous, result) if request.previous is not None else {})}


def replan_record(previous: Previous, result: PortfolioResult) -> dict:
    """What a replan's plan file says beside the plan: the bytes moved, the budget, what was kept."""
    return {"moved_bytes": result.moved_bytes, "move_budget": previous.budget, "keep_types": previous.keep_types,
            "tables_added": previous.added, "tables_dropped": list(previous.dropped)}


# ------------------------------------------------------------------ the pipeline


def run(request: PlanRequest, echo: Callable[[str], None] | None = None) -> PlanReport:
    """Every stage in turn; `echo` receives each line of the report as soon as its stage has it (the CLI
    prints them while the members race)."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if echo is not None:
            echo(line)

    for note in request.notes:
        say(f"note: {note}")
    instance = narrow(request)
    admitted = admit(request, instance)
    if admitted.unfit is not None:
        result = PortfolioResult(None, None, None, None, 0.0, skipped=admitted.skipped, refused=admitted.unfit,
                                 notes=request.notes)
        return PlanReport(instance, result, (), tuple(lines), report_record(request, instance, result, ()))
    portfolio, net = choose(request, admitted), safety_net(request)
    members = runnable(admitted, portfolio, net)
    doing = "replanning with" if request.previous is not None else "running"
    say(f"{instance.id} under {request.oracle}, budget {request.budget:g} s: "
        f"{doing} {' + '.join(dict.fromkeys([*portfolio, net]))}")
    oracle = get_oracle(request.oracle)
    load_backends(members)
    priced = price(instance, oracle, Budget(request.budget, gap=request.gap),
                   any(not get_solver(name).splits for name in members), request.previous,
                   any(get_solver(name).lp_bounded for name in members), request.resize_caches,
                   any(get_solver(name).plans_core for name in members))
    result = replace(certify(priced, race(priced, members, request.seed), admitted.skipped, request.resize_caches),
                     notes=request.notes)
    for line in report_lines(request, instance, result, oracle.unit):
        say(line)
    entered = tuple(dict.fromkeys([*portfolio, net]))
    return PlanReport(instance, result, entered, tuple(lines), report_record(request, instance, result, entered))


def plan_request(instance: Instance, oracle: str | None, **options) -> PlanRequest:
    """A request with the solvers given as any sequence (kept as a tuple), under the default oracle where
    `oracle` is None."""
    solvers = options.pop("solvers", None)
    notes = options.pop("notes", ())
    if oracle is None:
        oracle, assumed = default_oracle()
        notes = (*notes, *assumed)
    return replace(PlanRequest(instance, oracle, notes=tuple(notes), **options),
                   solvers=None if solvers is None else tuple(solvers))
