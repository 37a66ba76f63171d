"""A back-end's stray prints kept off the command's output: HiGHS 1.12 writes a debug line to the process's
own stdout whenever it repairs a new integer solution (ERGO-Code/HiGHS#2783), whatever its output_flag, and
`plan` printed 79 of them among its report on one tiers task."""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys


def _flush_all() -> None:
    """Python's buffered stdout, then C's stdio buffers, out to where descriptor 1 points now."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stdout.flush()
    ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def c_stdout_silenced():
    """Descriptor 1 points at the null device inside: what was printed before goes out first, what C's stdio
    buffered inside is flushed there before it points back. Where descriptor 1 cannot be duplicated (it is
    closed), nothing changes."""
    _flush_all()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
        finally:
            os.close(null)
        yield
    finally:
        try:
            _flush_all()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
