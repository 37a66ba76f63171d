"""What every solver shares: the result type with an honest status, the time budget, the registry of
solvers with their metadata, and the final check that validates a plan before anyone reports it."""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Mapping, Sequence

import numpy as np

from costmodels import Oracle
from instances import Instance, Plan, PlanError
from instances.memory import HBM, HOST, format_bytes, format_sizes, over_capacity, shortfall, tier_label
from instances.model import MAX_MEMORY_BYTES
from instances.moves import check_replan
from instances.sharding import check_capacity

from .bounds import best_option_bound
from .candidates import Problem

BOUND_MATCH_TOLERANCE = 1e-12  # float summation noise between a bound and an objective of the same tables
# Relative gap under which a proven bound certifies optimality: the MIP convention, wide enough for the
# MILP backends' bounds, which hold only up to their 1e-6 feasibility and integrality tolerances.
OPTIMALITY_TOLERANCE = 1e-5
MAX_SEED = 2**31 - 1           # CP-SAT takes a 32-bit seed
MAX_TIME_LIMIT = 1e6           # seconds; a budget must be finite for a search to return
TIME_LIMIT_SLACK = 0.9         # a solver blaming its time limit must have used at least this share of it


def wall_limit(time_limit: float) -> float:
    """The wall-clock seconds a run with this budget promises to return within, pricing and bounds included."""
    return 1.1 * time_limit + 2.0


def past(deadline: float | None) -> bool:
    """Whether a monotonic-clock deadline (None: none) has passed."""
    return deadline is not None and time.monotonic() >= deadline


class Status(str, Enum):
    OPTIMAL = "optimal"        # proven optimal under the oracle
    FEASIBLE = "feasible"      # a valid plan, optimality not proven
    INFEASIBLE = "infeasible"  # proven: no valid plan exists (reason says why)
    NO_PLAN = "no_plan"        # the solver found no plan (heuristic stuck, or out of time); proves nothing


class BudgetError(ValueError):
    """A time limit, round cap or seed outside what a solver can honour."""


@dataclass(frozen=True)
class Budget:
    """Wall-clock seconds (finite, > 0); `max_rounds` optionally caps a search's iterations so that its
    result depends on the seed alone and not on how fast the machine is. The clock runs from `started`
    (time.monotonic()), set when the run begins (`begun`), so that pricing the options and computing
    bounds spend the same budget as the search. `gap` lets a solver stop early once its plan is within
    that fraction of a proven lower bound (0: only a proven optimum stops it)."""

    time_limit: float = 10.0
    max_rounds: int | None = None
    started: float | None = None
    gap: float = 0.0

    def __post_init__(self):
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or \
                not (math.isfinite(self.time_limit) and 0 < self.time_limit <= MAX_TIME_LIMIT):
            raise BudgetError(f"time limit: must be a finite number of seconds in (0, {MAX_TIME_LIMIT:g}], "
                              f"got {self.time_limit!r}")
        if self.max_rounds is not None and (not isinstance(self.max_rounds, int) or self.max_rounds < 0):
            raise BudgetError(f"max rounds: must be a non-negative integer, got {self.max_rounds!r}")
        if isinstance(self.gap, bool) or not isinstance(self.gap, (int, float)) or not 0 <= self.gap < 1:
            raise BudgetError(f"gap: must be a fraction in [0, 1), got {self.gap!r}")

    @property
    def backend_gap(self) -> float:
        """The gap as MIP backends measure it ((plan − bound) / plan), kept a little inside ours
        (plan / bound − 1) so that their rounding and bound slack still certify within it."""
        return self.gap / (1 + self.gap) * 0.99

    def good_enough(self, objective: float, bound: float | None) -> bool:
        """Whether a plan of this objective is within the budget's gap of the bound (a proven optimum is)."""
        return bound is not None and objective <= bound * (1 + max(self.gap, OPTIMALITY_TOLERANCE))

    def begun(self, at: float | None = None) -> "Budget":
        """The budget with its clock running from `at` (now by default); one already running keeps its start."""
        if self.started is not None:
            return self
        return replace(self, started=time.monotonic() if at is None else at)

    def deadline(self) -> float:
        return (time.monotonic() if self.started is None else self.started) + self.time_limit

    def remaining(self) -> float:
        """Seconds left (negative once past the deadline)."""
        return self.deadline() - time.monotonic()

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def share(self, fraction: float) -> float:
        """The deadline after `fraction` of the budget (never past the budget's own)."""
        start = time.monotonic() if self.started is None else self.started
        return min(start + fraction * self.time_limit, self.deadline())


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise BudgetError(f"seed: must be an integer in 0..{MAX_SEED}, got {seed!r}")
    return int(seed)


