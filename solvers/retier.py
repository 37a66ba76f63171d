"""Re-tiering devices in local search, for additive oracles: the tables that live on one device alone
re-choose kernel and cache among their options cut the same way, for the least total cost within the
HBM that device has for them — a multiple-choice knapsack, solved by dynamic programming over the
Pareto front of (HBM bytes, cost), exact while the front stays below FRONT_STATES states — and a table
moves or swaps between the busiest device and another with both devices re-tiered at once. That is the
trade of HBM a single option change, move or in-place trade cannot make: a table leaves, and the tables
it leaves behind grow into the bytes it freed."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances.memory import HBM

from .assembly import Assembly
from .base import past

FRONT_STATES = 1024  # a knapsack's Pareto front is thinned to about this many states per table added
SWAP_PARTNERS = 60   # per target device, its lightest local tables tried in a swap


@dataclass(frozen=True)
class _Front:
    """A knapsack's Pareto front over some tables: per state its HBM bytes and cost, and per table (in the
    order added) the table, its variants, and per state the state it extends and the variant taken."""

    hbm: np.ndarray
    cost: np.ndarray
    stages: tuple = ()


EMPTY = _Front(np.zeros(1, dtype=np.int64), np.zeros(1))


class Retier:
    """Per assembly: each option's cost and bytes as one device's share (for options whose pieces all sit
    on one device), and the knapsack over a device's local tables."""

    def __init__(self, assembly: Assembly):
        self.a = assembly
        c = self.c = assembly.c
        self.cost, self.need = c.work, c.total_storage
        self.hbm = self.need[:, HBM]
        # A table's variants of each cut: every live option of the same layout (the knapsack is exact over
        # what it is given, so options off the convex hull stay: an integer packing may want them).
        self.variants: dict[int, np.ndarray] = {}
        for ids in c.by_table:
            for layout in np.unique(c.layout[ids]):
                self.variants[int(layout)] = ids[c.layout[ids] == layout]

    def local_tables(self, device: int) -> list[int]:
        """The tables whose pieces all sit on `device`."""
        a, c = self.a, self.c
        tables = np.unique(c.options.pieces.table[a.on(device)])
        return [int(t) for t in tables if (a.device[c.members(int(a.chosen[t]))] == device).all()]

    def movable(self, tables: list[int]) -> list[int]:
        """Of `tables`, those in a one-piece free option (a whole table that can sit on any device)."""
        a, c = self.a, self.c
        return [t for t in tables
                if c.options.options[int(a.chosen[t])].parts == 1 and c.placement(int(a.chosen[t])) == "free"]

    def room(self, device: int, tables: list[int]) -> tuple[float, np.ndarray]:
        """What `device` costs and has free with `tables` (local to it) taken off."""
        chosen = self.a.chosen[tables] if tables else np.zeros(0, dtype=np.int64)
        fixed = float(self.a.costs()[device] - self.cost[chosen].sum())
        return fixed, self.a.free[device] + self.need[chosen].sum(axis=0)

    def front(self, tables: list[int], budget: int, start: _Front = EMPTY) -> _Front | None:
        """`start` extended by `tables`, each over the variants of its current cut, within `budget` bytes of
        HBM: the Pareto front of (HBM, cost) over every choice; None where nothing fits."""
        hbm, cost, stages = start.hbm, start.cost, start.stages
        for t in tables:
            ids = self.variants[int(self.c.layout[int(self.a.chosen[t])])]
            h = (hbm[:, None] + self.hbm[ids][None, :]).ravel()
            c = (cost[:, None] + self.cost[ids][None, :]).ravel()
            keep = np.flatnonzero(h <= budget)
            if keep.size == 0:
                return None
            order = keep[np.lexsort((c[keep], h[keep]))]
            # Along rising HBM, a state is kept only where it costs less than every state before it.
            ordered = c[order]
            kept = order[np.r_[True, ordered[1:] < np.minimum.accumulate(ordered)[:-1]]]
            if kept.size > FRONT_STATES:
                # Thinned to the cheapest state per HBM bucket: still exact in bytes (every state is a real
                # choice), no longer exact in cost (a device with 40 tables under `analytic` kept ~10^4).
                bucket = (h[kept] * (FRONT_STATES / max(budget, 1))).astype(np.int64)
                kept = kept[np.r_[bucket[1:] != bucket[:-1], True]]
            hbm, cost = h[kept], c[kept]
            stages = (*stages, (t, ids, kept // ids.size, kept % ids.size))
        return _Front(hbm, cost, stages)

    def pick(self, front: _Front | None, free: np.ndarray) -> tuple[float, list[tuple[int, int]]] | None:
        """The front's cheapest choice, as its cost and (table, option) pairs; None where there is none or it
        leaves another tier short (HBM fits by construction)."""
        if front is None:
            return None
        state = int(np.argmin(front.cost))
        total = float(front.cost[state])
        chosen = []
        for table, ids, parent, variant in reversed(front.stages):
            chosen.append((table, int(ids[variant[state]])))
            state = int(parent[state])
        chosen.reverse()
        if chosen and (self.need[[o for _, o in chosen]].sum(axis=0) > free).any():
            return None
        return total, chosen

    def best_step(self, ceiling: float,
                  deadline: float | None = None) -> tuple[float, list[tuple[int, int, int]]] | None:
        """The re-tiering of the busiest device alone, or a move or swap of one of its whole local tables
        with another device and both re-tiered, whose busier device ends lowest, if below `ceiling`: its
        value and the changes as (table, option, device). The fronts of each device's tables less one are
        built once per step and extended by the table that comes in. Past `deadline` the candidates not yet
        tried are left (a step at 200 × 16 tries thousands of knapsacks) and the best so far returned."""
        a = self.a
        top = int(np.argmax(a.costs()))
        here = self.local_tables(top)
        if not here:
            return None
        best_value, best = ceiling, None

        def consider(top_side, top_fixed, other_side, other_fixed, device) -> None:
            nonlocal best_value, best
            if top_side is None or other_side is None:
                return
            value = max(top_fixed + top_side[0], other_fixed + other_side[0])
            if value < best_value:
                best_value = value
                best = [(t, o, top) for t, o in top_side[1]] + [(t, o, device) for t, o in other_side[1]]

        fixed_top, free_top = self.room(top, here)
        consider(self.pick(self.front(here, int(free_top[HBM])), free_top), fixed_top, (0.0, []), -np.inf, top)
        others = {}
        for device in range(a.k):
            if device == top:
                continue
            if past(deadline):
                break
            theirs = self.local_tables(device)
            fixed, free = self.room(device, theirs)
            budget = int(free[HBM])
            partners = sorted(self.movable(theirs), key=lambda t: self.cost[a.chosen[t]])[:SWAP_PARTNERS]
            without = {u: self.front([x for x in theirs if x != u], budget) for u in partners}
            others[device] = (fixed, free, self.front(theirs, budget), without)
        for t in sorted(self.movable(here), key=lambda t: -self.cost[a.chosen[t]]):
            kept = self.front([x for x in here if x != t], int(free_top[HBM]))
            if kept is None:
                continue
            alone = self.pick(kept, free_top)
            for device, (fixed, free, all_theirs, without) in others.items():
                if past(deadline):
                    break
                if alone is not None and fixed_top + alone[0] < best_value and all_theirs is not None:
                    consider(alone, fixed_top, self.pick(self.front([t], int(free[HBM]), all_theirs), free), fixed,
                             device)
                for u, rest in without.items():
                    back = self.pick(self.front([u], int(free_top[HBM]), kept), free_top)
                    if back is None or fixed_top + back[0] >= best_value or rest is None:
                        continue
                    consider(back, fixed_top, self.pick(self.front([t], int(free[HBM]), rest), free), fixed, device)
        if best is None:
            return None
        return best_value, best

    def apply(self, changes: list[tuple[int, int, int]]) -> None:
        """Each table to its option on its device (all its pieces there); tables already so are left."""
        a, c = self.a, self.c
        moving = [(t, o, d) for t, o, d in changes
                  if a.chosen[t] != o or (a.device[c.members(o)] != d).any()]
        for t, _, _ in moving:
            a.take(t)
        for _, o, d in moving:
            a.put(o, np.full(c.members(o).size, d, dtype=np.int64))


def usable(assembly: Assembly) -> bool:
    """Whether re-tiering applies: an additive oracle (a device's cost is its pieces' sum), tables with
    kernels or caches to choose, and no move budget to account for."""
    c = assembly.c
    return c.priced.additive and c.trades_hbm and assembly.moves is None

