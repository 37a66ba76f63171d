"""The CLI reference, docs/cli.md, generated from the `shardbench` argument parser so that it cannot drift
from the code: `python -m benchmarks.cli_reference -o docs/cli.md` (tests/test_docs.py checks it is current).

argparse has no public API to walk a parser, so this reads its `_actions` and subparser choices, as
documentation generators for argparse do; any command the parser gains is picked up by the walk."""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PARSER = "shardbench.cli:build_parser"
USAGE_WIDTH = 100  # fixed, so that the page does not depend on the terminal it was generated in
REGENERATE = "python -m benchmarks.cli_reference -o docs/cli.md"


@dataclass(frozen=True)
class Command:
    """One parser in the tree: its full name (`shardbench instances sample`), the one-line help its parent
    gave it, its other names, and the parser itself."""

    name: str
    summary: str
    aliases: tuple[str, ...]
    parser: argparse.ArgumentParser


def load_parser(spec: str = DEFAULT_PARSER) -> argparse.ArgumentParser:
    """The parser returned by `module:function`."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, tuple[str, ...], argparse.ArgumentParser]]:
    """(name, help, aliases, parser) of each direct subcommand, in the order they were added."""
    out = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._get_subactions()}
        seen: dict[int, int] = {}
        for name, child in action.choices.items():
            if id(child) in seen:  # an alias: the same parser under another name
                first = out[seen[id(child)]]
                out[seen[id(child)]] = (first[0], first[1], first[2] + (name,), first[3])
                continue
            seen[id(child)] = len(out)
            out.append((name, helps.get(name, ""), (), child))
    return out


def commands(parser: argparse.ArgumentParser, name: str | None = None, summary: str = "",
             aliases: tuple[str, ...] = ()) -> list[Command]:
    """Every parser in the tree, depth first: the root, then each subcommand and its own subcommands."""
    name = name or parser.prog
    found = [Command(name, summary, aliases, parser)]
    for child_name, child_help, child_aliases, child in _subcommands(parser):
        found += commands(child, f"{name} {child_name}", child_help, child_aliases)
    return found


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        shown = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        shown = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        shown = action.dest if not action.option_strings else action.dest.upper()
    nargs = action.nargs
    if nargs == "?":
        return f"[{shown}]"
    if nargs == "*":
        return f"[{shown} ...]"
    if nargs == "+":
        return f"{shown} [{shown} ...]"
    if isinstance(nargs, int):
        return " ".join([shown] * nargs)
    return shown


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return _metavar(action)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    return ", ".join(action.option_strings) + " " + _metavar(action)


def _value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's %-placeholders filled in, on one line."""
    text = action.help or ""
    if "%" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = prog
        params = {k: getattr(v, "__name__", v) if callable(v) else v for k, v in params.items()}
        if params.get("choices") is not None:
            params["choices"] = ", ".join(map(str, params["choices"]))
        text = text % params
    return " ".join(text.split())


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.required or default is None or default is argparse.SUPPRESS or action.nargs == 0:
        return ""  # a flag's default is its absence
    shown = _value(default)
    return f"`{shown}`" if shown else "(empty)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(name: str) -> str:
    return name.replace(" ", "-")


def _section(command: Command) -> list[str]:
    parser = command.parser
    lines = [f"## {command.name}", ""]
    if command.aliases:
        lines += [f"Also: {', '.join(f'`{a}`' for a in command.aliases)}.", ""]
    intro = parser.description or command.summary
    if intro:
        lines += [" ".join(intro.split()), ""]
    lines += ["```text", _usage(parser), "```", ""]
    hidden = (argparse._HelpAction, argparse._SubParsersAction)
    shown = [a for a in parser._actions if a.help is not argparse.SUPPRESS and not isinstance(a, hidden)]
    if shown:
        lines += ["| argument | what it is | default |", "|---|---|---|"]
        for action in shown:
            required = " (required)" if action.required and action.option_strings else ""
            lines.append(f"| `{_cell(_invocation(action))}`{required} | {_cell(_help(action, parser.prog))} | "
                         f"{_cell(_default(action))} |")
        lines.append("")
    subcommands = _subcommands(parser)
    if subcommands:
        lines += ["| command | what it does |", "|---|---|"]
        for name, summary, _, _ in subcommands:
            full = f"{command.name} {name}"
            lines.append(f"| [`{full}`](#{_anchor(full)}) | {_cell(' '.join(summary.split()))} |")
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    return lines


def reference(parser: argparse.ArgumentParser) -> str:
    """The Markdown page for every command of `parser`."""
    tree = commands(parser)
    lines = [f"# `{parser.prog}` command reference", "",
             f"Generated from the argument parser by `{REGENERATE}`; do not edit by hand.", ""]
    lines += [f"- [`{c.name}`](#{_anchor(c.name)}){' — ' + ' '.join(c.summary.split()) if c.summary else ''}"
              for c in tree[1:]]
    lines.append("")
    for command in tree:
        lines += _section(command)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m benchmarks.cli_reference", description=__doc__)
    cli.add_argument("-o", "--output", help="write the page here (default: standard output)")
    cli.add_argument("--parser", default=DEFAULT_PARSER, help="the parser to document, as module:function "
                     "(default: %(default)s)")
    args = cli.parse_args(argv)
    text = reference(load_parser(args.parser))
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            print(f"error: {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
