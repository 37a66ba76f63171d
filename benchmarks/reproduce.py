"""Checks that a change preserved behaviour: reruns a suite's cells of deterministic solvers whose plan does
not depend on the machine's speed, and compares each plan with the one its store holds. Run:
`.venv/bin/python -m benchmarks.reproduce benchmarks/suites/SUITE.toml [--solvers a,b] [--limit N]`."""
from __future__ import annotations

import argparse
import sys

from instances import load_instances

from .cells import execute_cell, suite_cells
from .store import cell_key, read_records
from .suite import load_suites

# Deterministic and finished long before any budget we run: their plans are a function of the code alone.
REPRODUCIBLE = ("best-greedy", "split-greedy", "lpt", "size-greedy", "dim-greedy", "lookup-greedy",
                "size-lookup-greedy", "oracle-greedy", "round-robin", "random")


def reproduce(suite_path: str, solvers: tuple[str, ...] = REPRODUCIBLE, limit: int | None = None) -> list[str]:
    """One line per cell compared: `same` or what differs; cells the store lacks are skipped."""
    lines = []
    for suite in load_suites(suite_path):
        stored = {cell_key(r): r for r in read_records(suite.results)}
        cells = [c for c in suite_cells(suite, load_instances(suite.instances)) if c.solver in solvers]
        for cell in cells[:limit]:
            before = stored.get(cell.key)
            if before is None:
                continue
            after = execute_cell(cell)
            label = f"{suite.name} {cell.instance.id} {cell.solver} [{cell.sharding}]"
            if after.get("plan") == before.get("plan") and after["status"] == before["status"]:
                lines.append(f"same  {label}")
            else:
                lines.append(f"DIFF  {label}: status {before['status']} -> {after['status']}, objective "
                             f"{before.get('objective')} -> {after.get('objective')}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite")
    parser.add_argument("--solvers", type=lambda v: tuple(s for s in v.split(",") if s), default=REPRODUCIBLE)
    parser.add_argument("--limit", type=int, help="cells per suite at most")
    args = parser.parse_args()
    lines = reproduce(args.suite, args.solvers, args.limit)
    print("\n".join(lines))
    differ = sum(line.startswith("DIFF") for line in lines)
    print(f"{len(lines) - differ}/{len(lines)} cells reproduce their stored plans")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
