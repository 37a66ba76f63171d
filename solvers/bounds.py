"""Lower bounds on the optimal max device cost for additive oracles on identical devices."""
from __future__ import annotations

import numpy as np


def average_bound(costs: np.ndarray, num_devices: int) -> float:
    """max(Σc / K, max c): some device carries at least the average, and the largest table sits somewhere."""
    costs = np.asarray(costs, dtype=float)
    return float(max(costs.sum() / num_devices, costs.max(initial=0.0)))


def pigeonhole_bound(costs: np.ndarray, num_devices: int) -> float:
    """Among the m·K + 1 largest tables some device holds m + 1 of them, so it carries at least the sum
    of the m + 1 smallest of those; m = 1 is the classic (K+1)-largest-items bound."""
    desc = np.sort(np.asarray(costs, dtype=float))[::-1]
    best = 0.0
    m = 1
    while m * num_devices + 1 <= desc.size:
        top = m * num_devices + 1
        best = max(best, float(desc[top - m - 1:top].sum()))
        m += 1
    return best


def additive_lower_bounds(costs: np.ndarray, num_devices: int) -> dict[str, float]:
    return {"average": average_bound(costs, num_devices), "pigeonhole": pigeonhole_bound(costs, num_devices)}


def best_additive_lower_bound(costs: np.ndarray, num_devices: int) -> float:
    return max(additive_lower_bounds(costs, num_devices).values())


def lp_relaxation_bound(costs: np.ndarray, memory: np.ndarray, capacity: float, num_devices: int) -> float | None:
    """The memory-aware LP relaxation of the placement MILP (fractional x, every device's load and memory
    within z and capacity, plus z ≥ c_t), solved with HiGHS. None when the LP is infeasible (then no plan
    fits either). On identical devices spreading every table evenly is LP-feasible whenever memory allows,
    so this bound rarely beats `average_bound`; it is kept as the reference relaxation."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    costs = np.asarray(costs, dtype=float)
    n, k = costs.size, num_devices
    scale = max(costs.sum() / k, 1e-300)
    c = costs / scale
    mem = np.asarray(memory, dtype=float) / capacity
    variables = n * k + 1  # x[t, d] at t * k + d, then z
    objective = np.zeros(variables)
    objective[-1] = 1.0
    rows_t = np.repeat(np.arange(n), k)
    cols = np.arange(n * k)
    assign = coo_matrix((np.ones(n * k), (rows_t, cols)), shape=(n, variables))
    device_of = np.tile(np.arange(k), n)
    load = coo_matrix((np.tile(c[:, None], (1, k)).ravel(), (device_of, cols)), shape=(k, variables)).tolil()
    load[:, n * k] = -1.0
    room = coo_matrix((np.repeat(mem, k), (device_of, cols)), shape=(k, variables))
    result = linprog(objective, A_ub=vstack([load.tocsr(), room.tocsr()]), b_ub=np.concatenate([np.zeros(k), np.ones(k)]),
                     A_eq=assign.tocsr(), b_eq=np.ones(n),
                     bounds=[(0, 1)] * (n * k) + [(float(c.max(initial=0.0)), None)], method="highs")
    if result.status == 2:
        return None
    if result.status != 0:
        raise RuntimeError(f"LP relaxation failed: {result.message}")
    return float(result.fun * scale * (1 - 1e-9))
