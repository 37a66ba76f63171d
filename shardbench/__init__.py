"""shardbench, the product: plan embedding-table sharding with the best of many methods, certified, from
Python (`plan`) or the `shardbench` command line. Importing it plugs the TorchRec adapters (its estimator
as the `torchrec` oracle, its planner as the `torchrec-planner` peer) into the registries."""
import interop  # noqa: F401  (registration happens on import)

from .api import plan
from .portfolio import Member, PortfolioResult

__all__ = ["Member", "PortfolioResult", "plan"]
