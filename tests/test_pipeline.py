"""The planning pipeline stage by stage (narrow, admit, choose, price, race, certify, report), and every
entry point calling it: the CLI's `plan` and `shardbench.plan` give the same plan for the same
deterministic member and defaults."""
import json

import pytest
from conftest import make_instance
from hypothesis import given
from hypothesis import strategies as st

import shardbench
from costmodels import get_oracle
from instances import InstanceError, save_instance
from instances.model import SHARDING_TYPES
from shardbench.cli import main
from shardbench.pipeline import (
    PlanRequest,
    admit,
    certify,
    choose,
    narrow,
    price,
    race,
    report_lines,
    report_record,
    run,
    runnable,
)
from shardbench.portfolio import SAFETY_NET
from solvers import Budget, SolverOracleMismatch, UnknownSolverError
from solvers.candidates import PricingError


def _split():
    # One table much heavier than the rest: the best plan splits it.
    return make_instance([(64, 16, 50.0)] + [(10, 4, 1.0)] * 6, 4, 10**6, "split", types=SHARDING_TYPES)


def test_narrow_restricts_types_and_kernels_and_names_the_argument_that_left_a_table_none():
    request = PlanRequest(_split(), "lookup", sharding_types=("table_wise", "column_wise"))
    assert narrow(request).sharding_types == ("table_wise", "column_wise")
    instance = make_instance([(10, 4, 1.0)], 2, 10**6, types=("row_wise",))
    with pytest.raises(InstanceError, match="^sharding_types: leaves table t0"):
        narrow(PlanRequest(instance, "lookup", sharding_types=("table_wise",)))
    cli = PlanRequest(instance, "lookup", sharding_types=("table_wise",),
                      names={"sharding_types": "--sharding-types", "compute_kernels": "--compute-kernels"})
    with pytest.raises(InstanceError, match="^--sharding-types: leaves table t0"):
        narrow(cli)
    with pytest.raises(InstanceError, match="^compute_kernels: leaves table t0"):
        narrow(PlanRequest(_split(), "lookup", compute_kernels=("fused_uvm",)))


def test_admit_checks_names_oracle_and_fit_before_anything_is_priced():
    instance = _split()
    with pytest.raises(UnknownSolverError):
        admit(PlanRequest(instance, "lookup", solvers=("nope",)), instance)
    admitted = admit(PlanRequest(instance, "neural-dreamshard", solvers=("cpsat", "split-greedy")), instance)
    assert [entry.split(":")[0] for entry in admitted.skipped] == ["cpsat"] and admitted.unfit is None
    assert runnable(admitted, ("cpsat", "split-greedy")) == ("split-greedy", SAFETY_NET)
    crowded = make_instance([(1000, 64, 1.0)] * 4, 2, 200_000, "crowded")
    assert "tables need" in admit(PlanRequest(crowded, "lookup"), crowded).unfit
    tiered = make_instance([(10, 4, 1.0)], 2, 10**6)
    from dataclasses import replace
    tiered = replace(tiered, topology=replace(tiered.topology, host_memory_bytes=10**9)).validate()
    with pytest.raises(SolverOracleMismatch, match="host memory"):
        admit(PlanRequest(tiered, "lookup"), tiered)


@pytest.mark.parametrize("argv,python,field", [
    (["--solvers", ""], {"solvers": []}, "solvers"),
    (["--solvers", ","], {"solvers": ()}, "solvers"),
    (["--seed", "-1"], {"seed": -1}, "seed"),
    (["--compute-kernels", "fused,dense"], {"compute_kernels": ("fused", "dense")}, "compute_kernels")],
    ids=["no solvers", "only commas", "seed -1", "a load factor left no cache"])
