"""What people read: sizes in KiB/MiB/GiB through the one helper, never two unequal sizes that read equal,
and reasons that name what is really wrong (no table "needs 0 B")."""
import re

import numpy as np
import pytest
from conftest import make_table
from hypothesis import given
from hypothesis import strategies as st

from costmodels import get_oracle
from instances import Instance, Plan, PlanError, TableSharding, Topology, Workload
from instances.memory import format_bytes, format_sizes
from solvers.base import memory_infeasibility
from solvers.candidates import Problem

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize("count,text", [(0, "0 B"), (80, "80 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                        (6_400_000, "6.1 MiB"), (7_301_444_403, "6.8 GiB"), (128 * GIB, "128 GiB"),
                                        (3 * 2**40, "3 TiB")])
def test_a_byte_count_reads_in_its_unit(count, text):
    assert format_bytes(count) == text


@given(st.integers(0, 2**62), st.integers(0, 2**62))
def test_unequal_sizes_never_read_equal(a, b):
    first, second = format_sizes(a, b)
    assert (first == second) == (a == b)


def _unplaceable(hbm: int, host: int) -> Instance:
    """One whole table of 6.1 MiB (fp16, 100,000 × 32) and a small one on two devices."""
    table = make_table("big", 100_000, 32, 2.0)
    return Instance("unplaceable", (table, make_table("small", 10, 8, 1.0)),
                    Topology(1, 2, hbm, host_memory_bytes=host), Workload(batch_size=64),
                    sharding_types=("table_wise",)).validate()


def test_a_table_that_fits_neither_tier_is_said_so_with_real_needs():
    """In HBM the table is too large; in host memory too: no option of it fits, each for its own tier. The
    reason names both tiers, each with the least its options need there (it used to say 'needs 0 B of HBM':
    the host-memory option's share of HBM)."""
    reason = memory_infeasibility(Problem(_unplaceable(4 * MIB, 2 * MIB), get_oracle("lookup")))
    assert reason is not None and "table big fits no device in any allowed option" in reason
    assert "HBM than a device's 4 MiB" in reason and "host memory than a device's 2 MiB" in reason
    assert "6.1 MiB" in reason and not re.search(r"\b0 B\b", reason), reason


def test_a_table_short_of_one_tier_names_its_leanest_need():
    reason = memory_infeasibility(Problem(_unplaceable(4 * MIB, 0), get_oracle("lookup")))
    assert reason.startswith("table big needs 6.1 MiB of HBM on some device in its leanest allowed option, more "
                             "than a device's 4 MiB"), reason


def test_a_plan_over_capacity_says_by_how_much_in_binary_units():
    instance = _unplaceable(8 * MIB, 0)
    plan = Plan(instance.id, tuple(TableSharding.whole(t.rows, t.dim, 0) for t in instance.tables))
    with pytest.raises(PlanError) as caught:
        plan.validate(Instance(instance.id, instance.tables, Topology(1, 2, 6 * MIB), instance.workload))
    message = str(caught.value)
    assert message.startswith("memory capacity (HBM 6 MiB per device) exceeded: device 0 uses 6.1")
    assert " B" not in message
    used = int(plan.storage_per_device(instance)[0, 0])
    assert np.isclose(float(message.split("uses ")[1].split(" MiB")[0]), used / MIB, atol=0.01)
