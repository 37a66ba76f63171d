"""Planner choice: workload features, the rule table fitted on evidence and evaluated leave-one-family-out,
`shardbench recommend`, `refit-recommender` and `plan` end to end, and their bad input."""
import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import make_instance
from hypothesis import given
from hypothesis import strategies as st

import shardbench
from benchmarks.refit import collect_evidence, leave_one_family_out
from benchmarks.runner import run_suite
from benchmarks.suite import load_suite
from shardbench.cli import main
from shardbench.recommend import NO_PLAN_REGRET, Rules, Workload, applicable, rule_key
from shardbench.workloads import Features, workload_features
from costmodels import get_oracle
from instances import load_plan, save_instance, save_instance_set
from instances.model import SHARDING_TYPES
from instances.sampler import MemorySpec, TaskSpec, sample_tasks
from solvers import Budget, run_solver


def test_features_of_a_hand_made_instance():
    # Costs under lookup are dim × pooling: 4·0.5, 4·0.5, 4·6 on 2 devices: balanced load 14, heaviest 24.
    instance = make_instance([(10, 4, 0.5), (10, 4, 0.5), (10, 4, 6.0)], 2, 10**6)
    f = workload_features(instance, "lookup", 1.0)
    assert (f.tables, f.devices, f.nodes, f.additive, f.budget) == (3, 2, 1, True, 1.0)
    assert f.heaviest == pytest.approx(24 / 14)
    costs = np.array([2.0, 2.0, 24.0])
    assert f.cost_cv == pytest.approx(costs.std() / costs.mean())
    assert f.tightness == pytest.approx(instance.table_storage()[:, 0].sum() / (2 * 10**6))
    assert f.split_share == 0.0  # make_instance allows table-wise only
    split = dataclasses.replace(instance, sharding_types=SHARDING_TYPES)
    assert workload_features(split, "lookup", 1.0).split_share == pytest.approx(1 / 3)  # only 24 ≥ 0.25 × 14
    assert not workload_features(instance, "neural-autoshard", 1.0).additive


def _workload(family, regrets: dict, features=None) -> Workload:
    features = features or Features(80, 8, 1, 0.5, 1.2, 1.0, 0.1, True, 1.0)
    results = {s: {"objective": None if r is None else 100.0 * (1 + r), "time": 1.0, "status": "feasible"}
               for s, r in regrets.items()}
    return Workload(family, "i", "lookup", features.budget, "instance", features, results)


def test_regret_counts_a_missing_plan_and_the_rules_rank_by_it():
    w = _workload("a", {"lpt": 0.02, "cpsat": 0.0, "local-search": None})
    assert w.regret("cpsat") == 0.0 and w.regret("lpt") == pytest.approx(0.02)
    assert w.regret("local-search") == NO_PLAN_REGRET and w.regret("never-ran") == NO_PLAN_REGRET
    rules = Rules.fit([w, _workload("b", {"lpt": 0.01, "cpsat": 0.0, "local-search": 0.0})], "coarse")
    ranking, source = rules.recommend(w.features)
    assert [r["solver"] for r in ranking] == ["cpsat", "lpt", "local-search"] and "rule" in source
    neural = Features(80, 8, 1, 0.5, 1.2, 1.0, 0.1, False, 1.0)
    assert "cpsat" not in rules.portfolio(neural) and "lpt" not in rules.portfolio(neural)


def test_leave_one_family_out_never_sees_the_held_out_family():
    # Family "a" alone favours lpt; "b" and "c" favour cpsat: held out, "a" is recommended cpsat.
    a = _workload("a", {"lpt": 0.0, "cpsat": 0.05})
    b = _workload("b", {"lpt": 0.05, "cpsat": 0.0})
    c = _workload("c", {"lpt": 0.05, "cpsat": 0.0})
    rows = {r["family"]: r for r in leave_one_family_out([a, b, c], "coarse")}
    assert rows["a"]["solver"] == "cpsat" and rows["a"]["regret"] == pytest.approx(0.05)
    assert rows["b"]["regret"] == 0.0