def test_a_bad_request_is_refused_by_name_from_the_cli_and_from_python(argv, python, field, tmp_path, capsys):
    instance = _split()
    if field == "compute_kernels":  # a fixed cache load factor, on devices with host memory
        from dataclasses import replace

        instance = replace(instance, tables=(replace(instance.tables[0], cache_load_factor=0.2), *instance.tables[1:]),
                           topology=replace(instance.topology, host_memory_bytes=10**9)).validate()
    path = tmp_path / "i.json"
    save_instance(instance, path)
    assert main(["plan", str(path), "--oracle", "analytic", "-o", str(tmp_path / "p.json"), *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and argv[0] in err[0], err
    with pytest.raises(Exception) as error:
        run(PlanRequest(instance, "analytic", budget=1.0, **python))
    assert str(error.value).startswith(f"{field}:"), str(error.value)
    assert not (tmp_path / "p.json").exists()


def test_choose_takes_the_given_solvers_or_the_recommendation():
    instance = _split()
    given = PlanRequest(instance, "lookup", solvers=("lpt", "split-greedy"))
    assert choose(given, admit(given, instance)) == ("lpt", "split-greedy")
    recommended = PlanRequest(instance, "lookup")
    chosen = choose(recommended, admit(recommended, instance))
    assert chosen and all(isinstance(name, str) for name in chosen)


def test_price_seals_the_problem_members_get():
    instance = _split()
    priced = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=False)
    assert priced.clock.started is not None and priced.seconds >= 0
    assert priced.problem.candidates is priced.problem.candidates  # priced once, read as often as asked
    with pytest.raises(PricingError, match="price stage"):
        priced.problem.whole_tables  # no whole-table member was to run: a solver asking for it is a bug
    both = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=True)
    assert both.problem.whole_tables.table_wise is not None and both.problem.whole_tables.sealed


def test_price_solves_the_lp_once_for_the_members_bounded_by_it(monkeypatch):
    import shardbench.pipeline as pipeline
    import solvers.bounds as bounds

    instance = _split()
    # The pipeline asks for it where a member is bounded by it, and only there.
    asked, real = [], pipeline.price

    def spy(*args, **kwargs):
        asked.append(kwargs.get("lp", args[5] if len(args) > 5 else False))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "price", spy)
    run(PlanRequest(instance, "lookup", budget=1.0, solvers=("split-greedy",)))
    run(PlanRequest(instance, "lookup", budget=1.0, solvers=("split-greedy", "pair-balance")))
    assert asked == [False, True]
    alone = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=False)
    assert "lp_bound" not in alone.problem.candidates.memo
    priced = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=False, lp=True)
    solved = priced.problem.candidates.memo["lp_bound"]
    assert solved == bounds._lp_bound(priced.problem.candidates) and solved > 0

    def again(_):
        raise AssertionError("the LP was solved again")

    monkeypatch.setattr(bounds, "_lp_bound", again)
    assert bounds.lp_bound(priced.problem.candidates) == solved  # a member forked from here reads it

    def out_of_time(candidates, seconds):
        raise bounds.LPOutOfTime(f"more than {seconds} s")

    # An LP slower than its share of the budget is left to the members that need it, as before.
    monkeypatch.setattr(bounds, "_lp_bound", out_of_time)
    late = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=False, lp=True)
    assert "lp_bound" not in late.problem.candidates.memo


def test_race_and_certify_keep_the_best_validated_plan_and_break_ties_by_entry_order():
    instance = make_instance([(10, 4, 1.0), (10, 4, 1.0), (20, 4, 1.0), (20, 4, 1.0)], 2, 10**6)
    priced = price(instance, get_oracle("lookup"), Budget(5.0), whole_tables=True)
    run_ = race(priced, ("lpt", SAFETY_NET), seed=0)
    assert run_.names == ("lpt", SAFETY_NET) and {m.solver for m in run_.members} <= {"lpt", SAFETY_NET}
    result = certify(priced, run_, ())
    assert result.plan is not None and result.objective == get_oracle("lookup").plan_cost(instance, result.plan)
    # Both find the optimum; the member entered first keeps it, whichever finished first.
    tied = [m for m in result.members if m.objective == result.objective]
    if len(tied) == 2:
        assert result.solver == "lpt"
    assert result.bound is not None and result.bound <= result.objective


