"""Plans by bin packing at a target makespan, for additive oracles: at a target T every table takes its
lightest option whose pieces stay at or below T (within a share of the spare memory, `choose_options`),
and pieces go best-fit (onto the busiest device they still fit under T and memory) instead of onto the
least loaded one; T is bisected between a lower bound and the best plan. Where pieces are large against
the makespan (hundreds of tables on 128 devices), balancing greedily leaves no room for the largest tables
whole and splits them at twice their work; packing keeps them whole."""
from __future__ import annotations

import numpy as np

from .assembly import Assembly, Trial
from .base import past
from .choice import MEMORY_SHARES, RELATIVE_STEP, choose_options
from .candidates import Candidates

PACKING_STEPS = 14  # bisection steps on the target (the last ones move it by ~1e-4 of the first interval)
# How a free piece picks among the devices it fits on: the busiest by cost alone, or by cost and memory
# shares together (which keeps room where memory is tight).
FITS = ("cost", "cost+memory")


def pack(candidates: Candidates, target: float, weight: np.ndarray, fit: str = "cost",
         memory_share: float = MEMORY_SHARES[0], allowed: np.ndarray | None = None) -> Assembly | None:
    """A plan whose every device costs at most `target`, or None where best-fit packing finds none: pinned
    options first, then node options, then free pieces largest first; a table whose option finds no room
    tries its other options that stay below the target, lightest first."""
    c = candidates
    chosen = choose_options(c, target, weight, memory_share, allowed)
    assembly = Assembly(c)
    rank = {"pinned": 0, "node": 1, "grid": 1, "node_free": 1, "free": 2}
    order = sorted(range(chosen.size), key=lambda t: (rank[c.placement(int(chosen[t]))], -c.biggest[chosen[t]], t))
    capacity = c.instance.topology.capacity.as_array().astype(float)
    has = capacity > 0
    limit = target * (1 + RELATIVE_STEP)
    for table in order:
        others = sorted((int(o) for o in c.by_table[table] if o != chosen[table]), key=lambda o: weight[o])
        for option in [int(chosen[table]), *others]:
            if c.biggest[option] > limit:
                continue
            devices = (_best_fit(assembly, option, limit, capacity, has, fit) if c.placement(option) == "free"
                       else _fixed_fit(assembly, option, limit))
            if devices is not None:
                assembly.put(option, devices)
                break
        else:
            return None
    return assembly


def _fixed_fit(assembly: Assembly, option: int, limit: float) -> np.ndarray | None:
    trial = assembly.fit(option)
    if isinstance(trial, Trial) and trial.costs[trial.devices].max() <= limit:
        return trial.devices
    return None


def _best_fit(assembly: Assembly, option: int, limit: float, capacity: np.ndarray, has: np.ndarray,
              fit: str) -> np.ndarray | None:
    members = assembly.c.members(option)
    costs = assembly.c.priced.costs
    loads, free = assembly.costs().copy(), assembly.free.copy()
    # Cost shares of the target (of the busiest device where the target is unbounded or zero).
    scale = limit if 0 < limit < np.inf else max(float(loads.max()) + float(costs[members].sum()), 1e-300)
    devices = np.empty(members.size, dtype=np.int64)
    for i, piece in enumerate(members):
        need = assembly.memory[piece]
        after = loads + costs[piece]
        fits = np.flatnonzero((after <= limit) & (free >= need).all(axis=1))
        if fits.size == 0:
            return None
        score = after[fits] / scale
        if fit == "cost+memory":
            score = score + (1 - free[fits][:, has] / capacity[has]).sum(axis=1)
        d = int(fits[np.argmax(score)])
        devices[i] = d
        loads[d] = after[d]
        free[d] -= need
    return devices


def packed(candidates: Candidates, low: float, best: Assembly | None, weight: np.ndarray,
           deadline: float | None = None, memory_share: float = MEMORY_SHARES[0],
           allowed: np.ndarray | None = None) -> Assembly | None:
    """The best plan of bisecting the target between `low` (a lower bound) and `best`'s objective (or the
    plan at an unbounded target), each target tried with every fit, the options chosen among `allowed`;
    None where none packs. Stops at `deadline` with the best plan so far."""
    high = best.objective() if best is not None else np.inf
    found = best
    if not np.isfinite(high):
        found = next((a for a in (pack(candidates, np.inf, weight, fit, memory_share, allowed) for fit in FITS)
                      if a is not None), None)
        if found is None:
            return None
        high = found.objective()
    for _ in range(PACKING_STEPS):
        if high <= low * (1 + 1e-6) or past(deadline):
            break
        target = (low + high) / 2
        trial = next((a for a in (pack(candidates, target, weight, fit, memory_share, allowed) for fit in FITS)
                      if a is not None), None)
        if trial is None:
            low = target
            continue
        if found is None or trial.objective() < found.objective():
            found = trial
        high = min(target, trial.objective())
    return found
