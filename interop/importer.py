"""A TorchRec model's tables, topology and constraints as an instance: from TorchRec's own objects
(`from_torchrec`) or from a small spec in TorchRec's field names (`instance_from_spec`)."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from decimal import Decimal
from typing import Any, Callable, Collection, Mapping

from instances import Instance, InstanceError, Table, Topology, Workload
from instances.kernels import KERNELS
from instances.memory import format_bytes
from instances.model import DEFAULT_SHARDING_TYPES, MAX_MEMORY_BYTES, OPTIMIZERS, SHARDING_TYPES

from .common import DATA_TYPES, IMPORTED_BINS, MS, STORAGE_RESERVE, load_torchrec


def _data_type_bytes(data_type: Any, path: str) -> int:
    name = getattr(data_type, "name", data_type)
    key = str(name).lower()
    if key not in DATA_TYPES:
        raise InstanceError(path, f"data type must be one of {tuple(DATA_TYPES)}, got {data_type!r}")
    return DATA_TYPES[key]


def from_torchrec(tables, topology, constraints: Mapping[str, Any] | None = None, batch_size: int = 512,
                  instance_id: str = "torchrec", host_memory: int | None = None,
                  weighted: Collection[str] = (), reserved: bool = False,
                  load_factor_field: Callable[[int, str], str] | None = None) -> Instance:
    """An instance from TorchRec's own objects: EmbeddingBagConfig / EmbeddingConfig list or an
    EmbeddingBagCollection / EmbeddingCollection, a planner Topology (its HBM per device and, on cuda, its
    DDR as host memory with `hbm_to_ddr_mem_bw` as the host link; on cpu its DDR is the device memory),
    ParameterConstraints per table (pooling factors — one input each, as TorchRec's estimator reads them —,
    allowed sharding types and compute kernels, a cache load factor) and the batch size per rank.
    `host_memory` (bytes per device) overrides the Topology's; `weighted` names the tables whose inputs
    carry weights (a weighted EmbeddingBagCollection's are all weighted). The instance plans in what is left
    after TorchRec's default 15 % reserve, or — `reserved` — in the Topology's memory as it is (a storage
    reservation already taken off). `load_factor_field(i, name)` is how the caller's errors name table i's
    cache load factor (default: tables[i].cache_params.load_factor)."""
    torchrec = load_torchrec()
    weighted = set(weighted)
    if isinstance(tables, torchrec.EmbeddingBagCollection):
        configs, pooled = tables.embedding_bag_configs(), True
        if tables.is_weighted():
            weighted |= {c.name for c in configs}
    elif isinstance(tables, torchrec.EmbeddingCollection):
        configs, pooled = tables.embedding_configs(), False
    else:
        configs = list(tables)
        pooled = None
    constraints = constraints or {}
    out = []
    for i, config in enumerate(configs):
        path = f"tables[{i}]"
        is_pooled = pooled if pooled is not None else isinstance(config, torchrec.EmbeddingBagConfig)
        constraint = constraints.get(config.name)
        factors = getattr(constraint, "pooling_factors", None)
        factors = [1.0] if constraint is None else factors  # TorchRec's POOLING_FACTOR where nothing is said
        factors = _pooling_factors(factors, f"constraints[{config.name!r}].pooling_factors", config.name)
        types = getattr(constraint, "sharding_types", None)
        if types is not None:
            bad = [t for t in types if t not in SHARDING_TYPES]
            if bad:
                raise InstanceError(f"{path}.sharding_types", f"{bad[0]!r} is not one of {SHARDING_TYPES}")
        kernels = getattr(constraint, "compute_kernels", None)
        if kernels is not None:
            kernels = modelled_kernels(kernels, f"{path}.compute_kernels", config.name)
        load_factor = cache_load_factor(getattr(constraint, "cache_params", None), f"{path}.cache_params",
                                        config.name)
        # As TorchRec's enumerator: the default types where the constraints name none (grid_shard only where named).
        out.append(Table.of_inputs(factors, name=config.name, rows=config.num_embeddings, dim=config.embedding_dim,
                                   dtype_bytes=_data_type_bytes(config.data_type, f"{path}.data_type"),
                                   reuse_bins=IMPORTED_BINS if sum(factors) > 0 else (0.0,) * 17,
                                   pooled=is_pooled,
                                   sharding_types=tuple(types) if types is not None else DEFAULT_SHARDING_TYPES,
                                   compute_kernels=kernels, cache_load_factor=load_factor,
                                   weighted=config.name in weighted))
    world, local = topology.world_size, topology.local_world_size
    if world % local:
        raise InstanceError("local_world_size", f"{local} does not divide world_size {world}")
    # Devices here are alike: the smallest rules. A cpu topology keeps its tables in DDR, as TorchRec's does.
    memory = min(device.storage.ddr if topology.compute_device == "cpu" else device.storage.hbm
                 for device in topology.devices)
    topo = Topology(nodes=world // local, devices_per_node=local,
                    memory_bytes=int(memory if reserved else memory * (1 - STORAGE_RESERVE)),
                    intra_node_a2a_bw=topology.intra_host_bw * MS, inter_node_a2a_bw=topology.inter_host_bw * MS,
                    device_kind="gpu" if topology.compute_device == "cuda" else topology.compute_device,
                    host_memory_bytes=host_memory_bytes(topology) if host_memory is None else host_memory,
                    host_link_bw=topology.hbm_to_ddr_mem_bw * MS)
    # A model TorchRec runs holds its shards' input and output buffers in HBM too: counted as its storage
    # estimator counts them.
    instance = Instance(instance_id, tuple(out), topo, Workload(batch_size=batch_size, dtype="fp32", io_buffers=True),
                        provenance="imported from TorchRec", sharding_types=SHARDING_TYPES)
    for i, table in enumerate(instance.tables):  # the instance's own rule, under the caller's name for the field
        problem = instance.cache_problem(table)
        if problem:
            field = load_factor_field(i, table.name) if load_factor_field else f"tables[{i}].cache_params.load_factor"
            raise InstanceError(field, f"table {table.name}: {problem}")
    return instance.validate()


def _pooling_factors(factors: Any, path: str, table: str) -> list[float]:
    """A table's pooling factors, one per input: a non-empty list of finite numbers >= 0."""
    if isinstance(factors, (str, bytes)) or not isinstance(factors, (list, tuple)) or not factors:
        raise InstanceError(path, f"table {table}: must be a non-empty list of numbers (one per input), got {factors!r}")
    for j, f in enumerate(factors):
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f < 0:
            raise InstanceError(f"{path}[{j}]", f"table {table}: must be a finite number >= 0, got {f!r}")
    return [float(f) for f in factors]


def host_memory_bytes(topology) -> int:
    """A TorchRec Topology's host memory per device, as its planner reads it: its smallest DDR on cuda
    (TorchRec's 128 GiB default where no `ddr_cap` was given), none on cpu (there DDR is the device's own
    memory)."""
    if topology.compute_device != "cuda":
        return 0
    return int(min(device.storage.ddr for device in topology.devices))


def assumes_default_ddr(topology) -> bool:
    """Whether the Topology's host memory is TorchRec's default (no `ddr_cap` given, or that very value)."""
    from torchrec.distributed.planner.constants import DDR_CAP

    return topology.compute_device == "cuda" and all(device.storage.ddr == DDR_CAP for device in topology.devices)


def modelled_kernels(kernels: Any, path: str, table: str) -> tuple[str, ...]:
    """A table's allowed compute kernels (TorchRec's names), in our order; a kernel we do not model (TorchRec's
    key_value and virtual-table kernels) is refused, naming the table."""
    if isinstance(kernels, str) or not isinstance(kernels, (list, tuple)) or not kernels:
        raise InstanceError(path, f"table {table}: must be a non-empty list of {KERNELS}, got {kernels!r}")
    for kernel in kernels:
        if kernel not in KERNELS:
            raise InstanceError(path, f"table {table}: compute kernel {kernel!r} is not modelled (shardbench "
                                f"plans {', '.join(KERNELS)})")
    return tuple(k for k in KERNELS if k in kernels)


# CacheParams fields besides load_factor. The runtime ones change what FBGEMM's cache does (or what
# TorchRec's storage estimator counts) and a plan we export carries only the load factor, so they are
# refused; `stats` is planning metadata that neither TorchRec's estimator nor the runtime reads (only its
# offload proposer does), so it is ignored.
UNMODELLED_CACHE_FIELDS = ("algorithm", "reserved_memory", "precision", "prefetch_pipeline",
                           "multipass_prefetch_config")


def cache_load_factor(cache_params: Any, path: str, table: str) -> float | None:
    """The load factor a table's CacheParams fixes (None: none, each cached option chooses its own): a number
    in (0, 1] (whether the table can use it is the instance's rule, Instance.cache_problem)."""
    if cache_params is None:
        return None
    for name in UNMODELLED_CACHE_FIELDS:
        if getattr(cache_params, name, None) is not None:
            raise InstanceError(f"{path}.{name}", f"table {table}: is not modelled (shardbench sizes a cache by its "
                                "load factor only and exports CacheParams(load_factor)); drop it or plan with "
                                "TorchRec's planner")
    return load_factor_for(getattr(cache_params, "load_factor", None), f"{path}.load_factor", table)


def load_factor_for(value: Any, path: str, table: str) -> float | None:
    """A table's fixed cache load factor (None where not given): a number in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InstanceError(path, f"table {table}: must be a number in (0, 1], got {value!r}")
    return float(value)


SPEC_FIELDS = ("tables", "world_size", "hbm_cap", "batch_size")
SPEC_OPTIONAL = ("local_world_size", "intra_host_bw", "inter_host_bw", "hbm_to_ddr_mem_bw", "id", "optimizer", "ddr_cap",
                 "ssd_cap")
# Bandwidths take TorchRec's names in bytes per second (TorchRec's own are per millisecond).
SPEC_BANDWIDTHS = ("intra_host_bw", "inter_host_bw", "hbm_to_ddr_mem_bw")
TABLE_FIELDS = ("name", "num_embeddings", "embedding_dim")
TABLE_OPTIONAL = ("data_type", "pooling_factors", "sharding_types", "pooled", "compute_kernels", "cache_load_factor",
                  "weighted")
# Planning this many devices is already beyond this machine; TorchRec's Topology alone takes seconds at 2^16.
MAX_DEVICES = 2**16
# Units of a size string: decimal (as disks are sold) and binary (as memory is); a bare number is bytes.
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
SIZE_UNITS_TEXT = "B, KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: powers of 1024; any case"
MIN_CAPACITY = 2**20  # per device; less is a size given in the wrong unit (hbm_cap = 80 meant as GB)
# TorchRec's (FBGEMM's) optimizer names for the state we model, besides our own names.
OPTIMIZER_ALIASES = {"exact_sgd": "sgd", "exact_adagrad": "adagrad", "row_wise_adagrad": "rowwise_adagrad",
                     "exact_row_wise_adagrad": "rowwise_adagrad"}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def _positive(value, path: str, kind=int) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
    if not ok or not math.isfinite(value) or value <= 0:
        raise InstanceError(path, f"must be a positive {'integer' if kind is int else 'number'}, got {value!r}")
    return value


def size_bytes(value: Any, path: str) -> int:
    """A size in bytes from a number of bytes or a string with a unit ("80GiB", "1.5 TB"): the one rule for
    every size the spec takes."""
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = match.group(2).upper() if match else None
        if match is None or (unit and unit not in SIZE_UNITS):
            raise InstanceError(path, f"must be a number of bytes or a number with a unit ({SIZE_UNITS_TEXT}), "
                                f"got {value!r}")
        amount = Decimal(match.group(1)) * SIZE_UNITS[unit or "B"]
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        amount = Decimal(value)
    else:
        raise InstanceError(path, f"must be a number of bytes or a string with a unit such as \"80GiB\", got {value!r}")
    if amount != amount.to_integral_value():
        raise InstanceError(path, f"must be a whole number of bytes, got {value!r}")
    if not 0 < amount <= MAX_MEMORY_BYTES:
        raise InstanceError(path, f"must be between 1 B and {format_bytes(MAX_MEMORY_BYTES)}, got {value!r}")
    return int(amount)


def capacity_bytes(value: Any, path: str) -> int:
    """A per-device capacity: a size of at least MIN_CAPACITY."""
    size = size_bytes(value, path)
    if size < MIN_CAPACITY:
        raise InstanceError(path, f"{format_bytes(size)} per device is less than 1 MiB, likely a unit mistake; give "
                            "bytes or a string with a unit, e.g. \"80GiB\"")
    return size


def _optimizer(value: Any) -> str:
    name = OPTIMIZER_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in OPTIMIZERS:
        raise InstanceError("optimizer", f"must be one of {OPTIMIZERS} (or TorchRec's {tuple(OPTIMIZER_ALIASES)}), "
                            f"got {value!r}")
    return name


def _fields(data: Any, path: str, required, optional) -> dict:
    if not isinstance(data, Mapping):
        raise InstanceError(path or "spec", "must be an object")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise InstanceError(f"{path}.{unknown[0]}" if path else unknown[0], "unknown field")
    for key in required:
        if key not in data:
            raise InstanceError(f"{path}.{key}" if path else key, "missing")
    return dict(data)


def parse_spec(text: str, where: str, toml: bool) -> Any:
    """A spec's document from its text (TOML, or JSON); `where` names it in the one-line error."""
    import json
    import tomllib

    try:
        return tomllib.loads(text) if toml else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        raise InstanceError(where, f"not valid {'TOML' if toml else 'JSON'} ({exc})") from exc


def load_spec(path: str) -> Any:
    """A spec file's document: TOML when its name ends in .toml, JSON otherwise."""
    from instances.io import read_text

    return parse_spec(read_text(path, "spec"), str(path), str(path).endswith(".toml"))


def instance_from_spec(spec: Any) -> Instance:
    """An instance from a small spec in TorchRec's field names (see README), through TorchRec's objects.
    The cluster's sizes are checked before any TorchRec object is built (its Topology holds one object per
    device)."""
    spec = _fields(spec, "", SPEC_FIELDS, SPEC_OPTIONAL)
    if not isinstance(spec["tables"], list) or not spec["tables"]:
        raise InstanceError("tables", "must be a non-empty list")
    world = _positive(spec["world_size"], "world_size")
    if world > MAX_DEVICES:
        raise InstanceError("world_size", f"{world} devices is more than this planner takes ({MAX_DEVICES})")
    local = _positive(spec.get("local_world_size", world), "local_world_size")
    if world % local:
        raise InstanceError("local_world_size", f"{local} does not divide world_size {world}")
    hbm = capacity_bytes(spec["hbm_cap"], "hbm_cap")
    ddr = capacity_bytes(spec["ddr_cap"], "ddr_cap") if "ddr_cap" in spec else 0
    if "ssd_cap" in spec:
        capacity_bytes(spec["ssd_cap"], "ssd_cap")
        raise InstanceError("ssd_cap", "SSD storage (ssd_cap) is not modelled: plans use device memory (hbm_cap) and "
                            "host memory (ddr_cap); leave it out")
    optimizer = _optimizer(spec.get("optimizer", "sgd"))
    batch_size = _positive(spec["batch_size"], "batch_size")
    bandwidths = {key: _positive(spec[key], key, float) / MS for key in SPEC_BANDWIDTHS if key in spec}
    instance_id = spec.get("id", "torchrec")
    if not isinstance(instance_id, str) or not instance_id:
        raise InstanceError("id", "must be a non-empty string")

    torchrec = load_torchrec()
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.planner import Topology as TorchRecTopology
    from torchrec.distributed.types import CacheParams

    configs, constraints, weighted_tables = [], {}, []
    data_types = {"fp32": torchrec.DataType.FP32, "fp16": torchrec.DataType.FP16, "bf16": torchrec.DataType.BF16,
                  "int8": torchrec.DataType.INT8}
    for i, entry in enumerate(spec["tables"]):
        path = f"tables[{i}]"
        entry = _fields(entry, path, TABLE_FIELDS, TABLE_OPTIONAL)
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise InstanceError(f"{path}.name", "must be a non-empty string")
        rows = _positive(entry["num_embeddings"], f"{path}.num_embeddings")
        dim = _positive(entry["embedding_dim"], f"{path}.embedding_dim")
        data_type = str(entry.get("data_type", "fp32")).lower()
        if data_type not in data_types:
            raise InstanceError(f"{path}.data_type", f"must be one of {tuple(data_types)}, got {entry.get('data_type')!r}")
        factors = _pooling_factors(entry.get("pooling_factors", [1.0]), f"{path}.pooling_factors", name)
        weighted = entry.get("weighted", False)
        if not isinstance(weighted, bool):
            raise InstanceError(f"{path}.weighted", f"must be a boolean, got {weighted!r}")
        types = entry.get("sharding_types")
        if types is not None and (not isinstance(types, list) or not types
                                  or any(t not in SHARDING_TYPES for t in types)):
            raise InstanceError(f"{path}.sharding_types", f"must be a non-empty list of {SHARDING_TYPES}, got {types!r}")
        kernels = entry.get("compute_kernels")
        if kernels is not None:
            kernels = list(modelled_kernels(kernels, f"{path}.compute_kernels", name))
        load_factor = load_factor_for(entry.get("cache_load_factor"), f"{path}.cache_load_factor", name)
        pooled = entry.get("pooled", True)
        if not isinstance(pooled, bool):
            raise InstanceError(f"{path}.pooled", f"must be a boolean, got {pooled!r}")
        config_type = torchrec.EmbeddingBagConfig if pooled else torchrec.EmbeddingConfig
        configs.append(config_type(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[name],
                                   data_type=data_types[data_type]))
        if weighted:
            weighted_tables.append(name)
        constraints[name] = ParameterConstraints(
            pooling_factors=factors, sharding_types=types, compute_kernels=kernels,
            cache_params=CacheParams(load_factor=load_factor) if load_factor is not None else None)
    topology = TorchRecTopology(world_size=world, local_world_size=local, compute_device="cuda", hbm_cap=hbm,
                                **({"ddr_cap": ddr} if ddr else {}), **bandwidths)
    # Host memory given, not read back from the Topology, where a ddr_cap equal to TorchRec's default reads as none.
    instance = from_torchrec(configs, topology, constraints, batch_size, instance_id, host_memory=ddr,
                             weighted=weighted_tables, load_factor_field=lambda i, _: f"tables[{i}].cache_load_factor")
    return replace(instance, workload=replace(instance.workload, optimizer=optimizer)).validate()
