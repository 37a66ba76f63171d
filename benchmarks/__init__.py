"""The benchmark harness: suites, cells and their runner (local or Ray), the results store, analysis,
leaderboards, reports and the harness's CLI commands. Importing it plugs the interop adapters (TorchRec's
oracle and planner) into the registries, through the product package."""
import shardbench  # noqa: F401  (registration happens on import)