class Cause(str, Enum):
    """Why a solver returned no plan; each comes with evidence that `check_no_plan` verifies."""

    DEAD_END = "dead_end"        # a constructive heuristic found no device with room for a table
    SAMPLING = "sampling"        # every random sample dead-ended
    OVERFLOW = "overflow"        # the solver's own plan breaks memory (a learned policy may end so)
    TIME_LIMIT = "time_limit"    # the budget ran out before a plan was found
    UNPROVEN = "unproven"        # a claim of infeasibility that came without a proof
    UNSUPPORTED = "unsupported"  # a solver of whole tables, on an instance whose tables cannot all be whole
    PEER_MODEL = "peer_model"    # a peer planner found no plan under its own cost and storage model
    MOVE_BUDGET = "move_budget"  # a replan's heuristic found no placement of every table within the move budget


@dataclass(frozen=True)
class NoPlan:
    """Evidence for a missing plan: the table that found no room (`table`, its `need` in memory tier `tier`
    and the `most_free` there that any device it could take had left), the overflowing plan, or the
    number of samples tried."""

    cause: Cause
    table: int | None = None
    need: int | None = None
    most_free: int | None = None
    plan: Plan | None = None
    samples: int | None = None
    tier: int = HBM


@dataclass(frozen=True)
class SolveResult:
    status: Status
    plan: Plan | None = None
    objective: float | None = None
    lower_bound: float | None = None
    reason: str = ""
    stats: Mapping[str, float | int | str] = field(default_factory=dict)
    no_plan: NoPlan | None = None

    @property
    def has_plan(self) -> bool:
        return self.plan is not None


def planned(instance: Instance, assignment, status: Status = Status.FEASIBLE, kernels=None, **fields) -> SolveResult:
    """A result holding the table-wise plan `assignment` (a device per table), served by `kernels` (each
    table's kernel and cache load factor, as Problem.table_kernels gives them; default: in HBM)."""
    return SolveResult(status, plan=Plan.table_wise(instance, assignment, kernels), **fields)


SolveFn = Callable[[Problem, Budget, int], SolveResult]


@dataclass(frozen=True)
class SolverInfo:
    """`splits`: the solver chooses sharding options (splits tables) where the instance allows; the others
    place whole tables and are benchmarked on table-wise. `budgeted`: the solver honours the time budget
    (a peer that does not gets the suite's longer deadline before it is killed). `peer`: another tool's
planner that plans under its own cost and storage model; it may find no plan where ours find one."""

    name: str
    solve: SolveFn
    description: str
    kinds: tuple[str, ...] = ("placement",)
    exact: bool = False
    needs_additive: bool = False
    stochastic: bool = False
    splits: bool = False
    budgeted: bool = True
    peer: bool = False
    replans: bool = False  # starts from a previous plan and keeps within a move budget (shardbench replan)
    lp_bounded: bool = False  # bounds its plan by the LP over options (solvers.bounds.lp_bound) where they are chosen
    plans_core: bool = False  # plans the tables the price stage names as the core (Problem.core) alone first
    backends: tuple[str, ...] = ()  # modules it imports when it runs (`load_backends`)


class UnknownSolverError(KeyError):
    def __str__(self) -> str:
        return self.args[0]


class SolverOracleMismatch(ValueError):
    """A solver that needs per-table costs was given an oracle without them."""


_REGISTRY: dict[str, SolverInfo] = {}


def register(name: str, description: str, **meta) -> Callable[[SolveFn], SolveFn]:
    def decorate(fn: SolveFn) -> SolveFn:
        _REGISTRY[name] = SolverInfo(name=name, solve=fn, description=description, **meta)
        return fn
    return decorate


