"""The leaderboard plot's numbers: whiskers that stay at or above zero, a labelled row for a planner without
a plan, and no panel for a metric that no planner has a value for."""
import math

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.leaderboard import leaderboard_plot, leaderboard_rows, plot_panels

BASE = {"oracle": "lookup", "time_limit": 1.0, "seed": 0, "balance": 1.0, "solve_time": 0.1,
        "lower_bound": None, "instance_bound": None}


def _record(solver, instance, objective, bound=None, status="feasible"):
    return {**BASE, "solver": solver, "instance": instance, "objective": objective, "instance_bound": bound,
            "status": status}


def _records():
    """Gaps 0, 0 and 30 % (mean − std < 0), a planner that timed out everywhere and one with 1 plan of 3."""
    records = []
    for instance, objective in (("a", 100.0), ("b", 100.0), ("c", 130.0)):
        records += [_record("random", instance, 300.0), _record("good", instance, objective, bound=100.0)]
        records.append(_record("slow", instance, None, status="timeout"))
        records.append(_record("patchy", instance, 200.0) if instance == "a" else
                       _record("patchy", instance, None, status="infeasible"))
    return records


def _all_bars(records):
    return [bar for line in plot_panels(leaderboard_rows(records)) for panel in line for bar in panel.bars]


def test_plot_renders_timeouts_and_whiskers_stay_above_zero(tmp_path):
    records = _records()
    rows = {row.solver: row for row in leaderboard_rows(records)}
    assert rows["good"].gap[0] - rows["good"].gap[1] < 0  # ± std would cross zero
    leaderboard_plot(records, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 1000
    [line] = plot_panels(leaderboard_rows(records))
    panels = {panel.metric.field: panel for panel in line}
    gaps = {bar.label: bar for bar in panels["gap"].bars}
    assert gaps["good"].low == 0 and math.isclose(gaps["good"].high, 30.0) and math.isclose(gaps["good"].value, 10.0)
    assert gaps["slow"].value is None and gaps["slow"].note == "timeout"
    assert gaps["patchy (1/3 planned)"].value == 100.0  # 200 against the bound of 100 on its one instance
    speedups = {bar.label: bar for bar in panels["speedup"].bars}
    assert speedups["slow"].note == "timeout" and speedups["patchy (1/3 planned)"].value == 1.5
    for bar in _all_bars(records):
        assert bar.value is None or 0 <= bar.low <= bar.value <= bar.high


def test_a_metric_no_planner_has_is_not_a_panel(tmp_path):
    # No random plan and no bound: only the comparison with the best plan is left to show.
    records = [_record("lpt", i, o) for i, o in (("a", 10.0), ("b", 12.0))] + \
              [_record("greedy", i, o) for i, o in (("a", 11.0), ("b", 12.0))] + \
              [_record("random", i, None, status="no_plan") for i in ("a", "b")]
    [line] = plot_panels(leaderboard_rows(records))
    assert [panel.metric.field for panel in line] == ["versus_best"]
    assert {bar.label: bar.note for bar in line[0].bars}["random"] == "no plan"
    leaderboard_plot(records, tmp_path / "p.png", "t")


@given(st.lists(st.tuples(st.sampled_from(["p", "q", "random"]), st.sampled_from(["a", "b", "c"]),
                          st.one_of(st.none(), st.floats(1.0, 1e6)), st.floats(0.5, 1.0)), min_size=1, max_size=30))
def test_no_whisker_goes_below_zero(cells):
    # A bound is a fraction of the instance's cheapest plan, as a valid bound is.
    cheapest = {}
    for _, instance, objective, _ in cells:
        if objective is not None:
            cheapest[instance] = min(cheapest.get(instance, math.inf), objective)
    records = [_record(solver, instance, objective, bound=cheapest.get(instance, 1.0) * fraction,
                       status="feasible" if objective is not None else "no_plan")
               for solver, instance, objective, fraction in cells]
    for bar in _all_bars(records):
        assert bar.value is None or 0 <= bar.low <= bar.value <= bar.high
        assert bar.value is not None or bar.note


def test_a_line_where_nobody_planned_names_the_reason(tmp_path):
    records = [_record("lpt", i, 10.0) for i in ("a", "b")] + \
              [{**_record(s, i, None, status="timeout"), "time_limit": 0.1} for s in ("lpt", "random") for i in ("a", "b")]
    lines = plot_panels(leaderboard_rows(records))
    nobody = next(line for line in lines if line[0].time_limit == 0.1)
    assert not any(panel.has_data for panel in nobody)
    assert {bar.note for panel in nobody for bar in panel.bars} == {"timeout"}
    leaderboard_plot(records, tmp_path / "p.png", "t")
    assert (tmp_path / "p.png").stat().st_size > 1000
