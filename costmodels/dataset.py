"""Cost datasets for training and judging neural oracles: random combinations of 1..N pool tables, each
measured as one device (forward, backward, repeat spread) together with each member's single-table cost.
Combinations never mix the two halves of the pool, so that AutoShard's unseen-tables split (train on
the first half, test on the second) is clean."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from instances import InstanceError, Table
from instances.io import read_text
from instances.model import MAX_DIM, MAX_POOLING, MAX_ROWS
from instances.pool import dlrm_pool

from .measured import Job, Measurement, MeasurementCache, Protocol, measure_many

DIMS = (16, 32)


def table_features(table: Table) -> list[float]:
    """AutoShard's 21 features: dim, rows, pooling factor, size (rows × dim) and the 17 reuse bins."""
    return [float(table.dim), float(table.rows), float(table.pooling_factor), float(table.rows * table.dim),
            *map(float, table.reuse_bins)]


def combinations(count: int, max_tables: int, seed: int, unseen_share: float = 0.3) -> Iterator[dict]:
    pool = dlrm_pool()
    half = len(pool) // 2
    rng = np.random.default_rng(seed)
    for k in range(count):
        split = "test" if rng.random() < unseen_share else "train"
        size = int(rng.integers(1, max_tables + 1))
        base = half if split == "test" else 0
        chosen = base + rng.choice(half if split == "train" else len(pool) - half, size=size, replace=False)
        yield {"id": k, "split": split, "pool_indices": [int(i) for i in chosen],
               "dims": [int(d) for d in rng.choice(DIMS, size=size)]}


def combination_tables(combo: dict) -> list[Table]:
    pool = dlrm_pool()
    return [pool[i].as_table(d, 2) for i, d in zip(combo["pool_indices"], combo["dims"])]


def measure_combination(task: tuple[dict, int, Protocol]) -> dict:
    """One dataset record: the combination measured as one device, and each member alone (on the device
    of whichever process runs it: a Ray worker's GPU under the ray executor)."""
    combo, batch, protocol = task
    cache = MeasurementCache()
    tables = combination_tables(combo)
    together = cache.get_or_measure(tables, batch, protocol)
    singles = [cache.get_or_measure([t], batch, protocol) for t in tables]
    return _record(combo, tables, together, singles, batch, protocol)


def _record(combo: dict, tables: list[Table], together: Measurement, singles: list[Measurement], batch: int,
            protocol: Protocol) -> dict:
    return {**combo, "features": [table_features(t) for t in tables], "batch": batch,
            "forward_s": together.forward_s, "backward_s": together.backward_s, "total_s": together.total_s,
            "spread": together.spread, "single_total_s": [s.total_s for s in singles],
            "single_forward_s": [s.forward_s for s in singles], "single_backward_s": [s.backward_s for s in singles],
            "single_spread": [s.spread for s in singles],
            "exposed": together.exposed, "single_exposed": [s.exposed for s in singles],
            "device": together.device, "versions": together.versions, "protocol": asdict(protocol)}


def measured_records(combos: Iterable[dict], batch: int, protocol: Protocol, workers: int = 0,
                     deadline: float | None = None) -> Iterator[dict]:
    """Dataset records for `combos`, in order, timed one at a time on this process's device while `workers`
    processes build the inputs ahead; each table alone is timed once. Nothing is timed after `deadline`
    (time.monotonic()); every record yielded is complete."""
    seen: set[tuple[int, int]] = set()
    singles: dict[tuple[int, int], Measurement] = {}

    def jobs() -> Iterator[Job]:
        for combo in combos:
            tables = combination_tables(combo)
            yield Job(("together", combo), tuple(tables), batch, protocol)
            for key, table in zip(_keys(combo), tables):
                if key not in seen:
                    seen.add(key)
                    yield Job(("single", key), (table,), batch, protocol)

    current = None
    for job, measurement in measure_many(jobs(), workers, deadline=deadline):
        kind, ref = job.tag
        if kind == "single":
            singles[ref] = measurement
            continue
        if current is not None:  # its singles came before this job: it is complete
            yield _finish(current, singles, batch, protocol)
        current = (ref, job.tables, measurement)
    if current is not None and all(key in singles for key in _keys(current[0])):
        yield _finish(current, singles, batch, protocol)  # the last one, unless the deadline cut its singles


