"""shardbench, the product: plan embedding-table sharding with the best of many methods, certified, from
Python (`plan`, `replan`, `ShardbenchPlanner`, `load_plan`, `save_sharding_plan`) or the `shardbench` command line;
torchrec itself loads only when `ShardbenchPlanner` or the `torchrec` oracle is first used."""
from .api import plan
from .planfiles import load_plan, save_sharding_plan
from .portfolio import Member, PortfolioResult
from .replan import replan

__all__ = ["Member", "PortfolioResult", "ShardbenchPlanner", "load_plan", "plan", "replan", "save_sharding_plan"]


def __getattr__(name: str):
    if name == "ShardbenchPlanner":  # lazily: the planner subclasses TorchRec's, and the CLI need not load it
        from .planner import ShardbenchPlanner

        return ShardbenchPlanner
    raise AttributeError(f"module 'shardbench' has no attribute {name!r}")
