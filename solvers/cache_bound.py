"""A lower bound over every cache load factor in (0, 1], not only the few the options offer: the LP over options
(solvers.bounds.lp_over) with each cached layout's grid options replaced by points along its whole load-factor
range, lowered so that a mix of two neighbouring points never lies above what a load factor between them costs or
stores. It holds where the oracle's cost is convex in the load factor and its bytes convex up to rounding
(`Oracle.convex_in_load_factor`), and so certifies plans whose caches are re-sized off the grid
(solvers.cache_sizes) and peers' plans that size caches their own way."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from costmodels import Oracle
from instances.kernels import FUSED_UVM_CACHING, LOAD_FACTOR_DIGITS
from instances.memory import CACHE_STATE_BYTES_PER_SLOT
from instances.pieces import Pieces

from .bounds import LP_PER_DEVICE_NONZEROS, LPColumns, LPOutOfTime, lp_over
from .candidates import Candidates, counted_storage

# The load factors each cached layout is priced at: POINTS from 0 to 1, spaced evenly in log(1 + SPREAD · lf).
# Any spacing keeps the bound valid; this one makes the lowering (`lowered`) lose about the same share of a
# cache's cost on every step where that cost is b / (1 + SPREAD · lf) — TorchRec's, with its default HBM
# bandwidth 28 times its HBM-to-DDR bandwidth — whose curvature is greatest at small load factors.
SPREAD = 27.0
POINTS = 128
STRIDE = 8  # the LP begins with every STRIDE-th point of each curve and generates the others it needs
# Bytes a piece's count may stray from a convex function of the load factor, in cache slots (a row and its
# bookkeeping): our storage count rounds a cache up to whole slots, TorchRec's its shares to whole bytes, and
# the lowering may amplify that a few times.
ROUNDING_SLOTS = 4
COST_ROUNDING = 1e-9  # relative float error of a priced cost
GUIDE_WEIGHT = 1e-6  # the least weight on a point of a curve at which the LP is taken to cache a table there


def load_factor_points(points: int = POINTS) -> np.ndarray:
    return np.expm1(np.linspace(0.0, np.log1p(SPREAD), points)) / SPREAD


def lowered(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Values at sorted points `x` (points × functions) of functions convex on [x₀, x_last], lowered so that the
    line between two neighbouring lowered values lies under the function between their points.

    On a step [a, b], a convex function lies above both neighbouring chords extended (through the points before
    a, and after b), so it dips below its own chord at most by the chord's height over the larger of those two
    lines, greatest where they cross; each point is lowered by the larger dip of its two steps."""
    x = np.asarray(x, dtype=float)
    g = np.asarray(values, dtype=float)
    if x.size < 3:
        raise ValueError("lowering a convex function needs at least three points")
    a, b = x[:-1, None], x[1:, None]
    ga, gb = g[:-1], g[1:]
    chord_slope = (gb - ga) / (b - a)
    # Slopes of the lines through each step's outer neighbours (none before the first step, after the last).
    left = np.full_like(ga, np.nan)
    left[1:] = (g[1:-1] - g[:-2]) / (x[1:-1] - x[:-2])[:, None]
    right = np.full_like(ga, np.nan)
    right[:-1] = (g[2:] - g[1:-1]) / (x[2:] - x[1:-1])[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(left == right, a, (gb - ga - right * b + left * a) / (left - right))
    cross = np.clip(np.where(np.isnan(left), a, np.where(np.isnan(right), b, cross)), a, b)
    chord = ga + chord_slope * (cross - a)
    line_left = np.where(np.isnan(left), -np.inf, ga + np.nan_to_num(left) * (cross - a))
    line_right = np.where(np.isnan(right), -np.inf, gb + np.nan_to_num(right) * (cross - b))
    dip = np.maximum(chord - np.maximum(line_left, line_right), 0.0)
    drop = np.zeros_like(g)
    drop[:-1] = dip
    drop[1:] = np.maximum(drop[1:], dip)
    return g - drop


def open_caches(candidates: Candidates) -> dict[tuple, list[int]]:
    """The cached layouts whose load factor the instance leaves open — (table, sharding type, pieces) — each with
    its options (live or not: an option pruned at one load factor may be the best at another)."""
    families: dict[tuple, list[int]] = {}
    tables = candidates.instance.tables
    for o, option in enumerate(candidates.options.options):
        if option.kernel == FUSED_UVM_CACHING and tables[option.table].cache_load_factor is None:
            families.setdefault((option.table, option.sharding_type, option.parts), []).append(o)
    return families


def curve_pieces(candidates: Candidates, oracle: Oracle, points: int = POINTS) -> int:
    """How many pieces pricing the curves of the bound takes (what its time grows with)."""
    layouts = [ids[0] for ids in open_caches(candidates).values()]
    if not layouts:
        return 0
    return _priced_once(candidates, oracle, np.concatenate([candidates.members(o) for o in layouts]))[0].size * points


def _priced_once(candidates: Candidates, oracle: Oracle, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the pieces `base`, those to price (one per shape where the oracle prices by shape) and which of them
    each piece is."""
    if not oracle.shape_priced:
        return np.arange(base.size), np.arange(base.size)
    source = candidates.options.pieces
    shapes = np.stack([getattr(source, f)[base] for f in ("table", "kind", "rows", "width", "kernel")], axis=1)
    _, once, same = np.unique(shapes, axis=0, return_index=True, return_inverse=True)
    return once, same.reshape(-1)


def every_load_factor_bound(candidates: Candidates, oracle: Oracle, points: int = POINTS,
                            time_limit: float | None = None) -> float | None:
    """The LP bound over plans whose caches take any load factor in (0, 1] (solved once per candidates); None
    where the oracle does not promise the convexity it rests on, in a replan, or where the LP is infeasible
    (then no plan fits). A table whose load factor the instance fixes keeps it. Raises bounds.LPOutOfTime
    where pricing the curves and the LP take more than `time_limit`."""
    key = ("every_load_factor_bound", points)
    if key not in candidates.memo:
        candidates.memo[key] = _timed(candidates, points, lambda: _bound(candidates, oracle, points, time_limit))
    return candidates.memo[key]


@dataclass(frozen=True)
class Guide:
    """What the LP over every load factor suggests (`guided_load_factors`): per table, the load factors at which
    it caches it, and the work each table's mix of columns does there (None where there is no such LP)."""

    load_factors: dict[int, tuple[float, ...]]
    work: np.ndarray | None = None


def guided_load_factors(candidates: Candidates, oracle: Oracle, time_limit: float | None = None,
                        points: int = POINTS) -> Guide:
    """Per table, the load factors at which the LP over every load factor (`every_load_factor_bound`, solved
    here and kept) caches it: offered as options beside the grid's, they let a search place the caches the
    relaxation wants, where the grid's steps leave HBM unused or a cache too small. Empty where there is no
    such bound. Raises bounds.LPOutOfTime past `time_limit`."""
    solution: list = []
    key = ("every_load_factor_bound", points)
    candidates.memo[key] = _timed(candidates, points, lambda: _bound(candidates, oracle, points, time_limit, solution))
    if not solution:
        return Guide({})
    x, table, factor, work = solution
    wanted: dict[int, set[float]] = {}
    for j in np.flatnonzero(x > GUIDE_WEIGHT):
        if 0 < factor[j] < 1:
            wanted.setdefault(int(table[j]), set()).add(round(float(factor[j]), LOAD_FACTOR_DIGITS))
    return Guide({t: tuple(sorted(f)) for t, f in sorted(wanted.items())}, work)


def has_every_load_factor_bound(candidates: Candidates, points: int = POINTS) -> bool:
    """Whether the bound was computed for these candidates already (then asking for it costs nothing)."""
    return ("every_load_factor_bound", points) in candidates.memo


def carry_bound(source: Candidates, target: Candidates, points: int = POINTS) -> None:
    """The bound over every load factor computed over `source` kept for `target`, the same problem with more
    load factors offered: every load factor is every load factor."""
    key = ("every_load_factor_bound", points)
    if key in source.memo:
        target.memo[key] = source.memo[key]


def _timed(candidates: Candidates, points: int, solve):
    """`solve()`, where it ran out of time once for these candidates not tried again: it would again."""
    late = ("every_load_factor_out_of_time", points)
    if late in candidates.memo:
        raise LPOutOfTime(candidates.memo[late])
    try:
        return solve()
    except LPOutOfTime as error:
        candidates.memo[late] = str(error)
        raise


def _bound(candidates: Candidates, oracle: Oracle, points: int, time_limit: float | None,
           solution: list | None = None) -> float | None:
    """The bound; where `solution` is given, the LP's weight on each curve column, its table and its load
    factor appended to it, and each table's work summed over its columns by their weights."""
    started = time.monotonic()
    instance = candidates.instance
    if candidates.moves is not None or not oracle.additive or not oracle.convex_in_load_factor(instance):
        return None
    families = open_caches(candidates)
    cached = np.zeros(len(candidates.options.options), dtype=bool)
    for ids in families.values():
        cached[ids] = True
    if not families:
        grid = LPColumns.of(candidates, np.flatnonzero(candidates.live))
        return lp_over(candidates, grid, time_limit, safe=True) if grid.table.size else None
    layouts = [ids[0] for ids in families.values()]
    curves = curve_columns(candidates, oracle, layouts, load_factor_points(points))
    curve, factor = curves.columns, curves.factor
    # Dominance pruned options comparing memory in the tiers that bind on the grid alone; where a cache larger
    # than the grid's could make another tier bind, an option pruned there may be needed: take every one that fits.
    most = candidates.most_per_table.copy()
    np.maximum.at(most, [candidates.options.options[o].table for o in layouts], curves.reach)
    newly = set(np.flatnonzero(most.sum(axis=0) > instance.topology.capacity.as_array())) - \
        set(candidates.binding_tiers)
    grid = LPColumns.of(candidates, np.flatnonzero((candidates.fits if newly else candidates.live) & ~cached))
    weights: list = []
    left = None if time_limit is None else max(time_limit - (time.monotonic() - started), 1e-3)
    # Begin with every STRIDE-th point of each curve, all of the rest generated where the duals ask for them.
    start = np.r_[np.ones(grid.table.size, dtype=bool), np.isin(factor, load_factor_points(points)[::STRIDE])]
    columns = grid + curve
    bound = lp_over(candidates, columns, left, safe=True, solution=weights, start=start)
    if solution is not None and weights:
        work = np.bincount(columns.table, weights=weights[0] * columns.work, minlength=instance.num_tables)
        solution += [weights[0][grid.table.size:], curve.table, factor, work]
    return bound


@dataclass(frozen=True)
class Curves:
    """The LP's columns for cached layouts along their load factors (`curve_columns`)."""

    columns: LPColumns
    factor: np.ndarray  # per column, its load factor
    reach: np.ndarray   # per layout, the most bytes per tier its pieces take together at a point kept (layouts × 2)


def curve_columns(candidates: Candidates, oracle: Oracle, layouts: list[int], x: np.ndarray) -> Curves:
    """Columns for each of the `layouts` (one option of each) at every load factor `x`, lowered (`lowered`)."""
    instance, options = candidates.instance, candidates.options
    members = [options.members(o) for o in layouts]
    sizes = np.array([m.size for m in members])
    base = np.concatenate(members)
    source = options.pieces
    priced_once, same = _priced_once(candidates, oracle, base)
    at = np.tile(base[priced_once], x.size)
    pieces = Pieces.of(*(getattr(source, f)[at] for f in ("table", "kind", "row_start", "row_end", "col_start",
                                                          "col_end", "kernel")),
                       load_factor=np.repeat(x, priced_once.size))
    priced = oracle.bind(instance, pieces)
    cost = np.asarray(priced.costs, dtype=float).reshape(x.size, -1)[:, same]
    stored = counted_storage(instance, pieces, priced, oracle.own_memory).reshape(x.size, -1, 2)[:, same]
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    dtype = np.array([t.dtype_bytes for t in instance.tables], dtype=np.int64)[source.table[base]]
    slot = source.width[base] * dtype + CACHE_STATE_BYTES_PER_SLOT
    slack = ROUNDING_SLOTS * np.add.reduceat(slot, starts).astype(float)

    def low_cost(values: np.ndarray) -> np.ndarray:
        return lowered(x, values) - COST_ROUNDING * np.abs(values)

    work = low_cost(np.add.reduceat(cost, starts, axis=1))
    biggest = low_cost(np.maximum.reduceat(cost, starts, axis=1))
    storage = np.stack([lowered(x, np.add.reduceat(stored[:, :, t], starts, axis=1).astype(float)) - slack
                        for t in range(2)], axis=-1)
    n, f, k = x.size, len(layouts), candidates.num_devices
    table = np.tile([options.options[o].table for o in layouts], n)
    pinned_layout = np.array([candidates.placement(o) == "pinned" for o in layouts], dtype=bool)
    pinned = np.tile(pinned_layout, n)
    floor = np.zeros((n, f))
    # What each pinned layout puts on each device, kept where the LP's per-device rows stay small.
    per_device = pinned.sum() * k <= LP_PER_DEVICE_NONZEROS
    profile_cost, profile_bytes = [], []
    for j in np.flatnonzero(pinned_layout):
        span = np.arange(starts[j], starts[j] + sizes[j])
        devices = options.pin[base[span]]
        on_cost, on_bytes = np.zeros((n, k)), np.zeros((n, k, 2))
        for piece, device in zip(span, devices):
            on_cost[:, device] += cost[:, piece]
            on_bytes[:, device] += stored[:, piece]
        # The least any device gets falls with the load factor; each point takes the next point's, so that a
        # mix of two neighbours stays below it anywhere between them.
        least = on_cost.min(axis=1)
        floor[:, j] = np.r_[least[1:], least[-1]] * (1 - COST_ROUNDING)
        if per_device:
            piece_slack = ROUNDING_SLOTS * np.bincount(devices, weights=slot[span], minlength=k)
            profile_cost.append(low_cost(on_cost))
            profile_bytes.append(np.stack([lowered(x, on_bytes[:, :, t]) - piece_slack for t in range(2)], axis=-1))
    profiles = None
    if per_device and profile_cost:
        # Columns run point by point, layout by layout within a point: so do their profiles.
        profiles = (np.stack(profile_cost, axis=1).reshape(-1, k), np.stack(profile_bytes, axis=1).reshape(-1, k, 2))
    elif per_device:
        profiles = (np.zeros((0, k)), np.zeros((0, k, 2)))
    # A piece too large for a device never sits on one: each layout's points stop at the first load factor at
    # which one of its pieces no longer fits (kept, for the load factors between it and the last that fits).
    capacity = instance.topology.capacity.as_array()
    unfit = np.maximum.reduceat((stored > capacity).any(axis=2), starts, axis=1)
    keep = (np.cumsum(unfit, axis=0) - unfit == 0) & ~unfit[:1]
    keep = keep.reshape(-1)
    columns = LPColumns(table, work.reshape(-1), biggest.reshape(-1), storage.reshape(-1, 2), pinned,
                        floor.reshape(-1), profiles).take(keep)
    kept = keep.reshape(n, f)
    together = np.stack([np.add.reduceat(stored[:, :, t], starts, axis=1) for t in range(2)], axis=-1)
    return Curves(columns, np.repeat(x, f)[keep], np.where(kept[:, :, None], together, 0).max(axis=0))
