"""Adapters at the edge of the suite: other tools' objects in and out, one module per job (importer,
export, oracle, peer; common holds TorchRec's objects for an instance). Importing this package plugs
TorchRec's estimator into the oracle registry (`torchrec`) and its planner into the solver registry
(`torchrec-planner`, `torchrec-planner-timeout`, `torchrec-dp`, `torchrec-offload`); torchrec itself loads only
when one of them is used."""
from costmodels import register_oracle
from solvers.base import register

from .oracle import TorchRecOracle
from .peer import dp_solver, offload_solver, planner_solver, timeout_solver

register_oracle("torchrec", TorchRecOracle, costly_additive=True, costly_tiers=True)
register("torchrec-planner", "TorchRec's EmbeddingShardingPlanner (default proposers, its default kernels and "
         "load factor 0.2 where devices have host memory): its plan as ours; "
         "ignores the given oracle and the time budget", splits=True, budgeted=False, peer=True)(planner_solver)
register("torchrec-planner-timeout", "TorchRec's EmbeddingShardingPlanner with its default proposers and its "
         "timeout_seconds set to the budget (whole seconds, at least 1; its enumeration and estimates come first "
         "and are not limited, so it is held to the suite's peer deadline); ignores the given oracle", splits=True,
         budgeted=False, peer=True)(timeout_solver)
register("torchrec-dp", "TorchRec's EmbeddingShardingPlanner with its DynamicProgrammingProposer (options chosen "
         "by a DP over HBM bins per table, then its greedy partitioner); ignores the given oracle and the time "
         "budget", splits=True, budgeted=False, peer=True)(dp_solver)
register("torchrec-offload", "TorchRec's EmbeddingOffloadScaleupProposer: every table UVM-cached (LRU) and its cache "
         "sized by a Luus-Jaakola search over our access curves as CacheStatistics, one sharding option per table; "
         "ignores the given oracle and the time budget", splits=True, budgeted=False, peer=True)(offload_solver)
