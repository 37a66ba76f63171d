"""Plans tidied at their makespan: a tidied plan costs no more, fits every tier, does no more work, moves each
changed table to a tidier option and leaves no single-piece tidier option that brute force finds room for;
`plan` hands it over from Python and the command line, and keeps a plan as it came where that re-sizes lower."""
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import examples, make_table
from hypothesis import assume, given
from hypothesis import strategies as st

import shardbench
from costmodels import get_oracle
from instances import Instance, Topology, Workload, load_plan, save_instance
from solvers import Budget, SolveResult, Status
from solvers.assembly import Assembly, Trial
from solvers.base import fits_every_tier
from solvers.candidates import Candidates, Problem
from solvers.tidy import assembled, tidier, tidy, tidy_plan


@st.composite
def tiered_split_instances(draw):
    """One to four tables on two or three devices, cut any way TorchRec cuts them, with host memory."""
    tables = tuple(make_table(f"t{i}", draw(st.integers(4, 400)), draw(st.sampled_from([16, 32])),
                              draw(st.floats(0.5, 20.0))) for i in range(draw(st.integers(1, 4))))
    need = sum(t.weight_bytes for t in tables)
    devices = draw(st.integers(2, 3))
    hbm = max(1, int(need * draw(st.floats(0.3, 2.0)) / devices))
    return Instance("tidy", tables, Topology(1, devices, hbm, host_memory_bytes=4 * need), Workload(batch_size=16),
                    sharding_types=("table_wise", "column_wise", "row_wise")).validate()


def untidy(candidates: Candidates, seed: int) -> Assembly | None:
    """Each table in a random live option where it fits (`Assembly.fit`), or None where one finds no room."""
    rng = np.random.default_rng(seed)
    assembly = Assembly(candidates)
    for t in rng.permutation(candidates.instance.num_tables):
        for o in rng.permutation(candidates.by_table[int(t)]):
            trial = assembly.fit(int(o))
            if isinstance(trial, Trial):
                assembly.put(int(o), trial.devices)
                break
        else:
            return None
    return assembly


@examples(30)
@given(tiered_split_instances(), st.integers(0, 2**16), st.sampled_from(["analytic", "torchrec"]))
def test_a_tidied_plan_costs_no_more_fits_and_does_less_work(instance, seed, oracle_name):
    oracle = get_oracle(oracle_name)
    candidates = Candidates.build(instance, oracle)
    assembly = untidy(candidates, seed)
    assume(assembly is not None)
    before, options, work = assembly.objective(), assembly.chosen.copy(), float(assembly.costs().sum())
    assert assembled(candidates, assembly.plan()).chosen.tolist() == options.tolist()
    changed = tidy(assembly, np.inf)
    plan = assembly.plan().validate(instance)
    fits_every_tier(instance, oracle, plan)
    assert oracle.plan_cost(instance, plan) <= before * (1 + 1e-9)
    assert float(assembly.costs().sum()) <= work * (1 + 1e-9)
    assert set(changed) == set(np.flatnonzero(assembly.chosen != options).tolist())
    for t in changed:  # less work in no more shards, or as much in fewer
        new, old = int(assembly.chosen[t]), int(options[t])
        assert candidates.parts[new] <= candidates.parts[old]
        assert candidates.work[new] < candidates.work[old] or candidates.parts[new] < candidates.parts[old]
        assert candidates.work[new] <= candidates.work[old] * (1 + 1e-9)
    assert tidy(assembly, np.inf) == ()  # a tidy plan stays as it is
    # Brute force for the options of one piece: no device has room for a tidier one clearly within the makespan
    # (at it, float noise in the running sums may decide).
    ceiling = before * (1 - 1e-9)
    for t in range(instance.num_tables):
        now = int(assembly.chosen[t])
        option, devices = assembly.take(t)
        for o in candidates.by_table[t]:
            if candidates.parts[o] == 1 and tidier(candidates, np.array([o]), now)[0]:
                for d in range(instance.num_devices):
                    on = np.array([d])
                    if assembly.fits_at(int(o), on):
                        assert assembly.state.costs_with(candidates.members(int(o)), on).max() > ceiling
        assembly.put(option, devices)


def _small_and_big() -> Instance:
    """A big table and a 4-row one on two devices of plenty of HBM: nothing needs cutting or caching."""
    tables = (make_table("big", 4000, 32, 10.0), make_table("tiny", 4, 32, 1.0))
    return Instance("small-and-big", tables, Topology(1, 2, 10**7, host_memory_bytes=10**8), Workload(batch_size=64),
                    sharding_types=("table_wise", "column_wise", "row_wise")).validate()


