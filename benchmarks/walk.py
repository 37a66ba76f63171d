"""Walks `shardbench plan` from its arguments to the printed report and counts how the data travels in the
planning process: stops (project modules it passes through), returns (calls the command makes itself: each
hands data back up to the entry point to be passed on again) and climbs (calls from a lower layer up to a
higher one). Run: `.venv/bin/python -m benchmarks.walk` (members run in forked processes, not walked)."""
from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

LAYERS = ("instances", "costmodels", "solvers", "interop", "shardbench", "benchmarks")


def _module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.split(".")[0] in LAYERS else None


def walk(argv: list[str]) -> dict:
    """Runs the CLI with `argv` under a profile hook; returns the counts and the climbing edges."""
    from shardbench.cli import main

    modules: set[str] = set()
    edges: Counter = Counter()
    direct: list[str] = []

    def hook(frame, event, _):
        if event != "call" or (callee := _module(frame)) is None:
            return
        modules.add(callee)
        caller = _module(frame.f_back) if frame.f_back is not None else None
        if caller is not None and frame.f_back.f_code.co_name == "_cmd_plan":
            direct.append(f"{callee}.{frame.f_code.co_name}")
        if caller is not None and caller != callee:
            edges[(caller, callee)] += 1

    sys.setprofile(hook)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    layer = {m: LAYERS.index(m.split(".")[0]) for edge in edges for m in edge}
    climbs = sorted({edge for edge in edges if layer[edge[0]] < layer[edge[1]]})
    return {"exit": code, "stops": len(modules), "returns": len(direct), "climbs": len(climbs), "climbing": climbs,
            "calls": direct}


def main() -> None:
    from instances import save_instance
    from instances.sampler import MemorySpec, TaskSpec, sample_tasks

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "instance.json"
        save_instance(sample_tasks(TaskSpec("autoshard", 40, count=1, num_devices=4,
                                            memory=MemorySpec(tightness=1.5)))[0], path)
        counts = walk(["plan", str(path), "--oracle", "analytic", "--budget", "2", "--solvers", "split-greedy",
                       "-o", str(Path(scratch) / "plan.json")])
    print({k: v for k, v in counts.items() if k not in ("climbing", "calls")})
    print("  the command's own calls: " + ", ".join(counts["calls"]))
    for caller, callee in counts["climbing"]:
        print(f"  climb: {caller} -> {callee}")


if __name__ == "__main__":
    main()
