"""Per-row access probabilities of sequence tables (FlexShard §4.1): p_i is the chance that row i appears
in a sample, and L = Σ p_i. Sources give their rows in descending p, either all at once or a slice
at a time; sums over rows and the rows above a threshold come without a per-row array (closed form for
power laws), so that tables of 2^40 rows need memory only for the slices asked of them."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .model import InstanceError, Table

# Power-law sums: rows below HEAD_ROWS are added one by one; a longer run of terms (x0 + j·step)^-alpha is
# summed by Euler–Maclaurin with three correction terms (B2, B4, B6), whose remainder is at most
# 2ζ(6)/(2π)^6 ∫|f⁽⁶⁾| = 3.307e-5 · alpha(alpha+1)…(alpha+4) · step^5 · x0^-(alpha+5). With x0 > HEAD_ROWS ·
# step that is below 3.1e-19 of the run's first term for every alpha <= MAX_ALPHA: under float64 rounding.
HEAD_ROWS = 1 << 16


def power_sums(first, step, count, alpha: float) -> np.ndarray:
    """Σ_{j < count} (first + j·step)^-alpha for arrays of runs (first >= 1, count >= 1), by Euler–Maclaurin:
    accurate to the bound above when first is large against step, exact when alpha = 0."""
    x0 = np.asarray(first, dtype=np.float64)
    s = np.asarray(step, dtype=np.float64)
    x1 = x0 + (np.asarray(count, dtype=np.float64) - 1) * s
    log_ratio = np.log1p((x1 - x0) / x0)
    if alpha == 1.0:
        integral = log_ratio / s
    else:
        integral = np.power(x0, 1 - alpha) * np.expm1((1 - alpha) * log_ratio) / ((1 - alpha) * s)

    def odd_derivative(x, k):  # d^k/dj^k (x0 + j·step)^-alpha at x, k odd
        rising = np.prod([alpha + i for i in range(k)])
        return -rising * s ** k * np.power(x, -alpha - k)

    total = integral + (np.power(x0, -alpha) + np.power(x1, -alpha)) / 2
    for k, coefficient in ((1, 1 / 12), (3, -1 / 720), (5, 1 / 30240)):  # B_2k / (2k)!
        total = total + coefficient * (odd_derivative(x1, k) - odd_derivative(x0, k))
    return total


def range_sums(values: np.ndarray, starts, stops) -> np.ndarray:
    """Σ values[starts[i]:stops[i]] for every i, added in extended precision (empty ranges give 0)."""
    starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
    if starts.size == 0:
        return np.zeros(0)
    padded = np.append(np.asarray(values, dtype=np.longdouble), 0)
    bounds = np.empty(2 * starts.size, dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, stops
    sums = np.add.reduceat(padded, bounds)[0::2].astype(np.float64)
    return np.where(stops > starts, sums, 0.0)


@dataclass(frozen=True)
class PowerLawRows:
    """p_i = min(1, s · i^-alpha) for i = 1..rows, with s set so that Σ p_i = length: the rows a
    power law would give more than certainty are capped at 1 and their excess spread over the rest.
    Sums over rows come from the closed form above, so a table of 2^40 rows costs no per-row array."""

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

    @cached_property
    def _head(self) -> np.ndarray:
        return self._weights(0, min(self.rows, HEAD_ROWS))

    def weight(self, starts, stops) -> np.ndarray:
        """Σ i^-alpha over rows [starts, stops) (0-based, so row r has weight (r + 1)^-alpha)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        head = self._head.size
        total = range_sums(self._head, np.minimum(starts, head), np.minimum(stops, head))
        tail_start, tail_stop = np.maximum(starts, head), np.maximum(stops, head)
        tail = tail_stop > tail_start
        if tail.any():
            total[tail] += power_sums(tail_start[tail] + 1, 1, tail_stop[tail] - tail_start[tail], self.alpha)
        return total

    @cached_property
    def _cap_and_scale(self) -> tuple[int, float]:
        """(k, s): rows 1..k sit at p = 1, the rest at s · i^-alpha."""
        head_size = min(self.rows, int(np.ceil(self.length)) + 1)  # at most ⌈L⌉ rows can be capped
        head = self._weights(0, head_size)
        beyond = float(self.weight([head_size], [self.rows])[0])
        # rest[k]: the weight of rows k+1.., added from the smallest up so that each is accurate on its own
        # scale (W − C_k cancels when a steep law puts nearly all weight on the first rows).
        rest = (np.cumsum(head[::-1].astype(np.longdouble))[::-1] + beyond).astype(np.float64)
        k = np.arange(head_size)
        # k capped rows work when the next row stays below 1: (L − k) · w_{k+1} ≤ rest[k]. The test is
        # monotone in k, so the first k that passes is the water level.
        ok = (self.length - k) * head <= rest * (1 + 1e-12)
        cap = int(np.argmax(ok)) if ok.any() else head_size
        remaining = rest[cap] if cap < head_size else beyond
        return cap, ((self.length - cap) / remaining if remaining > 0 else 0.0)

    def segment(self, start: int, stop: int) -> np.ndarray:
        cap, scale = self._cap_and_scale
        p = self._weights(start, stop)
        p *= scale
        p[: max(0, cap - start)] = 1.0
        return np.minimum(p, 1.0, out=p)

    def mass(self, starts, stops) -> np.ndarray:
        """Σ p_i over rows [starts, stops), per range."""
        cap, scale = self._cap_and_scale
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        capped = np.minimum(stops, cap) - np.minimum(starts, cap)
        return capped + scale * self.weight(np.maximum(starts, cap), np.maximum(stops, cap))

    def at_least(self, thresholds) -> tuple[np.ndarray, np.ndarray]:
        """For each threshold τ: how many rows have p >= τ (a prefix, p falling) and their Σ p. Found by
        bisection on the row, each probe computed as `segment` computes it, so counts agree with it."""
        cap, scale = self._cap_and_scale
        tau = np.asarray(thresholds, dtype=np.float64)
        low, high = np.zeros(tau.size, dtype=np.int64), np.full(tau.size, self.rows, dtype=np.int64)
        while np.any(low < high):  # invariant: rows < low pass, rows >= high fail
            middle = (low + high) // 2
            p = np.minimum(scale * np.power((middle + 1).astype(np.float64), -self.alpha), 1.0)
            passes = np.where(middle < cap, 1.0, p) >= tau
            active = low < high
            low = np.where(active & passes, middle + 1, low)
            high = np.where(active & ~passes, middle, high)
        return low, self.mass(np.zeros_like(low), low)

    def progression_mass(self, first, step: int, count) -> np.ndarray:
        """Σ p over rows first, first + step, ..., count of them, per run. Runs must start past the capped
        rows and at least 64 steps in (first >= 64 · step); then, by the remainder bound above, the error is
        below 1.2e-13 of p at row `first mod step` when that row is not capped, and below 1.4e-12 when it is
        and first >= 4 · (capped rows + 1) — so below 1.4e-12 of any sum that includes that row."""
        cap, scale = self._cap_and_scale
        first = np.asarray(first, dtype=np.int64)
        if np.any(first < max(cap, 64 * step)):
            raise ValueError(f"runs must start at row {max(cap, 64 * step)} or later")
        return scale * power_sums(first + 1, step, count, self.alpha)

    def smallest_positive(self) -> float:
        """The last row's p, or, where a steep law underflows to 0 before it, that of the last row above 0."""
        positive = int(self.at_least([np.finfo(np.float64).smallest_subnormal])[0][0])
        return float(self.segment(positive - 1, positive)[0]) if positive else 1.0

    def probabilities(self) -> np.ndarray:
        return self.segment(0, self.rows)


