"""Replanning after a workload shift (`shardbench replan`, `shardbench.replan`): the old plan read from our
plan file or a TorchRec ShardingPlan, the planning pipeline run from it within a move budget, the delta
TorchRec's DistributedModelParallel.reshard takes, and the frontier of cost against bytes moved."""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from instances import Instance, InstanceError, Plan, TableSharding
from instances.io import read_json, write_bytes_atomic, write_text_atomic
from instances.moves import PYTHON_NAMES, Previous, plan_moved_bytes, previous_plan, tables_from_dict, unbounded
from solvers.bounds import gap_to_bound

from .pipeline import PlanReport, plan_request, run
from .portfolio import PortfolioResult

# The frontier's move budgets, as shares of the bytes a fresh plan moves: from keeping the old plan to
# affording the fresh one, denser where a few moves buy most of the improvement.
FRONTIER_SHARES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
ZIP_MAGIC = b"PK"  # torch.save writes a zip archive


@dataclass(frozen=True)
class OldPlan:
    """An old plan read for a replan: its tables' shardings by name (those of the new instance), the names
    of its tables the instance dropped, and the TorchRec ShardingPlan it came as (None for our plan file)."""

    tables: Mapping[str, TableSharding]
    dropped: tuple[str, ...] = ()
    sharding_plan: Any = None

    def previous(self, instance: Instance, move_budget: int | None, keep_types: bool = True,
                 names: Mapping[str, str] = PYTHON_NAMES) -> Previous:
        return previous_plan(instance, self.tables, move_budget, keep_types, self.dropped, names)

    @property
    def module_paths(self) -> tuple[str, ...]:
        """The module paths of the ShardingPlan it came as (none for our plan file)."""
        return () if self.sharding_plan is None else tuple(self.sharding_plan.plan)


def read_old_plan(path: str | Path, instance: Instance) -> OldPlan:
    """Our plan file (JSON, as `plan`, `solve` and `replan` write it) or a TorchRec ShardingPlan (as `plan
    --torchrec-out` or `save_sharding_plan` write it), its tables matched to the instance's by name."""
    path = Path(path)
    try:
        head = path.open("rb").read(len(ZIP_MAGIC))
    except OSError as exc:
        raise InstanceError(str(path), f"cannot read the old plan ({exc.strerror or exc})") from exc
    try:
        if head == ZIP_MAGIC:
            return old_sharding_plan(_load_sharding_plan(path), instance)
        return OldPlan(*tables_from_dict(read_json(path), instance))
    except InstanceError as exc:
        if exc.field == str(path):
            raise
        raise InstanceError(f"{path}: {exc.field}", exc.reason) from exc


def _load_sharding_plan(path: Path):
    from .planfiles import load_plan

    try:
        loaded = load_plan(path)
    except Exception as exc:  # noqa: BLE001 - torch reports a foreign pickle in many ways; the user needs one line
        why = " ".join(str(exc).split())[:200]
        raise InstanceError(str(path), f"not a TorchRec ShardingPlan that loads safely ({why})") from exc
    if not hasattr(loaded, "plan"):
        raise InstanceError(str(path), f"holds a {type(loaded).__name__}, not a TorchRec ShardingPlan")
    return loaded


def old_sharding_plan(sharding_plan, instance: Instance) -> OldPlan:
    """A TorchRec ShardingPlan of a running job as the old plan of a replan."""
    from interop.export import tables_from_torchrec

    return OldPlan(*tables_from_torchrec(instance, sharding_plan), sharding_plan=sharding_plan)


