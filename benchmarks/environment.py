"""The machine and library versions a results record was produced with, read once per process from the
platform and from installed package metadata (no library is imported for its version)."""
from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import platform

from costmodels.measured import cpu_model

# Each library under the distribution names it may be installed as (fbgemm_gpu ships a CPU-only build
# under its own name).
LIBRARIES = {
    "numpy": ("numpy",),
    "torch": ("torch",),
    "fbgemm_gpu": ("fbgemm_gpu", "fbgemm_gpu_cpu"),
    "torchrec": ("torchrec",),
    "ortools": ("ortools",),
    "highspy": ("highspy",),
    "pulp": ("pulp",),
}


def library_version(names: tuple[str, ...]) -> str | None:
    """The version of the first of `names` that is installed, or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def environment() -> dict:
    """{"machine": {platform, cpu, cores}, "python": version, <library>: version or None, ...}: a fresh copy
    of what this process read once, so that a record may be changed without changing the next one's."""
    return copy.deepcopy(_read_environment())


@functools.cache
def _read_environment() -> dict:
    machine = {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count()}
    return {"machine": machine, "python": platform.python_version(),
            **{library: library_version(names) for library, names in LIBRARIES.items()}}
