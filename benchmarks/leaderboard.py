"""Turns result records into the leaderboard: per oracle, time limit and solver (and sharding setting),
mean ± std of the metrics over the cells that produced a plan, next to counts of every cell that did not
(infeasible, no plan, error), so that nothing is silently dropped; plus a PNG plot, where a planner without a
value is a labelled row. Where a suite plans under several sharding settings, each row also shows its plans
against the best plan of any setting. A page shows its plot and names the code revisions of its records."""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from instances.io import write_text_atomic
from solvers import get_solver, solver_names
from solvers.base import wall_limit

from .analysis import (
    INSTANCE_SETTING,
    TABLE_WISE_SETTING,
    best_bounds,
    best_objectives,
    judge_of,
    random_objectives,
    setting_of,
)
from .metrics import gap_to_bound, speedup_over_random
from .pages import plot_line, revisions_line
from .store import cell_key
from .suite import Suite


@dataclass(frozen=True)
class Row:
    oracle: str
    time_limit: float
    solver: str
    cells: int
    with_plan: int
    optimal: int
    infeasible: int
    no_plan: int
    errors: int
    timeouts: int
    objective: tuple[float, float]
    balance: tuple[float, float]
    speedup: tuple[float, float]
    speedup_cells: int
    gap: tuple[float, float]
    gap_cells: int
    within_0_1pct: int
    time: tuple[float, float]
    time_median: float
    versus_best: tuple[float, float]
    over_wall: int | None  # cells past the promised wall time (None: a peer, which keeps no budget)
    # (min, max) over the same cells as the mean beside them: the plot's whiskers
    speedup_range: tuple[float, float] = (float("nan"), float("nan"))
    gap_range: tuple[float, float] = (float("nan"), float("nan"))
    versus_best_range: tuple[float, float] = (float("nan"), float("nan"))


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    return (float(np.mean(values)), float(np.std(values)))


def _range(values: list[float]) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    return (float(np.min(values)), float(np.max(values)))


def _over_wall(group: list[dict]) -> int | None:
    """How many of a row's cells ran past wall_limit(budget); None for a solver that keeps no budget (a
    store may hold solvers no longer registered: they are held to the budget)."""
    name = group[0]["solver"]
    if name in solver_names() and not get_solver(name).budgeted:
        return None
    return sum(r["solve_time"] > wall_limit(r["time_limit"]) for r in group)


def leaderboard_rows(records: list[dict]) -> list[Row]:
    # In cell order, not store order: a resumed sweep stores the same cells in another order, and its
    # means must come out identical to the last bit.
    records = sorted(records, key=lambda r: tuple(map(str, cell_key(r))))
    randoms, (bounds, _) = random_objectives(records), best_bounds(records)
    best = best_objectives(records)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(judge_of(r), r["time_limit"], row_label(r))].append(r)
    rows = []
    for (oracle, limit, solver), group in groups.items():
        planned = [r for r in group if r.get("objective") is not None]
        speedups = [speedup_over_random(randoms[(r["instance"], oracle)], r["objective"])
                    for r in planned if (r["instance"], oracle) in randoms]
        gaps = [gap_to_bound(r["objective"], bounds[(r["instance"], oracle, setting_of(r))])
                for r in planned if (r["instance"], oracle, setting_of(r)) in bounds]
        times = [r["solve_time"] for r in group]
        versus = [r["objective"] / best[(r["instance"], oracle)] for r in planned if best[(r["instance"], oracle)] > 0]
        rows.append(Row(
            oracle=oracle, time_limit=limit, solver=solver, cells=len(group), with_plan=len(planned),
            optimal=sum(r["status"] == "optimal" for r in group),
            infeasible=sum(r["status"] == "infeasible" for r in group),
            no_plan=sum(r["status"] == "no_plan" for r in group),
            errors=sum(r["status"] == "error" for r in group),
            timeouts=sum(r["status"] == "timeout" for r in group),
            objective=_mean_std([r["objective"] for r in planned]),
            balance=_mean_std([r["balance"] for r in planned]),
            speedup=_mean_std(speedups), speedup_cells=len(speedups),
            gap=_mean_std(gaps), gap_cells=len(gaps), within_0_1pct=sum(g <= 1e-3 for g in gaps),
            time=_mean_std(times), time_median=float(np.median(times)),
            versus_best=_mean_std(versus), over_wall=_over_wall(group),
            speedup_range=_range(speedups), gap_range=_range(gaps), versus_best_range=_range(versus),
        ))
    rows.sort(key=lambda row: (row.oracle, row.time_limit, np.nan_to_num(row.gap[0], nan=np.inf), row.solver))
    return rows