def old_plan_of(previous_plan: Any, instance: Instance, previous_instance: Instance | None = None) -> OldPlan:
    """What `shardbench.replan` takes as the old plan: a file (ours or a TorchRec ShardingPlan), a TorchRec
    ShardingPlan, or one of our plans with the instance it was made for."""
    if isinstance(previous_plan, (str, Path)):
        return read_old_plan(previous_plan, instance)
    if isinstance(previous_plan, Plan):
        if previous_instance is None or previous_instance.id != previous_plan.instance_id:
            raise InstanceError("previous_instance", "give the instance the previous plan was made for (a plan "
                                "names its tables through it)")
        names = {t.name for t in instance.tables}
        tables = {t.name: s for t, s in zip(previous_instance.tables, previous_plan.tables)}
        return OldPlan({n: s for n, s in tables.items() if n in names}, tuple(n for n in tables if n not in names))
    if hasattr(previous_plan, "plan"):
        return old_sharding_plan(previous_plan, instance)
    raise InstanceError("previous_plan", f"must be a plan file, a TorchRec ShardingPlan or a Plan, got "
                        f"{type(previous_plan).__name__}")


def move_budget_bytes(value: Any, name: str = "move_budget") -> int | None:
    """A move budget: None or "unlimited", a number of bytes, or a size with a unit ("20GiB"; `0` keeps the
    old plan), read as instance specs read sizes (interop.importer.size_bytes)."""
    from interop.importer import SIZE_UNITS, size_bytes

    if value is None or (isinstance(value, str) and value.strip().lower() == "unlimited"):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0
    zero = re.fullmatch(r"\s*(0+(?:\.0*)?|\.0+)\s*([A-Za-z]*)\s*", value) if isinstance(value, str) else None
    if zero and zero.group(2).upper() in ("", *SIZE_UNITS):
        return 0
    return size_bytes(value, name)


def replan(instance: Instance, previous_plan: Any, move_budget: int | str | None, oracle: str | None = None,
           budget: float = 10.0, solvers: list[str] | None = None, seed: int = 0, gap: float = 0.0,
           allow_type_changes: bool = False, previous_instance: Instance | None = None) -> PortfolioResult:
    """The best validated plan found within `budget` seconds among those that move at most `move_budget`
    bytes from `previous_plan` (a plan file, a TorchRec ShardingPlan, or a Plan with its
    `previous_instance`), with the best bound proven over those plans; `result.moved_bytes` says what it
    moves. Every old table keeps its sharding type, shard count and kernel (only ranks change, as TorchRec's
    reshard does) unless `allow_type_changes`; new tables are placed and dropped ones free their memory.
    `oracle` None: shardbench.pipeline's default, as `plan`'s."""
    old = old_plan_of(previous_plan, instance, previous_instance)
    previous = old.previous(instance, move_budget_bytes(move_budget), not allow_type_changes)
    return run(plan_request(instance, oracle, budget=budget, solvers=solvers, seed=seed, gap=gap,
                            previous=previous)).result


# ---------------------------------------------------------------- TorchRec


def torchrec_plans(instance: Instance, result: PortfolioResult, old: OldPlan, previous: Previous,
                   module_path: str) -> tuple[Any, dict | None, str | None]:
    """The new ShardingPlan, and — where a running job can reshard into it (the same tables, every old table
    keeping its type) — the delta DistributedModelParallel.reshard takes; else None and why not."""
    from interop.export import reshard_delta, to_torchrec

    new = to_torchrec(instance, result.plan, path=module_path)
    if not previous.same_tables:
        return new, None, "tables were added or dropped, which a running job cannot reshard into"
    if not previous.keep_types:
        return new, None, "type changes need a checkpoint-and-reload re-shard, not DistributedModelParallel.reshard"
    current = old.sharding_plan
    if current is None:  # our plan file: the ShardingPlan the job runs is its export
        current = to_torchrec(unbounded(instance), Plan(instance.id, previous.shardings), path=module_path)
    return new, reshard_delta(current, new), None


def delta_path(output: str | Path) -> str:
    """Where the reshard delta of a ShardingPlan written to `output` goes."""
    return str(Path(output).with_suffix(".reshard.pt"))


# ---------------------------------------------------------------- the frontier