def _keys(combo: dict) -> list[tuple[int, int]]:
    return list(zip(combo["pool_indices"], combo["dims"]))


def _finish(current, singles, batch: int, protocol: Protocol) -> dict:
    combo, tables, together = current
    return _record(combo, list(tables), together, [singles[k] for k in _keys(combo)], batch, protocol)


def collect(out: Path, count: int, max_tables: int, batch: int, seed: int, protocol: Protocol,
            progress=None, run_many=None) -> int:
    """Appends measured combinations to `out` (JSON lines) as they finish; ids already there are skipped.
    `run_many(fn, tasks)` yields fn's results in any order (default: one after another, here)."""
    done = {r["id"] for r in load_dataset(out)} if out.exists() else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = [(combo, batch, protocol) for combo in combinations(count, max_tables, seed) if combo["id"] not in done]
    results = (run_many or _one_after_another)(measure_combination, tasks)
    written = 0
    for record in results:
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        written += 1
        if progress:
            progress(len(done) + written)
    return written


def _one_after_another(fn, tasks):
    return map(fn, tasks)


# Upper limits of AutoShard's 21 features, as an instance's tables are limited.
FEATURE_LIMITS = (MAX_DIM, MAX_ROWS, MAX_POOLING, MAX_ROWS * MAX_DIM, *([1.0] * 17))
RECORD_FIELDS = ("id", "split", "pool_indices", "dims", "features", "batch", "forward_s", "backward_s", "total_s")


def load_dataset(path: Path) -> list[dict]:
    """The records of a cost dataset; a line that is not one names itself in an InstanceError."""
    records = []
    for number, line in enumerate(read_text(path, "dataset").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InstanceError(where, f"not a JSON record ({exc})") from exc
        if not isinstance(record, dict):
            raise InstanceError(where, "not a dataset record (a JSON object)")
        missing = [k for k in RECORD_FIELDS if k not in record]
        if missing:
            raise InstanceError(where, f"missing {', '.join(missing)}")
        if not _count(record["id"], 0) or not _count(record["batch"], 1):
            raise InstanceError(where, "id must be an integer >= 0 and batch an integer >= 1")
        if record["split"] not in ("train", "test"):
            raise InstanceError(f"{where}: split", f"must be 'train' or 'test', got {record['split']!r}")
        features = record["features"]
        if (not isinstance(features, list) or not features or
                not all(isinstance(f, list) and len(f) == 21 and all(_finite(x) for x in f) for f in features)):
            raise InstanceError(f"{where}: features", "must be a non-empty list of 21 finite numbers per table")
        for f in features:
            if not all(0 <= x <= high for x, high in zip(f, FEATURE_LIMITS)):
                raise InstanceError(f"{where}: features", "a value is outside what a table can have "
                                    "(dim, rows, pooling, size, then 17 shares in [0, 1])")
        for key in ("pool_indices", "dims"):
            if not isinstance(record[key], list) or len(record[key]) != len(features) or \
                    not all(_count(x, 0) for x in record[key]):
                raise InstanceError(f"{where}: {key}", "must list one non-negative integer per table")
        singles = record.get("single_total_s")
        if singles is not None and (not isinstance(singles, list) or len(singles) != len(features)
                                    or not all(_finite(x) and x > 0 for x in singles)):
            raise InstanceError(f"{where}: single_total_s", "must list one positive time per table")
        for key in ("forward_s", "backward_s", "total_s"):
            if not (_finite(record[key]) and record[key] > 0):
                raise InstanceError(f"{where}: {key}", f"must be a positive number of seconds, got {record[key]!r}")
        records.append(record)
    return records


def _count(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
