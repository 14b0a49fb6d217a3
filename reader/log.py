"""Listing and parsing a table's `_delta_log` on a local filesystem: every read of the log is here.

The functions of the "reading files" section and `list_log` are the only ones
that touch the files; everything else in this project reads `_delta_log`
through them. (Writes are in `coordinator.delta_log.files`.)

A table root is a plain path or a `file://` URI. The log holds 20-digit
`<v>.json` commits, classic `<v>.checkpoint.parquet` checkpoints, deprecated
multi-part `<v>.checkpoint.<part>.<parts>.parquet` checkpoints, UUID-named V2
checkpoints (`<v>.checkpoint.<uuid>.{json,parquet}`) and `_last_checkpoint`.
Everything else (`.crc` files, temporary files, `_staged_commits/`, log
compactions) is ignored by the listing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from schemas.actions import Action, ActionParseError, CommitInfo, action_from_json, json_lines
from schemas.errors import DeltaCoordError

LOG_DIR_NAME = "_delta_log"
LAST_CHECKPOINT_NAME = "_last_checkpoint"

_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CLASSIC_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")

#: Action keys this project parses; any other top-level key in a commit line is
#: skipped (forward compatibility: readers ignore actions they do not need).
_KNOWN_ACTION_KEYS = frozenset({"add", "remove", "cdc", "metaData", "protocol", "txn", "domainMetadata", "commitInfo"})


class TableNotFoundError(DeltaCoordError, FileNotFoundError):
    """No Delta table (no `_delta_log` with a commit or checkpoint) at the given root."""


class VersionNotFoundError(DeltaCoordError, ValueError):
    """The requested version or timestamp cannot be reconstructed from the log."""


class CorruptLogError(DeltaCoordError, ValueError):
    """The log is inconsistent: missing commits, unreadable files, bad actions."""


# --------------------------------------------------------------------------- paths


def table_root(table_uri: str | os.PathLike[str]) -> Path:
    """The local directory of a table given as a path or a `file://` URI."""
    if isinstance(table_uri, os.PathLike):
        return Path(os.fspath(table_uri))
    if "://" in table_uri or table_uri.startswith("file:"):
        parsed = urlparse(table_uri)
        if parsed.scheme != "file":
            raise ValueError(f"only local tables (a path or a file:// URI) are supported, got {table_uri!r}")
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file URI with a remote host is not supported: {table_uri!r}")
        return Path(unquote(parsed.path))
    return Path(table_uri)


def log_dir(root: Path) -> Path:
    return root / LOG_DIR_NAME


def commit_file_name(version: int) -> str:
    return f"{version:020d}.json"


def checkpoint_file_name(version: int) -> str:
    return f"{version:020d}.checkpoint.parquet"


def multipart_checkpoint_file_name(version: int, part: int, num_parts: int) -> str:
    return f"{version:020d}.checkpoint.{part:010d}.{num_parts:010d}.parquet"


def commit_path(root: Path, version: int) -> Path:
    """Where version `version`'s commit file is."""
    return log_dir(root) / commit_file_name(version)


def resolve_data_path(root: Path, path: str) -> Path:
    """The local file of an `add`/`remove` path (URI-encoded, relative or absolute)."""
    if "://" in path or path.startswith("file:"):
        return table_root(path)
    decoded = unquote(path)
    if decoded.startswith("/"):
        return Path(decoded)
    return root / decoded


# --------------------------------------------------------------------------- reading files


def read_log_file(path: Path) -> bytes:
    """The bytes of one file of `_delta_log` (FileNotFoundError when absent)."""
    return path.read_bytes()


def log_file_exists(path: Path) -> bool:
    return path.exists()


def log_file_names(root: Path) -> list[str]:
    """Every name in `_delta_log`, sorted (temporary and unknown files included)."""
    return sorted(os.listdir(log_dir(root)))


def file_mtime_ms(path: Path) -> int:
    return os.stat(path).st_mtime_ns // 1_000_000


