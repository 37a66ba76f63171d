"""Where a results record comes from: the machine and library versions (read from the platform and from
installed package metadata; no library is imported for its version) and the code's git revision, each
read once per process."""
from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from costmodels.measured import cpu_model

from .store import SCHEMA_VERSION
from .suite import PAGES, STORES

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = tuple(str(path.relative_to(ROOT)) for path in (STORES, PAGES))  # what a run writes into the checkout

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


def revision() -> str:
    """The git commit of the checkout this code runs from (see checkout_revision)."""
    return checkout_revision(ROOT)


@functools.cache
def checkout_revision(root: Path) -> str:
    """HEAD of the git checkout whose top level is `root`, with "+dirty" where tracked files differ from it
    (the results stores and pages aside: a run changes those itself); "unknown" where `root` is not the top
    of a checkout (this code installed as a copy) or git cannot tell."""
    try:
        top, head = _git(root, "rev-parse", "--show-toplevel", "HEAD").splitlines()
        changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                       *(f":(exclude){path}" for path in OUTPUTS))
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown"
    if Path(top).resolve() != Path(root).resolve():
        return "unknown"
    return head + ("+dirty" if changed.strip() else "")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def provenance() -> dict:
    """What every results record carries about where it came from: the record schema's version, the code's
    revision and the machine and library versions (`env`)."""
    return {"schema_version": SCHEMA_VERSION, "revision": revision(), "env": environment()}
