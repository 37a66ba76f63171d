"""A plan tidied within its makespan: each table in the option of least work in no more shards (or as much in
fewer) that keeps every device within the plan's busiest, so that tables off the critical path are not left cut
or cached for nothing."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instances import Plan

from .assembly import Assembly, Trial
from .base import past
from .candidates import Candidates

# Relative difference in work below which two options count as doing the same work (float noise of the
# oracle's sums): between those, the one of fewer shards is the tidier.
SAME_WORK = 1e-9


@dataclass(frozen=True)
class Tidied:
    """A tidied plan, the tables whose option changed, and before and after: its busiest device's cost, the
    work summed over devices and the shards."""

    plan: Plan
    tables: tuple[int, ...]
    peak: tuple[float, float]
    work: tuple[float, float]
    shards: tuple[int, int]


def assembled(candidates: Candidates, plan: Plan, deadline: float = np.inf) -> Assembly | None:
    """The plan as an assembly of the candidates' live options (each table's sharding type, shard count,
    kernel, cache load factor and shards matched to an option's pieces), or None where a table matches none
    or `deadline` passes first."""
    options, pieces = candidates.options.options, candidates.options.pieces
    assembly = Assembly(candidates)
    for t, sharding in enumerate(plan.tables):
        if past(deadline):
            return None
        shape = (sharding.sharding_type, len(sharding.shards), sharding.compute_kernel, sharding.cache_load_factor)
        rectangles = [(*s.rows, *s.cols) for s in sharding.shards]
        for o in candidates.by_table[t]:
            option = options[int(o)]
            if (option.sharding_type, option.parts, option.kernel, option.load_factor) != shape:
                continue
            members = candidates.members(int(o))
            if [(pieces.row_start[p], pieces.row_end[p], pieces.col_start[p], pieces.col_end[p])
                    for p in members] == rectangles:
                assembly.put(int(o), np.array([s.device for s in sharding.shards], dtype=np.int64))
                break
        else:
            return None
    return assembly


def tidier(candidates: Candidates, options: np.ndarray, than: int) -> np.ndarray:
    """Which of `options` do less work than option `than` in no more shards, or as much in fewer. Never more
    shards: a replica on every device may do less work summed than the table whole on one (`analytic` at
    5000 × 512: 180 tables), but it is no tidier."""
    work, parts = candidates.work[options], candidates.parts[options]
    fewer, same = parts < candidates.parts[than], parts == candidates.parts[than]
    less = work < candidates.work[than] * (1 - SAME_WORK)
    return (less & (fewer | same)) | (fewer & (work <= candidates.work[than] * (1 + SAME_WORK)))


def tidy(assembly: Assembly, deadline: float) -> tuple[int, ...]:
    """Each table in turn (most shards first, then most work) takes the first of its tidier options (`tidier`,
    least work first) that fits with no device above the busiest before (`Assembly.fit` places it where it costs
    least), in rounds until a round changes nothing or `deadline` passes. A device an option leaves alone does
    not count: the running sums' adds and takes may have left it a float's noise above the busiest before. The
    searches judge a plan by its busiest device alone and leave the others as they found them: on the MLPerf
    Criteo-1TB tables with HBM short, `pair-balance` served a 36-row table column-wise in two cached pieces at
    18.6 ms of work where whole in HBM it does 0.31. Additive oracles (an option's work is its pieces' sum).
    The tables changed."""
    c = assembly.c
    ceiling = assembly.objective()
    now = assembly.chosen
    order = np.lexsort((np.arange(now.size), -c.work[now], -c.parts[now])).tolist()
    changed: set[int] = set()
    while True:
        moved = False
        for t in order:
            if past(deadline):
                return tuple(sorted(changed))
            ids = c.by_table[t]
            better = ids[tidier(c, ids, int(assembly.chosen[t]))]
            if not better.size:
                continue
            option, devices = assembly.take(t)
            allowed = np.maximum(assembly.costs(), ceiling)
            for o in better[np.lexsort((better, c.parts[better], c.work[better]))].tolist():
                trial = assembly.fit(o)
                if isinstance(trial, Trial) and (trial.costs <= allowed).all():
                    assembly.put(o, trial.devices)
                    changed.add(t)
                    moved = True
                    break
            else:
                assembly.put(option, devices)
        if not moved:
            return tuple(sorted(changed))


def tidy_plan(candidates: Candidates, plan: Plan, deadline: float) -> Tidied | None:
    """`tidy` on the plan (its options found among the candidates: `assembled`), or None where it changes
    nothing, a table is cut or cached as no live option is, or `deadline` passes before its options are found."""
    assembly = assembled(candidates, plan, deadline)
    if assembly is None:
        return None
    peak, work, shards = assembly.objective(), float(assembly.costs().sum()), int(assembly.placed().size)
    tables = tidy(assembly, deadline)
    if not tables:
        return None
    return Tidied(assembly.plan(), tables, (peak, assembly.objective()), (work, float(assembly.costs().sum())),
                  (shards, int(assembly.placed().size)))