# --------------------------------------------------------------------------- listing


def checkpoint_exists(table_uri: str | os.PathLike[str], version: int) -> bool:
    """Whether the classic checkpoint of `version` is in `_delta_log`."""
    return log_file_exists(log_dir(table_root(table_uri)) / checkpoint_file_name(version))


def newest_commit_version(table_uri: str | os.PathLike[str]) -> int:
    """The newest `<v>.json` in a table's `_delta_log` (one listing, names only), or -1 when there is none."""
    try:
        names = log_file_names(table_root(table_uri))
    except FileNotFoundError:
        return -1
    newest = -1
    for name in names:
        if len(name) == 25 and name.endswith(".json") and name[:20].isdigit():
            newest = max(newest, int(name[:20]))
    return newest


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """One complete checkpoint of a version: a classic file, all parts of a multi-part one, or a V2 file."""

    version: int
    paths: tuple[Path, ...]
    kind: str  # "classic" | "multipart" | "v2"

    @property
    def num_parts(self) -> int:
        return len(self.paths)


class CommitPaths(Mapping[int, Path]):
    """Commit files by version, holding the names as strings.

    A log of many thousand commits is listed at every checkpoint, and callers
    mostly look at versions only; building a `Path` per file dominated that.
    """

    __slots__ = ("_raw",)

    def __init__(self) -> None:
        self._raw: dict[int, str] = {}

    def __getitem__(self, version: int) -> Path:
        return Path(self._raw[version])

    def __contains__(self, version: object) -> bool:
        return version in self._raw

    def __iter__(self) -> Iterator[int]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def set(self, version: int, path: str) -> None:
        self._raw[version] = path


@dataclass(slots=True)
class LogListing:
    """What one directory listing of `_delta_log` found."""

    root: Path
    commits: CommitPaths = field(default_factory=CommitPaths)
    checkpoints: dict[int, list[CheckpointRef]] = field(default_factory=dict)

    @property
    def latest_commit_version(self) -> int | None:
        return max(self.commits) if self.commits else None

    @property
    def latest_version(self) -> int | None:
        """Newest version the log can reconstruct (a commit, or a checkpoint beyond the commits)."""
        candidates = [v for v in (self.latest_commit_version, max(self.checkpoints, default=None)) if v is not None]
        return max(candidates) if candidates else None

    @property
    def earliest_commit_version(self) -> int | None:
        return min(self.commits) if self.commits else None

    def best_checkpoint(self, version: int) -> CheckpointRef | None:
        """Newest complete checkpoint at or before `version`.

        For the same version a classic single file wins over a multi-part one,
        which wins over a V2 file (all are equivalent; the single file is cheapest).
        """
        eligible = [v for v in self.checkpoints if v <= version]
        if not eligible:
            return None
        return _preferred(self.checkpoints[max(eligible)])

    def checkpoint_candidates(self, version: int) -> list[CheckpointRef]:
        """Complete checkpoints at or before `version`, newest first (for fallback)."""
        return [_preferred(self.checkpoints[v]) for v in sorted((v for v in self.checkpoints if v <= version), reverse=True)]


_KIND_ORDER = {"classic": 0, "multipart": 1, "v2": 2}


def _preferred(refs: list[CheckpointRef]) -> CheckpointRef:
    return min(refs, key=lambda r: (_KIND_ORDER[r.kind], r.paths))