def setting_label(setting: str) -> str:
    return "split" if setting == INSTANCE_SETTING else setting.replace(",", "+")


def row_label(record: dict) -> str:
    """The solver, the oracle that guided it where a separate judge priced the plan, and the sharding
    setting where it is not table-wise."""
    label = record["solver"] if judge_of(record) == record["oracle"] else f"{record['solver']} ← {record['oracle']}"
    setting = setting_of(record)
    return label if setting == TABLE_WISE_SETTING else f"{label} [{setting_label(setting)}]"


def _fmt(pair: tuple[float, float], scale: float = 1.0, digits: int = 3, suffix: str = "", general: bool = False) -> str:
    mean, std = pair
    if np.isnan(mean):
        return "n/a"
    kind = "g" if general else "f"
    return f"{mean * scale:.{digits}{kind}} ± {std * scale:.{digits}{kind}}{suffix}"


def leaderboard_markdown(records: list[dict], title: str) -> str:
    rows = leaderboard_rows(records)
    lines = [f"#### {title}", ""]
    settings = {setting_of(rec) for rec in records}
    versus = len(settings) > 1
    timed = any(rec["status"] == "timeout" for rec in records)
    for (oracle, limit) in dict.fromkeys((r.oracle, r.time_limit) for r in rows):
        part = [r for r in rows if r.oracle == oracle and r.time_limit == limit]
        instances = len({rec["instance"] for rec in records if judge_of(rec) == oracle and rec["time_limit"] == limit})
        guided = any(judge_of(rec) != rec["oracle"] for rec in records if judge_of(rec) == oracle)
        lines += [f"{'judged by' if guided else 'oracle'} `{oracle}`, time limit {limit:g} s, {instances} instances"
                  + (" (`solver ← oracle`: the oracle that guided the solver)" if guided else "")
                  + ". Means ± std over cells with a plan; every other cell is counted in its column."
                  + (" `[split]`: planned with the instance's sharding types (others: whole tables); the gap is "
                     "to the bound of the problem the row solved, `× best plan` is its max device cost over the "
                     "best plan of any row on the same instance." if versus else ""), "",
                  "| solver | plans | optimal | infeasible | no plan | errors |" + (" timeouts |" if timed else "")
                  + " max device cost | balance | speedup over random | gap to bound | ≤0.1 % gap |"
                  + (" × best plan |" if versus else "") + " time (s) mean ± std | time median | over 1.1 × budget + 2 s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if versus else "")
                  + ("---|" if timed else "")]
        for r in part:
            lines.append(
                f"| {r.solver} | {r.with_plan}/{r.cells} | {r.optimal} | {r.infeasible} | {r.no_plan} | {r.errors} "
                + (f"| {r.timeouts} " if timed else "")
                + f"| {_fmt(r.objective, digits=4, general=True)} | {_fmt(r.balance)} | {_fmt(r.speedup)}× | {_fmt(r.gap, 100, 3, ' %')} "
                f"| {r.within_0_1pct}/{r.gap_cells} |" + (f" {_fmt(r.versus_best)} |" if versus else "")
                + f" {_fmt(r.time, digits=3)} | {r.time_median:.3f} | "
                + ("no budget |" if r.over_wall is None else f"{r.over_wall}/{r.cells} |"))
        lines.append("")
    conflicts = best_bounds(records)[1]
    if conflicts:
        lines += ["**Bound conflicts** (left out of the gaps above; each is a solver defect):", ""]
        lines += [f"- {c}" for c in conflicts] + [""]
    return "\n".join(lines)


