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
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

# OR-Tools' cp_model_solver.cc: LOG(ERROR) << "Infeasible LNS solution! " << info << " solved with params " <<
# params, where a fragment's solution fails the full model's check; CP-SAT then drops the fragment and goes on
# (google/or-tools#4013, #4099). The parameters follow as text-format lines, then an empty line.
# With absl's log prefix where logging was set up ("E1208 01:02:03.456789 123 cp_model_solver.cc:1234] ").
REJECTED_LNS = re.compile(r"(?:[IWEF]\d{4} [^\]]*\] )?Infeasible LNS solution!")
# A text-format field ("name: value", "name {") or a message's closing brace. A record not ended by an empty
# line would take such a line after it along.
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


class RejectedLns:
    """Sorts what CP-SAT prints, line by line as it comes: a report of a rejected LNS fragment (its line, its
    parameters' lines and the empty line after them) is dropped and counted, every other line kept."""

    def __init__(self) -> None:
        self.count = 0
        self._inside = False

    def keeps(self, line: str) -> bool:
        if self._inside:
            if _PARAMETER_LINE.fullmatch(line.rstrip("\r\n")):
                return False
            self._inside = False
            if not line.strip():
                return False
        if REJECTED_LNS.match(line):
            self.count += 1
            self._inside = True
            return False
        return True


def _write_all(descriptor: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(descriptor, data):]


def _pump(read: int, out: int, sorter: RejectedLns) -> None:
    with open(read, "rb") as lines:
        for line in lines:
            if sorter.keeps(line.decode(errors="replace")):
                _write_all(out, line)


def with_stderr_sorted(call: Callable[[], T], sorter: RejectedLns) -> T:
    """`call()` with what it writes to descriptor 2 passed on line by line as it comes, where `sorter` keeps
    it: a thread reads it from a pipe, so a line is out while the call still runs (a file read afterwards
    would hold all of it back). What the back-end writes just before it aborts the process is lost, as the
    thread has no time to read it. Descriptor 2 is the process's: one such call at a time, and a child process
    started inside keeps the call waiting until it exits. The back-end must release Python's lock while it
    runs (CP-SAT's solve does), or a full pipe would stop it. Where descriptor 2 cannot be duplicated (it is
    closed), `call()` as it is."""
    try:
        out = os.dup(2)
    except OSError:
        return call()
    try:
        read, write = os.pipe()
        reader = threading.Thread(target=_pump, args=(read, out, sorter), daemon=True)
        try:
            reader.start()
        except BaseException:
            os.close(read)
            os.close(write)
            raise
        try:
            with _pointed(2, write):
                return call()
        finally:
            os.close(write)  # descriptor 2 pointed back, the pipe's last write end: the reader sees its end
            reader.join()
    finally:
        os.close(out)