def list_log(root: Path) -> LogListing:
    """List `_delta_log` once; incomplete multi-part checkpoints are left out."""
    d = log_dir(root)
    listing = LogListing(root=root)
    multipart: dict[tuple[int, int], dict[int, Path]] = {}
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        raise TableNotFoundError(f"no Delta table at {root}: {d} does not exist") from None
    except NotADirectoryError:
        raise TableNotFoundError(f"no Delta table at {root}: {d} is not a directory") from None
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name[:1].isdigit():
            continue
        m = _COMMIT_RE.match(name)
        if m:
            listing.commits.set(int(m.group(1)), entry.path)
            continue
        m = _CLASSIC_CKPT_RE.match(name)
        if m:
            v = int(m.group(1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, (Path(entry.path),), "classic"))
            continue
        m = _MULTIPART_CKPT_RE.match(name)
        if m:
            v, part, parts = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if 1 <= part <= parts:
                multipart.setdefault((v, parts), {})[part] = Path(entry.path)
            continue
        m = _UUID_CKPT_RE.match(name)
        if m:
            v = int(m.group(1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, (Path(entry.path),), "v2"))
    for (v, parts), found in multipart.items():
        if len(found) == parts:
            paths = tuple(found[i] for i in range(1, parts + 1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, paths, "multipart"))
    return listing


# --------------------------------------------------------------------------- _last_checkpoint


@dataclass(frozen=True, slots=True)
class LastCheckpoint:
    """Contents of `_delta_log/_last_checkpoint`."""

    version: int
    size: int
    parts: int | None = None
    size_in_bytes: int | None = None
    num_of_add_files: int | None = None
    checkpoint_schema: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "size": self.size}
        if self.parts is not None:
            out["parts"] = self.parts
        if self.size_in_bytes is not None:
            out["sizeInBytes"] = self.size_in_bytes
        if self.num_of_add_files is not None:
            out["numOfAddFiles"] = self.num_of_add_files
        if self.checkpoint_schema is not None:
            out["checkpointSchema"] = dict(self.checkpoint_schema)
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> LastCheckpoint:
        known = {"version", "size", "parts", "sizeInBytes", "numOfAddFiles", "checkpointSchema"}
        return LastCheckpoint(
            version=int(d["version"]),
            size=int(d.get("size", 0)),
            parts=None if d.get("parts") is None else int(d["parts"]),
            size_in_bytes=None if d.get("sizeInBytes") is None else int(d["sizeInBytes"]),
            num_of_add_files=None if d.get("numOfAddFiles") is None else int(d["numOfAddFiles"]),
            checkpoint_schema=d.get("checkpointSchema"),
            extra={k: v for k, v in d.items() if k not in known},
        )


