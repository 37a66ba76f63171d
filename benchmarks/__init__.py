"""Benchmarks: metrics, suites, the runner, the results store, leaderboards and the `shardbench` CLI."""