@dataclass(frozen=True)
class EmpiricalRows:
    """Explicit per-row probabilities (any order on input; kept in descending order). A table longer than
    its list has p = 0 on the other rows, which are never held."""

    values: np.ndarray = field(repr=False)
    rows: int

    @classmethod
    def of(cls, probabilities, rows: int | None = None) -> "EmpiricalRows":
        p = np.asarray(probabilities, dtype=np.float64)
        if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or p.min() < 0 or p.max() > 1:
            raise InstanceError("probabilities", "must be a non-empty list of numbers in [0, 1]")
        if rows is not None and rows < p.size:
            raise InstanceError("probabilities", f"lists {p.size} rows, the table has {rows}")
        return cls(np.sort(p)[::-1].copy(), p.size if rows is None else rows)

    def segment(self, start: int, stop: int) -> np.ndarray:
        out = np.zeros(stop - start)
        listed = self.values[start:stop]
        out[:listed.size] = listed
        return out

    def mass(self, starts, stops) -> np.ndarray:
        n = self.values.size
        return range_sums(self.values, np.minimum(starts, n), np.minimum(stops, n))

    def progression_mass(self, first, step: int, count) -> np.ndarray:
        return np.array([self.values[f:f + step * c:step].sum() for f, c in np.broadcast(first, count)])

    def at_least(self, thresholds) -> tuple[np.ndarray, np.ndarray]:
        tau = np.asarray(thresholds, dtype=np.float64)
        counts = np.where(tau <= 0, self.rows, np.searchsorted(-self.values, -tau, side="right"))
        return counts, self.mass(np.zeros_like(counts), counts)

    def smallest_positive(self) -> float:
        positive = self.values[self.values > 0]
        return float(positive[-1]) if positive.size else 1.0

    def probabilities(self) -> np.ndarray:
        return self.segment(0, self.rows)


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
    return EmpiricalRows.of(dist.probabilities, rows=table.rows)
