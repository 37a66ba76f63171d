"""Cache sizes off the grid: a plan's caches re-sized to the load factors that cost its devices least within
their HBM. The options offer a cached table a few load factors (instances.kernels) so that the solvers' models
stay small; a cache may take any in (0, 1], and the HBM a plan leaves between two steps of that grid is worth
having (docs/memory-tiers.md). Tables, devices and kernels stay as the plan has them."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodels import Oracle
from instances import Instance, Plan
from instances.kernels import FUSED_UVM_CACHING, KERNEL_CODE
from instances.memory import HBM
from instances.pieces import Pieces

# Load factors a re-sized cache may take: the multiples of this step in (0, 1] (and the one it had), or, where
# more than MAX_VARIANTS pieces would be priced, of a coarser step.
STEP = 0.0025
MAX_VARIANTS = 50_000  # about 0.5 s of pricing under TorchRec's estimator, within what `plan` keeps back
PRICE_STEPS = 60  # bisection steps on a device's HBM price


def resizable(instance: Instance, pieces: Pieces) -> np.ndarray:
    """The plan's cached pieces whose load factor the instance leaves open."""
    open_factor = np.array([t.cache_load_factor is None for t in instance.tables], dtype=bool)[pieces.table]
    return np.flatnonzero(open_factor & (pieces.kernel == KERNEL_CODE[FUSED_UVM_CACHING]))


