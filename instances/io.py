"""Reading and writing instances, plans and instance sets on disk; writes are atomic, and a command's
several outputs are written all or none, so that a failed or interrupted command leaves no partial output."""
from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Mapping

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
    """A file's text as UTF-8 (a `.gz` file decompressed), or an InstanceError naming the file and why it
    cannot be read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InstanceError(str(path), f"cannot read {what} ({exc.strerror or exc})") from exc
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InstanceError(str(path), f"not a gzip file ({exc})") from exc
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


# Outputs are written to hidden siblings named after the output and this process, then renamed into place:
# `.plan.json.shardbench-4242-0.tmp`. A rename is atomic, a failure or an interrupt removes the siblings,
# and SIGKILL (which no process can clean up after) leaves siblings that say whose they are and that the
# next write of the same output sweeps once their process is gone.
TEMPORARY_MARK = "shardbench"
_TEMPORARY = re.compile(rf"\.(?P<name>.+)\.{TEMPORARY_MARK}-(?P<pid>\d+)-\d+\.tmp")
_serial = itertools.count()
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def temporary_path(path: Path) -> Path:
    """A hidden sibling of `path` for this process to write before renaming it into place."""
    return path.parent / f".{path.name}.{TEMPORARY_MARK}-{os.getpid()}-{next(_serial)}.tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_temporaries(path: Path) -> None:
    """Removes the temporaries of `path` that a killed process left (their pid no longer runs here)."""
    try:
        siblings = list(path.parent.iterdir())
    except OSError:  # no folder yet, or one we cannot list: nothing of ours there
        return
    for sibling in siblings:
        match = _TEMPORARY.fullmatch(sibling.name)
        if match and match["name"] == path.name and int(match["pid"]) != os.getpid() and not _alive(int(match["pid"])):
            sibling.unlink(missing_ok=True)


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held back inside (blocked for this thread) and delivered as it ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_files_atomic(files: Mapping[str | Path, bytes]) -> None:
    """Writes every file or none: each to its temporary sibling (`temporary_path`), then all renamed into place
    with SIGINT and SIGTERM held, so that no interrupt falls between two renames. Anything raised before
    then — an error, a full disk, Ctrl-C, or SIGTERM where the caller turns it into an exception (the CLI
    does) — removes the temporaries; an error among the renames also removes the outputs already renamed
    (the files they replaced are not restored). A signal that arrives during the renames takes effect once
    they are done: the outputs are then complete. SIGKILL leaves temporaries, swept by the next write of
    the same output. Files get the permissions the umask gives a new file."""
    paths = {check_output_path(path): data for path, data in files.items()}
    written: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for path, data in paths.items():
            with _writing_to(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                sweep_temporaries(path)
                temporary = temporary_path(path)
                written.append((temporary, path))
                with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
                    handle.write(data)
                os.chmod(temporary, 0o666 & ~_umask())
        with signals_held():
            for temporary, path in written:
                with _writing_to(path):
                    os.replace(temporary, path)
                placed.append(path)
    except BaseException:
        for temporary, _ in written:
            temporary.unlink(missing_ok=True)
        if len(placed) < len(written):
            for path in placed:
                path.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """One file written as `write_files_atomic` writes a set: via a temporary sibling and a rename."""
    write_files_atomic({path: data})


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def json_bytes(data: Any) -> bytes:
    """A JSON file's bytes, as every JSON output is written."""
    return (json.dumps(data, indent=1) + "\n").encode("utf-8")


def write_json_atomic(path: str | Path, data: Any) -> None:
    write_bytes_atomic(path, json_bytes(data))


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


def plan_file(plan: Plan, instance: Instance, report: dict | None = None) -> bytes:
    """A plan file's bytes, the plan validated against its instance first: an invalid plan is never written."""
    plan.validate(instance)
    return json_bytes(plan_to_dict(plan, instance, report))


def save_plan(plan: Plan, instance: Instance, path: str | Path, report: dict | None = None) -> None:
    write_bytes_atomic(path, plan_file(plan, instance, report))


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
