"""Loader for raw dlrm_datasets files (`.pt` or `.pt.gz` holding `(indices, offsets, lengths)` for T
tables × batch B) computing the same per-table features as the embedded pool."""
from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

from .model import NUM_REUSE_BINS, InstanceError
from .pool import PoolTable

MIN_ROWS = 100  # the pool floors hash sizes at 100, as the published statistics do


def reuse_bins(access_counts: np.ndarray) -> tuple[float, ...]:
    """Share of distinct indices whose access count c lies in (0,1], (1,2], (2,4], …, (32768, inf)."""
    counts = np.asarray(access_counts, dtype=np.int64)
    counts = counts[counts > 0]
    if counts.size == 0:
        return (0.0,) * NUM_REUSE_BINS
    # bin b >= 1 holds (2^(b-1), 2^b], i.e. b = ceil(log2 c); exact in float64 for counts far beyond a batch.
    bins = np.minimum(np.ceil(np.log2(counts)).astype(np.int64), NUM_REUSE_BINS - 1)
    hist = np.bincount(bins, minlength=NUM_REUSE_BINS).astype(float)
    return tuple(float(x) for x in hist / counts.size)


def table_features(indices: np.ndarray, batch_size: int, index: int) -> PoolTable:
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and indices.min() < 0:
        raise InstanceError(f"indices (table {index})", "negative index")
    rows = max(MIN_ROWS, int(indices.max()) + 1 if indices.size else 0)
    counts = np.unique(indices, return_counts=True)[1] if indices.size else np.zeros(0, dtype=np.int64)
    return PoolTable(index=index, rows=rows, pooling_factor=float(indices.size) / batch_size,
                     reuse_bins=reuse_bins(counts))


def _load_tensors(path: Path):
    import torch

    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                return torch.load(handle, weights_only=True)
        return torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise InstanceError(str(path), f"cannot load a dlrm_datasets tensor file ({exc})") from exc


def load_raw_tables(path: str | Path) -> list[PoolTable]:
    path = Path(path)
    data = _load_tensors(path)
    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise InstanceError(str(path), "expected a tuple (indices, offsets, lengths)")
    indices, offsets, lengths = (np.asarray(x.numpy() if hasattr(x, "numpy") else x) for x in data)
    if lengths.ndim != 2:
        raise InstanceError(f"{path}: lengths", f"must be 2-D (tables × batch), got shape {lengths.shape}")
    num_tables, batch = lengths.shape
    if offsets.ndim != 1 or offsets.size != num_tables * batch + 1:
        raise InstanceError(f"{path}: offsets", f"must hold tables × batch + 1 = {num_tables * batch + 1} values, "
                            f"got shape {offsets.shape}")
    if offsets[-1] != indices.size or not np.array_equal(np.diff(offsets), lengths.reshape(-1)):
        raise InstanceError(f"{path}: offsets", "inconsistent with lengths and the number of indices")
    return [table_features(indices[offsets[t * batch]:offsets[(t + 1) * batch]], batch, t) for t in range(num_tables)]