def test_report_lines_and_record_say_what_was_planned():
    instance = _split()
    request = PlanRequest(instance, "lookup", budget=2.0, solvers=("split-greedy",))
    report = run(request)
    assert report.lines[0] == "split under lookup, budget 2 s: running split-greedy + best-greedy"
    assert report.lines == tuple([report.lines[0], *report_lines(request, instance, report.result, "proxy units")])
    assert report.record == report_record(request, instance, report.result, report.members)
    assert report.record["portfolio"] == ["split-greedy", SAFETY_NET]
    assert report.record["objective"] == report.result.objective


@given(st.lists(st.text(st.characters(whitelist_categories=("L", "N", "P")), min_size=1, max_size=30),
                min_size=1, max_size=40))
def test_a_members_reason_is_cut_at_a_word_never_inside_one(words):
    from shardbench.pipeline import REASON_WIDTH
    from shardbench.portfolio import Member, PortfolioResult

    reason = " ".join(words)
    result = PortfolioResult(None, None, None, None, 1.0, (Member("lpt", None, 0.1, True, reason),))
    line = report_lines(PlanRequest(_split(), "lookup"), _split(), result, "units")[1]
    shown = line.split("  (", 1)[1].removesuffix(")")
    if len(reason) <= REASON_WIDTH:
        assert shown == reason
    else:
        kept = shown.removesuffix(" …").split(" ")
        assert shown.endswith(" …") and len(shown) <= REASON_WIDTH and kept == words[:len(kept)]


def test_an_instance_that_cannot_fit_runs_no_member():
    crowded = make_instance([(1000, 64, 1.0)] * 4, 2, 200_000, "crowded")
    result = shardbench.plan(crowded, "lookup", 1.0, ["lpt"])
    assert result.plan is None and result.members == ()
    assert result.no_plan_reason.startswith("infeasible: tables need")


def test_the_cli_and_python_give_the_same_plan_for_a_deterministic_member(tmp_path):
    """Both on their defaults: one oracle (TorchRec's estimator, installed here) and one unit of gap."""
    from shardbench.pipeline import DEFAULT_ORACLE

    # Room for TorchRec's storage estimate, which counts input and output buffers at the batch size too.
    instance = make_instance([(64, 16, 50.0)] + [(10, 4, 1.0)] * 6, 4, 2**32, "split", types=SHARDING_TYPES)
    path = tmp_path / "i.json"
    save_instance(instance, path)
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--budget", "2", "--solvers", "split-greedy", "-o", str(out)]) == 0
    python = shardbench.plan(instance, budget=2.0, solvers=["split-greedy"])
    from instances import load_plan

    assert load_plan(out, instance) == python.plan
    report = json.loads(out.read_text())["report"]
    assert report["oracle"] == DEFAULT_ORACLE == "torchrec" and python.notes == ()


def test_without_torchrec_the_default_falls_back_and_says_so(monkeypatch, tmp_path, capsys):
    import interop.common
    from shardbench.pipeline import FALLBACK_ORACLE

    def missing():
        raise ImportError("No module named 'torchrec'")

    monkeypatch.setattr(interop.common, "load_torchrec", missing)
    result = shardbench.plan(_split(), budget=1.0, solvers=["lpt"])
    assert result.plan is not None and len(result.notes) == 1
    assert result.notes[0].startswith("oracle: TorchRec cannot be imported here (No module named 'torchrec'), so "
                                      f"{FALLBACK_ORACLE} prices the plan")
    path = tmp_path / "i.json"
    save_instance(_split(), path)
    assert main(["plan", str(path), "--budget", "1", "--solvers", "lpt", "-o", str(tmp_path / "p.json")]) == 0
    assert capsys.readouterr().out.startswith(f"note: {result.notes[0]}\nsplit under {FALLBACK_ORACLE},")
    assert json.loads((tmp_path / "p.json").read_text())["report"]["oracle"] == FALLBACK_ORACLE


