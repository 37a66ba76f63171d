"""A back-end's stray prints kept off the command's output: HiGHS 1.12 writes a debug line to the process's
own stdout whenever it repairs a new integer solution (ERGO-Code/HiGHS#2783), whatever its output_flag, and
`plan` printed 79 of them among its report on one tiers task; CP-SAT logs every LNS fragment its own checker
rejects, with its parameters, to stderr (about 20 lines each, 15 of them on one zoo run)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from typing import Callable, TypeVar

T = TypeVar("T")

# OR-Tools' cp_model_solver.cc: LOG(ERROR) << "Infeasible LNS solution! " << info << " solved with params " <<
# params, where a fragment's solution fails the full model's check; CP-SAT then drops the fragment and goes on
# (google/or-tools#4013, #4099). The parameters follow as text-format lines, then an empty line.
LNS_REJECTED = "Infeasible LNS solution!"
_PARAMETER_LINE = re.compile(r"\s*([a-z_][a-z0-9_]*\s*(:.*|\{)|\})\s*")


def _flush_all() -> None:
    """Python's buffered streams, then C's stdio buffers, out to where descriptors 1 and 2 point now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def _pointed(descriptor: int, target: int):
    """`descriptor` points where `target` does inside: what was printed before goes out first, what C's stdio
    buffered inside is flushed there before it points back. Where it cannot be duplicated (it is closed),
    nothing changes."""
    _flush_all()
    try:
        saved = os.dup(descriptor)
    except OSError:
        yield
        return
    try:
        os.dup2(target, descriptor)
        yield
    finally:
        try:
            _flush_all()
        finally:
            os.dup2(saved, descriptor)
            os.close(saved)


@contextlib.contextmanager
def c_stdout_silenced():
    """Descriptor 1 points at the null device inside."""
    with open(os.devnull, "wb") as null, _pointed(1, null.fileno()):
        yield


def with_stderr(call: Callable[[], T]) -> tuple[T, str]:
    """`call()` with descriptor 2 written to a file, and what was written there, for the caller to sort. Where
    `call` raises, what it wrote goes to stderr first."""
    with tempfile.TemporaryFile() as sink:
        try:
            with _pointed(2, sink.fileno()):
                value = call()
        except BaseException:
            sys.stderr.write(_read(sink))
            raise
        return value, _read(sink)


def _read(sink) -> str:
    sink.seek(0)
    return sink.read().decode(errors="replace")


def without_rejected_lns(printed: str) -> tuple[str, int]:
    """What CP-SAT printed, less its reports of rejected LNS fragments (each a LNS_REJECTED line, its
    parameters' lines and the empty line after them), and how many there were."""
    kept, dropped = [], 0
    lines = printed.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith(LNS_REJECTED):
            kept.append(lines[i])
            i += 1
            continue
        dropped += 1
        i += 1
        while i < len(lines) and _PARAMETER_LINE.fullmatch(lines[i].rstrip("\n")):
            i += 1
        if i < len(lines) and not lines[i].strip():
            i += 1
    return "".join(kept), dropped