def _family(folder: Path, name: str, tables: int, devices: int) -> Path:
    tasks = sample_tasks(TaskSpec("autoshard", tables, count=2, num_devices=devices, memory=MemorySpec(tightness=1.3)))
    save_instance_set(tasks, folder / f"set-{name}", {})
    path = folder / f"workloads-{name}.toml"
    path.write_text(f'name = "workloads-{name}"\ninstances = "set-{name}"\nresults = "out/{name}.jsonl"\n'
                    'oracles = ["lookup"]\nsolvers = ["random", "lpt", "best-greedy", "split-greedy", "round-robin"]\n'
                    'sharding = ["table_wise", "instance"]\ntime_limits = [0.1, 1]\nrandom_seeds = [0]\nworkers = 2\n')
    return path


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evidence")
    suites = [_family(folder, "small", 20, 2), _family(folder, "mid", 40, 4)]
    for suite in suites:
        run_suite(load_suite(suite), quiet=True)
    return folder, suites


def test_refit_recommend_and_plan_end_to_end(evidence, tmp_path, capsys):
    folder, suites = evidence
    workloads = collect_evidence(suites)
    assert {w.family for w in workloads} == {"workloads-small", "workloads-mid"}
    assert {w.setting for w in workloads} == {"table_wise", "instance"}
    # A whole-table solver competes in the split setting too; a splitting one only in its own.
    split = next(w for w in workloads if w.setting == "instance")
    assert "lpt" in split.results and "split-greedy" in split.results
    rules_path = tmp_path / "rules.json"
    assert main(["refit-recommender", *map(str, suites), "-o", str(rules_path)]) == 0
    out = capsys.readouterr().out
    assert "held-out (leave one family out)" in out and "rules" in out
    rules = Rules.load(rules_path)
    assert len(rules.evidence) == len(workloads) and rules.granularity in ("coarse", "fine")
    instance = sample_tasks(TaskSpec("autoshard", 30, count=1, num_devices=3, memory=MemorySpec(tightness=1.3)))[0]
    path = tmp_path / "i.json"
    save_instance(instance, path)
    assert main(["recommend", str(path), "--oracle", "lookup", "--budget", "1", "--rules", str(rules_path)]) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "nearest workloads" in out
    plan_path = tmp_path / "plan.json"
    assert main(["plan", str(path), "--oracle", "lookup", "--budget", "1", "--rules", str(rules_path),
                 "-o", str(plan_path)]) == 0
    report = json.loads(plan_path.read_text())["report"]
    plan = load_plan(plan_path, instance)
    greedy = run_solver("best-greedy", instance, get_oracle("lookup"), Budget(1.0), 0)
    assert report["objective"] <= greedy.objective * (1 + 1e-9)
    assert report["objective"] == pytest.approx(get_oracle("lookup").plan_cost(instance, plan))
    assert report["lower_bound"] <= report["objective"] * (1 + 1e-9)


def test_a_proven_optimum_stops_the_portfolio(tmp_path):
    # One table per device: the plan meets the bound at once, and local search's 30 s are not waited for.
    instance = make_instance([(10, 4, 1.0), (10, 4, 1.0)], 2, 10**6)
    result = shardbench.plan(instance, "lookup", 30.0, ["local-search", "lpt"])
    assert result.plan is not None and result.wall_s < 20
    assert any(m.status == "optimal" for m in result.members)


def test_a_whole_table_optimum_does_not_stop_a_split_portfolio():
    # One table much heavier than the rest: best-greedy's whole-table plan is optimal among whole-table
    # plans at once, yet splitting that table does better, and the split member must be waited for.
    instance = make_instance([(64, 16, 50.0)] + [(10, 4, 1.0)] * 6, 4, 10**6, types=SHARDING_TYPES)
    result = shardbench.plan(instance, "lookup", 2.0, ["split-greedy"])
    whole = run_solver("best-greedy", instance.restricted_to(("table_wise",)), get_oracle("lookup"), Budget(2.0), 0)
    assert whole.status.value == "optimal"
    assert result.solver == "split-greedy" and result.objective < whole.objective * 0.9
    # Only a split plan proven optimal may stop it early (the packing bound meets this one), never the
    # whole-table optimum.
    finishers = [m for m in result.members if m.result is not None and m.result.status.value == "optimal"]
    assert not result.stopped_early or (finishers and all(m.posed for m in finishers))


