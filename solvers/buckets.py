"""Bucket-aware row sharding for collision-free tables (TorchRec RFC): ids map to buckets by interleave
(id mod B) or chunk (id ÷ (rows / B)); trainers own contiguous bucket ranges. Ranges are balanced
optimally (minimise the largest range's rows or access load), and a resharding from T1 to T2 trainers
keeps ranges contiguous and hands each new range to the trainer that already holds most of it."""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

MAPPINGS = ("interleave", "chunk")


def bucket_of(ids, num_buckets: int, rows: int, mapping: str) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if mapping == "interleave":
        return ids % num_buckets
    if mapping == "chunk":
        return ids * num_buckets // rows  # floor(id / (rows / B)) in exact integer arithmetic
    raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")


def rows_per_bucket(rows: int, num_buckets: int, mapping: str) -> np.ndarray:
    """How many of the ids 0..rows-1 land in each bucket, without enumerating them."""
    b = np.arange(num_buckets, dtype=np.int64)
    if mapping == "interleave":
        return rows // num_buckets + (b < rows % num_buckets)
    if mapping == "chunk":
        first = -((-b * rows) // num_buckets)  # ceil(b · rows / B): the first id of bucket b
        return np.diff(np.append(first, rows))
    raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")


def load_per_bucket(weights_by_id: np.ndarray, num_buckets: int, mapping: str) -> np.ndarray:
    """Σ of a per-id weight (access probability, or counts from an id sample) per bucket."""
    weights_by_id = np.asarray(weights_by_id, dtype=np.float64)
    buckets = bucket_of(np.arange(weights_by_id.size), num_buckets, weights_by_id.size, mapping)
    return np.bincount(buckets, weights=weights_by_id, minlength=num_buckets)


# Rows of an interleaved table added one by one before the closed form: more than 4 × the most rows a
# power law caps (pooling factor + 1 <= 1e6 + 1), which keeps the closed form within 1.4e-12 of each
# bucket's load (instances.rowdist.PowerLawRows.progression_mass).
INTERLEAVE_HEAD_ROWS = 1 << 22
CHUNK_ROWS = 1 << 22


def access_per_bucket(source, num_buckets: int, mapping: str) -> np.ndarray:
    """Σ of a row source's access probability per bucket, without a per-row array over a long table: chunk
    buckets are row ranges (the source's mass); interleave buckets take the first rows one by one (at least
    64 per bucket and INTERLEAVE_HEAD_ROWS) and each bucket's rest, every B-th row, from the source's
    closed form for a run (within 1.4e-12 of the bucket's load)."""
    rows = source.rows
    if mapping == "chunk":
        first = -((-np.arange(num_buckets + 1, dtype=np.int64) * rows) // num_buckets)
        return source.mass(first[:-1], first[1:])
    if mapping != "interleave":
        raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")
    head = min(rows, num_buckets * max(64, -(-INTERLEAVE_HEAD_ROWS // num_buckets)))
    loads = np.zeros(num_buckets)
    for start in range(0, head, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, head)
        loads += np.bincount(np.arange(start, stop) % num_buckets, weights=source.segment(start, stop),
                             minlength=num_buckets)
    if head < rows:
        bucket = np.arange(num_buckets, dtype=np.int64)
        count = (rows - head - bucket + num_buckets - 1) // num_buckets  # rows head + b, head + b + B, ...
        live = count > 0
        loads[live] += source.progression_mass(head + bucket[live], num_buckets, count[live])
    return loads


def range_loads(loads: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    prefix = np.concatenate([[0], np.cumsum(loads)])
    return prefix[boundaries[1:]] - prefix[boundaries[:-1]]


def even_split(num_buckets: int, parts: int) -> np.ndarray:
    """The RFC's split: each trainer gets B/T consecutive buckets (the first B mod T get one more)."""
    sizes = num_buckets // parts + (np.arange(parts) < num_buckets % parts)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _greedy_cut(prefix: np.ndarray, parts: int, cap) -> np.ndarray | None:
    """Fill each range as far as `cap` allows; None when `parts` ranges cannot cover every bucket."""
    n = prefix.size - 1
    bounds = [0]
    for _ in range(parts):
        position = bounds[-1]
        if position == n:
            bounds.append(n)
            continue
        reach = int(np.searchsorted(prefix, prefix[position] + cap, side="right")) - 1
        if reach <= position:
            return None
        bounds.append(min(reach, n))
    return np.array(bounds, dtype=np.int64) if bounds[-1] == n else None


def optimal_partition(loads, parts: int) -> np.ndarray:
    """Contiguous ranges minimising the largest range load (the linear partition problem). Parametric
    search: is a cap feasible is answered greedily in O(parts · log B); integer loads are searched exactly,
    real ones to a relative 1e-12."""
    loads = np.asarray(loads)
    if parts <= 0 or loads.size == 0:
        raise ValueError("need at least one part and one bucket")
    integral = np.issubdtype(loads.dtype, np.integer)
    prefix = np.concatenate([[0], np.cumsum(loads)])
    low = max(loads.max(), prefix[-1] / parts)
    high = prefix[-1]
    if integral:
        low, high = int(np.ceil(low)), int(high)
        while low < high:
            middle = (low + high) // 2
            if _greedy_cut(prefix, parts, middle) is None:
                low = middle + 1
            else:
                high = middle
    else:
        low, high = float(low) * (1 - 1e-15), float(high) * (1 + 1e-15)
        while high - low > 1e-12 * high:
            middle = (low + high) / 2
            if _greedy_cut(prefix, parts, middle) is None:
                low = middle
            else:
                high = middle
    return _greedy_cut(prefix, parts, high)


@dataclass(frozen=True)
class Resharding:
    new_boundaries: np.ndarray    # ranges of the new layout, in bucket order
    trainer_of_range: np.ndarray  # which trainer holds each new range (ids >= T1 are new trainers)
    rows_moved: int
    rows_total: int


def reshard(old_boundaries: np.ndarray, new_boundaries: np.ndarray, rows: np.ndarray) -> Resharding:
    """Hand each new contiguous range to a trainer so that the fewest rows move: a maximum-weight matching
    of new ranges to trainers on the rows they already hold (trainers beyond the old count hold none)."""
    from scipy.optimize import linear_sum_assignment

    old_boundaries, new_boundaries = np.asarray(old_boundaries), np.asarray(new_boundaries)
    t_old, t_new = old_boundaries.size - 1, new_boundaries.size - 1
    prefix = np.concatenate([[0], np.cumsum(rows)])
    keep = np.zeros((t_new, max(t_old, t_new)), dtype=np.int64)
    for j in range(t_new):
        lo, hi = new_boundaries[j], new_boundaries[j + 1]
        starts = np.clip(old_boundaries[:-1], lo, hi)
        ends = np.clip(old_boundaries[1:], lo, hi)
        keep[j, :t_old] = prefix[ends] - prefix[starts]
    range_index, trainer = linear_sum_assignment(keep, maximize=True)
    kept = int(keep[range_index, trainer].sum())
    order = np.empty(t_new, dtype=np.int64)
    order[range_index] = trainer
    return Resharding(new_boundaries, order, int(prefix[-1]) - kept, int(prefix[-1]))


def rehash_rows_moved(rows: int, old_trainers: int, new_trainers: int) -> int:
    """Rows that change trainer when every id is re-hashed from id mod T1 to id mod T2 (no buckets)."""
    period = old_trainers * new_trainers // gcd(old_trainers, new_trainers)
    ids = np.arange(min(period, rows))
    moved_in_period = int(np.count_nonzero(ids % old_trainers != ids % new_trainers))
    full, rest = divmod(rows, period)
    tail = np.arange(rest)
    return full * moved_in_period + int(np.count_nonzero(tail % old_trainers != tail % new_trainers))
