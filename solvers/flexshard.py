"""FlexShard row tiering (§4.3–4.6): rows in descending access probability go to DP (replicated), Flex
(row-wise within a node, replicated across nodes) or RW (row-wise over all GPUs). Tier boundaries follow
from the closed-form breakpoints and from where running sums of the per-row marginal costs cross a
budget; several tables merge into one distribution.

Rows are never all sorted together, nor all held: each table's source gives exact prefix counts and
probability sums on a grid of thresholds that includes every breakpoint (in closed form for power laws);
a crossing between two grid points is narrowed by bisection on the threshold and then resolved exactly by
sorting only the rows in that bracket.
Merged order is descending p, ties by table then row, so every result is a deterministic prefix."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from costmodels.flexshard import FlexParams, breakpoints, marginal_lines
from instances.memory import format_bytes

GRID_POINTS = 8192
BRACKET_ROWS = 1 << 22  # most rows put in merged order at once (32 MiB of probabilities)


@dataclass(frozen=True)
class RowTable:
    """A table as tiering sees it: a row source (descending p), its dim and element size."""

    name: str
    source: object  # PowerLawRows | EmpiricalRows
    dim: int
    dtype_bytes: int

    @property
    def rows(self) -> int:
        return self.source.rows


@dataclass(frozen=True)
class Prefix:
    """A prefix of the merged order: how many of each table's top rows it holds, and their Σp."""

    counts: np.ndarray
    sums: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.counts.sum())

    def __sub__(self, other: "Prefix") -> "Prefix":
        return Prefix(self.counts - other.counts, self.sums - other.sums)


