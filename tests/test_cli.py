"""The CLI's vocabulary stays one: every option of every command has help text that shows its default, every
command has an example and is listed in the help above it, and the shared names (--budget, -o/--output)
mean the same everywhere."""
import argparse

import pytest

from shardbench.cli import build_parser, main


def _commands(parser, path=()):
    """(path, parser) of the top level and every (sub)command under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


COMMANDS = list(_commands(build_parser()))


def _listed(parser):
    """The subcommands a parser's help lists, with their help text."""
    return {c.dest: c.help for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for c in a._choices_actions}


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) or "shardbench" for p, _ in COMMANDS])
def test_every_command_has_an_example_and_every_option_help_with_its_default(path, parser):
    assert parser.epilog and parser.epilog.startswith("examples:\n"), f"{path}: no example"
    assert all(line.strip().startswith("shardbench") for line in parser.epilog.splitlines()[1:]), parser.epilog
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{' '.join(path)} {name}: no help text"
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in parser._get_formatter()._get_help_string(action), f"{name}: default not shown"
    children = [c for c in COMMANDS if c[0][:-1] == path and len(c[0]) == len(path) + 1]
    listed = _listed(parser)
    for child_path, _ in children:
        assert listed.get(child_path[-1]), f"{child_path[-1]} not listed with help under {path}"
        assert child_path[-1] in text


