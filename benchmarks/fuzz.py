"""Malformed inputs for the reliability suite: valid documents of every file kind the command line reads,
mutations that break them the ways real files break (wrong types, NaN/inf, negatives, huge values,
missing and unknown keys, wrong schema versions, empty, truncated, binary, UTF-16 and deeply nested
files, a directory or a dangling link instead of a file), and the check that a command handled one:
exit 0 (the input was still valid) or 2 with one line on stderr naming the problem, no traceback, and
no output file left behind. Tests drive the mutations with hypothesis, `benchmarks.reliability` with
seeded draws, through one function."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from instances import instance_to_dict
from instances.model import Instance, Table, Topology, Workload


def _table(name: str, rows: int, dim: int, pooling: float, **extra) -> Table:
    return Table(name=name, rows=rows, dim=dim, dtype_bytes=2, pooling_factor=pooling,
                 reuse_bins=(0.5, 0.5) + (0.0,) * 15, **extra)


def base_instance() -> Instance:
    from instances.model import BucketSpec, RowDistribution

    tables = (_table("a", 1000, 16, 2.0), _table("b", 500, 8, 1.0),
              _table("s", 4000, 16, 3.0, pooled=False, row_distribution=RowDistribution("power_law", alpha=1.05),
                     buckets=BucketSpec(64, "interleave")))
    return Instance("fuzz", tables, Topology(1, 2, 1 << 30), Workload(batch_size=512)).validate()


def _plan_doc() -> dict:
    from instances.sharding import Plan, Shard, TableSharding, plan_to_dict, row_cuts

    instance = base_instance()
    a, b, seq = instance.tables
    plan = Plan(instance.id, (
        TableSharding("column_wise", (Shard(0, (0, a.rows), (0, 8)), Shard(1, (0, a.rows), (8, 16)))),
        TableSharding("table_wise", (Shard(1, (0, b.rows), (0, b.dim)),)),
        TableSharding("row_wise", tuple(Shard(d, r, (0, seq.dim)) for d, r in enumerate(row_cuts(seq.rows, 2))))))
    return plan_to_dict(plan, instance)


def _torchrec_spec() -> dict:
    return {"tables": [{"name": "u", "num_embeddings": 100, "embedding_dim": 16, "data_type": "fp16",
                        "pooling_factors": [2.0], "sharding_types": ["table_wise", "row_wise"]},
                       {"name": "v", "num_embeddings": 40, "embedding_dim": 8, "pooling_factors": [1.0]}],
            "world_size": 2, "hbm_cap": 2**30, "batch_size": 64}


def _suite_doc() -> dict:
    return {"name": "fuzz", "instances": "set", "results": "out/fuzz.jsonl", "solvers": ["lpt"],
            "oracles": ["lookup"], "time_limits": [1.0], "seeds": [0], "random_seeds": [0], "workers": 1}


def _pool_doc() -> list:
    return [{"row": 100 + 10 * i, "pooling_factor": 1.0 + i, **{f"bin_{b}": (1.0 if b == 0 else 0.0) for b in range(17)}}
            for i in range(3)]


def _dataset_doc() -> list:
    records = []
    for k in range(6):
        features = [[16.0, 100.0 + k, 1.0, 1600.0 + 16 * k] + [1.0] + [0.0] * 16]
        records.append({"id": k, "split": "test" if k % 3 == 0 else "train", "pool_indices": [k], "dims": [16],
                        "features": features, "batch": 64, "forward_s": 0.001 + k * 1e-4, "backward_s": 0.002,
                        "total_s": 0.003 + k * 1e-4, "single_total_s": [0.003]})
    return records


def _store_doc() -> list:
    return [{"instance": "fuzz", "solver": "lpt", "oracle": "lookup", "time_limit": 1.0, "seed": 0, "judge": "lookup",
             "status": "feasible", "solve_time": 0.01, "objective": 3.0, "balance": 1.0, "instance_bound": 3.0,
             "lower_bound": 3.0}]


def _rules_doc() -> dict:
    features = {"tables": 3, "devices": 2, "nodes": 1, "tightness": 0.5, "heaviest": 1.2, "cost_cv": 0.8,
                "split_share": 0.3, "additive": True, "budget": 1.0}
    row = {"solver": "lpt", "mean_regret": 0.0, "max_regret": 0.0, "mean_time": 0.01, "within": 1, "misses": 0,
           "workloads": 1}
    return {"granularity": "coarse", "rules": {"≤100 tables | ≤3 s | additive | splits": [row]},
            "evidence": [{"family": "workloads-fuzz", "instance": "fuzz", "oracle": "lookup", "budget": 1.0,
                          "setting": "instance", "features": features,
                          "results": {"lpt": {"objective": 3.0, "time": 0.01, "status": "feasible"}}}]}


# ---------------------------------------------------------------- documents and their writers


def toml_text(doc: dict) -> str:
    """A flat TOML document (what a suite is) from a dict; values TOML cannot write raise ValueError."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise ValueError(f"no TOML for {v!r}")
    return "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in doc.items() if v is not None)


