"""The results store: one JSON line per finished cell, appended as cells finish, so that an interrupted
sweep resumes where it stopped."""
from __future__ import annotations

import json
import sys
from pathlib import Path

KEY_FIELDS = ("instance", "solver", "oracle", "time_limit", "seed")


def cell_key(record: dict) -> tuple:
    return (*(record[k] for k in KEY_FIELDS), record.get("judge") or record["oracle"])


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            # A line cut short by a killed sweep: its cell simply runs again.
            print(f"warning: {path}:{number}: unreadable record skipped", file=sys.stderr)
    return records


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