def register_elsewhere(name: str, path: str, description: str, **meta) -> None:
    """Registers a solver whose function lives in a module above this package ("module:function", e.g. a
    peer planner in interop), imported only when the solver runs, so that the registry holds it whatever
    was imported before."""
    def solve(problem: Problem, budget: Budget, seed: int) -> SolveResult:
        module, _, function = path.partition(":")
        return getattr(importlib.import_module(module), function)(problem, budget, seed)

    solve.__qualname__ = path
    _REGISTRY[name] = SolverInfo(name=name, solve=solve, description=description, **meta)


def solver_names() -> list[str]:
    return sorted(_REGISTRY)


def get_solver(name: str) -> SolverInfo:
    if name not in _REGISTRY:
        raise UnknownSolverError(f"unknown solver {name!r}; available: {', '.join(solver_names())}")
    return _REGISTRY[name]


class ClaimError(AssertionError):
    """A solver reported something its own evidence contradicts (a bound above its plan, a no-plan
    cause that does not check out): a defect of that solver, turned into an error row by the runner."""


def incompatibility(info: SolverInfo | None, oracle_additive: bool, oracle_prices_tiers: bool = True,
                    uses_host_memory: bool = False, replanning: bool = False) -> str | None:
    """Why the solver (or, without one, any solver) cannot plan under an oracle (None when it can): the one
    compatibility rule, asked by run_solver, the portfolio, the suites and the recommender alike. An
    instance whose tables may live in host memory needs an oracle that prices those kernels; a replan
    needs a solver that starts from the previous plan."""
    if replanning and info is not None and not info.replans:
        return f"solver {info.name!r} plans afresh; a replan needs one that starts from the previous plan"
    if uses_host_memory and not oracle_prices_tiers:
        return ("the oracle does not price tables kept in host memory (fused_uvm, fused_uvm_caching): use analytic "
                "or torchrec, or keep every table in HBM (--compute-kernels fused,dense)")
    if info is not None and info.needs_additive and not oracle_additive:
        return f"solver {info.name!r} needs an additive oracle"
    return None


def _join(reason: str, more: str) -> str:
    return f"{reason}; {more}" if reason else more


# What run_solver itself imports for every solver: the option bound's LP (scipy's HiGHS).
RUN_BACKENDS = ("scipy.optimize",)


def load_backends(names: Sequence[str]) -> None:
    """Imports the modules the named solvers (and run_solver) import when they run. `plan` does it before its
    clock starts, as importing shardbench is: its members, forked afterwards, then start with them loaded
    instead of each spending its own budget on them (on 2 cores about 1 s of a 10 s budget: scipy.optimize
    0.9 s, CP-SAT 0.9 s, highspy 0.2 s)."""
    for module in dict.fromkeys([*RUN_BACKENDS, *(m for name in names for m in get_solver(name).backends)]):
        importlib.import_module(module)


def fits_every_tier(instance: Instance, oracle: Oracle, plan: Plan) -> None:
    """Raises PlanError where the plan is not valid for the instance (its shards, kernels and every memory tier
    by the instance's count) or, where the oracle counts memory its own way, exceeds a tier by that count."""
    plan.validate(instance)
    if oracle.own_memory:
        check_capacity(oracle.storage_per_device(instance, plan), instance, f" under {oracle.name}'s storage model")


