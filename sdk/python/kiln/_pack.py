"""Packing a working directory into a code bundle as `kiln run` does (sdk/cli/src/pack.rs).

The CLI walks the directory with the `ignore` crate: hidden files are kept, `.git` never goes
in, and `.kilnignore`, `.ignore`, `.gitignore` and `.git/info/exclude` exclude files, those of
the directory itself and of every directory above it (not the user's global gitignore). For a
path, each kind of file is asked from the deepest directory up, and the first that matches
(excluding, or including again with `!`) decides for that kind; the kinds then decide in that
order, `.kilnignore` first. An excluded directory is not entered. Symlinks are stored as links.
This module does the same, with `pathspec` for the gitignore patterns.

The archive holds the same entries as the CLI's, in the same order (paths sorted component by
component), with the same names, types, sizes, contents, link targets and modes (0755 for
directories and for files with the owner's execute bit, 0644 otherwise), owner 0 and tar-rs's
fixed time; tests/test_jobs.py compares both on one tree. It is not byte-identical: zlib's
deflate is not flate2's, a few header fields are spelt differently (the checksum's digits, empty
device numbers), and a sparse file goes in whole where tar-rs writes a GNU sparse entry (both
unpack to the same bytes). So the same tree has one digest from the SDK and another from the
CLI, and each is stored once.
"""

from __future__ import annotations

import gzip
import os
import pathlib
import re
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pathspec

from kiln.v1 import artifact_pb2, artifact_pb2_grpc

from ._address import Metadata
from ._track import _chunks, _digest

MTIME = 1153704088
"""The time of every entry: tar-rs's `HeaderMode::Deterministic` one."""
MAX_BUNDLE_BYTES = 1 << 30
"""Bundles above this size are refused, as by the CLI: a job's code should not be a data set."""
_COPY = 1 << 20
# The kinds of ignore files, in the order they decide (the ignore crate's precedence).
_IGNORE_FILES = (".kilnignore", ".ignore", ".gitignore")


@dataclass(frozen=True)
class Bundle:
    """A packed bundle: a temporary file (the caller removes it), its size, sha256 and entries."""

    path: pathlib.Path
    size: int
    digest: str
    files: int