def _priced(instance: Instance, oracle: Oracle, pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
    """Each piece's cost and its bytes per tier, as the solvers count them (candidates.storage's rule)."""
    priced = oracle.bind(instance, pieces)
    storage = priced.storage if not oracle.own_memory else np.maximum(priced.storage, pieces.storage(instance))
    return np.asarray(priced.costs, dtype=float), storage


def _variants(pieces: Pieces, chosen: np.ndarray, factors: np.ndarray) -> Pieces:
    """Every chosen piece at every load factor (piece-major)."""
    at = np.repeat(chosen, factors.size)
    return Pieces.of(*(getattr(pieces, f)[at] for f in ("table", "kind", "row_start", "row_end", "col_start",
                                                        "col_end", "kernel")),
                     load_factor=np.tile(factors, chosen.size))


def _least_cost(cost: np.ndarray, hbm: np.ndarray, room: float) -> np.ndarray:
    """Per row (a piece's variants), the column chosen so that the HBM summed over rows stays within `room`
    and the cost summed is least at the lowest HBM price that fits (bisected); -1 per row where even each
    row's leanest variant does not fit."""
    def choice(price: float) -> np.ndarray:
        return np.argmin(cost + price * hbm, axis=1)

    def used(columns: np.ndarray) -> float:
        return float(hbm[np.arange(len(columns)), columns].sum())

    if used(choice(0.0)) <= room:
        return choice(0.0)
    low, high = 0.0, max(float(cost.max()), 1e-300) / max(float(hbm.min(initial=1.0)), 1.0)
    while used(choice(high)) > room and high < 1e300:
        high *= 2
    if used(choice(high)) > room:
        return np.full(len(cost), -1)
    for _ in range(PRICE_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if used(choice(middle)) > room else (low, middle)
    return choice(high)


def resize_caches(instance: Instance, oracle: Oracle, plan: Plan) -> Plan | None:
    """The plan with its caches re-sized (`resizable`; a table's pieces share one load factor), None where
    that lowers no device's cost. First, per device, the caches of the tables it holds whole, sized for the
    least cost it pays within the HBM the rest of its pieces leave (the Lagrangian choice over load factors
    STEP apart, then STEP by STEP into the HBM left); then each cached table in turn at the load factor that
    lowers the busiest device it sits on, and then the cost of all its devices, the most, while every device
    fits every tier — the only move for a table cut over several devices. Additive oracles only (a device's
    cost is its pieces' sum)."""
    if not oracle.additive:
        return None
    pieces, devices = Pieces.of_plan(instance, plan)
    chosen = resizable(instance, pieces)
    if chosen.size == 0:
        return None
    cost, storage = _priced(instance, oracle, pieces)
    steps = max(20, min(round(1 / STEP), MAX_VARIANTS // chosen.size))
    factors = np.unique(np.r_[np.round(np.arange(1, steps + 1) / steps, 4), pieces.load_factor[chosen]])
    variant_cost, variant_storage = _priced(instance, oracle, _variants(pieces, chosen, factors))
    variant_cost = variant_cost.reshape(chosen.size, factors.size)
    variant_storage = variant_storage.reshape(chosen.size, factors.size, 2)
    column = np.searchsorted(factors, pieces.load_factor[chosen])
    capacity = instance.topology.capacity.as_array()
    k = instance.num_devices
    tables = pieces.table[chosen]
    whole = np.bincount(tables, minlength=instance.num_tables)[tables] == 1

    def state() -> tuple[np.ndarray, np.ndarray]:
        """Each device's cost and bytes with the chosen pieces at their current columns."""
        at = np.arange(chosen.size)
        load = np.bincount(devices, weights=cost, minlength=k) + np.bincount(
            devices[chosen], weights=variant_cost[at, column] - cost[chosen], minlength=k)
        used = np.zeros((k, 2), dtype=np.int64)
        np.add.at(used, devices, storage)
        np.add.at(used, devices[chosen], variant_storage[at, column] - storage[chosen])
        return load, used

    for d in np.unique(devices[chosen[whole]]):
        rows = np.flatnonzero(whole & (devices[chosen] == d))
        _, used = state()
        room = float(capacity[HBM] - used[d, HBM] + variant_storage[rows, column[rows], HBM].sum())
        hbm = variant_storage[rows, :, HBM].astype(float)
        picked = _least_cost(variant_cost[rows], hbm, room)
        if (picked < 0).any():
            continue
        picked = _grow(variant_cost[rows], hbm, picked, room)
        extra = (variant_storage[rows, picked] - variant_storage[rows, column[rows]]).sum(axis=0)
        if (used[d] + extra <= capacity).all() and variant_cost[rows, picked].sum() < variant_cost[rows, column[rows]].sum():
            column[rows] = picked
    for t in np.unique(tables):
        rows = np.flatnonzero(tables == t)
        load, used = state()
        on = devices[chosen[rows]]
        # Per factor: each of the table's devices' cost and bytes with its pieces there at that factor.
        delta_cost = np.zeros((factors.size, k))
        delta_used = np.zeros((factors.size, k, 2), dtype=np.int64)
        for r, d in zip(rows, on):
            delta_cost[:, d] += variant_cost[r] - variant_cost[r, column[r]]
            delta_used[:, d] += variant_storage[r] - variant_storage[r, column[r]]
        fits = (used[None] + delta_used <= capacity).all(axis=(1, 2))
        devices_of = np.unique(on)
        after = load[None, devices_of] + delta_cost[:, devices_of]
        score = np.where(fits, after.max(axis=1), np.inf)
        best = np.flatnonzero(score <= score.min())
        f = int(best[np.argmin(after[best].sum(axis=1))])
        if f != column[rows[0]] and after[f].sum() < (load[devices_of]).sum() and score[f] <= load[devices_of].max():
            column[rows] = f
    new = factors[column]
    if np.array_equal(new, pieces.load_factor[chosen]):
        return None
    factor_of = {int(t): float(f) for t, f in zip(tables, new)}
    return Plan(plan.instance_id, tuple(replace(s, cache_load_factor=factor_of[t]) if t in factor_of else s
                                        for t, s in enumerate(plan.tables)))


def _grow(cost: np.ndarray, hbm: np.ndarray, columns: np.ndarray, room: float) -> np.ndarray:
    """The chosen columns, each raised while the HBM left allows and that lowers the cost: the Lagrangian
    choice leaves up to one step's worth of HBM per piece unused."""
    columns = columns.copy()
    rows = np.arange(len(columns))
    while True:
        left = room - float(hbm[rows, columns].sum())
        best, gain = None, 0.0
        for r in rows:
            up = np.flatnonzero((hbm[r] - hbm[r, columns[r]] <= left) & (cost[r] < cost[r, columns[r]]))
            if up.size:
                c = int(up[np.argmin(cost[r, up])])
                if cost[r, columns[r]] - cost[r, c] > gain:
                    best, gain = (r, c), cost[r, columns[r]] - cost[r, c]
        if best is None:
            return columns
        columns[best[0]] = best[1]