@dataclass(frozen=True)
class Kind:
    """A file kind: its valid document, how it is written, and the keys it cannot do without."""

    name: str
    document: Callable[[], Any]
    write: Callable[[Any], str]
    required: frozenset[str]
    strict: bool  # unknown keys are rejected


def _json(doc: Any) -> str:
    return json.dumps(doc, indent=1, allow_nan=True)


def _jsonl(doc: list) -> str:
    return "".join(json.dumps(r, allow_nan=True) + "\n" for r in doc)


INSTANCE_KEYS = frozenset({"schema_version", "id", "topology", "tables", "name", "rows", "dim", "dtype_bytes",
                           "pooling_factor", "reuse_bins", "nodes", "devices_per_node", "memory_bytes", "kind",
                           "count", "mapping"})
KINDS = {
    "instance": Kind("instance", lambda: instance_to_dict(base_instance()), _json, INSTANCE_KEYS, True),
    "plan": Kind("plan", _plan_doc, _json, frozenset({"schema_version", "instance_id", "tables", "name",
                                                     "sharding_type", "shards", "device", "rows", "cols"}), True),
    "torchrec spec": Kind("torchrec spec", _torchrec_spec, _json, frozenset({"tables", "world_size", "hbm_cap",
                                                                             "batch_size", "name", "num_embeddings",
                                                                             "embedding_dim"}), True),
    "manifest": Kind("manifest", lambda: {"protocol": "fuzz", "instances": ["fuzz.json"]}, _json,
                     frozenset({"instances"}), False),
    "suite": Kind("suite", _suite_doc, toml_text, frozenset({"name", "instances", "results", "solvers", "oracles"}), True),
    "pool": Kind("pool", _pool_doc, _json, frozenset({"row", "pooling_factor", *(f"bin_{b}" for b in range(17))}), False),
    "dataset": Kind("dataset", _dataset_doc, _jsonl, frozenset({"id", "split", "pool_indices", "dims", "features",
                                                                "batch", "forward_s", "backward_s", "total_s"}), False),
    "rules": Kind("rules", _rules_doc, _json, frozenset({"granularity", "rules", "evidence", "solver", "family",
                                                        "budget", "features", "results", "status", "time"}), True),
    "store": Kind("store", _store_doc, _jsonl, frozenset({"instance", "solver", "oracle", "time_limit", "seed",
                                                          "status", "solve_time"}), False),
}


# ---------------------------------------------------------------- mutations


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON-like document."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, prefix + (i,))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for step in path[:-1]:
        doc = doc[step]
    return doc


