"""A back-end's stray prints kept off the command's output: HiGHS 1.12 writes a debug line to the process's
own stdout whenever it repairs a new integer solution (ERGO-Code/HiGHS#2783), whatever its output_flag, and
`plan` printed 79 of them among its report on one tiers task."""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys


@contextlib.contextmanager
def c_stdout_silenced():
    """File descriptor 1 points at the null device inside, and what C's stdio buffered there meanwhile is
    flushed before it points back; Python's own buffered output goes out first. Where descriptor 1 cannot
    be duplicated (closed), nothing changes."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
