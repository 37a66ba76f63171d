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


def resize_caches(instance: Instance, oracle: Oracle, plan: Plan) -> Plan | None:
    """The plan with its caches re-sized (`resizable`; a table's pieces share one load factor) over load factors
    STEP apart, None where that lowers no cost. First the tables cut over several devices: each at its least
    cost plus one price on the HBM it takes, at the least price where every device fits (bisected), then grown
    into what HBM is left (`_cheapest_within`), kept where no device then costs more. Then, device by device, the
    caches of the tables it holds whole, at the least cost that device pays within the HBM the rest of its
    pieces leave (the same). Every tier is checked; additive oracles only (a device's cost
    is its pieces' sum)."""
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

    split = np.flatnonzero(~whole)
    if split.size:
        _, used = state()
        ids, row_of = np.unique(tables[split], return_inverse=True)
        table_cost = np.zeros((ids.size, factors.size))
        table_hbm = np.zeros((ids.size, k, factors.size))
        np.add.at(table_cost, row_of, variant_cost[split])
        np.add.at(table_hbm, (row_of, devices[chosen[split]]), variant_storage[split, :, HBM])
        room = capacity[HBM] - used[:, HBM] + np.bincount(devices[chosen[split]], minlength=k,
                                                          weights=variant_storage[split, column[split], HBM])
        picked = _cheapest_within(table_cost, table_hbm, room)
        if picked is not None:
            trial = column.copy()
            trial[split] = picked[row_of]
            load, _ = state()
            column_before, column[:] = column.copy(), trial
            after, used_after = state()
            if not ((used_after <= capacity).all() and after.max() <= load.max() and after.sum() < load.sum()):
                column[:] = column_before
    for d in np.unique(devices[chosen[whole]]):
        rows = np.flatnonzero(whole & (devices[chosen] == d))
        _, used = state()
        room = capacity[HBM] - used[d, HBM] + variant_storage[rows, column[rows], HBM].sum()
        picked = _cheapest_within(variant_cost[rows], variant_storage[rows, None, :, HBM], np.array([room]))
        if picked is None:
            continue
        extra = (variant_storage[rows, picked] - variant_storage[rows, column[rows]]).sum(axis=0)
        cheaper = variant_cost[rows, picked].sum() < variant_cost[rows, column[rows]].sum()
        if cheaper and (used[d] + extra <= capacity).all():
            column[rows] = picked
    new = factors[column]
    if np.array_equal(new, pieces.load_factor[chosen]):
        return None
    factor_of = {int(t): float(f) for t, f in zip(tables, new)}
    return Plan(plan.instance_id, tuple(replace(s, cache_load_factor=factor_of[t]) if t in factor_of else s
                                        for t, s in enumerate(plan.tables)))


def _cheapest_within(cost: np.ndarray, hbm: np.ndarray, room: np.ndarray) -> np.ndarray | None:
    """Per table (row of `cost`, tables × factors; `hbm`, tables × devices × factors), the factor chosen so that
    every device's HBM stays within its `room`: each table's least cost plus one price times its HBM summed
    over devices, at the least price that fits (bisected), then raised while every device still fits and that
    lowers the cost, the largest saving first; None where even the leanest factors do not fit."""
    summed = hbm.sum(axis=1)
    rows = np.arange(len(cost))

    def choice(price: float) -> np.ndarray:
        return np.argmin(cost + price * summed, axis=1)

    def fits(columns: np.ndarray) -> bool:
        return bool((hbm[rows, :, columns].sum(axis=0) <= room).all())

    price = 0.0
    if not fits(choice(price)):
        low, high = 0.0, max(float(cost.max()), 1e-300) / max(float(summed[summed > 0].min(initial=1.0)), 1.0)
        while not fits(choice(high)) and high < 1e300:
            high *= 2
        if not fits(choice(high)):
            return None
        for _ in range(PRICE_STEPS):
            middle = (low + high) / 2
            low, high = (middle, high) if not fits(choice(middle)) else (low, middle)
        price = high
    columns = choice(price)
    while True:
        left = room - hbm[rows, :, columns].sum(axis=0)
        extra = hbm - hbm[rows, :, columns][:, :, None]
        saving = np.where((extra <= left[None, :, None]).all(axis=1), cost[rows, columns][:, None] - cost, 0.0)
        r, c = np.unravel_index(np.argmax(saving), saving.shape)
        if saving[r, c] <= 0:
            return columns
        columns[r] = c
