"""The model registry from Python: `kiln.Client().models`, what `kiln model register|ls|show|
versions|alias|unalias|tag|get` do.

    client = kiln.Client()
    version = client.models.register("digits-net", job.id, path="model", alias="candidate",
                                     tags={"stage": "dev"})          # a ModelVersion: digits-net:1
    client.models.alias("digits-net", version.version, "production")
    served = client.models.get("digits-net@production")             # NAME, NAME:3 or NAME@ALIAS
    client.models.download("digits-net@production", "model/")      # every sha256 checked

A model is named `NAME` (in `project`, or the one project you may read that has one) or
`PROJECT/NAME`, as the CLI names it; a version `NAME`, `NAME:VERSION` or `NAME@ALIAS`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kiln.v1 import model_pb2

from ._address import Metadata
from ._errors import translated
from ._jobs import _safe_join
from ._manage import ManageStubs
from ._track import from_proto

# The most models or versions one page holds (as `kiln model ls` asks).
_PAGE = 1000


@dataclass(frozen=True)
class Model:
    """A model: its project, creator, highest version number (0 before the first) and aliases
    (alias -> version number)."""

    name: str
    project: str
    created_by: str
    created_at_ms: int
    latest_version: int
    aliases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelFile:
    """One file of a version: its path in the version, sha256 (hex) and size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class DatasetRef:
    name: str
    digest: str


@dataclass(frozen=True)
class Lineage:
    """Where a version came from: the job (its sweep, config, each metric's latest value when
    the version was made, image, code, datasets, owner, project) and the path among its files."""

    job_id: str = ""
    sweep_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    image: str = ""
    code_digest: str = ""
    datasets: tuple[DatasetRef, ...] = ()
    job_owner: str = ""
    project: str = ""
    source_path: str = ""


@dataclass(frozen=True)
class ModelVersion:
    """An immutable version of a model: its files (the manifest), their digest
    (`sha256:<hex>` of the manifest), lineage, tags and the aliases that point at it."""

    model: str
    version: int
    project: str
    digest: str
    files: tuple[ModelFile, ...] = ()
    lineage: Lineage = Lineage()
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    description: str = ""
    size: int = 0
    created_by: str = ""
    created_at_ms: int = 0

    @property
    def ref(self) -> str:
        """`NAME:VERSION`, as `kiln model show` and a service's `models` take it."""
        return f"{self.model}:{self.version}"


def _model(message: model_pb2.Model) -> Model:
    return Model(name=message.name, project=message.project, created_by=message.created_by,
                 created_at_ms=message.created_at_ms, latest_version=message.latest_version,
                 aliases=dict(sorted(message.aliases.items())))


def _version(message: model_pb2.ModelVersion) -> ModelVersion:
    lineage = message.lineage
    return ModelVersion(
        model=message.model, version=message.version, project=message.project, digest=message.digest,
        files=tuple(ModelFile(path=f.path, sha256=f.sha256, size=f.size) for f in message.files),
        lineage=Lineage(
            job_id=lineage.job_id, sweep_id=lineage.sweep_id, config=from_proto(lineage.config),
            metrics=dict(sorted(lineage.metrics.items())), image=lineage.image, code_digest=lineage.code_digest,
            datasets=tuple(DatasetRef(name=d.name, digest=d.digest) for d in lineage.datasets),
            job_owner=lineage.job_owner, project=lineage.project, source_path=lineage.source_path,
        ),
        tags=dict(sorted(message.tags.items())), aliases=tuple(message.aliases), description=message.description,
        size=message.size, created_by=message.created_by, created_at_ms=message.created_at_ms,
    )