@dataclass(frozen=True)
class _Pattern:
    """One line of an ignore file, matched as the ignore crate matches it: against the path
    itself. (pathspec's regexes, made for git, also match every path under a directory that
    matches; git never enters that directory, but here another file's `!` may have let the
    walk in, and then those paths must be judged by their own patterns.)"""

    regex: re.Pattern[str]
    exclude: bool  # False for a `!` line
    dir_only: bool  # the line ended with `/`
    closed: bool  # the regex must match the whole path; an open one (`dir/**`, `*`) any path it starts

    def matches(self, relative: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        found = self.regex.fullmatch(relative) if self.closed else self.regex.match(relative)
        return found is not None


Rules = Sequence[Optional[Sequence[_Pattern]]]
"""A directory's patterns: .kilnignore, .ignore, .gitignore, .git/info/exclude (None: no file)."""


def _patterns(path: pathlib.Path) -> list[_Pattern] | None:
    """The patterns of an ignore file, in order; None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except (FileNotFoundError, NotADirectoryError):
        return None
    lines = []
    dir_only = []
    for line in text.splitlines():
        while line.endswith(" ") and not line.endswith("\\ "):  # unescaped trailing spaces go
            line = line[:-1]
        # `dir/` is `dir` for directories only (as in the ignore crate); pathspec gets `dir`.
        dir_only.append(line.endswith("/"))
        lines.append(line[:-1] if line.endswith("/") else line)
    compiled = pathspec.GitIgnoreSpec.from_lines(lines).patterns
    assert len(compiled) == len(lines), "pathspec gives one pattern a line"
    # A regex that ends `(?:(?P<ps_d>/)|$)` matches the path or what is under it: only a whole
    # match is the path's own (tests/test_jobs.py checks this against the CLI).
    return [
        _Pattern(regex=pattern.regex, exclude=bool(pattern.include), dir_only=only,
                 closed=pattern.regex.pattern.endswith("$)"))
        for pattern, only in zip(compiled, dir_only)
        if pattern.include is not None and pattern.regex is not None
    ]


def _git_dir(directory: pathlib.Path) -> pathlib.Path | None:
    """Where `directory`'s `.git/info/exclude` is read from: `.git`, or for a `.git` file
    (`gitdir: X`, a worktree) X's common dir; None when there is none (as the ignore crate)."""
    dot_git = directory / ".git"
    if dot_git.is_dir():
        return dot_git
    if not dot_git.is_file():
        return None
    lines = dot_git.read_text(errors="surrogateescape").splitlines()
    if not lines or not lines[0].startswith("gitdir: "):
        return None
    real = pathlib.Path(lines[0][len("gitdir: "):])
    try:
        common = (real / "commondir").read_text(errors="surrogateescape").splitlines()
    except OSError:
        return None
    if not common:
        return None
    return real / common[0] if common[0].startswith(".") else pathlib.Path(common[0])


def _rules(directory: pathlib.Path) -> Rules:
    rules = [_patterns(directory / name) for name in _IGNORE_FILES]
    git_dir = _git_dir(directory)
    rules.append(_patterns(git_dir / "info" / "exclude") if git_dir is not None else None)
    return rules


def _ignored(chain: list[tuple[pathlib.Path, Rules]], path: pathlib.Path, is_dir: bool) -> bool:
    """Whether the rules of `chain` (directories with ignore files, the deepest last) exclude
    `path`: per kind, the deepest directory whose file has a matching line (its last one)
    decides; the first kind with a verdict wins."""
    verdicts: list[bool | None] = [None] * 4
    for directory, rules in reversed(chain):
        relative = path.relative_to(directory).as_posix()
        for kind, patterns in enumerate(rules):
            if verdicts[kind] is None and patterns:
                verdicts[kind] = next((p.exclude for p in reversed(patterns) if p.matches(relative, is_dir)), None)
    return next((verdict for verdict in verdicts if verdict is not None), False)


def walk(root: str | os.PathLike[str]) -> list[tuple[pathlib.Path, str]]:
    """(path, name in the archive) of what `kiln run` packs from `root`, in the CLI's order."""
    base = pathlib.Path(root).resolve()
    if not base.is_dir():
        raise NotADirectoryError(f"kiln: {root} is not a directory to pack")
    chain: list[tuple[pathlib.Path, Rules]] = []
    for parent in reversed(base.parents):  # the directories above, outermost first
        above_rules = _rules(parent)
        if any(above_rules):
            chain.append((parent, above_rules))
    found: list[pathlib.Path] = []
    pending = [(base, chain)]
    while pending:
        directory, above = pending.pop()
        own = _rules(directory)
        rules = above + [(directory, own)] if any(own) else above
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name == ".git":
                    continue
                path = pathlib.Path(entry.path)
                is_dir = entry.is_dir(follow_symlinks=False)
                if _ignored(rules, path, is_dir):
                    continue
                found.append(path)
                if is_dir:
                    pending.append((path, rules))
    # tar-rs's order: `Vec<PathBuf>::sort`, which compares paths component by component.
    found.sort(key=lambda path: tuple(os.fsencode(part) for part in path.relative_to(base).parts))
    return [(path, path.relative_to(base).as_posix()) for path in found]


class _Entry(tarfile.TarInfo):
    """A tar header whose directory names have no trailing `/`, as tar-rs writes them (tarfile
    adds one, and Python 3.9 reads it back)."""

    def get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = dict(super().get_info())
        info["name"] = self.name
        return info


def _entry(path: pathlib.Path, name: str) -> tarfile.TarInfo:
    """The tar header tar-rs writes for `path` in `HeaderMode::Deterministic`."""
    status = os.lstat(path)
    mode = status.st_mode
    info = _Entry(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
    info.mode = 0o755 if stat.S_ISDIR(mode) or mode & 0o100 else 0o644
    if stat.S_ISREG(mode):
        info.type, info.size = tarfile.REGTYPE, status.st_size
    elif stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISFIFO(mode):
        info.type = tarfile.FIFOTYPE
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(status.st_rdev), os.minor(status.st_rdev)
    else:
        raise ValueError(f"kiln: {path}: a socket can not be packed (list it in .kilnignore)")
    return info


def _copy(path: pathlib.Path, size: int, archive: gzip.GzipFile) -> None:
    """Appends the `size` bytes of a file the header announced, then the padding to 512 bytes."""
    left = size
    with open(path, "rb") as source:
        while left:
            chunk = source.read(min(left, _COPY))
            if not chunk:
                raise OSError(f"kiln: {path} shrank while it was packed")
            archive.write(chunk)
            left -= len(chunk)
    archive.write(b"\0" * (-size % tarfile.BLOCKSIZE))


def pack(root: str | os.PathLike[str]) -> Bundle:
    """Packs `root` as `kiln run` does into a temporary tar.gz (see the module's doc)."""
    handle, name = tempfile.mkstemp(prefix="kiln-code-", suffix=".tar.gz")
    bundle_path = pathlib.Path(name)
    files = 0
    try:
        with os.fdopen(handle, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                           compresslevel=6) as archive:
            for path, entry_name in walk(root):
                info = _entry(path, entry_name)
                archive.write(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
                if info.type == tarfile.REGTYPE:
                    _copy(path, info.size, archive)
                files += 1
                if raw.tell() > MAX_BUNDLE_BYTES:
                    raise ValueError(f"kiln: {root} packs to more than {MAX_BUNDLE_BYTES} bytes; list data in .kilnignore")
            archive.write(b"\0" * (2 * tarfile.BLOCKSIZE))  # the end of the archive, no record padding
        digest, size = _digest(bundle_path)
    except BaseException:
        bundle_path.unlink(missing_ok=True)
        raise
    return Bundle(path=bundle_path, size=size, digest=digest, files=files)


def upload_code(artifacts: artifact_pb2_grpc.ArtifactServiceStub, metadata: Metadata,
                root: str | os.PathLike[str], project: str) -> str:
    """Packs `root` and uploads it to `project` (empty: `default`) unless the project has it;
    returns its digest, which a job's spec names (StatArtifact, then UploadArtifact, as the CLI)."""
    bundle = pack(root)
    try:
        asked = artifact_pb2.StatArtifactRequest(digest=bundle.digest, project=project)
        if not artifacts.StatArtifact(asked, metadata=metadata, timeout=60).exists:
            artifacts.UploadArtifact(_chunks(bundle.path, bundle.digest, bundle.size, project), metadata=metadata)
    finally:
        bundle.path.unlink(missing_ok=True)
    return bundle.digest


__all__ = ["Bundle", "MAX_BUNDLE_BYTES", "MTIME", "pack", "upload_code", "walk"]