def run_solver(name: str, instance: Instance, oracle: Oracle, budget: Budget, seed: int = 0,
               problem: Problem | None = None) -> SolveResult:
    """The one entry point: checks solver/oracle compatibility, re-validates and re-prices whatever plan
    comes back, and verifies every claim in one place: `optimal` needs a bound that meets the plan,
    `infeasible` a proof, a bound must be finite and below the plan, and a missing plan needs evidence.
    Claims that fail are downgraded (optimal → feasible, unproven infeasible → no plan) or raised. The budget's
    clock starts here unless it already runs; `problem` (of this instance and oracle) may come with its
    options already priced."""
    budget = budget.begun()
    info = get_solver(name)
    seed = check_seed(seed)
    if problem is None:
        problem = Problem(instance, oracle)
    elif problem.instance is not instance or problem.oracle is not oracle:
        raise ValueError("run_solver: the problem given is not of this instance and oracle")
    previous = problem.previous
    mismatch = incompatibility(info, oracle.additive, oracle.prices_tiers, instance.uses_host_memory,
                               previous is not None)
    if mismatch:
        raise SolverOracleMismatch(f"oracle {oracle.name!r}: {mismatch}")
    proof = memory_infeasibility(problem)
    if proof:
        return infeasible(proof)
    if not info.splits:
        obstacle = whole_table_obstacle(problem)
        if obstacle:
            return obstacle
    result = info.solve(problem if info.splits else problem.whole_tables, budget, seed)
    elapsed = budget.elapsed()
    stats = dict(result.stats)
    claimed = result.lower_bound
    if claimed is not None and not (isinstance(claimed, (int, float)) and math.isfinite(claimed)):
        stats["dropped_bound"] = repr(claimed)
        claimed = None
    combinatorial = best_option_bound(problem.candidates) if oracle.additive else None
    if result.plan is None:
        return _verified_failure(name, info, problem, budget, elapsed, result, claimed, stats, previous is not None)
    fits_every_tier(instance, oracle, result.plan)
    if previous is not None:
        stats["moved_bytes"] = check_replan(instance, previous, result.plan)
    objective = oracle.plan_cost(instance, result.plan)
    if not math.isfinite(objective):
        raise ValueError(f"oracle {oracle.name!r} priced the plan at {objective}: costs must be finite")
    if claimed is not None and claimed > objective * (1 + 1e-9) + 1e-12:
        raise ClaimError(f"solver {name!r} claims bound {claimed} above its objective {objective}")
    outside = problem.candidates.outside(result.plan)
    if outside is not None:
        # The bound is over the enumerated options; a plan off them (a peer's cache size off our grid) may
        # lie below it, and is then neither bounded by it nor called optimal by it.
        stats["outside_options"] = outside
        combinatorial = None
    if combinatorial is not None and combinatorial > objective * (1 + 1e-9) + 1e-12:
        raise ClaimError(f"the combinatorial bound {combinatorial} lies above {name!r}'s plan of the enumerated "
                         f"options ({objective})")
    bounds = [b for b in (claimed, combinatorial) if b is not None]
    bound = min(max(bounds), objective) if bounds else None  # float noise aside (checked above), the bound
    status, reason = result.status, result.reason
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        raise ClaimError(f"solver {name!r} returned a plan with status {status.value}")
    proven = claimed is not None and claimed >= objective * (1 - OPTIMALITY_TOLERANCE)
    if status == Status.OPTIMAL and not proven:
        status, reason = Status.FEASIBLE, _join(reason, "claimed optimal without a bound that meets the plan")
    if status == Status.FEASIBLE and combinatorial is not None and objective <= combinatorial * (1 + BOUND_MATCH_TOLERANCE):
        # Any plan that meets a valid lower bound is optimal, whoever found it.
        status, reason = Status.OPTIMAL, _join(reason, "meets the combinatorial lower bound")
    if combinatorial is not None:
        stats["option_bound"] = combinatorial
    return SolveResult(status=status, plan=result.plan, objective=objective, lower_bound=bound,
                       reason=reason, stats=stats)


def _verified_failure(name: str, info: "SolverInfo", problem: Problem, budget: Budget, elapsed: float,
                      result: SolveResult, bound: float | None, stats: dict, replanning: bool = False) -> SolveResult:
    if result.status == Status.INFEASIBLE:
        if info.exact:  # an exact model's own infeasibility verdict is its proof
            return SolveResult(Status.INFEASIBLE, reason=result.reason, stats=stats)
        return SolveResult(Status.NO_PLAN, reason=_join(result.reason, "claimed infeasible without a proof"),
                           stats=stats, no_plan=NoPlan(Cause.UNPROVEN), lower_bound=bound)
    if result.status != Status.NO_PLAN or result.no_plan is None or not result.reason:
        raise ClaimError(f"solver {name!r} returned no plan with status {result.status.value} and no evidence")
    check_no_plan(problem.instance, budget, elapsed, result.no_plan, peer=info.peer, problem=problem,
                  replanning=replanning)
    return SolveResult(Status.NO_PLAN, reason=result.reason, stats=stats, no_plan=result.no_plan, lower_bound=bound)


