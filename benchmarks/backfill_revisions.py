"""One-off migration (issue 29): the committed results records, written before records carried their code
revision, become `schema_version` 1 records with a backfilled `revision` and a `revision_note` saying so.

How it decides: `git blame` names, for each line of a committed store, the commit that added that line;
the record's revision is that commit's parent, the code as committed just before the results were stored
(results were committed after the runs that produced them, so this is the best the history tells). Every
other field stays as it was, and each line keeps its key order (sorted, as the store writes them, or not).
Lines that already carry a `schema_version` are left alone; a store with uncommitted changes is refused,
since blame speaks for the committed lines only.

    python -m benchmarks.backfill_revisions          # every store under benchmarks/results
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

from instances.io import write_text_atomic

from .suite import STORES

# In blame's porcelain output each line's block opens with "<commit> <original line> <final line> [<count>]".
BLAME_HEADER = re.compile(r"^([0-9a-f]{40}) \d+ \d+", re.MULTILINE)
NOTE = "backfilled: the commit before the one that stored this record"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(STORES), *args], capture_output=True, text=True, check=True).stdout


def line_commits(store: Path) -> list[str]:
    """The commit that added each line of the committed store, in line order."""
    store = store.resolve()
    if _git("status", "--porcelain", "--", str(store)).strip():
        raise SystemExit(f"{store}: has uncommitted changes; commit or restore it first")
    blame = _git("blame", "--line-porcelain", "HEAD", "--", str(store))
    return BLAME_HEADER.findall(blame)


@functools.cache
def parent(commit: str) -> str:
    return _git("rev-parse", f"{commit}^").strip()


def backfilled(line: str, commit: str) -> str:
    """The line with the version 1 fields added, written as it was written (keys sorted or in their order)."""
    record = json.loads(line)
    if "schema_version" in record:
        return line
    ordered = line == json.dumps(record, sort_keys=True)
    if line != json.dumps(record, sort_keys=ordered):
        raise ValueError(f"a record that json.dumps does not write back as it is: {line[:80]}…")
    record.update(schema_version=1, revision=parent(commit), revision_note=NOTE)
    return json.dumps(record, sort_keys=ordered)


def backfill(store: Path) -> int:
    """Rewrites one store; returns how many records gained a revision."""
    lines = store.read_text().splitlines()
    commits = line_commits(store)
    if len(commits) != len(lines):
        raise ValueError(f"{store}: blame names {len(commits)} lines, the file has {len(lines)}")
    new = [backfilled(line, commit) for line, commit in zip(lines, commits)]
    write_text_atomic(store, "".join(line + "\n" for line in new))
    return sum(a != b for a, b in zip(lines, new))


def main() -> int:
    for store in sorted(STORES.rglob("*.jsonl")):
        print(f"{store.relative_to(STORES)}: {backfill(store)} records backfilled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
