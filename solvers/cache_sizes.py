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

from .base import past
from .candidates import counted_storage

# Load factors a re-sized cache may take: the multiples of this step in (0, 1] (and the one it had), or, where
# more than MAX_VARIANTS pieces would be priced, of a coarser step.
STEP = 0.0025
MAX_VARIANTS = 25_000  # about 0.25 s of pricing under TorchRec's estimator, within what `plan` keeps back
PRICE_STEPS = 60  # bisection steps on a device's HBM price


def resizable(instance: Instance, pieces: Pieces) -> np.ndarray:
    """The plan's cached pieces whose load factor the instance leaves open."""
    open_factor = np.array([t.cache_load_factor is None for t in instance.tables], dtype=bool)[pieces.table]
    return np.flatnonzero(open_factor & (pieces.kernel == KERNEL_CODE[FUSED_UVM_CACHING]))


def _priced(instance: Instance, oracle: Oracle, pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
    """Each piece's cost and its bytes per tier, as the solvers count them."""
    priced = oracle.bind(instance, pieces)
    return np.asarray(priced.costs, dtype=float), counted_storage(instance, pieces, priced, oracle.own_memory)


def _variants(pieces: Pieces, chosen: np.ndarray, factors: np.ndarray) -> Pieces:
    """Every chosen piece at every load factor (piece-major)."""
    at = np.repeat(chosen, factors.size)
    return Pieces.of(*(getattr(pieces, f)[at] for f in ("table", "kind", "row_start", "row_end", "col_start",
                                                        "col_end", "kernel")),
                     load_factor=np.tile(factors, chosen.size))


def resize_caches(instance: Instance, oracle: Oracle, plan: Plan, deadline: float = np.inf) -> Plan | None:
    """The plan with its caches re-sized (`resizable`; a table's pieces share one load factor) over load factors
    STEP apart (or coarser: MAX_VARIANTS), None where that lowers no cost or `deadline` (time.monotonic()) is
    past. First the tables cut over several devices together (`_Caches.resize_split`), then each device's whole
    tables (`_Caches.resize_whole`), each step kept where it fits every tier and no device then costs more.
    Additive oracles only (a device's cost is its pieces' sum)."""
    if not oracle.additive or past(deadline):
        return None
    pieces, devices = Pieces.of_plan(instance, plan)
    chosen = resizable(instance, pieces)
    if chosen.size == 0:
        return None
    caches = _Caches(instance, oracle, pieces, devices, chosen)
    caches.resize_split(deadline)
    caches.resize_whole(deadline)
    new = caches.factors[caches.column]
    if np.array_equal(new, pieces.load_factor[chosen]):
        return None
    factor_of = {int(t): float(f) for t, f in zip(caches.tables, new)}
    return Plan(plan.instance_id, tuple(replace(s, cache_load_factor=factor_of[t]) if t in factor_of else s
                                        for t, s in enumerate(plan.tables)))


class _Caches:
    """A plan's resizable pieces, each priced at every load factor of the fine grid, and the column (load
    factor) each is at now."""

    def __init__(self, instance: Instance, oracle: Oracle, pieces: Pieces, devices: np.ndarray, chosen: np.ndarray):
        self.devices, self.chosen, self.k = devices, chosen, instance.num_devices
        self.capacity = instance.topology.capacity.as_array()
        self.cost, self.storage = _priced(instance, oracle, pieces)
        steps = max(1, min(round(1 / STEP), MAX_VARIANTS // chosen.size))
        self.factors = np.unique(np.r_[np.round(np.arange(1, steps + 1) / steps, 4), pieces.load_factor[chosen]])
        variant_cost, variant_storage = _priced(instance, oracle, _variants(pieces, chosen, self.factors))
        self.variant_cost = variant_cost.reshape(chosen.size, self.factors.size)
        self.variant_storage = variant_storage.reshape(chosen.size, self.factors.size, 2)
        self.column = np.searchsorted(self.factors, pieces.load_factor[chosen])
        self.tables = pieces.table[chosen]
        self.whole = np.bincount(self.tables, minlength=instance.num_tables)[self.tables] == 1

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Each device's cost and bytes per tier with the resizable pieces at their current columns."""
        at, on = np.arange(self.chosen.size), self.devices[self.chosen]
        load = np.bincount(self.devices, weights=self.cost, minlength=self.k) + np.bincount(
            on, weights=self.variant_cost[at, self.column] - self.cost[self.chosen], minlength=self.k)
        used = np.zeros((self.k, 2), dtype=np.int64)
        np.add.at(used, self.devices, self.storage)
        np.add.at(used, on, self.variant_storage[at, self.column] - self.storage[self.chosen])
        return load, used

    def resize_split(self, deadline: float) -> None:
        """The tables cut over several devices (one load factor per table): each at its least cost plus one
        price on the HBM it takes, at the least price where every device fits (`_cheapest_within`, by
        `deadline`), kept where every tier fits, no device costs more and they cost less in all."""
        split = np.flatnonzero(~self.whole)
        if not split.size:
            return
        load, used = self.state()
        on = self.devices[self.chosen[split]]
        ids, row_of = np.unique(self.tables[split], return_inverse=True)
        table_cost = np.zeros((ids.size, self.factors.size))
        table_hbm = np.zeros((ids.size, self.k, self.factors.size))
        np.add.at(table_cost, row_of, self.variant_cost[split])
        np.add.at(table_hbm, (row_of, on), self.variant_storage[split, :, HBM])
        room = self.capacity[HBM] - used[:, HBM] + np.bincount(
            on, weights=self.variant_storage[split, self.column[split], HBM], minlength=self.k)
        picked = _cheapest_within(table_cost, table_hbm, room, deadline)
        if picked is None:
            return
        before = self.column.copy()
        self.column[split] = picked[row_of]
        after, used = self.state()
        if not ((used <= self.capacity).all() and after.max() <= load.max() and after.sum() < load.sum()):
            self.column = before

    def resize_whole(self, deadline: float) -> None:
        """Device by device while `deadline` allows, the caches of the tables it holds whole, at the least cost
        that device pays within the HBM its other pieces leave (`_cheapest_within`), kept where the device
        then costs less and fits every tier."""
        for d in np.unique(self.devices[self.chosen[self.whole]]):
            if past(deadline):
                return
            rows = np.flatnonzero(self.whole & (self.devices[self.chosen] == d))
            _, used = self.state()
            now = self.column[rows]
            room = self.capacity[HBM] - used[d, HBM] + self.variant_storage[rows, now, HBM].sum()
            picked = _cheapest_within(self.variant_cost[rows], self.variant_storage[rows, None, :, HBM],
                                      np.array([room]), deadline)
            if picked is None:
                continue
            extra = (self.variant_storage[rows, picked] - self.variant_storage[rows, now]).sum(axis=0)
            cheaper = self.variant_cost[rows, picked].sum() < self.variant_cost[rows, now].sum()
            if cheaper and (used[d] + extra <= self.capacity).all():
                self.column[rows] = picked


def _cheapest_within(cost: np.ndarray, hbm: np.ndarray, room: np.ndarray, deadline: float) -> np.ndarray | None:
    """Per table (row of `cost`, tables × factors; `hbm`, tables × devices × factors), the factor chosen so that
    every device's HBM stays within its `room`: each table's least cost plus one price times its HBM summed
    over devices, at the least price that fits (bisected), then raised while every device still fits, that
    lowers the cost and `deadline` allows, the largest saving first; None where even the leanest factors do
    not fit."""
    summed = hbm.sum(axis=1)
    rows = np.arange(len(cost))

    def choice(price: float) -> np.ndarray:
        return np.argmin(cost + price * summed, axis=1)

    def fits(columns: np.ndarray) -> bool:
        return bool((hbm[rows, :, columns].sum(axis=0) <= room).all())

    price = 0.0
    if not fits(choice(price)):
        low, high = 0.0, max(float(cost.max()), 1e-300) / float(summed[summed > 0].min(initial=1.0))
        while not fits(choice(high)) and high < 1e300:
            high *= 2
        if not fits(choice(high)):
            return None
        for _ in range(PRICE_STEPS):
            middle = (low + high) / 2
            low, high = (middle, high) if not fits(choice(middle)) else (low, middle)
        price = high
    columns = choice(price)
    while not past(deadline):
        left = room - hbm[rows, :, columns].sum(axis=0)
        extra = hbm - hbm[rows, :, columns][:, :, None]
        saving = np.where((extra <= left[None, :, None]).all(axis=1), cost[rows, columns][:, None] - cost, 0.0)
        r, c = np.unravel_index(np.argmax(saving), saving.shape)
        if saving[r, c] <= 0:
            break
        columns[r] = c
    return columns
