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
    assert "(default: 10.0)" in out and "(default: lookup)" in out and "--time-limit" in out


OUTPUT_COMMANDS = [("instances", "sample"), ("instances", "import-raw"), ("instances", "import-torchrec"), ("solve",),
                   ("plan",), ("export-torchrec",), ("flexshard",), ("buckets",), ("refit-recommender",), ("measure",),
                   ("train", "costmodel"), ("train", "policy"), ("summarize",)]


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