@dataclass(frozen=True)
class PlotMetric:
    field: str       # the Row field holding (mean, std); `<field>_range` holds (min, max)
    label: str
    missing: str     # written where a planner's bar would be when it has plans but no value
    offset: float    # drawn as (value - offset) × scale
    scale: float
    log: bool        # symlog axis: gaps span 0.001 % to 100 %


PLOT_METRICS = (
    PlotMetric("speedup", "speedup over random (×)", "no random plan", 0.0, 1.0, log=False),
    PlotMetric("gap", "gap to best lower bound (%)", "no bound", 0.0, 100.0, log=True),
    PlotMetric("versus_best", "excess over the best plan of any row (%)", "best plan costs 0", 1.0, 100.0, log=True),
)


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None  # the mean; None: no bar, `note` is written in its place
    low: float           # whisker ends: min and max over the cells, never below 0
    high: float
    note: str = ""


@dataclass(frozen=True)
class Panel:
    oracle: str
    time_limit: float
    metric: PlotMetric
    bars: tuple[Bar, ...]

    @property
    def has_data(self) -> bool:
        return any(bar.value is not None for bar in self.bars)


def _without_plan(row: Row) -> str:
    counts = [(n, what) for n, what in ((row.timeouts, "timeout"), (row.no_plan, "no plan"),
                                        (row.infeasible, "infeasible"), (row.errors, "error")) if n]
    if len(counts) == 1:
        return counts[0][1]
    return ", ".join(f"{n} {what}" for n, what in counts) or "no plan"


def _bar(row: Row, metric: PlotMetric) -> Bar:
    partial = 0 < row.with_plan < row.cells
    label = row.solver + (f" ({row.with_plan}/{row.cells} planned)" if partial else "")
    mean = getattr(row, metric.field)[0]
    low, high = getattr(row, f"{metric.field}_range")
    if not all(np.isfinite((mean, low, high))):
        return Bar(label, None, 0.0, 0.0, metric.missing if row.with_plan else _without_plan(row))
    value, low, high = ((v - metric.offset) * metric.scale for v in (mean, low, high))
    # A bound within the conflict tolerance above a plan leaves a gap of -1e-9: zero, as the table reads.
    value = max(value, 0.0)
    return Bar(label, value, max(min(low, value), 0.0), max(high, value))


def plot_panels(rows: list[Row]) -> list[tuple[Panel, ...]]:
    """The plot's grid: a line per (oracle, time limit), a panel per metric that some line has a value for;
    each panel a bar per row, with min–max whiskers."""
    settings = list(dict.fromkeys((r.oracle, r.time_limit) for r in rows))
    grid = [tuple(Panel(oracle, limit, metric, tuple(_bar(r, metric) for r in rows
                                                     if (r.oracle, r.time_limit) == (oracle, limit)))
                  for metric in PLOT_METRICS) for oracle, limit in settings]
    kept = [i for i in range(len(PLOT_METRICS)) if any(line[i].has_data for line in grid)] or [0]
    return [tuple(line[i] for i in kept) for line in grid]


def _written(bar: Bar, metric: PlotMetric) -> str:
    """What is written where a bar would be: why it is missing, or its value where bar and whiskers are too
    short to see (a missing bar and a zero one must not look alike)."""
    if bar.value is None:
        return bar.note
    if bar.high == 0:
        return "0"
    if metric.log and bar.high < 1e-3:
        return "< 0.001 %"
    return ""


def _draw_panel(ax, panel: Panel, labelled: bool) -> None:
    metric = panel.metric
    if not panel.has_data and not labelled:
        ax.axis("off")
        ax.text(0.5, 0.5, f"{metric.label}:\n{metric.missing} for any planner", ha="center", va="center",
                transform=ax.transAxes, color="dimgray")
        return
    y = np.arange(len(panel.bars))
    drawn = [(i, bar) for i, bar in zip(y, panel.bars) if bar.value is not None]
    ax.barh([i for i, _ in drawn], [bar.value for _, bar in drawn],
            color="tab:blue" if metric.field == "speedup" else "tab:orange")
    ax.errorbar([bar.value for _, bar in drawn], [i for i, _ in drawn], fmt="none", ecolor="black", capsize=2,
                xerr=[[bar.value - bar.low for _, bar in drawn], [bar.high - bar.value for _, bar in drawn]])
    for i, bar in zip(y, panel.bars):
        if text := _written(bar, metric):
            ax.text(0.01, i, text, transform=ax.get_yaxis_transform(), va="center", ha="left",
                    color="dimgray", style="italic" if bar.value is None else "normal", fontsize=8)
    if metric.log:
        ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlim(left=0)
    ax.set_ylim(len(panel.bars) - 0.5, -0.5)
    ax.set_yticks(y, [bar.label for bar in panel.bars] if labelled else [])
    ax.set_xlabel(metric.label)
    ax.set_title(f"{panel.oracle}, {panel.time_limit:g} s", fontsize=10)


