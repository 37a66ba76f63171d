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
