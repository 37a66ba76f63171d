"""Other tools' planners as peer solvers, registered here by name with their metadata and run from the
adapters that wrap them (interop.peer), which load only when a peer runs."""
from .base import register_elsewhere

register_elsewhere("torchrec-planner", "interop.peer:planner_solver",
                   "TorchRec's EmbeddingShardingPlanner (default proposers, its default kernels and load factor 0.2 "
                   "where devices have host memory): its plan as ours; ignores the given oracle and the time budget",
                   splits=True, budgeted=False, peer=True)
register_elsewhere("torchrec-planner-timeout", "interop.peer:timeout_solver",
                   "TorchRec's EmbeddingShardingPlanner with its default proposers and its timeout_seconds set to the "
                   "budget (whole seconds, at least 1; its enumeration and estimates come first and are not limited, "
                   "so it is held to the suite's peer deadline); ignores the given oracle", splits=True,
                   budgeted=False, peer=True)
register_elsewhere("torchrec-dp", "interop.peer:dp_solver",
                   "TorchRec's EmbeddingShardingPlanner with its DynamicProgrammingProposer (options chosen by a DP "
                   "over HBM bins per table, then its greedy partitioner); ignores the given oracle and the time "
                   "budget", splits=True, budgeted=False, peer=True)
register_elsewhere("torchrec-offload", "interop.peer:offload_solver",
                   "TorchRec's EmbeddingOffloadScaleupProposer: every table UVM-cached (LRU) and its cache sized by a "
                   "Luus-Jaakola search over our access curves as CacheStatistics, one sharding option per table; "
                   "ignores the given oracle and the time budget", splits=True, budgeted=False, peer=True)
