"""Shared hypothesis profiles, strategies and helpers for small random instances.

Profiles: `ci` (the default) is derandomized, so a verdict is the same on every machine; `fresh`
(HYPOTHESIS_PROFILE=fresh) draws fresh examples, as many as `ci`; `deep` (HYPOTHESIS_PROFILE=deep,
`make test-deep`) draws fresh examples, DEEP_FACTOR times as many."""
from __future__ import annotations

import itertools
import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from instances import Instance, Table, Topology, Workload

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

DEEP_FACTOR = 5
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("fresh", derandomize=False, database=None, deadline=None, print_blob=True)
settings.register_profile("deep", derandomize=False, database=None, deadline=None, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(count: int, fixture_constant: bool = False) -> settings:
    """Per-test example count, scaled up under the deep profile. `fixture_constant` says that the test's
    function-scoped fixtures do not change between examples."""
    checks = [HealthCheck.function_scoped_fixture] if fixture_constant else []
    return settings(max_examples=count * (DEEP_FACTOR if PROFILE == "deep" else 1), suppress_health_check=checks)


def make_table(name: str, rows: int, dim: int, pooling: float, dtype_bytes: int = 2) -> Table:
    bins = (1.0,) + (0.0,) * 16
    return Table(name=name, rows=rows, dim=dim, dtype_bytes=dtype_bytes, pooling_factor=pooling, reuse_bins=bins)


def make_instance(specs, devices: int, capacity: int, instance_id: str = "t", types=("table_wise",),
                  nodes: int = 1) -> Instance:
    """Whole tables only unless `types` says otherwise: most tests are about the table-wise problem."""
    tables = tuple(make_table(f"t{i}", rows, dim, pooling) for i, (rows, dim, pooling) in enumerate(specs))
    return Instance(id=instance_id, tables=tables,
                    topology=Topology(nodes=nodes, devices_per_node=devices, memory_bytes=capacity),
                    workload=Workload(), sharding_types=tuple(types)).validate()


@st.composite
def small_instances(draw, max_tables: int = 8, max_devices: int = 3, tight: bool = True):
    n = draw(st.integers(1, max_tables))
    k = draw(st.integers(1, max_devices))
    specs = [(draw(st.integers(1, 1000)), draw(st.sampled_from([4, 8, 16, 32])),
              draw(st.floats(0.0, 50.0, allow_nan=False))) for _ in range(n)]
    total = sum(rows * dim * 2 for rows, dim, _ in specs)
    largest = max(rows * dim * 2 for rows, dim, _ in specs)
    # From hopeless to roomy: some draws are infeasible, some bind, most leave room.
    factor = draw(st.floats(0.5, 3.0)) if tight else 10.0
    capacity = max(1, int(max(largest * factor, total / k * factor)))
    return make_instance(specs, k, capacity)


def brute_force_optimum(instance: Instance, costs: np.ndarray) -> float | None:
    """Minimum over every memory-feasible assignment of the max device load; None when none fits."""
    k, memory = instance.num_devices, instance.table_storage()[:, 0]
    capacity = instance.topology.memory_bytes
    best = None
    for assignment in itertools.product(range(k), repeat=instance.num_tables):
        a = np.array(assignment)
        if np.bincount(a, weights=memory, minlength=k).max() > capacity:
            continue
        value = np.bincount(a, weights=costs, minlength=k).max()
        best = value if best is None else min(best, value)
    return best
