"""Adapters at the edge of the suite: other tools' objects in and out, one module per job (importer,
export, oracle, peer; common holds TorchRec's objects for an instance). Importing this package plugs
TorchRec's estimator into the oracle registry (`torchrec`) and its planner into the solver registry
(`torchrec-planner`, `torchrec-offload`); torchrec itself loads only when one of them is used."""
from costmodels import register_oracle
from solvers.base import register

from .oracle import TorchRecOracle
from .peer import offload_solver, planner_solver

register_oracle("torchrec", TorchRecOracle, costly_additive=True, costly_tiers=True)
register("torchrec-planner", "TorchRec's EmbeddingShardingPlanner (default proposers, its default kernels and "
         "load factor 0.2 where devices have host memory): its plan as ours; "
         "ignores the given oracle and the time budget", splits=True, budgeted=False, peer=True)(planner_solver)
register("torchrec-offload", "TorchRec's EmbeddingOffloadScaleupProposer: every table UVM-cached (LRU) and its cache "
         "sized by a Luus-Jaakola search over our access curves as CacheStatistics, one sharding option per table; "
         "ignores the given oracle and the time budget", splits=True, budgeted=False, peer=True)(offload_solver)
