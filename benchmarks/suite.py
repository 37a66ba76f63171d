"""Benchmark suites: a TOML file naming an instance set, solvers, oracles, time limits and seeds.
Paths inside a suite are relative to the suite file. A `[grid]` table of parameter = [values] makes the
file a family of suites, one per combination of values, each with its own instance set and results
store: `{parameter}` in name, description, instances and results stands for the value."""
from __future__ import annotations

import itertools
import math
import os
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from costmodels import get_oracle
from instances import SHARDING_TYPES, InstanceError
from instances.io import read_text
from solvers import MAX_SEED, MAX_TIME_LIMIT, get_solver

MAX_WORKERS = 1024
_ROOT = Path(__file__).resolve().parent.parent
STORES = _ROOT / "benchmarks" / "results"
PAGES = _ROOT / "docs" / "results"
MAX_GRID_POINTS = 1024  # suites one file may describe


class SuiteError(ValueError):
    pass


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    instances: Path
    solvers: tuple[str, ...]
    oracles: tuple[str, ...]
    time_limits: tuple[float, ...]
    seeds: tuple[int, ...]
    random_seeds: tuple[int, ...]
    results: Path
    workers: int
    description: str = ""
    judge: str | None = None
    sharding: tuple[str, ...] = ("instance",)
    peer_deadline: float = 900.0  # seconds a solver that ignores its budget may run before it is killed

    @property
    def leaderboard_path(self) -> Path:
        return page_path(self.results, ".md")

    @property
    def plot_path(self) -> Path:
        return page_path(self.results, ".png")

    def relocated(self, directory: Path) -> Suite:
        """The same suite with its store (and so its pages) in `directory`: a run that leaves the committed
        store and pages alone."""
        return replace(self, results=Path(directory).resolve() / self.results.name)


def page_path(store: Path, suffix: str) -> Path:
    """Where a page made from a results store goes: a store under the repository's benchmarks/results (data)
    publishes at the same place under docs/results (pages); any other store, beside itself."""
    store = Path(store).resolve()
    if store.is_relative_to(STORES):
        return (PAGES / store.relative_to(STORES)).with_suffix(suffix)
    return store.with_suffix(suffix)


_KNOWN = {"name", "description", "instances", "solvers", "oracles", "time_limits", "seeds", "random_seeds",
          "results", "workers", "judge", "sharding", "peer_deadline", "grid"}
GRID_FIELDS = ("name", "description", "instances", "results")  # where a grid parameter's {name} is replaced
_PARAMETER = re.compile(r"\{(\w+)\}")


def _settings(data: dict, path: Path) -> tuple[str, ...]:
    """Sharding settings: "instance" (the instance's own types), "all", or a comma-separated list of
    types; normalised to "instance" or the types in their canonical order."""
    out = []
    for entry in _list(data, "sharding", str, path, ["instance"]):
        if entry == "instance":
            out.append(entry)
            continue
        kinds = SHARDING_TYPES if entry == "all" else tuple(k.strip() for k in entry.split(","))
        bad = [k for k in kinds if k not in SHARDING_TYPES]
        if bad or not kinds:
            raise SuiteError(f"{path}: sharding: {entry!r} is not 'instance', 'all' or a list of {SHARDING_TYPES}")
        out.append(",".join(k for k in SHARDING_TYPES if k in kinds))
    if len(set(out)) != len(out):
        raise SuiteError(f"{path}: sharding: lists a setting twice")
    return tuple(out)


def _list(data: dict, key: str, kind: type, path: Path, default=None) -> tuple:
    value = data.get(key, default)
    if value is None:
        raise SuiteError(f"{path}: {key}: missing")
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SuiteError(f"{path}: {key}: must be a non-empty list of {getattr(kind, '__name__', 'number')}")
    if len(set(value)) != len(value):
        raise SuiteError(f"{path}: {key}: lists a value twice")
    return tuple(value)


def _seeds(data: dict, key: str, path: Path, default: list[int]) -> tuple[int, ...]:
    seeds = _list(data, key, int, path, default)
    bad = next((s for s in seeds if not 0 <= s <= MAX_SEED), None)
    if bad is not None:
        raise SuiteError(f"{path}: {key}: seeds must be in 0..{MAX_SEED}, got {bad}")
    return seeds