def leaderboard_plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = plot_panels(leaderboard_rows(records))
    heights = [len(line[0].bars) for line in grid] or [1]
    columns = len(grid[0]) if grid else 1
    fig, axes = plt.subplots(len(heights), columns, squeeze=False, layout="constrained",
                             figsize=(4.6 * columns + 2.4, sum(0.28 * h + 1.1 for h in heights) + 0.8),
                             gridspec_kw={"height_ratios": [h + 3 for h in heights]})
    for line, ax_line in zip(grid, axes):
        # The first panel with a value carries the planners' names; a line without any shows its reasons.
        first = next((i for i, panel in enumerate(line) if panel.has_data), 0)
        for i, (panel, ax) in enumerate(zip(line, ax_line)):
            _draw_panel(ax, panel, labelled=i == first)
    if not grid:
        axes[0][0].axis("off")
        axes[0][0].text(0.5, 0.5, "no results", ha="center", va="center")
    fig.suptitle(f"{title}\nbars: mean over the cells with a value; whiskers: min–max over those cells", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish_leaderboard(suite: Suite, records: list[dict]) -> str:
    """Writes a suite's leaderboard page, which shows its plot and names the code revisions of the records,
    and the plot; returns the page's Markdown. The plot is drawn aside first and moved in once the page is
    written, so that a failed write (a full disk) leaves neither."""
    title = f"Suite `{suite.name}`" + (f": {suite.description}" if suite.description else "")
    drawn = suite.plot_path.with_name(f".{suite.plot_path.name}.tmp.png")
    leaderboard_plot(records, drawn, f"shardbench suite {suite.name}")
    plot = plot_line(suite.leaderboard_path, suite.plot_path,
                     f"{suite.name}: the leaderboard per solver (bars: means; whiskers: min–max)")
    markdown = "\n".join((leaderboard_markdown(records, title), plot, "", revisions_line(records)))
    try:
        write_text_atomic(suite.leaderboard_path, markdown + "\n")
    except BaseException:
        drawn.unlink(missing_ok=True)
        raise
    os.replace(drawn, suite.plot_path)
    return markdown


def publish_report(text: str, path: Path) -> None:
    """Writes a report to its page and prints it."""
    write_text_atomic(path, text.rstrip("\n") + "\n")
    print(text)


def sweep_table(named_records: list[tuple[str, list[dict]]], metric: str = "speedup") -> str:
    """One row per suite, one column per solver (`solver ← oracle` when judged separately): the mean of
    `metric` ('speedup', 'balance' or 'gap'), with cells that produced no plan counted beside it."""
    tables = [(name, {row.solver: row for row in leaderboard_rows(records)}) for name, records in named_records]
    solvers = list(dict.fromkeys(solver for _, rows in tables for solver in rows))
    lines = ["| suite | " + " | ".join(solvers) + " |", "|---|" + "---|" * len(solvers)]
    for name, rows in tables:
        cells = []
        for solver in solvers:
            row = rows.get(solver)
            if row is None:
                cells.append("—")
                continue
            mean = getattr(row, metric)[0]
            failed = row.cells - row.with_plan
            value = "n/a" if np.isnan(mean) else (f"{mean:.3f}×" if metric == "speedup" else
                                                  f"{100 * mean:.2f} %" if metric == "gap" else f"{mean:.3f}")
            cells.append(value + (f" ({failed} without plan)" if failed else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
