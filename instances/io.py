"""Reading and writing instances, plans and instance sets on disk; writes are atomic so that a failed
command never leaves a partial file behind."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

from .model import (
    Instance,
    InstanceError,
    Plan,
    instance_from_dict,
    instance_to_dict,
    plan_from_dict,
    plan_to_dict,
)

MANIFEST = "manifest.json"


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InstanceError(str(path), f"cannot read file ({exc.strerror or exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstanceError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def load_instance(path: str | Path) -> Instance:
    try:
        return instance_from_dict(read_json(path))
    except InstanceError as exc:
        if exc.field == str(path):
            raise
        raise InstanceError(f"{path}: {exc.field}", exc.reason) from exc


def save_instance(instance: Instance, path: str | Path) -> None:
    write_json_atomic(path, instance_to_dict(instance.validate()))


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_json(path))


def save_plan(plan: Plan, instance: Instance, path: str | Path, extra: dict | None = None) -> None:
    """Validates the plan against its instance first: an invalid plan is never written."""
    plan.validate(instance)
    write_json_atomic(path, {**plan_to_dict(plan), **(extra or {})})


def save_instance_set(instances: Iterable[Instance], folder: str | Path, description: dict) -> Path:
    """Writes `folder/<id>.json` per instance plus a manifest, built in a temporary sibling folder and
    moved into place only once complete."""
    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder}: already exists; choose another folder or remove it first")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        files = []
        for instance in instances:
            name = f"{instance.id}.json"
            save_instance(instance, staging / name)
            files.append(name)
        write_json_atomic(staging / MANIFEST, {**description, "instances": files})
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def load_instance_set(folder: str | Path) -> tuple[dict, tuple[Instance, ...]]:
    folder = Path(folder)
    manifest = read_json(folder / MANIFEST)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("instances"), list):
        raise InstanceError(str(folder / MANIFEST), "instances: must list the set's instance files")
    return manifest, tuple(load_instance(folder / name) for name in manifest["instances"])


def load_instances(path: str | Path) -> tuple[Instance, ...]:
    """A single instance file, or an instance-set folder."""
    path = Path(path)
    if path.is_dir():
        return load_instance_set(path)[1]
    return (load_instance(path),)
