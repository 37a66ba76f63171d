"""shardbench, the product: plan embedding-table sharding with the best of many methods, certified, from
Python (`plan`, `replan`, `ShardbenchPlanner`, `load_plan`, `save_sharding_plan`) or the `shardbench` command line;
torchrec itself loads only when `ShardbenchPlanner` or the `torchrec` oracle is first used."""
import importlib

# Each name loads its module when first used: the command line starts before anything heavy is imported
# (so that Ctrl-C while it loads is handled), and the planner, a subclass of TorchRec's, loads TorchRec.
_EXPORTS = {"plan": ".api", "load_plan": ".planfiles", "save_sharding_plan": ".planfiles", "Member": ".portfolio",
            "PortfolioResult": ".portfolio", "ShardbenchPlanner": ".planner",
            "replan": ".replanning"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'shardbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