def test_the_portfolio_prices_the_options_once_before_its_members_start(tmp_path, monkeypatch):
    from costmodels.base import Oracle
    from solvers.candidates import Candidates

    log = tmp_path / "pricing"

    def logged(priced):
        def wrapper(*args):
            with open(log, "a") as out:
                out.write(f"{os.getpid()}\n")
            return priced(*args)
        return wrapper

    monkeypatch.setattr(Candidates, "build", classmethod(logged(Candidates.build.__func__)))
    monkeypatch.setattr(Oracle, "table_wise", logged(Oracle.table_wise))
    instance = sample_tasks(TaskSpec("autoshard", 40, count=1, num_devices=4, memory=MemorySpec(tightness=1.5)))[0]
    result = shardbench.plan(instance, "analytic", 1.0, ["split-greedy", "local-search", "lpt"])
    assert result.plan is not None and len(result.members) == 4 and not result.stopped_early
    assert set(log.read_text().split()) == {str(os.getpid())}  # the members forked afterwards priced nothing


def test_a_plan_certified_within_the_gap_stops_the_portfolio():
    instance = sample_tasks(TaskSpec("autoshard", 40, count=1, num_devices=4, memory=MemorySpec(tightness=1.5)))[0]
    result = shardbench.plan(instance, "analytic", 60.0, ["split-greedy", "local-search"], gap=0.5)
    assert result.stopped_early and result.plan is not None and result.gap <= 0.5


def test_whole_table_bounds_do_not_bound_a_split_plan():
    instance = sample_tasks(TaskSpec("autoshard", 40, count=1, num_devices=4, memory=MemorySpec(tightness=1.5)))[0]
    result = shardbench.plan(instance, "lookup", 1.0, ["split-greedy"])
    whole = run_solver("lpt", instance.restricted_to(("table_wise",)), get_oracle("lookup"), Budget(1.0), 0)
    assert result.bound is not None and result.bound <= result.objective * (1 + 1e-9)
    assert result.objective <= whole.objective * (1 + 1e-9)


@pytest.mark.parametrize("argv, needle", [
    (["--oracle", "nope"], "unknown oracle"),
    (["--budget", "0"], "--budget"),
    (["--budget", "-1"], "--budget"),
    (["--rules", "RULES_CORRUPT"], "not a recommender rules file"),
])
def test_bad_questions_fail_in_one_line(tmp_path, capsys, argv, needle):
    instance = make_instance([(10, 4, 1.0)], 2, 10**6)
    path = tmp_path / "i.json"
    save_instance(instance, path)
    corrupt = tmp_path / "rules.json"
    corrupt.write_text("{not json")
    argv = [a.replace("RULES_CORRUPT", str(corrupt)) for a in argv]
    for command in (["recommend", str(path)], ["plan", str(path), "-o", str(tmp_path / "p.json")]):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
        assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("gap", ["1", "100%", "-1", "-0.5%", "x", "%", "nan"])
