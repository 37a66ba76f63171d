"""Cost datasets for training and judging neural oracles: random combinations of 1..N pool tables, each
measured as one device (forward, backward, repeat spread) together with each member's single-table cost.
Combinations never mix the two halves of the pool, so that AutoShard's unseen-tables split (train on
the first half, test on the second) is clean."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import numpy as np

from instances import Table
from instances.pool import dlrm_pool

from .measured import MeasurementCache, Protocol

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


def collect(out: Path, count: int, max_tables: int, batch: int, seed: int, protocol: Protocol,
            cache: MeasurementCache | None = None, progress=None) -> int:
    """Appends measured combinations to `out` (JSON lines); ones already there are skipped."""
    cache = cache or MeasurementCache()
    done = sum(1 for line in out.read_text().splitlines() if line.strip()) if out.exists() else 0
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    for combo in combinations(count, max_tables, seed):
        if combo["id"] < done:
            continue
        tables = combination_tables(combo)
        together = cache.get_or_measure(tables, batch, protocol)
        singles = [cache.get_or_measure([t], batch, protocol) for t in tables]
        record = {**combo, "features": [table_features(t) for t in tables], "batch": batch,
                  "forward_s": together.forward_s, "backward_s": together.backward_s, "total_s": together.total_s,
                  "spread": together.spread, "single_total_s": [s.total_s for s in singles],
                  "single_forward_s": [s.forward_s for s in singles], "single_backward_s": [s.backward_s for s in singles],
                  "device": together.device, "versions": together.versions, "protocol": asdict(protocol)}
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        written += 1
        if progress:
            progress(combo["id"] + 1)
    return written


def load_dataset(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
