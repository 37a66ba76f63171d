"""Per-row access probabilities of sequence tables (FlexShard §4.1): p_i is the chance that row i appears
in a sample, and L = Σ p_i. Sources give their rows in descending p, either all at once or a slice
at a time, so that tens of millions of rows never need more than one table's array in memory."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .model import InstanceError, Table

POWER_LAW_CHUNK = 1 << 22


@dataclass(frozen=True)
class PowerLawRows:
    """p_i = min(1, s · i^-alpha) for i = 1..rows, with s set so that Σ p_i = length: the rows a
    power law would give more than certainty are capped at 1 and their excess spread over the rest."""

    rows: int
    alpha: float
    length: float

    def __post_init__(self):
        if not 0 < self.length <= self.rows:
            raise InstanceError("length", f"must be in (0, rows={self.rows}], got {self.length}")
        if self.alpha < 0:
            raise InstanceError("alpha", f"must be >= 0, got {self.alpha}")

    def _weights(self, start: int, stop: int) -> np.ndarray:
        return np.power(np.arange(start + 1, stop + 1, dtype=np.float64), -self.alpha)

    def _water_level(self, total: float) -> tuple[int, float]:
        """(k, s): rows 1..k sit at p = 1, the rest at s · i^-alpha."""
        head_size = min(self.rows, int(np.ceil(self.length)) + 1)  # at most ⌈L⌉ rows can be capped
        head = self._weights(0, head_size)
        capped_weight = np.concatenate([[0.0], np.cumsum(head)])  # weight of rows 1..k, k = 0..head_size
        k = np.arange(head_size)
        # k capped rows work when the next row stays below 1: (L − k) · w_{k+1} ≤ W − C_k. The test is
        # monotone in k, so the first k that passes is the water level.
        ok = (self.length - k) * head[k] <= (total - capped_weight[k]) * (1 + 1e-12)
        cap = int(np.argmax(ok)) if ok.any() else head_size
        rest = total - capped_weight[cap]
        return cap, ((self.length - cap) / rest if rest > 0 else 0.0)

    @cached_property
    def _cap_and_scale(self) -> tuple[int, float]:
        total = sum(float(self._weights(a, min(a + POWER_LAW_CHUNK, self.rows)).sum())
                    for a in range(0, self.rows, POWER_LAW_CHUNK))
        return self._water_level(total)

    def segment(self, start: int, stop: int) -> np.ndarray:
        cap, scale = self._cap_and_scale
        p = self._weights(start, stop)
        p *= scale
        p[: max(0, cap - start)] = 1.0
        return np.minimum(p, 1.0, out=p)

    def smallest_positive(self) -> float:
        return float(self.segment(self.rows - 1, self.rows)[0])

    def probabilities(self) -> np.ndarray:
        p = self._weights(0, self.rows)
        if "_cap_and_scale" not in self.__dict__:
            # Summed chunk by chunk exactly as _cap_and_scale does, so that segment() gives identical bits.
            total = sum(float(p[a:a + POWER_LAW_CHUNK].sum()) for a in range(0, self.rows, POWER_LAW_CHUNK))
            self.__dict__["_cap_and_scale"] = self._water_level(total)
        cap, scale = self._cap_and_scale
        p *= scale
        p[:cap] = 1.0
        return np.minimum(p, 1.0, out=p)


@dataclass(frozen=True)
class EmpiricalRows:
    """Explicit per-row probabilities (any order on input; kept in descending order)."""

    values: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, probabilities) -> "EmpiricalRows":
        p = np.asarray(probabilities, dtype=np.float64)
        if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1:
            raise InstanceError("probabilities", "must be a non-empty list of numbers in [0, 1]")
        return cls(np.sort(p)[::-1].copy())

    @property
    def rows(self) -> int:
        return self.values.size

    def segment(self, start: int, stop: int) -> np.ndarray:
        return self.values[start:stop]

    def smallest_positive(self) -> float:
        positive = self.values[self.values > 0]
        return float(positive[-1]) if positive.size else 1.0

    def probabilities(self) -> np.ndarray:
        return self.values


def probabilities_from_ids(indices, offsets, rows: int) -> np.ndarray:
    """Per-row probability of appearing in a sample, from a sample of id lists in CSR form (sample j holds
    indices[offsets[j]:offsets[j+1]]); an id repeated within a sample counts once."""
    indices = np.asarray(indices, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    samples = offsets.size - 1
    if samples <= 0 or offsets[0] != 0 or offsets[-1] != indices.size or np.any(np.diff(offsets) < 0):
        raise InstanceError("offsets", "must start at 0, never decrease and end at the number of indices")
    if indices.size and (indices.min() < 0 or indices.max() >= rows):
        raise InstanceError("indices", f"must lie in 0..{rows - 1}")
    sample_of = np.repeat(np.arange(samples, dtype=np.int64), np.diff(offsets))
    present = np.unique(sample_of * rows + indices)
    return np.bincount(present % rows, minlength=rows) / samples


def row_source(table: Table):
    """The row distribution a sequence table declares; its pooling factor is taken as L."""
    dist = table.row_distribution
    if dist is None:
        raise InstanceError(f"table {table.name}.row_distribution", "required for row-level sharding")
    if dist.kind == "power_law":
        return PowerLawRows(rows=table.rows, alpha=float(dist.alpha), length=table.pooling_factor)
    values = np.zeros(table.rows)
    values[:len(dist.probabilities)] = dist.probabilities
    return EmpiricalRows.of(values)
