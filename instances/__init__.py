"""Instances: the shared problem format (tables, topology, workload, plans), the embedded DLRM table
pool, the papers' task samplers and the raw-dataset loader."""
from .io import (
                    load_instance,
                    load_instance_set,
                    load_instances,
                    load_plan,
                    save_instance,
                    save_instance_set,
                    save_plan,
)
from .model import (
                    SHARDING_TYPES,
                    BucketSpec,
                    Instance,
                    InstanceError,
                    PlanError,
                    RowDistribution,
                    Table,
                    Topology,
                    Workload,
                    instance_from_dict,
                    instance_to_dict,
)
from .memory import HBM, HOST, TIERS, Storage
from .sharding import Plan, Shard, TableSharding

__all__ = [
    "SHARDING_TYPES", "BucketSpec", "Instance", "InstanceError", "Plan", "PlanError", "Shard", "TableSharding", "RowDistribution", "Table", "Topology",
    "Workload", "instance_from_dict", "instance_to_dict", "load_instance", "load_instance_set", "load_instances",
    "load_plan", "save_instance", "save_instance_set", "save_plan", "HBM", "HOST", "TIERS", "Storage",
]