def parse_ref(text: str) -> tuple[str, int, str]:
    """(name, version, alias) of `NAME`, `NAME:VERSION` or `NAME@ALIAS` (NAME maybe
    `PROJECT/NAME`), as the CLI reads a version; version 0 and alias "" when not given."""
    name, version, alias = text, 0, ""
    if "@" in text:
        name, alias = text.split("@", 1)
    elif ":" in text:
        name, number = text.split(":", 1)
        if not (number.isascii() and number.isdigit() and int(number) > 0):
            raise ValueError(f"kiln: {text!r}: the version after ':' must be a number from 1")
        version = int(number)
    if not name:
        raise ValueError(f"kiln: {text!r} names no model: write NAME, NAME:VERSION or NAME@ALIAS")
    return name, version, alias


def manifest_digest(files: Sequence[ModelFile]) -> str:
    """The digest of a manifest, as kiln_core::models::manifest_digest makes it: `sha256:` and
    the hex sha256 of its compact JSON, entries in the order given (the server's: by path)."""
    entries = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in files]
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class Models:
    """Registers, reads, names and downloads model versions: `kiln.Client().models`."""

    def __init__(self, stubs: Callable[[], ManageStubs], metadata: Metadata):
        self._stubs = stubs  # the client's, opened on first use
        self._metadata = metadata

    def register(self, name: str, job_id: str, path: str = "", *, description: str = "",
                 tags: Mapping[str, str] | None = None, alias: str = "") -> ModelVersion:
        """Makes the next version of model `name` (the model is made on its first) from the
        ended job's synced outputs and saved artifacts: all of them, or the file or directory
        `path` among them (`kiln model register NAME --from JOB:PATH`); `alias` points at the
        new version in the same call. The model is of the job's project.

            version = client.models.register("digits-net", best.job_id, "model", alias="candidate")
            print(version.ref, version.digest, [f.path for f in version.files])
        """
        if not job_id:
            raise ValueError("kiln: register needs the job whose outputs make the version")
        request = model_pb2.RegisterModelRequest(name=name, job_id=job_id, path=path, description=description,
                                                 tags=dict(tags or {}), alias=alias)
        with translated():
            return _version(self._stubs().models.RegisterModel(request, metadata=self._metadata, timeout=300))

    def get(self, ref: str, *, project: str = "") -> ModelVersion:
        """A version, `NAME` (the latest), `NAME:VERSION` or `NAME@ALIAS`, with its files and
        lineage (`kiln model show`).

            production = client.models.get("digits-net@production")
        """
        name, version, alias = parse_ref(ref)
        request = model_pb2.GetModelVersionRequest(name=name, version=version, alias=alias, project=project)
        with translated():
            return _version(self._stubs().models.GetModelVersion(request, metadata=self._metadata, timeout=60))

    def model(self, name: str, *, project: str = "") -> Model:
        """The model itself: its latest version number and aliases.

            print(client.models.model("digits-net").aliases)   # {"production": 3, ...}
        """
        with translated():
            return _model(self._stubs().models.GetModel(model_pb2.GetModelRequest(name=name, project=project),
                                                        metadata=self._metadata, timeout=60))

    def versions(self, name: str, *, project: str = "", query: str = "", tags: Mapping[str, str] | None = None,
                 limit: int = 100) -> list[ModelVersion]:
        """A model's versions, newest first, at most `limit`: those whose description, source
        job or a tag value contains `query`, and that have every one of `tags`.

            candidates = client.models.versions("digits-net", tags={"stage": "dev"})
        """
        _check_limit(limit)
        found: list[ModelVersion] = []
        before = 0
        with translated():
            while len(found) < limit:
                request = model_pb2.ListModelVersionsRequest(name=name, query=query, tags=dict(tags or {}),
                                                             limit=min(limit - len(found), _PAGE),
                                                             before_version=before, project=project)
                page = self._stubs().models.ListModelVersions(request, metadata=self._metadata, timeout=60)
                found.extend(_version(version) for version in page.versions)
                before = page.next_before_version
                if not before:
                    break
        return found

    def alias(self, name: str, version: int, alias: str, *, project: str = "") -> ModelVersion:
        """Points `alias` at `version`, moving it at once from the version that held it.

            client.models.alias("digits-net", 3, "production")
        """
        request = model_pb2.SetModelAliasRequest(name=name, version=version, alias=alias, project=project)
        with translated():
            return _version(self._stubs().models.SetModelAlias(request, metadata=self._metadata, timeout=60))

    def unalias(self, name: str, alias: str, *, project: str = "") -> int:
        """Removes `alias`; returns the version it pointed at."""
        request = model_pb2.DeleteModelAliasRequest(name=name, alias=alias, project=project)
        with translated():
            return int(self._stubs().models.DeleteModelAlias(request, metadata=self._metadata, timeout=60).version)

    def tag(self, ref: str, tags: Mapping[str, str], *, project: str = "") -> ModelVersion:
        """Sets key=value tags on the version `NAME:VERSION`; an empty value removes a tag.

            client.models.tag("digits-net:3", {"stage": "prod", "stage-old": ""})
        """
        name, version, _ = parse_ref(ref)
        if version == 0:
            raise ValueError(f"kiln: name the version to tag: {name}:VERSION")
        request = model_pb2.SetModelTagsRequest(name=name, version=version, tags=dict(tags), project=project)
        with translated():
            return _version(self._stubs().models.SetModelTags(request, metadata=self._metadata, timeout=60))

    def download(self, ref: str, dest: str | os.PathLike[str], *, project: str = "") -> list[pathlib.Path]:
        """Writes the version's files under `dest` at their paths in it (`kiln model get`) and
        returns them. Each file's sha256 and size are checked against the manifest, and the
        manifest against the version's digest: a file that does not match is removed and a
        ValueError raised, so what is under `dest` is exactly what was registered.

            client.models.download("digits-net@production", "model/")
        """
        version = self.get(ref, project=project)
        if manifest_digest(version.files) != version.digest:
            raise ValueError(f"kiln: the manifest of {version.ref} digests to {manifest_digest(version.files)}, "
                             f"not its recorded {version.digest}")
        models = self._stubs().models
        written = []
        for file in version.files:
            target = _safe_join(pathlib.Path(dest), file.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            # Into a temporary name first: a file that fails its check never appears complete.
            partial = target.with_name(target.name + ".kiln-partial")
            # The version found, in its project, whatever the name it was asked by.
            request = model_pb2.GetModelFileRequest(name=version.model, project=version.project,
                                                    version=version.version, path=file.path)
            digest = hashlib.sha256()
            size = 0
            with translated(), open(partial, "wb") as out:
                for chunk in models.GetModelFile(request, metadata=self._metadata):
                    digest.update(chunk.data)
                    size += len(chunk.data)
                    out.write(chunk.data)
            if digest.hexdigest() != file.sha256 or size != file.size:
                partial.unlink()
                raise ValueError(f"kiln: {file.path} arrived as {size} bytes with sha256 {digest.hexdigest()}, "
                                 f"not the registered {file.size} bytes with {file.sha256}")
            partial.replace(target)
            written.append(target)
        return written

    # Last in the class: below it, `list` in an annotation would name this method.
    def list(self, project: str = "", *, query: str = "", limit: int = 100) -> list[Model]:
        """Models you may read, of one `project` or every one, whose name contains `query`
        (`kiln model ls`).

            for model in client.models.list(project="vision"):
                print(model.name, model.latest_version, model.aliases)
        """
        _check_limit(limit)
        found: list[Model] = []
        token = ""
        with translated():
            while len(found) < limit:
                request = model_pb2.ListModelsRequest(project=project, query=query,
                                                      limit=min(limit - len(found), _PAGE), page_token=token)
                page = self._stubs().models.ListModels(request, metadata=self._metadata, timeout=60)
                found.extend(_model(model) for model in page.models)
                token = page.next_page_token
                if not token:
                    break
        return found


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"kiln: limit must be at least 1, not {limit}")


__all__ = ["DatasetRef", "Lineage", "Model", "ModelFile", "ModelVersion", "Models", "manifest_digest", "parse_ref"]