@dataclass(frozen=True)
class FrontierPoint:
    """A replan at one move budget: what it moves and costs (the best plan of this budget or any smaller),
    the best bound over plans within it (proven here or at any larger budget), and the member that found it."""

    share: float
    budget: int
    moved: int
    objective: float
    bound: float | None
    solver: str

    @property
    def gap(self) -> float | None:
        return None if self.bound is None else gap_to_bound(self.objective, self.bound)


@dataclass(frozen=True)
class Frontier:
    """Cost against bytes moved, from the old plan kept to a fresh plan (its cost and bytes beside)."""

    instance: str
    oracle: str
    unit: str
    keep_types: bool
    seconds: float
    old_objective: float | None     # the old plan itself, where the instance has exactly its tables
    fresh_objective: float
    fresh_moved: int
    fresh_bound: float | None
    points: tuple[FrontierPoint, ...]


def frontier(instance: Instance, old: OldPlan, oracle: str, budget: float, seed: int = 0, keep_types: bool = True,
             solvers: list[str] | None = None, gap: float = 0.0, shares: tuple[float, ...] = FRONTIER_SHARES,
             echo: Callable[[str], None] | None = None) -> Frontier:
    """A fresh plan, then a replan at each share of the bytes it moves, `budget` seconds each. Each point
    keeps the best plan of its budget or a smaller one (it is within its budget too) and the best bound of
    its budget or a larger one (it bounds the plans within a smaller budget too): cost falls and bound falls
    as the budget grows."""
    from costmodels import get_oracle

    say = echo or (lambda _: None)
    say(f"fresh plan of {instance.id} under {oracle}, {budget:g} s")
    # On the options' grid of load factors, where the replans plan (types kept, each old table keeps its cache).
    fresh = run(plan_request(instance, oracle, budget=budget, solvers=solvers, seed=seed, gap=gap,
                             resize_caches=False)).result
    if fresh.plan is None:
        raise InstanceError("instance", f"no fresh plan to measure the frontier against: {fresh.no_plan_reason}")
    unbounded_previous = old.previous(instance, None, keep_types)
    fresh_moved = plan_moved_bytes(instance, unbounded_previous, fresh.plan)
    reports: list[tuple[float, int, PlanReport]] = []
    for share in sorted(set(shares)):
        limit = int(share * fresh_moved)
        say(f"replan within {share:.0%} of the fresh plan's bytes ({limit} B)")
        request = plan_request(instance, oracle, budget=budget, solvers=solvers, seed=seed, gap=gap,
                               previous=replace(unbounded_previous, budget=limit))
        reports.append((share, limit, run(request)))
    points, best = [], None
    for i, (share, limit, report) in enumerate(reports):
        result = report.result
        if result.plan is not None and (best is None or result.objective < best.objective):
            best = result
        if best is None:
            continue
        bounds = [r.result.bound for _, _, r in reports[i:] if r.result.bound is not None]
        points.append(FrontierPoint(share, limit, best.moved_bytes, best.objective,
                                    min(max(bounds), best.objective) if bounds else None, best.solver))
    kept = Plan(instance.id, unbounded_previous.shardings) if unbounded_previous.same_tables else None
    cost = get_oracle(oracle)
    return Frontier(instance.id, oracle, cost.unit, keep_types, budget,
                    cost.plan_cost(instance, kept) if kept is not None else None, fresh.objective, fresh_moved,
                    fresh.bound, tuple(points))


def recovered(start: float, fresh: float, objective: float) -> float | None:
    """The share of a fresh plan's improvement over the start (the old plan kept) that a plan recovers."""
    return None if start <= fresh else (start - objective) / (start - fresh)


