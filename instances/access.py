"""Access curves: the share of a table's lookups served by its hottest fraction f of rows, i.e. the hit rate
of a static HBM cache holding those rows (the best any cache of that size can do on independent lookups).

Two sources, one shape (a concave piecewise-linear curve through knots (f_j, h_j) from (0, 0) to (1, 1)):

- **Per-row distribution** (`table.row_distribution`, the model FlexShard's tiering reads through
  `rowdist.row_source`): rows come in descending probability p_1 ≥ p_2 ≥ …, and the hottest k rows serve
  H(k) = (p_1 + … + p_k) / Σ p. H is evaluated at every k up to EXACT_ROWS and beyond that on a geometric
  grid of row counts (ratio GRID_RATIO), summing the source's segments between grid points, so that a
  table of 10^9 rows never needs its per-row array; between knots the curve is linear (below the true
  concave curve by < 10^-4 of its value). A power law's intervals longer than CHUNK rows (only past
  ~2·10^8 rows) are summed by Simpson's rule in log(row) on three point values, as it is smooth there. An
  empirical list shorter than the table leaves the other rows at probability 0: they serve nothing.
- **AutoShard's 17 reuse bins** only: bin b holds the share s_b of the distinct indices a reference batch
  of REFERENCE_BATCH samples touched (0,1], (1,2], (2,4], …, (32768,∞) times. With integer counts, bin b
  spans [lo_b, hi_b] = [2^(b-1)+1, 2^b] (bin 0: exactly 1; the last capped at 2^16), mean count
  m_b = (lo_b + hi_b)/2. The batch's lookups are N = REFERENCE_BATCH × pooling factor, so it touched
  D = N / Σ_b s_b m_b distinct rows (at most the table's rows), D·s_b of them in bin b, which serve a share
  s_b m_b / Σ s m of the lookups. Hottest bins first, each bin's rows taken as equally hot, the curve runs
  through the knots (Σ_{b'≥b} D s_b' / rows, Σ_{b'≥b} s_b' m_b' / Σ s m) and stays at 1 past f = D/rows:
  rows the batch never touched serve nothing. The same ranges and D are what the measured oracle uses to
  synthesise its inputs, so its traces and this curve agree.

A table without lookups (pooling factor 0) gets the diagonal h(f) = f; nothing is priced by it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .model import NUM_REUSE_BINS, InstanceError, Table
from .rowdist import EmpiricalRows, row_source

REFERENCE_BATCH = 65536  # the batch the pool's reuse bins were counted on
EXACT_ROWS = 1 << 14     # every row count up to this is a knot
GRID_RATIO = 2 ** (1 / 32)
CHUNK = 1 << 22          # the longest segment summed row by row at once
# Marginal hit rate of one more cached row, relative to an average row (slope of h): the cache sizes where
# it falls below each of these are a table's bends.
BEND_SLOPES = (1024.0, 256.0, 64.0, 16.0, 4.0, 1.0, 0.25)


def bin_count_ranges(scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Access-count range [low, high] of each reuse bin, (2^(b-1), 2^b] in integers (bin 0 exactly 1, the
    last capped at 2^16), rescaled from the reference batch by `scale` and never below one access."""
    low = np.array([1] + [2 ** (b - 1) + 1 for b in range(1, NUM_REUSE_BINS)], dtype=float)
    high = np.array([1] + [2 ** b for b in range(1, NUM_REUSE_BINS)], dtype=float)
    return np.maximum(1.0, low * scale), np.maximum(1.0, high * scale)


def distinct_per_batch(table: Table, batch: int) -> float:
    """Distinct rows a batch of `batch` samples touches by the reuse bins: its lookups over their mean
    count, between 1 and min(rows, lookups); 0 without lookups."""
    lookups = batch * table.pooling_factor
    bins = np.asarray(table.reuse_bins, dtype=float)
    if lookups <= 0 or bins.sum() <= 0:
        return 0.0
    low, high = bin_count_ranges(batch / REFERENCE_BATCH)
    mean_count = float(np.dot(bins / bins.sum(), (low + high) / 2))
    return float(np.clip(lookups / mean_count, 1.0, min(table.rows, lookups)))


