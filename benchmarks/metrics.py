"""The papers' plan metrics: max device cost, degree of balance (min/max), speedup over random
(mean over random seeds of max C_random / max C) and the gap to a lower bound."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from solvers.bounds import gap_to_bound  # noqa: F401  (the certificate's one gap rule, read by the leaderboard)


def max_cost(device_costs: Sequence[float]) -> float:
    return float(max(device_costs))


def degree_of_balance(device_costs: Sequence[float]) -> float:
    """min/max over devices; 1 is perfect balance. A plan whose every device costs 0 is balanced."""
    top = max(device_costs)
    return 1.0 if top == 0 else float(min(device_costs) / top)


def speedup_over_random(random_objectives: Sequence[float], objective: float) -> float:
    return float(np.mean([r / objective for r in random_objectives])) if objective > 0 else float("nan")