def _grid_points(data: dict, path: Path) -> list[dict[str, str]]:
    """Every combination of the grid's values (the first parameter varies slowest), as text; one empty
    point without a grid."""
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise SuiteError(f"{path}: grid: must be a table of parameter = [values]")
    values = {}
    for key, listed in grid.items():
        if not re.fullmatch(r"\w+", key):
            raise SuiteError(f"{path}: grid.{key}: a parameter name is letters, digits and underscores")
        if not isinstance(listed, list) or not listed or \
                not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in listed):
            raise SuiteError(f"{path}: grid.{key}: must be a non-empty list of strings or numbers")
        texts = [str(v) for v in listed]
        if len(set(texts)) != len(texts):
            raise SuiteError(f"{path}: grid.{key}: lists a value twice")
        values[key] = texts
    if math.prod(len(v) for v in values.values()) > MAX_GRID_POINTS:
        raise SuiteError(f"{path}: grid: more than {MAX_GRID_POINTS} combinations")
    return [dict(zip(values, combination)) for combination in itertools.product(*values.values())]


def _at_point(data: dict, point: dict[str, str], path: Path) -> dict:
    """The suite's fields with the grid point's values in place of their {parameter}s."""
    if not point:
        return data
    fields = dict(data)
    for key in GRID_FIELDS:
        value = data.get(key)
        if not isinstance(value, str):
            continue  # the member's own checks name it
        unknown = next((name for name in _PARAMETER.findall(value) if name not in point), None)
        if unknown is not None:
            raise SuiteError(f"{path}: {key}: {{{unknown}}} is not a grid parameter")
        fields[key] = _PARAMETER.sub(lambda match: point[match.group(1)], value)
    return fields


def load_suites(path: str | Path) -> tuple[Suite, ...]:
    """The suites a file describes: itself, or one per point of its grid (in the grid's order)."""
    path = Path(path)
    if path.is_dir():
        raise SuiteError(f"{path}: is a directory, not a suite file")
    try:
        data = tomllib.loads(read_text(path, "suite"))
    except InstanceError as exc:
        raise SuiteError(str(exc)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise SuiteError(f"{path}: {unknown[0]}: unknown field")
    suites = tuple(_member(_at_point(data, point, path), path) for point in _grid_points(data, path))
    for key in ("name", "results"):
        seen = [getattr(suite, key) for suite in suites]
        shared = next((value for value in seen if seen.count(value) > 1), None)
        if shared is not None:
            raise SuiteError(f"{path}: {key}: the grid gives {shared} to several suites; name every grid "
                             f"parameter in {key}")
    return suites


def load_suite(path: str | Path) -> Suite:
    """The one suite of a file (a grid of one point included)."""
    suites = load_suites(path)
    if len(suites) > 1:
        raise SuiteError(f"{path}: grid: describes {len(suites)} suites; this command takes a single suite")
    return suites[0]


def _member(data: dict, path: Path) -> Suite:
    """One suite from its fields, every field checked."""
    for key in ("name", "instances", "results"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise SuiteError(f"{path}: {key}: missing or not a non-empty string")
    solvers = _list(data, "solvers", str, path)
    oracles = _list(data, "oracles", str, path)
    for name in solvers:
        get_solver(name)
    judge = data.get("judge")
    if judge is not None and not isinstance(judge, str):
        raise SuiteError(f"{path}: judge: must be an oracle name")
    for name in (*oracles, *([judge] if judge else [])):
        get_oracle(name)
    time_limits = tuple(float(t) for t in _list(data, "time_limits", (int, float), path, [10.0]))
    if not all(math.isfinite(t) and 0 < t <= MAX_TIME_LIMIT for t in time_limits):
        raise SuiteError(f"{path}: time_limits: each must be a finite number of seconds in (0, {MAX_TIME_LIMIT:g}]")
    workers = data.get("workers", os.cpu_count() or 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 0 < workers <= MAX_WORKERS:
        raise SuiteError(f"{path}: workers: must be an integer in 1..{MAX_WORKERS}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SuiteError(f"{path}: description: must be a string")
    base = path.parent
    instances = (base / data["instances"]).resolve()
    if not instances.exists():
        raise SuiteError(f"{path}: instances: {instances} does not exist")
    peer_deadline = data.get("peer_deadline", 900.0)
    if isinstance(peer_deadline, bool) or not isinstance(peer_deadline, (int, float)) or \
            not (math.isfinite(peer_deadline) and 0 < peer_deadline <= MAX_TIME_LIMIT):
        raise SuiteError(f"{path}: peer_deadline: must be a number of seconds in (0, {MAX_TIME_LIMIT:g}]")
    results = (base / data["results"]).resolve()
    if results.is_dir() or results.suffix != ".jsonl":
        raise SuiteError(f"{path}: results: must name a .jsonl file, got {data['results']!r}")
    return Suite(
        name=data["name"], path=path, instances=instances, solvers=solvers, oracles=oracles,
        time_limits=time_limits, seeds=_seeds(data, "seeds", path, [0]),
        random_seeds=_seeds(data, "random_seeds", path, list(range(10))),
        results=results, workers=workers, description=description, judge=judge, sharding=_settings(data, path),
        peer_deadline=float(peer_deadline),
    )