@dataclass(frozen=True)
class AccessCurve:
    """h(f) through the knots `fractions` (increasing, 0 … 1) and `shares` (0 … 1), linear between."""

    fractions: np.ndarray
    shares: np.ndarray

    def __post_init__(self):
        for name in ("fractions", "shares"):
            array = np.array(getattr(self, name), dtype=np.float64)
            array.setflags(write=False)
            object.__setattr__(self, name, array)

    def hit_rate(self, f):
        """Share of lookups a cache of the hottest fraction f of rows serves; f a number or an array."""
        f = np.asarray(f, dtype=np.float64)
        bad = ~((f >= 0) & (f <= 1))
        if np.any(bad):
            raise InstanceError("load_factor", f"a cache fraction must lie in [0, 1], got {f[bad].flat[0]}")
        h = np.interp(f, self.fractions, self.shares)
        return float(h) if h.ndim == 0 else h

    def miss_area(self) -> float:
        """∫_0^1 (1 − h(f)) df: 0 for a table one row serves, 1/2 for uniform access."""
        widths = np.diff(self.fractions)
        return float(1.0 - np.dot(widths, (self.shares[1:] + self.shares[:-1]) / 2))

    def bends(self) -> tuple[float, ...]:
        """The cache fractions in (0, 1) past which one more row serves less than τ times an average row
        (τ in BEND_SLOPES), and the fraction where h reaches 1 (caching more serves nothing): where the
        curve turns, a small set to enumerate load factors from."""
        slopes = np.diff(self.shares) / np.diff(self.fractions)
        ends = self.fractions[1:]
        points = {float(ends[slopes >= tau][-1]) for tau in BEND_SLOPES if np.any(slopes >= tau)}
        full = self.fractions[np.argmax(self.shares >= 1.0)]
        points.add(float(full))
        return tuple(sorted(p for p in points if 0 < p < 1))


def _knots(rows: int) -> np.ndarray:
    """Row counts 0, 1, …, EXACT_ROWS, then a geometric grid up to `rows` (which is always a knot)."""
    head = np.arange(min(rows, EXACT_ROWS) + 1, dtype=np.int64)
    if rows <= EXACT_ROWS:
        return head
    steps = int(np.ceil(np.log(rows / EXACT_ROWS) / np.log(GRID_RATIO)))
    grid = np.round(EXACT_ROWS * GRID_RATIO ** np.arange(1, steps + 1)).astype(np.int64)
    return np.unique(np.concatenate([head, np.minimum(grid, rows), [rows]]))


def _identity(p: np.ndarray) -> np.ndarray:
    return p


def _point(source, row: int, h) -> float:
    return float(h(source.segment(row, row + 1))[0])


def _interval_sum(source, start: int, stop: int, h=_identity) -> float:
    """Σ h(p) over rows start..stop-1: row by row in CHUNK pieces when short enough or explicit, else
    ∫ h(p) over [start − ½, stop − ½] by Simpson's rule in log(row) (h(p)·row is smooth in log(row) for the
    power laws that are this long; rounding a node to its row moves it by < 10^-8 of itself)."""
    if stop - start <= CHUNK or isinstance(source, EmpiricalRows):  # explicit rows need not be smooth
        return sum(float(h(source.segment(a, min(a + CHUNK, stop))).sum()) for a in range(start, stop, CHUNK))
    a, b = start - 0.5, stop - 0.5
    nodes = (a, np.sqrt(a * b), b)
    values = [_point(source, min(stop - 1, int(round(x))), h) * x for x in nodes]
    return float(np.log(b / a) / 6 * (values[0] + 4 * values[1] + values[2]))


