"""Argument types and the parser of the command line: bad arguments are reported in one line naming the
argument and the reason, with exit status 2."""
from __future__ import annotations

import argparse
import math
from decimal import Decimal, InvalidOperation

from instances import SHARDING_TYPES
from instances.kernels import KERNELS
from solvers import MAX_SEED, MAX_TIME_LIMIT

EXIT_ERROR = 2


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (unless it has none, or says it itself); descriptions and
    examples keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
                or not action.option_strings):
            return text
        shown = ",".join(default) if isinstance(default, tuple) else "%(default)s"
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage block) and exits 2, and formats help with
    HelpFormatter (its subcommands' parsers too)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_ERROR, f"error: {self.prog}: {message}\n")


def number(kind, low=None, high=None, low_open=False, what="value"):
    """An argparse type: a finite `kind` within [low, high] (or (low, high] when low_open)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}")
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


def examples(*lines: str) -> str:
    """A subcommand's epilog: the command lines shown under its help."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


TIME_LIMIT = number(float, 0, MAX_TIME_LIMIT, low_open=True, what="seconds")
SEED = number(int, 0, MAX_SEED, what="seed")
MAX_GAP = 0.99


def gap_fraction(text: str) -> float:
    """An argparse type: a gap as everywhere else, a fraction of the bound ("0.005"), or in percent with the
    sign ("0.5%"), in [0, MAX_GAP]."""
    percent = text.strip().endswith("%")
    try:  # in decimal, so that 0.7% is the fraction 0.007 written out
        number = Decimal(text.strip().removesuffix("%"))
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"must be a fraction such as 0.005 or a percentage such as 0.5%, got {text!r}")
    value = float(number / 100 if percent else number) if number.is_finite() else math.nan
    if not 0 <= value <= MAX_GAP:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, {MAX_GAP:g}] (or a percentage up to "
                                         f"{100 * MAX_GAP:g}%), got {text!r}")
    return value


GAP_HELP = ("stop once a plan is certified within this fraction of the proven bound, e.g. 0.005, or 0.5%% "
            "(default: 0, run the budget out unless a plan is proven optimal)")
POSITIVE = number(int, 1, what="count")


def name_list(names: tuple[str, ...], what: str):
    """An argparse type: a comma-separated list of distinct names from `names`, or `all`."""
    def parse(text: str) -> tuple[str, ...]:
        if text.strip() == "all":
            return names
        chosen = tuple(k.strip() for k in text.split(",") if k.strip())
        bad = [k for k in chosen if k not in names]
        if not chosen or bad or len(set(chosen)) != len(chosen):
            raise argparse.ArgumentTypeError(f"must be 'all' or distinct names from {', '.join(names)}, got {text!r}")
        return chosen
    parse.__name__ = what  # argparse names the type in its messages
    return parse


def move_budget(text: str) -> int | None:
    """An argparse type: a move budget in bytes — a size with a unit, 0, or `unlimited` (None)."""
    from instances import InstanceError

    from .replanning import move_budget_bytes

    try:
        return move_budget_bytes(text, "--move-budget")
    except InstanceError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from exc


move_budget.__name__ = "move budget"  # argparse names the type in its messages

sharding_types = name_list(SHARDING_TYPES, "sharding types")
compute_kernels = name_list(KERNELS, "compute kernels")