def test_defaults_are_shown_in_the_help(capsys):
    assert main(["solve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 10.0)" in out and "--time-limit" in out
    assert "default: torchrec, TorchRec's own estimator, or analytic where TorchRec cannot be imported" in out


@pytest.mark.parametrize("command", [["solve", "i.json", "--solver", "lpt"], ["recommend", "i.json"],
                                     ["plan", "i.json", "-o", "p.json"],
                                     ["show-plan", "p.json", "--instance", "i.json"]])
def test_every_command_with_an_oracle_defaults_to_the_one_python_uses(command):
    """The CLI leaves the default to the pipeline, which shardbench.plan and ShardbenchPlanner share."""
    import inspect

    import shardbench
    from shardbench.pipeline import DEFAULT_ORACLE, default_oracle

    assert build_parser().parse_args(command).oracle is None
    assert default_oracle() == (DEFAULT_ORACLE, ())  # TorchRec is installed here
    assert inspect.signature(shardbench.plan).parameters["oracle"].default is None
    assert inspect.signature(shardbench.ShardbenchPlanner).parameters["oracle"].default == DEFAULT_ORACLE


OUTPUT_COMMANDS = [("instances", "sample"), ("instances", "import-raw"), ("instances", "import-torchrec"), ("solve",),
                   ("plan",), ("export-torchrec",), ("flexshard",), ("buckets",), ("refit-recommender",), ("measure",),
                   ("train", "costmodel"), ("train", "policy"), ("summarize",), ("zoo",)]


@pytest.mark.parametrize("path", OUTPUT_COMMANDS, ids=[" ".join(p) for p in OUTPUT_COMMANDS])
def test_every_command_that_writes_a_file_takes_o_and_output(path):
    parser = dict(COMMANDS)[path]
    output = [a for a in parser._actions if "--output" in a.option_strings]
    assert output and "-o" in output[0].option_strings and output[0].dest == "output"


@pytest.mark.parametrize("path", [("solve",), ("plan",), ("recommend",)])
def test_the_time_budget_has_one_name(path):
    parser = dict(COMMANDS)[path]
    budget = [a for a in parser._actions if "--budget" in a.option_strings]
    assert budget and budget[0].dest == "budget"


def test_aliases_still_parse():
    parser = build_parser()
    assert parser.parse_args(["solve", "i.json", "--solver", "lpt", "--time-limit", "3"]).budget == 3.0
    assert parser.parse_args(["instances", "import-torchrec", "s.toml", "--out", "i.json"]).output == "i.json"
    assert parser.parse_args(["measure", "--out", "d.jsonl"]).output == "d.jsonl"


# ---------------------------------------------------------------- plan says what it did


def _saved(instance, tmp_path):
    from instances import save_instance

    path = tmp_path / f"{instance.id}.json"
    save_instance(instance, path)
    return str(path)


def _split_instance():
    from conftest import make_instance

    from instances import SHARDING_TYPES

    # One table much heavier than the rest: the best plan splits it, best-greedy solves whole tables only.
    return make_instance([(64, 16, 50.0)] + [(10, 4, 1.0)] * 6, 4, 10**6, "split", types=SHARDING_TYPES)


def test_plan_says_types_scope_and_the_problem_each_member_solved(tmp_path, capsys):
    import json

    out = tmp_path / "plan.json"
    assert main(["plan", _saved(_split_instance(), tmp_path), "--oracle", "lookup", "--budget", "2",
                 "--solvers", "split-greedy", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    members = {line.split()[0]: line for line in lines if line.startswith("  ") and " s  " in line}
    assert "(as posed)" in members["split-greedy"] and "<- kept" in members["split-greedy"]
    if "best-greedy" in members:
        assert "(whole tables only)" in members["best-greedy"] and "<- kept" not in members["best-greedy"]
    else:  # split-greedy's plan met the bound first and stopped it
        assert "  a proven optimum stopped the others" in lines
    report = json.loads(out.read_text())["report"]
    types = ", ".join(f"{k} {v} table{'s' if v != 1 else ''}" for k, v in report["sharding_type_counts"].items())
    assert f"  sharding types: {types}" in lines and sum(report["sharding_type_counts"].values()) == 7
    assert report["sharding_type_counts"].keys() - {"table_wise"}, "the heavy table is split"
    certificate = next(line for line in lines if line.startswith("  certificate:"))
    assert certificate.endswith("over the enumerated options (sharding types × shard counts)")
    assert report["optimal_over"] == "the enumerated options (sharding types × shard counts)"
    expected = {"split-greedy": "as posed", "best-greedy": "whole tables only"}
    if "best-greedy" not in members:
        del expected["best-greedy"]
    assert {m["solver"]: m["problem"] for m in report["members"]} == expected


def test_a_whole_table_plan_is_certified_over_whole_table_plans(tmp_path, capsys):
    assert main(["plan", _saved(_split_instance(), tmp_path), "--oracle", "lookup", "--budget", "1",
                 "--solvers", "lpt", "--sharding-types", "table_wise", "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "over whole-table plans" in out and "(whole tables only)" not in out


def _unfit(tmp_path, heavy: bool):
    """An instance no plan fits: one table larger than a device however cut (heavy), or more bytes in
    all than the devices hold."""
    from conftest import make_instance

    if heavy:
        return _saved(make_instance([(10**6, 64, 1.0), (10, 4, 1.0)], 2, 10**6, "heavy"), tmp_path)
    return _saved(make_instance([(1000, 64, 1.0)] * 4, 2, 200_000, "crowded"), tmp_path)


@pytest.mark.parametrize("heavy", [True, False], ids=["a table too big", "too many bytes"])
def test_an_instance_that_cannot_fit_gets_its_reason_from_plan_validate_and_recommend(heavy, tmp_path, capsys):
    path = _unfit(tmp_path, heavy)
    needle = "table t0 needs" if heavy else "tables need"
    assert main(["instances", "validate", path]) == 3
    captured = capsys.readouterr()
    assert "ok" not in captured.out and needle in captured.err and len(captured.err.splitlines()) == 1
    assert main(["recommend", path, "--oracle", "lookup"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("no plan:") and needle in err[0]
    assert main(["plan", path, "--oracle", "lookup", "--budget", "1", "--solvers", "lpt",
                 "-o", str(tmp_path / "p.json")]) == 3
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith("no plan: infeasible: ") and needle in err[0]
    assert "no plan within" not in captured.err and not (tmp_path / "p.json").exists()


def test_no_plan_names_every_member_cause():
    from shardbench.portfolio import Member, PortfolioResult
    from solvers import SolveResult, Status

    crashed = PortfolioResult(None, None, None, None, 1.0, (
        Member("a", None, 0.1, True, "ValueError: boom"), Member("b", None, 0.2, False, "process died (exit code -9)")))
    assert crashed.no_plan_reason == "every member failed: a: ValueError: boom; b: process died (exit code -9)"
    mixed = PortfolioResult(None, None, None, None, 3.0, (
        Member("a", SolveResult(Status.NO_PLAN, reason="ran out of time"), 3.0, True),
        Member("b", None, 9.0, True, "killed after 9.0 s")))
    assert mixed.no_plan_reason == "no member found one within 3.0 s: a: ran out of time; b: killed after 9.0 s"
    # A whole-table solver's infeasibility is no proof about split plans.
    whole = PortfolioResult(None, None, None, None, 1.0, (
        Member("w", SolveResult(Status.INFEASIBLE, reason="whole tables do not fit"), 0.1, False),))
    assert whole.no_plan_reason.startswith("no member found one")
