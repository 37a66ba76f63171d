"""Reading and writing instances, plans and instance sets on disk; writes are atomic so that a failed
command never leaves a partial file behind."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

from .model import (
    Instance,
    InstanceError,
    PlanError,
    instance_from_dict,
    instance_to_dict,
)
from .sharding import Plan, plan_from_dict, plan_to_dict

MANIFEST = "manifest.json"


def read_text(path: str | Path, what: str = "file") -> str:
    """A file's text as UTF-8, or an InstanceError naming the file and why it cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InstanceError(str(path), f"cannot read {what} ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InstanceError(str(path), f"not UTF-8 text (byte {exc.start}: {exc.reason})") from exc


def read_json(path: str | Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstanceError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except RecursionError as exc:
        raise InstanceError(str(path), "not valid JSON (nested too deeply)") from exc
    except ValueError as exc:  # e.g. an integer literal longer than Python converts
        raise InstanceError(str(path), f"not valid JSON ({exc})") from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_path(path: str | Path, what: str = "output") -> Path:
    """Fails early, before any work, when `path` cannot receive a file: it is a directory, or its parent
    is a file."""
    path = Path(path)
    if path.is_dir():
        raise InstanceError(str(path), f"{what} is a directory; give a file name")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise InstanceError(str(path), f"{what}: {parent} is not a directory")
    return path


@contextmanager
def _writing_to(path: Path):
    """Turns an OSError while writing `path` (its temporary sibling, its folder) into one that names `path`
    itself, so the user reads which output failed (a read-only folder, a full disk), not a temporary name."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Writes via a temporary sibling and a rename, removing the sibling when anything fails; the file gets
    the permissions the umask gives a new file."""
    path = check_output_path(path)
    with _writing_to(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


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


def load_plan(path: str | Path, instance: Instance) -> Plan:
    """A plan file for `instance`, parsed (errors name the field) and validated (errors name the table)."""
    try:
        return plan_from_dict(read_json(path), instance).validate(instance)
    except InstanceError as exc:
        if exc.field == str(path):
            raise
        raise InstanceError(f"{path}: {exc.field}", exc.reason) from exc
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from exc


def save_plan(plan: Plan, instance: Instance, path: str | Path, report: dict | None = None) -> None:
    """Validates the plan against its instance first: an invalid plan is never written."""
    plan.validate(instance)
    write_json_atomic(path, plan_to_dict(plan, instance, report))


def save_instance_set(instances: Iterable[Instance], folder: str | Path, description: dict) -> Path:
    """Writes `folder/<id>.json` per instance plus a manifest, built in a temporary sibling folder and
    moved into place only once complete."""
    folder = Path(folder)
    if folder.exists():
        raise FileExistsError(f"{folder}: already exists; choose another folder or remove it first")
    check_output_path(folder, "instance-set folder")
    with _writing_to(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        files = []
        for instance in instances:
            name = f"{instance.id}.json"
            if name in files:
                raise InstanceError("id", f"two instances share the id {instance.id!r}")
            save_instance(instance, staging / name)
            files.append(name)
        write_json_atomic(staging / MANIFEST, {**description, "instances": files})
        with _writing_to(folder):
            os.chmod(staging, 0o777 & ~_umask())
            os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def load_instance_set(folder: str | Path) -> tuple[dict, tuple[Instance, ...]]:
    """The manifest and its instances; file names must be plain names inside the folder, and ids unique."""
    folder = Path(folder)
    path = folder / MANIFEST
    manifest = read_json(path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("instances"), list) or not manifest["instances"]:
        raise InstanceError(f"{path}: instances", "must be a non-empty list of the set's instance files")
    names = manifest["instances"]
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise InstanceError(f"{path}: instances[{i}]", f"must be a file name inside the folder, got {name!r}")
    if len(set(names)) != len(names):
        raise InstanceError(f"{path}: instances", "lists a file twice")
    instances = tuple(load_instance(folder / name) for name in names)
    first: dict[str, str] = {}
    for name, instance in zip(names, instances):
        if instance.id in first:
            raise InstanceError(f"{folder / name}: id", f"{instance.id!r} is also the id of {first[instance.id]}")
        first[instance.id] = name
    return manifest, instances


def load_instances(path: str | Path) -> tuple[Instance, ...]:
    """A single instance file, or an instance-set folder."""
    path = Path(path)
    if path.is_dir():
        return load_instance_set(path)[1]
    return (load_instance(path),)