def _knot_sums(source, knots: np.ndarray, h=_identity) -> np.ndarray:
    """Σ h(p) over the first k rows, for each knot k of `_knots(source.rows)`."""
    head = h(source.segment(0, min(source.rows, EXACT_ROWS)))
    tail = knots[head.size + 1:]  # knots 0 … head.size are the head's rows, one by one
    sums = [_interval_sum(source, int(a), int(b), h) for a, b in zip(knots[head.size:-1], tail)]
    return np.concatenate([[0.0], np.cumsum(np.concatenate([head, sums]))])


def _per_row_curve(source, rows: int) -> AccessCurve:
    """The curve of a descending per-row source holding the first `source.rows` of `rows` rows."""
    knots = _knots(source.rows)
    mass = _knot_sums(source, knots)
    if mass[-1] <= 0:
        return AccessCurve(np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    fractions, shares = knots / rows, mass / mass[-1]
    if source.rows < rows:
        fractions, shares = np.append(fractions, 1.0), np.append(shares, 1.0)
    return AccessCurve(fractions, shares)


def _bins_curve(table: Table) -> AccessCurve:
    distinct = distinct_per_batch(table, REFERENCE_BATCH)
    if distinct <= 0:
        return AccessCurve(np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    bins = np.asarray(table.reuse_bins, dtype=float)[::-1]  # hottest first
    bins = bins / bins.sum()
    low, high = bin_count_ranges()
    counts = ((low + high) / 2)[::-1]
    used = bins > 0
    fractions = np.cumsum(bins[used]) * distinct / table.rows
    shares = np.cumsum(bins[used] * counts[used]) / np.dot(bins, counts)
    fractions, shares = np.concatenate([[0.0], fractions]), np.concatenate([[0.0], shares])
    # A bin too thin to move f in floating point holds no lookups worth a knot of its own.
    kept = np.concatenate([[True], np.diff(fractions) > 1e-12])
    fractions, shares = fractions[kept], shares[kept]
    shares[-1] = 1.0
    if fractions[-1] < 1.0:
        fractions, shares = np.append(fractions, 1.0), np.append(shares, 1.0)
    else:
        fractions[-1] = 1.0
    return AccessCurve(fractions, shares)


@lru_cache(maxsize=256)  # shared by a table's curve and its distinct rows: a power law sums its rows once
def _per_row_source(table: Table):
    """The table's per-row source, or None when all its rows are equally hot (every row in every sample,
    or no sample at all). An empirical list is taken as it is: the rows it leaves out have p = 0."""
    dist = table.row_distribution
    if dist.kind == "empirical":
        return EmpiricalRows.of(dist.probabilities)
    if table.pooling_factor <= 0 or table.pooling_factor >= table.rows:
        return None
    return row_source(table)


@lru_cache(maxsize=4096)
def access_curve(table: Table) -> AccessCurve:
    """The table's access curve: from its per-row distribution when it has one, else from its reuse bins."""
    if table.row_distribution is None:
        return _bins_curve(table)
    source = _per_row_source(table)
    if source is None:
        return AccessCurve(np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    return _per_row_curve(source, table.rows)


def expected_distinct(table: Table, batch: int) -> float:
    """Expected distinct rows a batch of `batch` samples touches: Σ_i 1 − (1 − p_i)^batch by the per-row
    distribution (p_i the chance row i is in a sample), else by the reuse bins (`distinct_per_batch`)."""
    if table.row_distribution is None:
        return distinct_per_batch(table, batch)
    if table.pooling_factor <= 0:
        return 0.0
    source = _per_row_source(table)
    if source is None:
        return float(table.rows)

    def touched(p: np.ndarray) -> np.ndarray:
        return -np.expm1(batch * np.log1p(-np.minimum(p, 1.0 - 1e-16)))

    return float(_knot_sums(source, _knots(source.rows), touched)[-1])