def read_last_checkpoint(root: Path) -> LastCheckpoint | None:
    """`_last_checkpoint`, or None when absent or unreadable (it is only a hint)."""
    p = log_dir(root) / LAST_CHECKPOINT_NAME
    try:
        raw = read_log_file(p)
    except FileNotFoundError:
        return None
    try:
        d = json.loads(raw)
        if not isinstance(d, dict):
            return None
        return LastCheckpoint.from_json(d)
    except (ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- commits


def parse_commit_lines(data: bytes | str, *, source: str = "<commit>") -> list[Action]:
    """Parse a commit file into actions; unknown action kinds are skipped.

    Unlike `schemas.actions.parse_commit` this tolerates actions added to the
    protocol after this reader was written, as Delta readers must. A malformed
    known action is an error.
    """
    return [a for _lineno, a in iter_commit_actions(data, source=source)]


def iter_commit_actions(data: bytes | str, *, source: str = "<commit>") -> Iterator[tuple[int, Action]]:
    """(line number, action) of each action of a commit file, as `parse_commit_lines` reads them."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    for lineno, line in enumerate(json_lines(text), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorruptLogError(f"{source}: line {lineno} is not JSON: {e}") from e
        if not isinstance(obj, dict) or len(obj) != 1:
            raise CorruptLogError(f"{source}: line {lineno} is not a single-key action object")
        if next(iter(obj)) not in _KNOWN_ACTION_KEYS:
            continue
        try:
            action = action_from_json(obj)
        except ActionParseError as e:
            raise CorruptLogError(f"{source}: line {lineno}: {e}") from e
        if action is not None:
            yield lineno, action


def read_commit(path: Path) -> list[Action]:
    """All actions of one `<v>.json` commit file."""
    return parse_commit_lines(read_log_file(path), source=str(path))


def read_commit_info(path: Path) -> CommitInfo | None:
    """The commit's `commitInfo`, read without parsing its other actions.

    With in-commit timestamps the commitInfo is the first line, so this is
    usually a one-line read.
    """
    with open(path, "rb") as f:
        for line in f:
            if b'"commitInfo"' not in line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorruptLogError(f"{path}: a line is not JSON: {e}") from e
            if isinstance(obj, dict) and "commitInfo" in obj and isinstance(obj["commitInfo"], dict):
                return CommitInfo.from_json(obj["commitInfo"])
    return None


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class LogSegment:
    """The files needed to reconstruct one version: a checkpoint (optional) and the commits after it."""

    root: Path
    version: int
    checkpoint: CheckpointRef | None
    commits: tuple[tuple[int, Path], ...]


def log_segment(listing: LogListing, version: int | None = None, *, checkpoint: CheckpointRef | None = None,
                use_checkpoint: bool = True) -> LogSegment:
    """Pick the newest checkpoint <= version and the contiguous commits after it.

    `checkpoint` forces a specific checkpoint (used to fall back from an
    unreadable one); `use_checkpoint=False` replays JSON commits from version 0.
    """
    latest = listing.latest_version
    if latest is None:
        raise TableNotFoundError(f"no Delta table at {listing.root}: {LOG_DIR_NAME} has no commits or checkpoints")
    target = latest if version is None else version
    if target < 0:
        raise VersionNotFoundError(f"invalid version {target}")
    if target > latest:
        raise VersionNotFoundError(f"version {target} does not exist: the latest version of {listing.root} is {latest}")
    cp = checkpoint if checkpoint is not None else (listing.best_checkpoint(target) if use_checkpoint else None)
    start = 0 if cp is None else cp.version + 1
    commits: list[tuple[int, Path]] = []
    for v in range(start, target + 1):
        p = listing.commits.get(v)
        if p is None:
            if cp is None and v == start:
                earliest = listing.earliest_commit_version
                raise VersionNotFoundError(
                    f"cannot reconstruct version {target} of {listing.root}: no checkpoint at or before it and "
                    f"commit {v} is missing (earliest available commit: {earliest}, "
                    f"checkpoints: {sorted(listing.checkpoints)})"
                )
            raise CorruptLogError(f"cannot reconstruct version {target} of {listing.root}: commit file {commit_file_name(v)} is missing")
        commits.append((v, p))
    return LogSegment(root=listing.root, version=target, checkpoint=cp, commits=tuple(commits))


#: Beyond this many commits after the hinted checkpoint, one listing is cheaper than a stat each.
_HINT_MAX_COMMITS = 1000


def segment_from_last_checkpoint(root: Path, version: int) -> LogSegment | None:
    """The segment for `version` found through `_last_checkpoint`, without listing `_delta_log`.

    Stats the hinted classic checkpoint and each commit after it. None when the
    hint is absent, newer than `version`, multi-part, or leads to a missing
    file: the caller then lists the directory (`list_log` + `log_segment`).
    Any complete checkpoint at or before `version` gives the same state, so an
    older hint is still correct, only slower.
    """
    lc = read_last_checkpoint(root)
    if lc is None or lc.version > version or lc.parts not in (None, 1) or version - lc.version > _HINT_MAX_COMMITS:
        return None
    d = log_dir(root)
    ckpt = d / checkpoint_file_name(lc.version)
    if not log_file_exists(ckpt):
        return None
    commits: list[tuple[int, Path]] = []
    for v in range(lc.version + 1, version + 1):
        p = d / commit_file_name(v)
        if not log_file_exists(p):
            return None
        commits.append((v, p))
    return LogSegment(root=root, version=version, checkpoint=CheckpointRef(lc.version, (ckpt,), "classic"), commits=tuple(commits))


def iter_commits(segment: LogSegment) -> Iterator[tuple[int, list[Action]]]:
    """(version, actions) for each commit of the segment, oldest first."""
    for v, p in segment.commits:
        yield v, read_commit(p)