def test_the_registries_resolve_torchrec_entries_whatever_was_imported_first():
    import subprocess
    import sys

    code = ("import sys; from costmodels import oracle_is_additive, oracle_prices_tiers, is_costly, get_oracle; "
            "from solvers import get_solver; "
            "print(oracle_is_additive('torchrec'), oracle_prices_tiers('torchrec'), is_costly('torchrec'), "
            "'shardbench' in sys.modules, 'torchrec' in sys.modules, get_solver('torchrec-planner').peer, "
            "get_oracle('torchrec').name)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    # Capabilities come from the class without building the oracle (torchrec not loaded until it is built).
    assert done.stdout.split() == ["True", "True", "True", "False", "False", "True", "torchrec"], done.stderr[-2000:]


def test_every_oracles_capabilities_are_its_class_attributes():
    from costmodels import is_costly, oracle_class, oracle_is_additive, oracle_names, oracle_prices_tiers

    for name in oracle_names():
        cls = oracle_class(name)
        assert (oracle_is_additive(name), oracle_prices_tiers(name), is_costly(name)) == \
            (cls.additive, cls.prices_tiers, cls.costly)
        if not cls.costly:
            built = get_oracle(name)
            assert isinstance(built, cls) and built.additive == cls.additive


def test_where_every_member_dead_ends_the_exact_model_still_finds_the_plan(monkeypatch):
    # Heuristics may dead-end where a plan fits; then the exact model runs after them, and plan says "no
    # plan" only where none exists.
    import shardbench.pipeline as pipeline
    from solvers.base import _REGISTRY, Cause, NoPlan, SolveResult, Status, register

    def dead_end(problem, budget, seed):
        capacity = int(problem.instance.topology.memory_bytes)
        return SolveResult(Status.NO_PLAN, reason="a dead end (for the test)",
                           no_plan=NoPlan(Cause.DEAD_END, table=0, need=capacity, most_free=capacity - 1))

    register("dead-end", "always dead-ends", splits=True)(dead_end)
    monkeypatch.setattr(pipeline, "SAFETY_NET", "dead-end")
    try:
        report = run(PlanRequest(_split(), "lookup", budget=1.0, solvers=("dead-end",)))
        assert report.result.plan is not None and report.result.solver == "cpsat", report.result.no_plan_reason
        assert [m.solver for m in report.result.members][-1] == "cpsat"
        crowded = make_instance([(1000, 64, 1.0)] * 4, 2, 200_000, "crowded")
        assert run(PlanRequest(crowded, "lookup", budget=1.0, solvers=("dead-end",))).result.plan is None
    finally:
        del _REGISTRY["dead-end"]


_WATCHED = ("scipy.optimize", "highspy", "ortools.sat.python.cp_model", "pulp")


@pytest.mark.parametrize("solver", ["cpsat", "pair-balance", "milp-highs", "milp-cbc", "local-search"])
def test_a_solver_run_imports_no_backend_that_load_backends_left_out(solver):
    # plan loads the members' back-ends before its clock starts and forks them afterwards: one the metadata
    # leaves out would be imported again in every member, on its budget. A fresh interpreter, so that nothing
    # is loaded before.
    import subprocess
    import sys
    from pathlib import Path

    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from conftest import make_instance
from costmodels import get_oracle
from solvers import Budget, run_solver
from solvers.base import load_backends
load_backends([{solver!r}])
loaded = {{m for m in {_WATCHED!r} if m in sys.modules}}
instance = make_instance([(10, 4, 5.0), (10, 4, 4.0), (10, 4, 3.0), (10, 4, 3.0)], 2, 10**6, "odd")
run_solver({solver!r}, instance, get_oracle("lookup"), Budget(1.0))
late = {{m for m in {_WATCHED!r} if m in sys.modules}} - loaded
print(json.dumps({{"loaded": sorted(loaded), "late": sorted(late)}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["late"] == [] and "scipy.optimize" in seen["loaded"], seen


def test_plan_loads_its_members_backends_before_its_clock_starts(monkeypatch):
    import shardbench.pipeline as pipeline

    calls = []
    real_price = pipeline.price
    monkeypatch.setattr(pipeline, "load_backends", lambda names: calls.append(("load", tuple(names))))
    monkeypatch.setattr(pipeline, "price", lambda *args, **kw: calls.append(("price",)) or real_price(*args, **kw))
    run(PlanRequest(_split(), "lookup", budget=1.0, solvers=("cpsat",)))
    assert calls == [("load", ("cpsat", SAFETY_NET)), ("price",)]
