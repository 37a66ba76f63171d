"""Benchmark suites: a TOML file naming an instance set, solvers, oracles, time limits and seeds.
Paths inside a suite are relative to the suite file."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from costmodels import get_oracle
from solvers import get_solver


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

    @property
    def leaderboard_path(self) -> Path:
        return self.results.with_suffix(".md")

    @property
    def plot_path(self) -> Path:
        return self.results.with_suffix(".png")


_KNOWN = {"name", "description", "instances", "solvers", "oracles", "time_limits", "seeds", "random_seeds",
          "results", "workers", "judge"}


def _list(data: dict, key: str, kind: type, path: Path, default=None) -> tuple:
    value = data.get(key, default)
    if value is None:
        raise SuiteError(f"{path}: {key}: missing")
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise SuiteError(f"{path}: {key}: must be a non-empty list of {getattr(kind, '__name__', 'number')}")
    return tuple(value)


def load_suite(path: str | Path) -> Suite:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read suite ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise SuiteError(f"{path}: {unknown[0]}: unknown field")
    for key in ("name", "instances", "results"):
        if not isinstance(data.get(key), str):
            raise SuiteError(f"{path}: {key}: missing or not a string")
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
    if any(t <= 0 for t in time_limits):
        raise SuiteError(f"{path}: time_limits: must be > 0")
    workers = data.get("workers", os.cpu_count() or 1)
    if not isinstance(workers, int) or workers <= 0:
        raise SuiteError(f"{path}: workers: must be a positive integer")
    base = path.parent
    instances = (base / data["instances"]).resolve()
    if not instances.exists():
        raise SuiteError(f"{path}: instances: {instances} does not exist")
    return Suite(
        name=data["name"], path=path, instances=instances, solvers=solvers, oracles=oracles,
        time_limits=time_limits, seeds=_list(data, "seeds", int, path, [0]),
        random_seeds=_list(data, "random_seeds", int, path, list(range(10))),
        results=(base / data["results"]).resolve(), workers=workers, description=data.get("description", ""),
        judge=judge,
    )
