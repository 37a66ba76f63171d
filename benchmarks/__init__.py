"""Benchmarks: suites, the runner, the results store, analysis, leaderboards, reports and the command
line. Importing it plugs the interop adapters (TorchRec's oracle and planner) into the registries."""
import interop  # noqa: F401  (registration happens on import)