class MergedRows:
    def __init__(self, tables: Sequence[RowTable], special_thresholds: Sequence[float] = ()):
        self.tables = tuple(tables)
        self.dims = np.array([t.dim for t in tables], dtype=np.float64)
        top = max(float(t.source.segment(0, 1)[0]) for t in tables)
        bottom = min((t.source.smallest_positive() for t in tables), default=top)
        grid = np.geomspace(top, bottom, GRID_POINTS) if top > 0 else np.zeros(0)
        specials = [t for t in special_thresholds if t is not None and 0 < t < np.inf]
        self.grid = np.unique(np.concatenate([grid, specials, [np.inf, 0.0]]))[::-1]  # descending, +inf first
        self.counts = np.zeros((len(tables), self.grid.size), dtype=np.int64)
        self.sums = np.zeros((len(tables), self.grid.size))
        for i, table in enumerate(self.tables):  # rows with p >= τ: a prefix of the table
            self.counts[i], self.sums[i] = table.source.at_least(self.grid)
        self.lengths = self.sums[:, -1].copy()

    def column(self, g: int) -> Prefix:
        return Prefix(self.counts[:, g].copy(), self.sums[:, g].copy())

    @property
    def total_rows(self) -> int:
        return int(self.counts[:, -1].sum())

    def at_threshold(self, threshold: float) -> Prefix:
        """All rows with p >= threshold (a grid point: every breakpoint is one)."""
        return self.column(self._grid_index(threshold))

    def whole(self) -> Prefix:
        return self.column(self.grid.size - 1)

    def weight(self, prefix: Prefix, line: tuple[float, float]) -> float:
        """Σ over the prefix's rows of dim · (a + b·p)."""
        a, b = line
        return float(np.dot(self.dims, a * prefix.counts + b * prefix.sums))

    def crossing(self, start_threshold: float, line: tuple[float, float], offset: float, budget: float) -> Prefix:
        """The longest prefix extending the rows with p >= start_threshold whose weight, counted from
        `offset` there, stays <= budget. Every row added must weigh >= 0, so the running sum only rises."""
        start_g = self._grid_index(start_threshold)
        start = self.column(start_g)
        totals = offset + np.array([self.weight(self.column(g) - start, line) for g in range(start_g, self.grid.size)])
        over = np.flatnonzero(totals > budget)
        if over.size == 0:
            return self.whole()
        g = start_g + int(over[0])
        if g == start_g:
            return start
        # The crossing lies between grid points g-1 (within budget) and g (over it). Narrow that bracket by
        # bisection on the threshold until its rows fit in memory, then put only those in merged order.
        low, low_total, high = self.column(g - 1), float(totals[g - 1 - start_g]), self.column(g)
        upper, lower = min(float(self.grid[g - 1]), 2.0), float(self.grid[g])  # no p exceeds 1
        while (high - low).rows > BRACKET_ROWS:
            tau = (upper + lower) / 2
            if not lower < tau < upper:  # no float between: every row of the bracket has p == lower
                return self._take_tied(low, low_total, high, lower, line, budget)
            middle = self._prefix_at(tau)
            total = offset + self.weight(middle - start, line)
            if total > budget:
                high, lower = middle, tau
            else:
                low, low_total, upper = middle, total, tau
        lo, hi = low.counts, high.counts
        pieces = [(self.tables[i].source.segment(int(lo[i]), int(hi[i])), i) for i in range(len(self.tables))
                  if hi[i] > lo[i]]
        p = np.concatenate([piece for piece, _ in pieces])
        owner = np.concatenate([np.full(piece.size, i) for piece, i in pieces])
        rank = np.concatenate([np.arange(piece.size) for piece, _ in pieces])
        order = np.lexsort((rank, owner, -p))
        p, owner = p[order], owner[order]
        a, b = line
        running = low_total + np.cumsum(self.dims[owner] * (a + b * p))
        take = int(np.searchsorted(running, budget, side="right"))
        result = Prefix(low.counts.copy(), low.sums.copy())
        np.add.at(result.counts, owner[:take], 1)
        np.add.at(result.sums, owner[:take], p[:take])
        return result

    def _prefix_at(self, threshold: float) -> Prefix:
        """All rows with p >= threshold, any threshold (not only grid points)."""
        counts, sums = zip(*(t.source.at_least([threshold]) for t in self.tables))
        return Prefix(np.concatenate(counts).astype(np.int64), np.concatenate(sums))

    def _take_tied(self, low: Prefix, low_total: float, high: Prefix, p: float, line: tuple[float, float],
                   budget: float) -> Prefix:
        """The crossing among rows that all have probability p, so merged order is by table, then row."""
        a, b = line
        counts, sums, total = low.counts.copy(), low.sums.copy(), low_total
        for i, n in enumerate((high - low).counts.tolist()):
            each = float(self.dims[i] * (a + b * p))
            take = n if each <= 0 else min(n, max(0, int((budget - total) // each)))
            while take > 0 and total + take * each > budget:  # floor division may round up by one
                take -= 1
            counts[i] += take
            sums[i] += take * p
            total += take * each
            if take < n:
                break
        return Prefix(counts, sums)

    def _grid_index(self, threshold: float) -> int:
        matches = np.flatnonzero(self.grid == threshold)
        if matches.size == 0:
            raise ValueError(f"threshold {threshold} is not on the grid")
        return int(matches[0])


@dataclass(frozen=True)
class Tiering:
    """A row-tiered plan: per table, its top `dp` rows replicated, the next `flex` rows Flex-sharded,
    the rest row-wise; with the costs FlexShard's equations predict for it and for plain RW."""

    mode: str
    tables: tuple[str, ...]
    dp_rows: tuple[int, ...]
    flex_rows: tuple[int, ...]
    rw_rows: tuple[int, ...]
    coverage: dict[str, tuple[float, ...]]        # per tier, per table: share of the table's L
    merged_coverage: dict[str, float]
    memory_per_gpu: float
    rw_memory_per_gpu: float
    global_a2a_bytes: float                      # per GPU per direction
    rw_global_a2a_bytes: float
    intra_a2a_bytes: float
    allreduce_bytes: float
    communication_seconds: float
    rw_communication_seconds: float
    breakpoints: dict[str, float | None]
    points: dict[str, int]                       # merged rows up to A, B, C, D (DP prefix lengths)


class FlexShard:
    """Tiering of one or several sequence tables under FlexShard's cost model."""

    def __init__(self, tables: Sequence[RowTable], params: FlexParams):
        dtypes = {t.dtype_bytes for t in tables}
        if len(dtypes) != 1:
            raise ValueError("tables merged for tiering must share one dtype")
        self.params = params
        self.dtype = dtypes.pop()
        self.bp = breakpoints(params)
        self.lines = marginal_lines(params, self.dtype)
        self.rows = MergedRows(tables, (self.bp.dp_memory, self.bp.dp_comm, self.bp.flex_comm))

    def _threshold(self, breakpoint: float | None) -> float:
        """A breakpoint as a grid threshold; +inf (no rows) when it does not exist or lies above p = 1."""
        return breakpoint if breakpoint is not None and 0 < breakpoint <= 1 else np.inf

    def point_a(self) -> Prefix:
        """Largest memory saving: every row above the DP memory-neutral breakpoint."""
        return self.rows.at_threshold(self._threshold(self.bp.dp_memory))

    def point_c(self) -> Prefix:
        """Largest communication saving: every row above the DP communication-neutral breakpoint."""
        return self.rows.at_threshold(self._threshold(self.bp.dp_comm))

    def dp_within(self, extra_memory: float) -> Prefix | None:
        """The longest DP prefix past A whose marginal memory over RW stays <= extra_memory (B at 0);
        None when even A needs more."""
        a = self.point_a()
        saved = self.rows.weight(a, self.lines["DP:memory"])
        if saved > extra_memory:
            return None
        return self.rows.crossing(self._threshold(self.bp.dp_memory), self.lines["DP:memory"], saved, extra_memory)

    def least_communication(self, extra_memory: float) -> Prefix:
        """Among all DP/RW hybrids (any subset of rows replicated) using at most `extra_memory` more bytes
        per GPU than RW, the one with least communication. Both marginal costs fall as p rises, so the best
        set of each size is the top rows; along the prefixes memory falls to A and then rises, communication
        falls to C and then rises, so the best prefix is C cut back to the longest one within the budget."""
        if extra_memory < 0:
            raise ValueError("extra_memory must be >= 0 (bytes per GPU above RW)")
        high = self.dp_within(extra_memory)
        c = self.point_c()
        return c if c.rows <= high.rows else high

    def two_tier(self, extra_memory: float = 0.0) -> Tiering:
        """FlexShard 2-tier: DP from the top until the marginal memory is back to `extra_memory` (point B
        at 0, the memory-neutral design the paper evaluates), RW after."""
        dp = self.dp_within(extra_memory)
        if dp is None:
            raise ValueError(f"no DP/RW hybrid fits {format_bytes(extra_memory)} of extra memory per GPU")
        return self.report("2-tier", dp, dp)

    def three_tier(self) -> Tiering:
        """FlexShard 3-tier: DP up to A, then Flex until the memory DP saved is spent or Flex reaches its
        communication-neutral breakpoint against RW, then RW."""
        a = self.point_a()
        saved = self.rows.weight(a, self.lines["DP:memory"])
        flex_memory = self.lines["Flex:memory"]
        if flex_memory[0] <= 0 or self._threshold(self.bp.flex_comm) == np.inf:
            flex_end = a
        else:
            flex_end = self.rows.crossing(self._threshold(self.bp.dp_memory), flex_memory, saved, 0.0)
            neutral = self.rows.at_threshold(self._threshold(self.bp.flex_comm))
            if neutral.rows < flex_end.rows:
                flex_end = neutral if neutral.rows > a.rows else a
        return self.report("3-tier", a, flex_end)

    @cached_property
    def points(self) -> dict[str, int]:
        """Merged rows replicated at A, B, C and D of Fig. 5."""
        return {"A": self.point_a().rows, "B": self.dp_within(0.0).rows, "C": self.point_c().rows,
                "D": self.rows.whole().rows}

    def frontier(self) -> tuple[np.ndarray, np.ndarray]:
        """(extra memory, extra communication) per GPU over RW of replicating the top rows, on the grid."""
        columns = [self.rows.column(g) for g in range(self.rows.grid.size)]
        return (np.array([self.rows.weight(c, self.lines["DP:memory"]) for c in columns]),
                np.array([self.rows.weight(c, self.lines["DP:communication"]) for c in columns]))

    def report(self, mode: str, dp: Prefix, flex_end: Prefix) -> Tiering:
        """Rows, coverage and predicted costs of the plan: DP up to `dp`, Flex up to `flex_end`, RW after."""
        rows, params, dt = self.rows, self.params, self.dtype
        whole = rows.whole()
        flex, rw = flex_end - dp, whole - flex_end
        U, B, W = params.gpus, params.batch, params.gpus_per_node
        lengths = np.where(rows.lengths > 0, rows.lengths, 1.0)
        rw_memory = float(np.dot(rows.dims, whole.counts / U * dt + 2 * B * whole.sums * dt))
        memory = (rw_memory + rows.weight(dp, self.lines["DP:memory"]) + rows.weight(flex, self.lines["Flex:memory"]))
        rw_comm = 2 * float(np.dot(rows.dims, B * whole.sums * dt)) / params.a2a_global
        comm = (rw_comm + rows.weight(dp, self.lines["DP:communication"])
                + rows.weight(flex, self.lines["Flex:communication"]))
        tiers = {"DP": dp, "Flex": flex, "RW": rw}
        total_length = float(rows.lengths.sum()) or 1.0
        b = self.bp
        return Tiering(
            mode=mode, tables=tuple(t.name for t in rows.tables),
            dp_rows=tuple(int(x) for x in dp.counts), flex_rows=tuple(int(x) for x in flex.counts),
            rw_rows=tuple(int(x) for x in rw.counts),
            coverage={k: tuple(float(x) for x in v.sums / lengths) for k, v in tiers.items()},
            merged_coverage={k: float(v.sums.sum() / total_length) for k, v in tiers.items()},
            memory_per_gpu=memory, rw_memory_per_gpu=rw_memory,
            global_a2a_bytes=float(np.dot(rows.dims, B * rw.sums * dt)),
            rw_global_a2a_bytes=float(np.dot(rows.dims, B * whole.sums * dt)),
            intra_a2a_bytes=float(np.dot(rows.dims, B * flex.sums * dt)),
            allreduce_bytes=float(np.dot(rows.dims, dp.counts * dt + flex.counts / W * dt)),
            communication_seconds=comm, rw_communication_seconds=rw_comm,
            breakpoints={"dp_memory": b.dp_memory, "dp_comm": b.dp_comm, "flex_comm": b.flex_comm,
                         "flex_memory": b.flex_memory},
            points=self.points,
        )
