"""Tracking a run beyond its metrics: its config, summary values and saved artifacts.

    kiln.init(config={"optimizer": {"lr": 3e-4, "name": "adam"}})   # stored as optimizer.lr, optimizer.name
    kiln.summary({"best/acc": 0.93})                                  # merged into the run's summary
    kiln.save("checkpoints/")                                         # a file or a directory

Saved files are content-addressed: each is hashed (sha256, read in chunks, never whole), a blob
kiln already has is not uploaded again, and the run's artifact names its files' blobs.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Union

from kiln.v1 import artifact_pb2, artifact_pb2_grpc, job_pb2, job_pb2_grpc

from ._address import Metadata

CHUNK = 1 << 20
"""Bytes read, hashed and sent at a time."""

# A config or summary value as kiln stores it (typing's Union: an alias is evaluated at import, and
# `X | Y` needs Python 3.10).
Scalar = Union[bool, int, float, str]


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Nested dicts as flat `a.b` keys with bool/int/float/str values; anything else raises a
    TypeError naming the key."""
    flat: dict[str, Scalar] = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"kiln: config key {key!r} under {prefix or 'the top'} is a {type(key).__name__}; keys are strings")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            raise TypeError(
                f"kiln: config value of {name!r} is a {type(value).__name__}; "
                "values are bool, int, float or str (or dicts of them)"
            )
    return flat


def config_value(key: str, value: Scalar) -> job_pb2.ConfigValue:
    if isinstance(value, bool):
        return job_pb2.ConfigValue(bool_value=value)
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise TypeError(f"kiln: {key!r} = {value} does not fit in 64 bits")
        return job_pb2.ConfigValue(int_value=value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"kiln: {key!r} is {value}; values must be finite")
        return job_pb2.ConfigValue(float_value=value)
    return job_pb2.ConfigValue(string_value=value)


def from_proto(values: Mapping[str, job_pb2.ConfigValue]) -> dict[str, Any]:
    """A proto `map<string, ConfigValue>` as a plain dict, sorted by key."""
    plain: dict[str, Any] = {}
    for key in sorted(values):
        which = values[key].WhichOneof("value")
        if which is not None:  # a value with none of its fields set is left out
            plain[key] = getattr(values[key], which)
    return plain


@dataclass
class _Session:
    job_id: str
    api_address: str
    token: str
    # The run's project, where its blobs go; empty inside a job (the job's own).
    project: str = ""

    @property
    def metadata(self) -> Metadata:
        return (("authorization", f"Bearer {self.token}"),)


_session: _Session | None = None


def bind(job_id: str, api_address: str, token: str, project: str = "") -> None:
    """Called by `kiln.init`: the run and the api that `summary` and `save` talk to."""
    global _session
    _session = _Session(job_id=job_id, api_address=api_address, token=token, project=project)


def unbind() -> None:
    global _session
    _session = None


def _current(what: str) -> _Session:
    if _session is None:
        raise RuntimeError(f"kiln.{what} before kiln.init")
    if not _session.api_address:
        raise RuntimeError(f"kiln.{what}: no api address (KILN_API is not set in this job)")
    return _session


def update_run(config: Mapping[str, Any] | None = None, summary: Mapping[str, Any] | None = None,
               session: _Session | None = None, what: str = "summary") -> None:
    from ._run import _channel

    session = session or _current(what)
    request = job_pb2.UpdateRunRequest(job_id=session.job_id)
    for key, value in flatten(config or {}).items():
        request.config[key].CopyFrom(config_value(key, value))
    for key, value in flatten(summary or {}).items():
        request.summary[key].CopyFrom(config_value(key, value))
    with _channel(session.api_address) as channel:
        job_pb2_grpc.JobServiceStub(channel).UpdateRun(request, metadata=session.metadata, timeout=60)


def summary(values: Mapping[str, Any]) -> None:
    """Sets summary values of the current run (nested dicts become `a.b` keys); keys set
    before keep their values unless given again."""
    update_run(summary=values)


@dataclass(frozen=True)
class Saved:
    """What `kiln.save` stored: the artifact's name, its files and bytes, and how many blobs
    were uploaded (the others kiln had already)."""

    name: str
    files: int
    bytes: int
    uploaded: int
    skipped: int


def _digest(path: pathlib.Path) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as source:
        while chunk := source.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def _chunks(path: pathlib.Path, digest: str, size: int, project: str = "") -> Iterator[artifact_pb2.UploadArtifactRequest]:
    header = artifact_pb2.ArtifactHeader(digest=digest, size=size, project=project)
    yield artifact_pb2.UploadArtifactRequest(header=header)
    with open(path, "rb") as source:
        while chunk := source.read(CHUNK):
            yield artifact_pb2.UploadArtifactRequest(chunk=chunk)


def _files(root: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    """(file, path under the artifact): the file itself with "", or a directory's regular files
    by `/`-separated relative path."""
    if root.is_file():
        return [(root, "")]
    if not root.is_dir():
        raise FileNotFoundError(f"kiln.save: {root} is neither a file nor a directory")
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            file = pathlib.Path(directory) / name
            if file.is_file():
                found.append((file, file.relative_to(root).as_posix()))
    if not found:
        raise ValueError(f"kiln.save: directory {root} has no files")
    return sorted(found, key=lambda pair: pair[1])


def save(path: str | os.PathLike[str], name: str | None = None) -> Saved:
    """Saves a file or a directory as an artifact of the current run, under `name` (the file's
    or directory's name by default); saving under a name again replaces what it held."""
    from ._run import _channel

    session = _current("save")
    root = pathlib.Path(path)
    name = name or root.resolve().name
    files = _files(root)
    listed, uploaded, skipped, total = [], 0, 0, 0
    with _channel(session.api_address) as channel:
        artifacts = artifact_pb2_grpc.ArtifactServiceStub(channel)
        done: set[str] = set()
        for file, relative in files:
            digest, size = _digest(file)
            total += size
            listed.append(artifact_pb2.RunArtifactFile(path=relative, digest=digest, size=size))
            if digest in done:
                continue
            done.add(digest)
            asked = artifact_pb2.StatArtifactRequest(digest=digest, project=session.project)
            stat = artifacts.StatArtifact(asked, metadata=session.metadata, timeout=60)
            if stat.exists:
                skipped += 1
                continue
            artifacts.UploadArtifact(_chunks(file, digest, size, session.project), metadata=session.metadata)
            uploaded += 1
        artifacts.SaveRunArtifact(
            artifact_pb2.SaveRunArtifactRequest(job_id=session.job_id, name=name, files=listed),
            metadata=session.metadata,
            timeout=60,
        )
    return Saved(name=name, files=len(listed), bytes=total, uploaded=uploaded, skipped=skipped)


__all__ = ["Saved", "flatten", "save", "summary"]