def check_no_plan(instance: Instance, budget: Budget, elapsed: float, evidence: NoPlan, peer: bool = False,
                  problem: Problem | None = None, replanning: bool = False) -> None:
    """Raises ClaimError unless the evidence for a missing plan holds (`problem`: the instance's, priced by
    the solver's oracle; built under the lookup oracle where not given). Only a peer may blame its own
    model: we cannot check another tool's storage model, and none of our solvers has one of its own; only a
    replan may blame its move budget."""
    cause = evidence.cause
    if cause == Cause.DEAD_END:  # the table's (or one of its pieces') need is more than any device had left
        ok = (evidence.table is not None and 0 <= evidence.table < instance.num_tables and evidence.need is not None
              and evidence.tier in (HBM, HOST) and evidence.most_free is not None
              and 0 <= evidence.most_free < evidence.need <= instance.topology.capacity.as_array()[evidence.tier])
    elif cause == Cause.SAMPLING:
        ok = evidence.samples is not None and evidence.samples >= 1
    elif cause == Cause.OVERFLOW:
        ok = evidence.plan is not None and _overflows_only(evidence.plan, instance)
    elif cause == Cause.TIME_LIMIT:
        ok = elapsed >= TIME_LIMIT_SLACK * budget.time_limit
    elif cause == Cause.UNSUPPORTED:
        if problem is None:
            from costmodels import get_oracle

            problem = Problem(instance, get_oracle("lookup"))
        ok = whole_table_obstacle(problem) is not None
    elif cause == Cause.PEER_MODEL:
        ok = peer
    elif cause == Cause.MOVE_BUDGET:
        ok = replanning
    else:
        ok = False
    if not ok:
        raise ClaimError(f"no-plan evidence does not hold: {evidence}")


# ---------------------------------------------------------------- memory


def memory_infeasibility(problem: Problem) -> str | None:
    """A proof that no plan fits, from two necessary conditions per memory tier over the instance's
    options, or None when none fires: a table with no option, or none of whose options fits a device, or
    more bytes of a tier in all (each table in its leanest option for that tier) than the devices have."""
    instance, candidates = problem.instance, problem.candidates
    capacity = instance.topology.capacity.as_array()
    for t, (table, ids) in enumerate(zip(instance.tables, candidates.by_table)):
        if ids.size == 0:
            options = [o for o, option in enumerate(candidates.options.options) if option.table == t]
            if not options:  # an instance narrowed after validation (restricted_to) can leave a table none
                return (f"table {table.name} has no sharding option: its allowed types "
                        f"{', '.join(instance.allowed_types(table)) or '(none)'} cannot cut it on this topology")
            # Each option overflows some tier on some device; options may overflow different tiers (in HBM
            # whole, or in host memory), so each tier is reported with the least its options need of it.
            short: dict[int, int] = {}
            for o in options:
                peak = candidates.storage[candidates.members(o)].max(axis=0)
                for tier in np.flatnonzero(peak > capacity):
                    short[int(tier)] = min(short.get(int(tier), int(peak[tier])), int(peak[tier]))
            if len(short) == 1:
                (tier, need), = short.items()
                need_text, cap_text = format_sizes(need, capacity[tier])
                return (f"table {table.name} needs {need_text} of {tier_label(tier)} on some device in its leanest "
                        f"allowed option, more than a device's {cap_text}" + _host_hint(instance, tier))
            return (f"table {table.name} fits no device in any allowed option: each needs more "
                    + " or more ".join(f"{tier_label(tier)} than a device's {cap_text} (the leanest of those "
                                       f"{need_text})" for tier, need in sorted(short.items())
                                       for cap_text, need_text in [format_sizes(capacity[tier], need)]))
    for tier in (HBM, HOST):
        total = sum(int(candidates.total_storage[ids, tier].min()) for ids in candidates.by_table)
        room = int(capacity[tier]) * instance.num_devices
        if total > room:
            total_text, room_text = format_sizes(total, room)
            return (f"tables need {total_text} of {tier_label(tier)} in all, more than {instance.num_devices} "
                    f"devices × {format_bytes(capacity[tier])} = {room_text}" + _host_hint(instance, tier))
    return None


def _host_hint(instance: Instance, tier: int) -> str:
    if tier != HBM or instance.topology.host_memory_bytes:
        return ""
    return ("; with host memory (--host-memory-bytes, or ddr_cap in a spec) tables may live there "
            "(fused_uvm, fused_uvm_caching)")