def test_a_gap_outside_0_to_0_99_is_refused(tmp_path, capsys, gap):
    path = tmp_path / "i.json"
    save_instance(make_instance([(10, 4, 1.0)], 2, 10**6), path)
    for command in (["plan", str(path), "-o", str(tmp_path / "p.json")], ["solve", str(path), "--solver", "lpt"]):
        assert main([*command, "--gap", gap]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--gap" in err[0]
        assert not (tmp_path / "p.json").exists()


@given(st.decimals(0, "0.99", places=4))
def test_a_gap_reads_the_same_as_a_fraction_or_a_percentage(fraction):
    from shardbench.args import gap_fraction

    assert gap_fraction(str(fraction)) == gap_fraction(f"{fraction * 100}%") == float(fraction)


def test_the_cli_and_python_share_the_gap_unit_and_plan_takes_time_limit_as_solve_does(tmp_path):
    """`--gap 0.5%`, `--gap 0.005` and `gap=0.005` are one target, recorded as the fraction."""
    from shardbench.cli import build_parser

    parser = build_parser()
    for command in (["plan", "i.json", "-o", "p.json"], ["solve", "i.json", "--solver", "lpt"],
                    ["recommend", "i.json"]):
        assert parser.parse_args([*command, "--time-limit", "3"]).budget == 3.0
        if command[0] != "recommend":
            percent, fraction = (parser.parse_args([*command, "--gap", g]).gap for g in ("0.5%", "0.005"))
            assert percent == fraction == 0.005
    path = tmp_path / "i.json"
    instance = make_instance([(10, 4, 1.0), (20, 4, 2.0)], 2, 10**6)
    save_instance(instance, path)
    assert main(["plan", str(path), "--oracle", "lookup", "--time-limit", "1", "--solvers", "lpt", "--gap", "0.5%",
                 "-o", str(tmp_path / "p.json")]) == 0
    report = json.loads((tmp_path / "p.json").read_text())["report"]
    assert report["gap_target"] == 0.005 and report["budget"] == 1.0
    python = shardbench.plan(instance, "lookup", 1.0, ["lpt"], gap=0.005)
    assert python.objective == report["objective"]


def test_refit_refuses_empty_or_corrupt_stores(evidence, tmp_path, capsys):
    folder, suites = evidence
    empty = tmp_path / "workloads-empty.toml"
    empty.write_text(f'name = "workloads-empty"\ninstances = "{folder / "set-small"}"\nresults = "empty.jsonl"\n'
                     'oracles = ["lookup"]\nsolvers = ["lpt"]\n')
    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "rules.json"
    assert main(["refit-recommender", str(empty), str(suites[1]), "-o", str(out)]) == 2
    assert "the store is empty" in capsys.readouterr().err and not out.exists()
    (tmp_path / "empty.jsonl").write_text("garbage\n{}\n")
    assert main(["refit-recommender", str(empty), str(suites[1]), "-o", str(out)]) == 2
    assert "empty.jsonl" in capsys.readouterr().err and not out.exists()
    assert main(["refit-recommender", str(suites[1]), "-o", str(out)]) == 2
    assert "at least two workload families" in capsys.readouterr().err and not out.exists()


def test_rule_keys_separate_what_they_should():
    small = Features(20, 2, 1, 0.9, 0.5, 0.5, 0.0, True, 0.1)
    big = Features(5000, 512, 64, 0.3, 2.5, 3.0, 0.2, True, 10.0)
    assert rule_key(small, "coarse") != rule_key(big, "coarse")
    assert rule_key(small, "fine").startswith(rule_key(small, "coarse"))


def test_the_shipped_rules_load_and_answer_for_every_oracle_kind():
    rules = Rules.load()
    assert {w.family for w in rules.evidence} >= {"workloads-80x8", "workloads-5000x512"}
    instance = sample_tasks(TaskSpec("autoshard", 60, count=1, num_devices=6, memory=MemorySpec(tightness=1.2)))[0]
    for oracle in ("lookup", "analytic", "neural-dreamshard"):
        features = workload_features(instance, oracle, 5.0)
        portfolio = rules.portfolio(features)
        assert portfolio and all(applicable(s, features) for s in portfolio)


def test_members_still_plan_when_pricing_took_the_whole_budget(tmp_path, monkeypatch, capsys):
    # Pricing that outlasts the promised wall time must not leave the members no time at all: each gets
    # its first-plan allowance, and plan says that pricing ran past the budget.
    from solvers.candidates import Problem

    priced = Problem.priced.__func__

    def slow(cls, *args, **kwargs):
        time.sleep(3.0)
        return priced(cls, *args, **kwargs)

    monkeypatch.setattr(Problem, "priced", classmethod(slow))
    path = tmp_path / "i.json"
    save_instance(make_instance([(10, 4, 1.0), (20, 4, 2.0), (30, 4, 3.0)], 2, 10**6), path)
    assert main(["plan", str(path), "--oracle", "lookup", "--budget", "0.5", "--solvers", "lpt",
                 "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "past the budget" in out and (tmp_path / "p.json").exists()
