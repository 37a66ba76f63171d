"""Turns result records into the leaderboard: per oracle, time limit and solver (and sharding setting),
mean ± std of the metrics over the cells that produced a plan, next to counts of every cell that did not
(infeasible, no plan, error), so that nothing is silently dropped; plus a PNG plot. Where a suite plans
under several sharding settings, each row also shows its plans against the best plan of any setting."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from instances.io import write_text_atomic

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


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    return (float(np.mean(values)), float(np.std(values)))


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
            versus_best=_mean_std([r["objective"] / best[(r["instance"], oracle)] for r in planned
                                   if best[(r["instance"], oracle)] > 0]),
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
                  + (" × best plan |" if versus else "") + " time (s) mean ± std | time median |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if versus else "")
                  + ("---|" if timed else "")]
        for r in part:
            lines.append(
                f"| {r.solver} | {r.with_plan}/{r.cells} | {r.optimal} | {r.infeasible} | {r.no_plan} | {r.errors} "
                + (f"| {r.timeouts} " if timed else "")
                + f"| {_fmt(r.objective, digits=4, general=True)} | {_fmt(r.balance)} | {_fmt(r.speedup)}× | {_fmt(r.gap, 100, 3, ' %')} "
                f"| {r.within_0_1pct}/{r.gap_cells} |" + (f" {_fmt(r.versus_best)} |" if versus else "")
                + f" {_fmt(r.time, digits=3)} | {r.time_median:.3f} |")
        lines.append("")
    conflicts = best_bounds(records)[1]
    if conflicts:
        lines += ["**Bound conflicts** (left out of the gaps above; each is a solver defect):", ""]
        lines += [f"- {c}" for c in conflicts] + [""]
    return "\n".join(lines)


def leaderboard_plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = leaderboard_rows(records)
    settings = list(dict.fromkeys((r.oracle, r.time_limit) for r in rows))
    fig, axes = plt.subplots(len(settings), 2, figsize=(12, 3.2 * len(settings) + 0.8), squeeze=False)
    for (oracle, limit), (ax_speed, ax_gap) in zip(settings, axes):
        part = [r for r in rows if r.oracle == oracle and r.time_limit == limit]
        names = [r.solver for r in part]
        y = np.arange(len(part))
        ax_speed.barh(y, [r.speedup[0] for r in part], xerr=[r.speedup[1] for r in part], color="tab:blue")
        ax_speed.set_yticks(y, names)
        ax_speed.set_xlabel("speedup over random (×)")
        ax_speed.set_title(f"{oracle}, {limit:g} s")
        ax_gap.barh(y, [100 * r.gap[0] for r in part], xerr=[100 * r.gap[1] for r in part], color="tab:orange")
        ax_gap.set_yticks(y, names)
        ax_gap.set_xscale("symlog", linthresh=0.1)
        ax_gap.set_xlabel("gap to best lower bound (%)")
        for ax in (ax_speed, ax_gap):
            ax.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish_leaderboard(suite: Suite, records: list[dict]) -> str:
    """Writes a suite's leaderboard page and plot from its records; returns the page's Markdown."""
    title = f"Suite `{suite.name}`" + (f": {suite.description}" if suite.description else "")
    markdown = leaderboard_markdown(records, title)
    write_text_atomic(suite.leaderboard_path, markdown + "\n")
    leaderboard_plot(records, suite.plot_path, f"shardbench suite {suite.name}")
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