def _type_class(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


WRONG_VALUES = {"number": 7, "str": "x", "list": [1], "dict": {"a": 1}, "bool": True}
SPECIAL_NUMBERS = (math.nan, math.inf, -math.inf)
HUGE = (10**30, 1e300)


@dataclass(frozen=True)
class Mutated:
    """A broken input: `text` to write (None: `special` says what to put there instead), and whether a
    correct reader must reject it (False: it may still be valid, and must merely be handled)."""

    mutation: str
    text: str | bytes | None
    must_reject: bool
    special: str = ""


def _edit(kind: Kind, rng: random.Random, fn: Callable[[Any, tuple, Any], bool], name: str) -> Mutated:
    """Applies `fn(parent, key, value) -> must_reject` at a random path of the document."""
    doc = kind.document()
    paths = _paths(doc)
    path = paths[rng.randrange(len(paths))]
    parent = _parent(doc, path)
    must = fn(parent, path[-1], parent[path[-1]])
    try:
        return Mutated(f"{name} at {'.'.join(map(str, path))}", kind.write(doc), must)
    except ValueError:  # the format cannot express the value (TOML has no null): a missing key instead
        return _missing(kind, rng)


def _wrong_type(kind: Kind, rng: random.Random) -> Mutated:
    def fn(parent, key, value):
        choices = [k for k in WRONG_VALUES if k != _type_class(value)]
        parent[key] = copy.deepcopy(WRONG_VALUES[rng.choice(choices)])
        return kind.strict or kind.name in ("pool", "dataset", "store")
    return _edit(kind, rng, fn, "wrong type")


def _numeric_path(doc: Any, rng: random.Random) -> tuple | None:
    numeric = [p for p in _paths(doc) if _type_class(_parent(doc, p)[p[-1]]) == "number"]
    return numeric[rng.randrange(len(numeric))] if numeric else None


def _special_number(kind: Kind, rng: random.Random, values: tuple, name: str) -> Mutated:
    doc = kind.document()
    path = _numeric_path(doc, rng)
    if path is None:
        return _wrong_type(kind, rng)
    _parent(doc, path)[path[-1]] = rng.choice(values)
    # Huge but finite timings are plausible in a dataset, and a store's numbers are not range-checked on
    # reading: those only have to be handled.
    must = kind.name not in ("store", "dataset") or (kind.name == "dataset" and values is SPECIAL_NUMBERS
                                                      and path[0] != "single_total_s" and len(path) > 1)
    return Mutated(f"{name} at {'.'.join(map(str, path))}", kind.write(doc), must)


def _negative(kind: Kind, rng: random.Random) -> Mutated:
    doc = kind.document()
    path = _numeric_path(doc, rng)
    if path is None:
        return _wrong_type(kind, rng)
    value = _parent(doc, path)[path[-1]]
    _parent(doc, path)[path[-1]] = -abs(value) - 1
    must = kind.name in ("instance", "suite", "pool")
    return Mutated(f"negative at {'.'.join(map(str, path))}", kind.write(doc), must)


def _missing(kind: Kind, rng: random.Random) -> Mutated:
    doc = kind.document()
    keyed = [p for p in _paths(doc) if isinstance(p[-1], str)]
    path = keyed[rng.randrange(len(keyed))]
    del _parent(doc, path)[path[-1]]
    return Mutated(f"missing {'.'.join(map(str, path))}", kind.write(doc), path[-1] in kind.required)


def _unknown_key(kind: Kind, rng: random.Random) -> Mutated:
    doc = kind.document()
    objects = [()] if isinstance(doc, dict) else []
    objects += [p for p in _paths(doc) if isinstance(_parent(doc, p)[p[-1]], dict)]
    path = objects[rng.randrange(len(objects))]
    target = doc if not path else _parent(doc, path)[path[-1]]
    target["zz_unknown"] = 1
    return Mutated(f"unknown key in {'.'.join(map(str, path)) or 'top level'}", kind.write(doc), kind.strict)


def _schema_version(kind: Kind, rng: random.Random) -> Mutated:
    doc = kind.document()
    if not isinstance(doc, dict) or "schema_version" not in doc:
        return _wrong_type(kind, rng)
    doc["schema_version"] = rng.choice([0, 99, "1", True, 1.0, None, -1])
    return Mutated(f"schema_version {doc['schema_version']!r}", kind.write(doc), True)


def _null(kind: Kind, rng: random.Random) -> Mutated:
    def fn(parent, key, value):
        parent[key] = None
        return False  # optional fields take null
    return _edit(kind, rng, fn, "null")


def _truncated(kind: Kind, rng: random.Random) -> Mutated:
    text = kind.write(kind.document()).rstrip()
    # A prefix of a TOML file or a JSON-lines file can still be a valid (shorter) one.
    return Mutated("truncated", text[:rng.randrange(1, len(text) - 1)], kind.name not in ("dataset", "store", "suite"))


def _fixed(text, name: str, must: bool = True):
    return lambda kind, rng: Mutated(name, text if not callable(text) else text(kind, rng), must)


MUTATIONS: dict[str, Callable[[Kind, random.Random], Mutated]] = {
    "wrong type": _wrong_type,
    "nan/inf": lambda kind, rng: _special_number(kind, rng, SPECIAL_NUMBERS, "non-finite"),
    "huge": lambda kind, rng: _special_number(kind, rng, HUGE, "huge"),
    "negative": _negative,
    "missing key": _missing,
    "unknown key": _unknown_key,
    "schema version": _schema_version,
    "null": _null,
    "empty": lambda kind, rng: Mutated("empty file", "", kind.name not in ("dataset", "store")),
    "truncated": _truncated,
    "binary": lambda kind, rng: Mutated("binary garbage", bytes(rng.randrange(256) for _ in range(200)) + b"\xff\xfe", True),
    "utf-16": lambda kind, rng: Mutated("UTF-16", kind.write(kind.document()).encode("utf-16"), True),
    "latin-1": lambda kind, rng: Mutated("latin-1 text", kind.write(kind.document()).replace("a", "\u00e9", 1)
                                         .encode("latin-1"), True),
    "deep nesting": lambda kind, rng: Mutated("200k-deep nesting", "[" * 200_000 + "]" * 200_000 + "\n", True),
    "directory": lambda kind, rng: Mutated("a directory", None, True, special="directory"),
    # A results store is written as well as read: a link to a file yet to exist is followed, as `touch` would.
    "dangling link": lambda kind, rng: Mutated("a dangling symlink", None, kind.name != "store", special="dangling"),
}


def mutate(kind_name: str, mutation: str, seed: int) -> Mutated:
    return MUTATIONS[mutation](KINDS[kind_name], random.Random(seed))


def place(mutated: Mutated, path: Path) -> None:
    """Puts the broken input at `path`."""
    if mutated.special == "directory":
        path.mkdir()
    elif mutated.special == "dangling":
        path.symlink_to(path.parent / "nowhere" / path.name)
    elif isinstance(mutated.text, bytes):
        path.write_bytes(mutated.text)
    else:
        path.write_text(mutated.text)


# ---------------------------------------------------------------- commands that read files


@dataclass(frozen=True)
class Target:
    """A command that reads a file of `kind`: `argv(file, out)` builds its arguments; `out` must not exist
    afterwards unless the command succeeded."""

    name: str
    kind: str
    argv: Callable[[Path, Path], list[str]]
    setup: Callable[[Path], Path]  # prepares the workspace, returns where the mutated file goes


def _instance_file(work: Path) -> Path:
    return work / "instance.json"


def _instance_with_rules(work: Path) -> Path:
    (work / "rules.json").write_text(_json(_rules_doc()))
    return work / "instance.json"


def _rules_file(work: Path) -> Path:
    (work / "instance.json").write_text(_json(instance_to_dict(base_instance())))
    return work / "rules.json"


def _plan_file(work: Path) -> Path:
    (work / "instance.json").write_text(_json(instance_to_dict(base_instance())))
    return work / "plan.json"


def _spec_file(work: Path) -> Path:
    return work / "spec.json"


def _set_with_manifest(work: Path) -> Path:
    (work / "set").mkdir()
    (work / "set" / "fuzz.json").write_text(_json(instance_to_dict(base_instance())))
    return work / "set" / "manifest.json"


def _suite_files(work: Path) -> Path:
    _set_with_manifest(work)
    (work / "set" / "manifest.json").write_text(_json({"instances": ["fuzz.json"]}))
    return work / "suite.toml"


def _store_files(work: Path) -> Path:
    _suite_files(work)
    (work / "suite.toml").write_text(toml_text(_suite_doc()))
    (work / "out").mkdir()
    return work / "out" / "fuzz.jsonl"


TARGETS = (
    Target("instances validate", "instance", lambda f, o: ["instances", "validate", str(f)], _instance_file),
    Target("instances show", "instance", lambda f, o: ["instances", "show", str(f)], _instance_file),
    Target("solve", "instance", lambda f, o: ["solve", str(f), "--solver", "lpt", "--oracle", "lookup", "-o", str(o)],
           _instance_file),
    Target("flexshard", "instance", lambda f, o: ["flexshard", str(f), "-o", str(o)], _instance_file),
    Target("buckets", "instance", lambda f, o: ["buckets", str(f), "--trainers", "4", "-o", str(o)], _instance_file),
    Target("show-plan", "plan", lambda f, o: ["show-plan", str(f), "--instance", str(f.parent / "instance.json"),
                                              "--oracle", "analytic"],
           _plan_file),
    Target("export-torchrec", "plan", lambda f, o: ["export-torchrec", str(f), "--instance",
                                                    str(f.parent / "instance.json"), "-o", str(o)], _plan_file),
    Target("instances import-torchrec", "torchrec spec", lambda f, o: ["instances", "import-torchrec", str(f),
                                                                       "--out", str(o)], _spec_file),
    Target("instances validate (set)", "manifest", lambda f, o: ["instances", "validate", str(f.parent)],
           _set_with_manifest),
    Target("instances sample --pool", "pool", lambda f, o: ["instances", "sample", "--pool", str(f), "--tables", "2",
                                                            "--devices", "1", "--count", "1", "--out", str(o)],
           _instance_file),
    Target("recommend", "instance", lambda f, o: ["recommend", str(f), "--oracle", "lookup", "--budget", "1",
                                                  "--rules", str(f.parent / "rules.json")], _instance_with_rules),
    Target("plan", "instance", lambda f, o: ["plan", str(f), "--oracle", "lookup", "--budget", "0.5",
                                             "--solvers", "lpt", "-o", str(o)], _instance_file),
    Target("recommend --rules", "rules", lambda f, o: ["recommend", str(f.parent / "instance.json"), "--oracle",
                                                      "lookup", "--rules", str(f)], _rules_file),
    Target("bench", "suite", lambda f, o: ["bench", str(f)], _suite_files),
    Target("bench (store)", "store", lambda f, o: ["bench", str(f.parent.parent / "suite.toml")], _store_files),
    Target("summarize (store)", "store", lambda f, o: ["summarize", str(f.parent.parent / "suite.toml"), "-o", str(o)],
           _store_files),
    Target("train costmodel", "dataset", lambda f, o: ["train", "costmodel", "--dataset", str(f), "--epochs", "1",
                                                      "--out", str(o)], _instance_file),
)


@dataclass(frozen=True)
class Outcome:
    target: str
    mutation: str
    code: int | None
    handled: bool
    problem: str


def run_case(target: Target, mutated: Mutated, work: Path, main: Callable[[list[str]], int]) -> Outcome:
    """Runs the command on the broken input in `work` (emptied first) and judges how it was handled."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    file = target.setup(work)
    place(mutated, file)
    out = work / "output.json"
    before = _listing(work)
    stderr = io.StringIO()
    code, problem = None, ""
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(target.argv(file, out))
        except BaseException as exc:  # noqa: BLE001 - the point is to see anything that escapes
            problem = f"raised {type(exc).__name__}: {str(exc)[:120]}"
    lines = [line for line in stderr.getvalue().splitlines() if line.strip() and not line.startswith("warning:")]
    if not problem:
        if code not in (0, 2, 3):
            problem = f"exit code {code}"
        elif code == 0 and mutated.must_reject:
            problem = "accepted an input that must be rejected"
        elif code == 2 and (len(lines) != 1 or not lines[0].startswith("error: ")):
            problem = f"{len(lines)} lines on stderr: {' | '.join(lines)[:160]}"
        elif code != 0 and _listing(work) - before:
            problem = f"left {sorted(_listing(work) - before)[:3]} behind"
    return Outcome(target.name, mutated.mutation, code, not problem, problem)


def _listing(work: Path) -> set[str]:
    out = set()
    for root, dirs, files in os.walk(work):
        for name in (*dirs, *files):
            out.add(os.path.relpath(os.path.join(root, name), work))
    return out
