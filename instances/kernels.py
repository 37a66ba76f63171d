"""Compute kernels, TorchRec's names for where a table's rows live: `fused` (all in HBM), `fused_uvm` (all in
host memory, read over UVM), `fused_uvm_caching` (in host memory with an HBM cache of a fraction of its rows,
the load factor), `dense` (data-parallel replicas). The one place that knows which kernel may serve which
sharding type, which need host memory, and which load factors a table is offered."""
from __future__ import annotations

FUSED, FUSED_UVM, FUSED_UVM_CACHING, DENSE = "fused", "fused_uvm", "fused_uvm_caching", "dense"
KERNELS = (FUSED, FUSED_UVM, FUSED_UVM_CACHING, DENSE)
KERNEL_CODE = {kernel: code for code, kernel in enumerate(KERNELS)}
HOST_KERNELS = (FUSED_UVM, FUSED_UVM_CACHING)  # kernels that keep the table in host memory
# Load factors every cached table is offered (the share of its rows the HBM cache holds); each table adds
# the bends of its own access curve (instances.access).
LOAD_FACTOR_GRID = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
LOAD_FACTOR_DIGITS = 4  # load factors are rounded to this many decimals, so that equal caches are one option
# TorchRec's cache when nothing sizes it (its planner's UVM_CACHING_RATIO): on the grid, so every cached
# table is offered it.
TORCHREC_LOAD_FACTOR = 0.2


def kernels_for(sharding_type: str) -> tuple[str, ...]:
    """The kernels that may serve a sharding type: data-parallel replicas are `dense`, the rest fused in
    HBM, in host memory, or cached."""
    return (DENSE,) if sharding_type == "data_parallel" else (FUSED, FUSED_UVM, FUSED_UVM_CACHING)


def default_kernel(sharding_type: str) -> str:
    """The kernel of a plan that names none (plans before kernels): HBM, as they were priced."""
    return kernels_for(sharding_type)[0]


def kernel_problem(sharding_type: str, kernel: str, load_factor: float | None) -> str | None:
    """What is wrong with serving a sharding type with this kernel and load factor, or None."""
    if kernel not in KERNELS:
        return f"unknown compute kernel {kernel!r} (one of {', '.join(KERNELS)})"
    if kernel not in kernels_for(sharding_type):
        return f"compute kernel {kernel} cannot serve {sharding_type} (it takes {', '.join(kernels_for(sharding_type))})"
    if kernel == FUSED_UVM_CACHING:
        if load_factor is None or isinstance(load_factor, bool) or not isinstance(load_factor, (int, float)) \
                or not 0 < load_factor <= 1:
            return f"cache load factor must be in (0, 1] for {FUSED_UVM_CACHING}, got {load_factor!r}"
    elif load_factor is not None:
        return f"a cache load factor belongs to {FUSED_UVM_CACHING} only, not {kernel}"
    return None


def load_factor_choices(bends: tuple[float, ...] = ()) -> tuple[float, ...]:
    """The load factors a cached table is offered: the grid and its own curve's bends, in (0, 1)."""
    values = {round(float(f), LOAD_FACTOR_DIGITS) for f in (*LOAD_FACTOR_GRID, *bends)}
    return tuple(sorted(f for f in values if 0 < f < 1))
