"""The results store: one JSON line per finished cell, appended as cells finish, so that an interrupted
sweep resumes where it stopped. One bench process at a time may write a store (a lock beside it); a line
cut short by a killed process is cut off before anything is appended, so it cannot swallow the next."""
from __future__ import annotations

import fcntl
import json
import math
import os
import sys
from pathlib import Path

from instances.io import write_text_atomic

# The record schema. Version 2 records carry `schema_version` and `revision`: the git commit of the code
# that produced them, "+dirty" where tracked code differed from it, "unknown" outside a checkout
# (benchmarks.environment.revision). Records without the field are version 1; a committed one may carry
# a backfilled `revision` with a `revision_note` saying how it was inferred.
SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, 2)
KEY_FIELDS = ("instance", "solver", "oracle", "time_limit", "seed")
REQUIRED_FIELDS = (*KEY_FIELDS, "status", "solve_time")
STATUSES = ("optimal", "feasible", "infeasible", "no_plan", "error", "timeout")
_NUMBER = (int, float)
# Fields the leaderboard reads, with the types they must have where present (None is always allowed
# for the optional ones).
FIELD_TYPES = {"instance": str, "solver": str, "oracle": str, "judge": str, "sharding": str, "time_limit": _NUMBER,
               "seed": int,
               "status": str, "objective": _NUMBER, "balance": _NUMBER, "solve_time": _NUMBER,
               "lower_bound": _NUMBER, "instance_bound": _NUMBER, "env": dict, "instance_set": str,
               "schema_version": int, "revision": str, "revision_note": str}
# Records written before a field existed lack it: "env" (machine and library versions) and
# "instance_set" came late, and version 1 records have no "schema_version" and no "revision" of their own.
OPTIONAL = ("judge", "sharding", "objective", "balance", "lower_bound", "instance_bound", "env", "instance_set",
            "schema_version", "revision", "revision_note")
WITH_A_PLAN = ("balance",)  # required when the record has an objective


class StoreError(ValueError):
    """A store that cannot be used: a corrupt record, or another process writing it."""


def cell_key(record: dict) -> tuple:
    """Records from before sharding settings were all planned table-wise."""
    return (*(record[k] for k in KEY_FIELDS), record.get("judge") or record["oracle"],
            record.get("sharding") or "table_wise")


def _check_record(record, where: str) -> dict:
    if not isinstance(record, dict):
        raise StoreError(f"{where}: not a result record (a JSON object), got {type(record).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in record]
    if missing:
        raise StoreError(f"{where}: not a result record: missing {', '.join(missing)}")
    for key, kind in FIELD_TYPES.items():
        value = record.get(key)
        needed = key in WITH_A_PLAN and record.get("objective") is not None
        if value is None and (key in OPTIONAL or key not in record) and not needed:
            continue
        if isinstance(value, bool) or not isinstance(value, kind):
            raise StoreError(f"{where}: {key}: wrong type ({type(value).__name__})")
        if kind is _NUMBER and not math.isfinite(float(value)):
            raise StoreError(f"{where}: {key}: must be finite, got {value!r}")
    if record["status"] not in STATUSES:
        raise StoreError(f"{where}: status: unknown status {record['status']!r}")
    _check_schema(record, where)
    return record


def _check_schema(record: dict, where: str) -> None:
    version = record.get("schema_version", 1)
    if version not in SCHEMA_VERSIONS:
        raise StoreError(f"{where}: schema_version: unknown version {version!r} (this harness reads "
                         f"{', '.join(map(str, SCHEMA_VERSIONS))})")
    if version >= 2 and record.get("revision") is None:
        raise StoreError(f"{where}: revision: missing (a version {version} record names the code it came from)")


def read_records(path: Path) -> list[dict]:
    """Every complete record. A last line without its newline is a write cut short by a kill: it is left
    out (its cell runs again). Any other line that is not a result record is an error naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, not a results store")
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path}: cannot read the results store ({exc})") from exc
    lines = text.split("\n")
    complete, partial = lines[:-1], lines[-1]
    if partial.strip():
        print(f"warning: {path}:{len(lines)}: incomplete last record skipped (its cell runs again)", file=sys.stderr)
    records = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise StoreError(f"{path}:{number}: corrupt record ({exc}); remove the line or rerun with --fresh") from exc
        records.append(_check_record(record, f"{path}:{number}"))
    return records


class Store:
    """A results store opened for appending by this process alone: an exclusive, non-blocking lock on a
    hidden sibling file that holds the owner's pid. The kernel releases the lock when the process ends
    however it ends; a clean close also removes the file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a directory, not a results store")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock_path = self.path.parent / f".{self.path.name}.lock"
        while True:
            self._lock = open(self.lock_path, "a+")
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._lock.seek(0)
                holder = self._lock.read().strip() or "unknown"
                self._lock.close()
                raise StoreError(f"{self.path}: another bench process (pid {holder}) is writing this store; wait "
                                 "for it to finish or give this suite another results file") from None
            # The previous holder may have removed the file between our open and our lock: then the lock
            # is on an orphan and a newcomer could lock a fresh file. Lock the file the path names.
            if self.lock_path.exists() and os.stat(self.lock_path).st_ino == os.fstat(self._lock.fileno()).st_ino:
                break
            self._lock.close()
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self._lock.closed:
            self.lock_path.unlink(missing_ok=True)  # while still holding the lock: see __init__
            self._lock.close()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def discard(self, solvers: tuple[str, ...]) -> int:
        """Drops the records of these solvers (their cells then run again), rewriting the store at once;
        returns how many were dropped."""
        records = self.records()
        kept = [r for r in records if r["solver"] not in solvers]
        if len(kept) != len(records):
            write_text_atomic(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return len(records) - len(kept)

    def records(self) -> list[dict]:
        """The stored records, after cutting off an incomplete last line so that appends start clean."""
        records = read_records(self.path)
        if self.path.exists():
            with self.path.open("rb+") as handle:
                data = handle.read()
                end = data.rfind(b"\n") + 1
                if end != len(data):
                    handle.truncate(end)
        return records

    def append(self, record: dict) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        # One write call per record, in append mode: a kill can cut it short, but never interleave it.
        with self.path.open("a") as handle:
            handle.write(line)
            handle.flush()
