"""shardbench, the product: plan embedding-table sharding with the best of many methods, certified, from
Python (`plan`, `ShardbenchPlanner`, `load_plan`, `save_sharding_plan`) or the `shardbench` command line. Importing it plugs the
TorchRec adapters (its estimator as the `torchrec` oracle, its planner as the `torchrec-planner` peer)
into the registries; torchrec itself loads only when `ShardbenchPlanner` is first used."""
import interop  # noqa: F401  (registration happens on import)

from .api import plan
from .planfiles import load_plan, save_sharding_plan
from .portfolio import Member, PortfolioResult

__all__ = ["Member", "PortfolioResult", "ShardbenchPlanner", "load_plan", "plan", "save_sharding_plan"]


def __getattr__(name: str):
    if name == "ShardbenchPlanner":  # lazily: the planner subclasses TorchRec's, and the CLI need not load it
        from .planner import ShardbenchPlanner

        return ShardbenchPlanner
    raise AttributeError(f"module 'shardbench' has no attribute {name!r}")