def whole_table_obstacle(problem: Problem) -> SolveResult | None:
    """Why a solver that places whole tables cannot plan the problem's instance, when it cannot: a table
    that forbids table-wise, or none of whose whole-table options (each kernel it may take, in HBM or host
    memory) fits a device, or more bytes of a tier in all — each table in its leanest whole option — than
    the devices have. A no-plan, not an infeasibility: splitting tables may still fit."""
    whole = problem.whole_tables
    candidates, instance = whole.candidates, problem.instance
    capacity = instance.topology.capacity.as_array()
    for t, (table, ids) in enumerate(zip(instance.tables, candidates.by_table)):
        if ids.size:
            continue
        if "table_wise" not in instance.allowed_types(table):
            why = "does not allow table_wise"
        else:
            options = [o for o, option in enumerate(candidates.options.options) if option.table == t]
            need = candidates.total_storage[options]
            tier = int(np.argmax((need > capacity).all(axis=0)) if (need > capacity).all(axis=0).any() else
                       np.argmax(need.min(axis=0) - capacity))
            need_text, cap_text = format_sizes(int(need[:, tier].min()), int(capacity[tier]))
            why = (f"needs {need_text} of {tier_label(tier)} whole in its leanest kernel, more than a device's "
                   f"{cap_text}")
        return SolveResult(Status.NO_PLAN, reason=f"this solver places whole tables only; table {table.name} {why}",
                           no_plan=NoPlan(Cause.UNSUPPORTED, table=t))
    leanest = np.array([candidates.total_storage[ids].min(axis=0) for ids in candidates.by_table])
    if over_capacity(leanest.sum(axis=0, keepdims=True), capacity * instance.num_devices):
        return SolveResult(Status.NO_PLAN, reason="this solver places whole tables only, and whole tables need more "
                           "memory than the devices have", no_plan=NoPlan(Cause.UNSUPPORTED))
    return None


def _overflows_only(plan: Plan, instance: Instance) -> bool:
    """The plan is sound but for memory: valid once the capacity is lifted, over it as it stands."""
    roomy = replace(instance, topology=replace(instance.topology, memory_bytes=MAX_MEMORY_BYTES,
                                               host_memory_bytes=MAX_MEMORY_BYTES))
    try:
        replace(plan, instance_id=roomy.id).validate(roomy)
    except PlanError:
        return False
    return bool(over_capacity(plan.storage_per_device(instance), instance.topology.capacity.as_array()))


class MemoryTracker:
    """Free memory per device and tier while a solver places tables one at a time; `need` is each table's
    storage (tables × 2; the oracle's storage model where it has one), by default the instance's."""

    def __init__(self, instance: Instance, need: np.ndarray | None = None):
        self.need = np.array(instance.table_storage() if need is None else need, dtype=np.int64).reshape(-1, 2)
        self.free = np.array(instance.capacity, dtype=np.int64)

    def fits(self, table: int) -> np.ndarray:
        return (self.free >= self.need[table]).all(axis=1)

    def place(self, table: int, device: int) -> None:
        self.free[device] -= self.need[table]

    def unplace(self, table: int, device: int) -> None:
        self.free[device] += self.need[table]


def stuck(instance: Instance, table: int, tracker: MemoryTracker) -> SolveResult:
    name = instance.tables[table].name
    tier, most_free = shortfall(tracker.need[table], tracker.free)
    need = int(tracker.need[table, tier])
    need_text, free_text = format_sizes(need, most_free)
    return SolveResult(Status.NO_PLAN, reason=(
        f"table {name} ({need_text} of {tier_label(tier)}) fits on no device: the most free {tier_label(tier)} left "
        f"is {free_text} (a heuristic dead end, not a proof of infeasibility)"),
        no_plan=NoPlan(Cause.DEAD_END, table=table, need=need, most_free=most_free, tier=tier))


def infeasible(reason: str) -> SolveResult:
    return SolveResult(Status.INFEASIBLE, reason=reason)


def order_by_cost(costs: Sequence[float]) -> np.ndarray:
    """Descending cost, ties by table index, so orders are deterministic."""
    costs = np.asarray(costs, dtype=float)
    return np.lexsort((np.arange(costs.size), -costs))