def frontier_page(front: Frontier, plot: Path, command: str) -> str:
    """The frontier's results page: a row per move budget, the old and fresh plans beside, and the plot."""
    start = front.points[0].objective if front.points else None
    unit = front.unit
    lines = [f"# Replan frontier: {front.instance} under {front.oracle}", "",
             f"Cost (max device cost, {unit}) against bytes moved from the old plan, from keeping it (0 B: new tables "
             f"placed around it) to affording a fresh plan, {front.seconds:g} s of planning per point; "
             + ("every old table keeps its sharding type, shard count and kernel (TorchRec's reshard moves ranks)."
                if front.keep_types else "tables may change type (a checkpoint-and-reload re-shard)."),
             "Each point keeps the best plan of its budget or a smaller one and the best bound proven for its budget "
             "or a larger one; the gap is to that bound, over the plans within the budget.", "",
             f"- old plan as it stands: {_cost(front.old_objective, unit)}",
             f"- fresh plan (`plan`, types free): {front.fresh_objective:.6g} {unit}, moving {_gib(front.fresh_moved)}"
             + (f", bound {front.fresh_bound:.6g}" if front.fresh_bound is not None else ""), "",
             "| budget (share of fresh bytes) | budget | moved | cost | bound | gap | recovered | found by |",
             "|---|---|---|---|---|---|---|---|"]
    for p in front.points:
        share = recovered(start, front.fresh_objective, p.objective) if start is not None else None
        lines.append(f"| {p.share:.0%} | {_gib(p.budget)} | {_gib(p.moved)} | {p.objective:.6g} | "
                     f"{'-' if p.bound is None else f'{p.bound:.6g}'} | {'-' if p.gap is None else f'{p.gap:.3%}'} | "
                     f"{'-' if share is None else f'{share:.1%}'} | {p.solver} |")
    lines += ["", "Recovered: the share of the fresh plan's improvement over keeping the old plan (the 0 B point).",
              "", f"![cost against bytes moved]({plot.name})", "", f"Made by `{command}`."]
    return "\n".join(lines) + "\n"


def _cost(value: float | None, unit: str) -> str:
    return "not comparable (tables were added or dropped)" if value is None else f"{value:.6g} {unit}"


def _gib(count: int) -> str:
    return f"{count / 2**30:.3f} GiB"


def frontier_plot(front: Frontier) -> bytes:
    """The frontier as a PNG: cost and bound against GiB moved, the fresh plan marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moved = [p.moved / 2**30 for p in front.points]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.step(moved, [p.objective for p in front.points], where="post", marker="o", color="tab:blue", label="replan")
    bounded = [(p.budget / 2**30, p.bound) for p in front.points if p.bound is not None]
    if bounded:
        ax.step(*zip(*bounded), where="post", linestyle="--", color="tab:grey", label="bound within the budget")
    ax.plot([front.fresh_moved / 2**30], [front.fresh_objective], "*", markersize=12, color="tab:red",
            label="fresh plan")
    ax.set_xlabel("bytes moved from the old plan (GiB)")
    ax.set_ylabel(f"max device cost ({front.unit})")
    ax.set_title(f"{front.instance} under {front.oracle}")
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    return image.getvalue()


def frontier_record(front: Frontier) -> dict:
    """The frontier's points as JSON, beside its page."""
    return {"instance": front.instance, "oracle": front.oracle, "unit": front.unit, "keep_types": front.keep_types,
            "seconds_per_point": front.seconds, "old_objective": front.old_objective,
            "fresh_objective": front.fresh_objective, "fresh_moved_bytes": front.fresh_moved,
            "fresh_bound": front.fresh_bound,
            "points": [{"share": p.share, "budget_bytes": p.budget, "moved_bytes": p.moved, "objective": p.objective,
                        "bound": p.bound, "gap": p.gap, "solver": p.solver} for p in front.points]}


def write_frontier(front: Frontier, page: str | Path, command: str) -> tuple[Path, Path]:
    """The page, its plot (PAGE.png) and its points (PAGE.json), each written atomically; their paths."""
    page = Path(page)
    plot, points = page.with_suffix(".png"), page.with_suffix(".json")
    image = frontier_plot(front)
    write_bytes_atomic(plot, image)
    write_text_atomic(points, json.dumps(frontier_record(front), indent=1) + "\n")
    write_text_atomic(page, frontier_page(front, plot, command))
    return plot, points
