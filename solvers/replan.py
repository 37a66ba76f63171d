"""The greedy a replan starts from (what `split-greedy` does given a previous plan, and so where local search
and the exact models start): every old table where the previous plan had it, the new tables placed around
them, then descent on moves, swaps and option changes off the busiest device while the move budget allows;
and the fresh split-aware greedy's plan instead where the budget affords it and it is better."""
from __future__ import annotations

import copy

import numpy as np

from .assembly import Assembly, Stuck, Trial, choose_options
from .candidates import Candidates


def from_previous(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | Stuck | None:
    """The previous plan kept, and what it lacks added: each old table in its old option on its old devices
    unless that option is gone or no longer fits the memory left (then it is placed anew, as the new
    tables are, largest first where it costs least, moving what it must); then descent within the move
    budget. A Stuck where a table fits nowhere, None where the move budget cannot place one."""
    from .search import descend, option_weight

    moves = candidates.moves
    assembly = Assembly(candidates)
    for table, option in enumerate(moves.old_option):
        if option < 0 or not candidates.live[option]:
            continue
        members = candidates.members(int(option))
        devices = moves.old_device[members]
        need = np.zeros_like(assembly.free)
        np.add.at(need, devices, assembly.memory[members])
        if (need <= assembly.free).all():
            assembly.put(int(option), devices)
    weight = option_weight(candidates)
    chosen = choose_options(candidates, np.inf, weight)
    biggest = candidates.biggest if candidates.priced.additive else np.maximum.reduceat(
        candidates.single_costs, candidates.options.first)
    unplaced = sorted(np.flatnonzero(assembly.chosen < 0).tolist(), key=lambda t: (-biggest[chosen[t]], t))
    for table in unplaced:
        first = int(chosen[table])
        others = sorted((int(o) for o in candidates.by_table[table] if o != first), key=lambda o: weight[o])
        stuck = None
        for option in [first, *others]:
            result = assembly.fit(option)
            if isinstance(result, Trial):
                assembly.put(option, result.devices)
                break
            stuck = stuck or result
        else:
            return stuck
    descend(assembly, changes, np.inf if deadline is None else deadline)
    return assembly


def fresh_within_budget(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | None:
    """The split-aware greedy's plan made afresh (the previous plan ignored), where the bytes it moves fit
    the move budget; else None."""
    from .search import split_greedy

    fresh = copy.copy(candidates)
    fresh.moves = None
    found = split_greedy(fresh, changes, deadline)
    if not isinstance(found, Assembly):
        return None
    placed = found.placed()
    if candidates.moves.moved(placed, found.device[placed]).sum() > candidates.moves.budget:
        return None
    assembly = Assembly(candidates)
    assembly.load(*found.snapshot())
    return assembly


def replanned(candidates: Candidates, changes: bool, deadline: float | None) -> Assembly | Stuck | None:
    """The better of the previous plan kept and improved (`from_previous`) and the fresh greedy's plan
    where the budget affords it."""
    kept = from_previous(candidates, changes, deadline)
    fresh = fresh_within_budget(candidates, changes, deadline)
    if fresh is not None and (not isinstance(kept, Assembly) or fresh.objective() < kept.objective()):
        return fresh
    return kept