def _dearest(problem, budget, seed):
    """Every table in its option of most work that fits (for the tests): a plan no search would leave."""
    candidates = problem.candidates
    assembly = Assembly(candidates)
    for t in range(problem.instance.num_tables):
        for o in sorted(candidates.by_table[t], key=lambda o: -candidates.work[o]):
            trial = assembly.fit(int(o))
            if isinstance(trial, Trial):
                assembly.put(int(o), trial.devices)
                break
    return SolveResult(Status.FEASIBLE, plan=assembly.plan())


@pytest.fixture
def dearest(monkeypatch):
    import shardbench.pipeline as pipeline
    from solvers.base import _REGISTRY, register

    register("dearest", "every table in its dearest option", splits=True)(_dearest)
    monkeypatch.setattr(pipeline, "SAFETY_NET", "dearest")
    yield
    del _REGISTRY["dearest"]


def test_plan_tidies_the_kept_plan_from_python_and_the_command_line(dearest, tmp_path, capsys):
    from shardbench.cli import main

    instance, oracle = _small_and_big(), get_oracle("torchrec")
    member = _dearest(Problem(instance, oracle), None, 0).plan
    result = shardbench.plan(instance, "torchrec", budget=2.0, solvers=["dearest"])
    assert result.solver == "dearest" and result.tidied is not None
    assert result.objective <= oracle.plan_cost(instance, member) * (1 + 1e-9)
    (before, after), (shards, now) = result.tidied.work, result.tidied.shards
    assert after < before and now <= shards
    assert result.tidied.work[0] == pytest.approx(sum(d.total for d in oracle.device_costs(instance, member)))
    assert result.plan.tables[1].sharding_type == "table_wise" and result.plan.tables[1].compute_kernel == "fused"
    path, out = tmp_path / "i.json", tmp_path / "p.json"
    save_instance(instance, path)
    assert main(["plan", str(path), "--oracle", "torchrec", "--budget", "2", "--solvers", "dearest",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tidied within the max device cost" in printed and "tiny" in printed
    record = json.loads(out.read_text())
    report = record.get("report", record)
    assert "tiny" in report["tidied"]["tables"] and report["tidied"]["work"][1] < report["tidied"]["work"][0]
    assert load_plan(out, instance) == result.plan


def test_the_plan_as_it_came_is_kept_where_it_re_sizes_lower(monkeypatch):
    import shardbench.portfolio as portfolio
    from instances import Plan, Shard, TableSharding

    instance, oracle = _small_and_big(), get_oracle("torchrec")
    problem = Problem(instance, oracle)
    member = _dearest(problem, None, 0).plan
    tidied = tidy_plan(problem.candidates, member, np.inf)
    assert tidied is not None
    race = portfolio.Race(("a",), (portfolio.Member("a", SolveResult(Status.FEASIBLE, plan=member), 1.0, True),),
                          False, 1.0)
    low = oracle.plan_cost(instance, tidied.plan)  # the tidied plan's; the plan as it came costs no less
    for after, kept in (({tidied.plan: 0.9, member: 0.8}, member), ({tidied.plan: 0.8, member: 0.8}, tidied.plan)):
        monkeypatch.setattr(portfolio, "resized_caches",
                            lambda problem, plan, cost, deadline, after=after: (plan, low * after[plan]))
        result = portfolio.settle(problem, race, (), 0.0, Budget(5.0))
        assert result.plan == kept and (result.tidied is None) == (kept is member)
        assert result.grid_objective == pytest.approx(oracle.plan_cost(instance, kept))
    # Every member's plan as it came is re-sized first, then each tidied: where the clock is short, tidying is
    # what goes without.
    other = Plan(instance.id, (member.tables[0], TableSharding("table_wise", (Shard(1, (0, 4), (0, 32)),))))
    assert other != member and oracle.plan_cost(instance, other) >= oracle.plan_cost(instance, member)
    both = portfolio.Race(("a", "b"), (*race.members, portfolio.Member("b", SolveResult(
        Status.FEASIBLE, plan=other), 1.0, True)), False, 1.0)
    calls = []
    monkeypatch.setattr(portfolio, "resized_caches",
                        lambda problem, plan, cost, deadline: calls.append(plan) or None)
    assert portfolio.settle(problem, both, (), 0.0, Budget(5.0)).tidied is not None
    other_tidied = tidy_plan(problem.candidates, other, np.inf)
    assert calls == [member, other, tidied.plan, other_tidied.plan]
    # Without the clock (--grid-caches) the best plan is tidied, and stays on the grid.
    on_grid = portfolio.settle(problem, both, (), 0.0)
    assert on_grid.plan == tidied.plan and on_grid.grid_objective is None and on_grid.tidied is not None
    assert portfolio.tidied_plan(problem, member, oracle.plan_cost(instance, member), time.monotonic() - 1) is None
    assert assembled(problem.candidates, member, time.monotonic() - 1) is None
    # Not under an oracle that is not additive: an option's work is no sum of its pieces' costs there.
    assert portfolio.tidied_plan(Problem(instance, SimpleNamespace(additive=False)), member, 1.0, np.inf) is None
    # A replan keeps its plan as it came: a table changed would move bytes.
    from instances.moves import previous_plan

    previous = previous_plan(instance, {t.name: s for t, s in zip(instance.tables, member.tables)})
    replan = Problem(instance, oracle, previous=previous)
    assert portfolio.tidied_plan(replan, member, oracle.plan_cost(instance, member), np.inf) is None


def test_tables_stay_cut_where_whole_they_would_raise_the_makespan():
    # Under TorchRec's estimator a column block costs nearly what the whole table does, so each table cut in two
    # does almost twice the work it would whole; but whole, either table's one piece would leave its device
    # above the busiest now: tidying leaves both cut.
    from instances import Plan, Shard, TableSharding

    tables = (make_table("big", 40_000, 32, 50.0), make_table("tiny", 4, 32, 1.0))
    instance = Instance("cut", tables, Topology(1, 2, 10**8, host_memory_bytes=10**9), Workload(batch_size=64),
                        sharding_types=("table_wise", "column_wise")).validate()
    oracle = get_oracle("torchrec")
    cut = Plan(instance.id, tuple(TableSharding("column_wise", (Shard(0, (0, t.rows), (0, 16)),
                                                                Shard(1, (0, t.rows), (16, 32))))
                                  for t in tables))
    candidates = Candidates.build(instance, oracle)
    assembly = assembled(candidates, cut)
    for t in range(2):
        whole = [int(o) for o in candidates.by_table[t] if candidates.options.options[int(o)].parts == 1]
        assert whole and tidier(candidates, np.array(whole), int(assembly.chosen[t])).all()
    before = oracle.plan_cost(instance, cut)
    assert tidy(assembly, np.inf) == ()
    assert assembly.plan() == cut and oracle.plan_cost(instance, assembly.plan()) == before


def test_a_whole_table_stays_whole_where_cut_in_more_shards_it_does_less_work():
    # Row-wise in two, the big table does less work summed than whole (TorchRec's estimator), and would fit:
    # tidying never adds shards.
    from instances import Plan, Shard, TableSharding

    instance, oracle = _small_and_big(), get_oracle("torchrec")
    whole = Plan(instance.id, tuple(TableSharding("table_wise", (Shard(d, (0, t.rows), (0, t.dim)),))
                                    for d, t in enumerate(instance.tables)))
    candidates = Candidates.build(instance, oracle)
    assembly = assembled(candidates, whole)
    rows = [int(o) for o in candidates.by_table[0] if candidates.options.options[int(o)].sharding_type == "row_wise"
            and candidates.options.options[int(o)].kernel == "fused"]
    assert rows and candidates.work[rows[0]] < candidates.work[assembly.chosen[0]]
    assembly.take(0)
    assert assembly.fit(rows[0]).peak < oracle.plan_cost(instance, whole)  # it would fit within the makespan
    assembly = assembled(candidates, whole)
    assert tidy(assembly, np.inf) == () and assembly.plan() == whole


def test_the_report_line_names_the_tables_and_survives_zero_work():
    from shardbench.portfolio import PortfolioResult
    from solvers.tidy import Tidied

    instance = _small_and_big()
    for work, peak, shown in (((2.0, 1.0), (1.0, 1.0), "-50.00%"), ((0.0, 0.0), (0.0, 0.0), "0 -> 0")):
        result = PortfolioResult(None, None, None, None, 0.0, tidied=Tidied(None, (0, 1), peak, work, (4, 2)))
        line = result.tidied_line(instance)
        assert "2 tables (big, tiny)" in line and shown in line and "shards 4 -> 2" in line
    lower = PortfolioResult(None, None, None, None, 0.0, tidied=Tidied(None, (1,), (2.0, 1.5), (3.0, 2.0), (2, 1)))
    assert "max device cost 2 -> 1.5" in lower.tidied_line(instance)
