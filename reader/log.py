"""Listing and parsing a table's `_delta_log` through the storage edge: every read of the log is here.

The functions of the "reading files" section and `list_log` are the only ones
that touch the log; everything else in this project reads `_delta_log`
through them. (Writes are in `deltacoord.coordinator.delta_log.files`.)

A table is named by a location: a plain path, any URI `deltacoord.storage.table` accepts
(`file://`, `s3://`, `az://`, `abfss://`, `gs://`, ...), or a `TableStorage`
already built with its `storage_options`. Files in the log are `StoredObject`s
(storage + key); a local `pathlib.Path` is accepted wherever one is read.

The log holds 20-digit `<v>.json` commits, classic `<v>.checkpoint.parquet`
checkpoints, deprecated multi-part `<v>.checkpoint.<part>.<parts>.parquet`
checkpoints, UUID-named V2 checkpoints (`<v>.checkpoint.<uuid>.{json,parquet}`)
and `_last_checkpoint`. Everything else (`.crc` files, temporary files,
`_staged_commits/`, log compactions) is ignored by the listing.

Finding the newest version does not list the whole log where the protocol
allows: `_last_checkpoint` names a checkpoint, and a listing that starts at its
version (S3's StartAfter) finds it and every commit after it
(`list_log_from_hint`). Time travel to older versions lists everything.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import unquote, urlparse

from deltacoord.schemas.actions import (
    ARROW_LINES_MIN_BYTES,
    Action,
    ActionParseError,
    CommitInfo,
    Metadata,
    action_from_json,
    commit_lines,
    commit_piece_lines,
    decode_line,
)
from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.schemas.staged import lines_after_first_by_arrow
from deltacoord.storage.table import StoredObject, TableStorage, parse_table_uri, stored_object
from deltacoord.storage.uri import check_key

LOG_DIR_NAME = "_delta_log"
LAST_CHECKPOINT_NAME = "_last_checkpoint"
LAST_CHECKPOINT_KEY = f"{LOG_DIR_NAME}/{LAST_CHECKPOINT_NAME}"

#: `json.loads` without its per-call argument checks.
_DECODE = json.JSONDecoder().decode
_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CLASSIC_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID_CKPT_RE = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")

#: Action keys this project parses; any other top-level key in a commit line is
#: skipped (forward compatibility: readers ignore actions they do not need).
_KNOWN_ACTION_KEYS = frozenset({"add", "remove", "cdc", "metaData", "protocol", "txn", "domainMetadata", "commitInfo"})

#: A table's location: a path, a URI, or a `TableStorage` built with its options.
TableLocation: TypeAlias = "str | os.PathLike[str] | TableStorage"
#: A file of the log: a `StoredObject`, or a local path.
LogFile: TypeAlias = "StoredObject | os.PathLike[str] | str"


class TableNotFoundError(DeltaCoordError, FileNotFoundError):
    """No Delta table (no `_delta_log` with a commit or checkpoint) at the given root."""


class VersionNotFoundError(DeltaCoordError, ValueError):
    """The requested version or timestamp cannot be reconstructed from the log."""


class CorruptLogError(DeltaCoordError, ValueError):
    """The log is inconsistent: missing commits, unreadable files, bad actions."""


# --------------------------------------------------------------------------- locations


def table_storage(location: TableLocation, storage_options: Mapping[str, str] | None = None) -> TableStorage:
    """The `TableStorage` of a location (a `TableStorage` is returned as it is)."""
    if isinstance(location, TableStorage):
        return location
    return TableStorage(location, storage_options, fsync=False)


def table_root(table_uri: str | os.PathLike[str]) -> Path:
    """The local directory of a table given as a path or a `file://` URI (local tables only)."""
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


def commit_key(version: int) -> str:
    """The key of version `version`'s commit file, relative to the table root."""
    return f"{LOG_DIR_NAME}/{version:020d}.json"


def checkpoint_key(version: int) -> str:
    return f"{LOG_DIR_NAME}/{version:020d}.checkpoint.parquet"


def commit_path(root: Path, version: int) -> Path:
    """Where version `version`'s commit file is in a local table."""
    return log_dir(root) / commit_file_name(version)


def commit_object(location: TableLocation, version: int) -> StoredObject:
    """Version `version`'s commit file of any table."""
    return StoredObject(table_storage(location), commit_key(version))


def resolve_data_path(root: Path, path: str) -> Path:
    """The local file of an `add`/`remove` path (URI-encoded, relative or absolute)."""
    if "://" in path or path.startswith("file:"):
        return table_root(path)
    decoded = unquote(path)
    if decoded.startswith("/"):
        return Path(decoded)
    return root / decoded


def data_object(storage: TableStorage, path: str) -> StoredObject:
    """The object of an `add`/`remove`/DV path (URI-encoded, relative or absolute) of a table.

    Relative paths and absolute ones below the root are keys of `storage`; an absolute
    location elsewhere is reached with the same storage options.
    """
    if path.startswith("file:") and not path.startswith("file://"):
        uri = parse_table_uri(str(table_root(path)))
    elif "://" in path:
        uri = parse_table_uri(path)
    elif unquote(path).startswith("/"):
        uri = parse_table_uri(unquote(path))
    else:
        return StoredObject(storage, check_key(unquote(path)))
    key = storage.key_of(uri)
    if key is not None:
        return StoredObject(storage, key)
    parent, _, name = uri.path.rpartition("/")
    return StoredObject(storage.at(dataclasses.replace(uri, path=parent if uri.kind != "file" else parent or "/")), name)


# --------------------------------------------------------------------------- reading files


def read_log_file(ref: LogFile) -> bytes:
    """The bytes of one file of `_delta_log` (FileNotFoundError when absent)."""
    return stored_object(ref).read_bytes()


def log_file_exists(ref: LogFile) -> bool:
    return stored_object(ref).exists()


def log_file_names(location: TableLocation) -> list[str]:
    """Every name directly in `_delta_log`, sorted (temporary and unknown files included)."""
    return [k.rsplit("/", 1)[1] for k, _t in table_storage(location).list_keys(LOG_DIR_NAME)]


def file_mtime_ms(ref: LogFile) -> int:
    return stored_object(ref).mtime_ms()


# --------------------------------------------------------------------------- listing


def checkpoint_exists(location: TableLocation, version: int) -> bool:
    """Whether a complete checkpoint of `version` (classic, multi-part or V2) is in `_delta_log`."""
    storage = table_storage(location)
    if storage.exists(checkpoint_key(version)):
        return True
    return bool(list_log(storage, from_version=version).checkpoints.get(version))


def newest_commit_version(location: TableLocation) -> int:
    """The newest `<v>.json` in a table's `_delta_log`, or -1 when there is none.

    Lists from `_last_checkpoint`'s version on when that names an existing checkpoint.
    """
    try:
        v = list_log_from_hint(location).latest_commit_version
    except TableNotFoundError:
        return -1
    return -1 if v is None else v


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """One complete checkpoint of a version: a classic file, all parts of a multi-part one, or a V2 file."""

    version: int
    paths: tuple[StoredObject, ...]
    kind: str  # "classic" | "multipart" | "v2"

    @property
    def num_parts(self) -> int:
        return len(self.paths)


class CommitPaths(Mapping[int, str]):
    """Commit files by version, as keys (strings) relative to the table root.

    A log of many thousand commits is listed at every checkpoint, and callers
    mostly look at versions only; building an object per file dominated that.
    """

    __slots__ = ("_raw",)

    def __init__(self) -> None:
        self._raw: dict[int, str] = {}

    def __getitem__(self, version: int) -> str:
        return self._raw[version]

    def __contains__(self, version: object) -> bool:
        return version in self._raw

    def __iter__(self) -> Iterator[int]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def set(self, version: int, key: str) -> None:
        self._raw[version] = key


@dataclass(slots=True)
class LogListing:
    """What one listing of `_delta_log` found.

    `listed_from` is None for a listing of the whole log, else the version it
    started at (files of older versions are absent from it, not from the log).
    """

    storage: TableStorage
    commits: CommitPaths = field(default_factory=CommitPaths)
    checkpoints: dict[int, list[CheckpointRef]] = field(default_factory=dict)
    listed_from: int | None = None
    #: Modification times (ms) of listed keys, where the listing returned them (object stores).
    mtimes: dict[str, int] = field(default_factory=dict)

    @property
    def location(self) -> str:
        return self.storage.location

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

    def commit(self, version: int) -> StoredObject:
        """The listed commit file of `version` (KeyError when not listed)."""
        return StoredObject(self.storage, self.commits[version])

    def commit_mtime_ms(self, version: int) -> int:
        key = self.commits[version]
        known = self.mtimes.get(key)
        return known if known is not None else StoredObject(self.storage, key).mtime_ms()

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
    return min(refs, key=lambda r: (_KIND_ORDER[r.kind], [p.key for p in r.paths]))


def list_log(location: TableLocation, *, from_version: int | None = None,
             storage_options: Mapping[str, str] | None = None) -> LogListing:
    """List `_delta_log` once (from version `from_version` on, when given); incomplete multi-part
    checkpoints are left out. An empty listing of the whole log is `TableNotFoundError`."""
    storage = table_storage(location, storage_options)
    start_after = None if from_version is None else f"{LOG_DIR_NAME}/{from_version:020d}"
    try:
        entries = storage.list_keys(LOG_DIR_NAME, start_after=start_after)
    except NotADirectoryError:
        entries = []
    listing = LogListing(storage=storage, listed_from=from_version)
    if not entries and from_version is None:
        raise TableNotFoundError(f"no Delta table at {storage.location}: {LOG_DIR_NAME} is missing or empty")
    multipart: dict[tuple[int, int], dict[int, StoredObject]] = {}
    skip = len(LOG_DIR_NAME) + 1
    for key, mtime in entries:
        name = key[skip:]
        if name.startswith(".") or not name[:1].isdigit():
            continue
        m = _COMMIT_RE.match(name)
        if m:
            listing.commits.set(int(m.group(1)), key)
            if mtime is not None:
                listing.mtimes[key] = int(mtime.timestamp() * 1000)
            continue
        m = _CLASSIC_CKPT_RE.match(name)
        if m:
            v = int(m.group(1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, (StoredObject(storage, key),), "classic"))
            if mtime is not None:
                listing.mtimes[key] = int(mtime.timestamp() * 1000)
            continue
        m = _MULTIPART_CKPT_RE.match(name)
        if m:
            v, part, parts = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if 1 <= part <= parts:
                multipart.setdefault((v, parts), {})[part] = StoredObject(storage, key)
            continue
        m = _UUID_CKPT_RE.match(name)
        if m:
            v = int(m.group(1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, (StoredObject(storage, key),), "v2"))
    for (v, parts), found in multipart.items():
        if len(found) == parts:
            paths = tuple(found[i] for i in range(1, parts + 1))
            listing.checkpoints.setdefault(v, []).append(CheckpointRef(v, paths, "multipart"))
    return listing


def list_log_from_hint(location: TableLocation, *, storage_options: Mapping[str, str] | None = None,
                       at_most: int | None = None) -> LogListing:
    """A listing that starts at `_last_checkpoint`'s version, or of the whole log.

    The whole log is listed when the hint is missing or unreadable, newer than
    `at_most` (time travel to an older version), or names a checkpoint that the
    listing does not find (cleaned up, or a stale hint): a partial listing must
    hold a checkpoint to reconstruct anything.
    """
    storage = table_storage(location, storage_options)
    lc = read_last_checkpoint(storage)
    if lc is None or (at_most is not None and lc.version > at_most):
        return list_log(storage)
    listing = list_log(storage, from_version=lc.version)
    if not listing.checkpoints:
        return list_log(storage)
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


def read_last_checkpoint(location: TableLocation) -> LastCheckpoint | None:
    """`_last_checkpoint`, or None when absent or unreadable (it is only a hint)."""
    try:
        raw = table_storage(location).get(LAST_CHECKPOINT_KEY)
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

    Unlike `deltacoord.schemas.actions.parse_commit` this tolerates actions added to the
    protocol after this reader was written, as Delta readers must. A malformed
    known action is an error.
    """
    if isinstance(data, bytes) and (split := lines_after_first_by_arrow(data)) is not None:
        # a large commit: its lines after the first (a commitInfo) read by Arrow, which vouched for them
        head, rest = split
        return [a for _lineno, a in _line_actions(commit_lines(data[:head]), source)] + rest
    return [a for _lineno, a in iter_commit_actions(data, source=source)]


def iter_commit_actions(data: bytes | str, *, source: str = "<commit>") -> Iterator[tuple[int, Action]]:
    """(line number, action) of each action of a commit file, as `parse_commit_lines` reads them."""
    return _line_actions(commit_lines(data), source)


def stream_commit_actions(obj: StoredObject) -> Iterator[tuple[int, Action]]:
    """`iter_commit_actions` of a stored commit read a piece at a time: a version of a million files is never
    held as its bytes beside what is made of them. A large one (`ARROW_LINES_MIN_BYTES`) is read a block of lines
    at a time, each by Arrow when it vouches for it (`deltacoord.schemas.action_lines`), by the parser from the
    first block it does not."""
    source = str(obj)
    pieces = iter(obj.storage.read_pieces(obj.key))
    head: list[bytes] = []
    size = 0
    for piece in pieces:  # a small commit is read by the parser alone (Arrow is not imported for it)
        head.append(piece)
        size += len(piece)
        if size >= ARROW_LINES_MIN_BYTES:
            break
    else:
        yield from _line_actions(commit_piece_lines(head), source)
        return
    from deltacoord.schemas.action_lines import BLOCK_BYTES, LineParser, line_blocks

    blocks = line_blocks(itertools.chain(head, pieces), BLOCK_BYTES)
    first = next(blocks)
    cut = first.find(b"\n") + 1
    lineno = 0
    parser = LineParser()
    rest = first[cut:] if cut else first
    if cut:  # the first line (a published version's commitInfo) as the parser reads it
        yield from _line_actions(commit_lines(first[:cut]), source)
        lineno = 1
    for block in itertools.chain((rest,) if rest else (), blocks):
        actions = parser.parse(block) if cut else None
        if actions is None:
            yield from _line_actions(commit_piece_lines(itertools.chain((block,), blocks)), source, lineno + 1)
            return
        for a in actions:  # a block it vouches for holds one action a line, no blank line
            lineno += 1
            yield lineno, a


def _line_actions(lines: Iterable[str], source: str, first: int = 1) -> Iterator[tuple[int, Action]]:
    """(line number, action) of each known action of `lines`, the first of which is line `first` of `source`."""
    for lineno, line in enumerate(lines, first):
        if not line or line.isspace():
            continue
        try:
            obj = decode_line(line)  # one call per line of a commit of any size
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
        if isinstance(action, Metadata):
            check_schema_string(action, f"{source}: line {lineno}")
        if action is not None:
            yield lineno, action


def check_schema_string(metadata: Metadata, where: str) -> None:
    """Raise CorruptLogError (naming `where`) unless the metaData's schemaString is a JSON struct type.

    Readers parse the schema later and everywhere; a null, non-string or non-JSON one must fail
    here, where the log file and line are known, not as a TypeError far away.
    """
    raw: object = metadata.schema_string
    if not isinstance(raw, str):
        raise CorruptLogError(f"{where}: the metaData action's schemaString is {type(raw).__name__} {raw!r}, "
                              "not a JSON string of the table schema; the log is corrupt: restore this file from a "
                              "backup or rewrite the metaData with a valid schema")
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CorruptLogError(f"{where}: the metaData action's schemaString is not valid JSON ({e}); "
                              "the log is corrupt: restore this file or rewrite the metaData with a valid schema") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "struct" or not isinstance(parsed.get("fields"), list):
        raise CorruptLogError(f"{where}: the metaData action's schemaString is not a Delta struct type "
                              f"(an object with \"type\": \"struct\" and a \"fields\" list): {raw[:200]!r}")


def read_commit(ref: LogFile) -> list[Action]:
    """All actions of one `<v>.json` commit file."""
    obj = stored_object(ref)
    return parse_commit_lines(obj.read_bytes(), source=str(obj))


def read_commit_info(ref: LogFile) -> CommitInfo | None:
    """The commit's `commitInfo`, read without parsing its other actions.

    With in-commit timestamps the commitInfo is the first line, so a local file
    is usually read one line only (an object is fetched whole).
    """
    obj = stored_object(ref)
    if obj.storage.is_local:
        with open(obj.storage.local_path(obj.key), "rb") as f:
            return _commit_info_of(f, obj)
    return _commit_info_of(iter(obj.read_bytes().splitlines()), obj)


def _commit_info_of(lines: Iterable[bytes], obj: StoredObject) -> CommitInfo | None:
    for line in lines:
        if b'"commitInfo"' not in line:
            continue
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorruptLogError(f"{obj}: a line is not JSON: {e}") from e
        if isinstance(parsed, dict) and "commitInfo" in parsed and isinstance(parsed["commitInfo"], dict):
            return CommitInfo.from_json(parsed["commitInfo"])
    return None


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class LogSegment:
    """The files needed to reconstruct one version: a checkpoint (optional) and the commits after it."""

    storage: TableStorage
    version: int
    checkpoint: CheckpointRef | None
    commits: tuple[tuple[int, StoredObject], ...]


def log_segment(listing: LogListing, version: int | None = None, *, checkpoint: CheckpointRef | None = None,
                use_checkpoint: bool = True) -> LogSegment:
    """Pick the newest checkpoint <= version and the contiguous commits after it.

    `checkpoint` forces a specific checkpoint (used to fall back from an
    unreadable one); `use_checkpoint=False` replays JSON commits from version 0.
    """
    where = listing.location
    latest = listing.latest_version
    if latest is None:
        raise TableNotFoundError(f"no Delta table at {where}: {LOG_DIR_NAME} has no commits or checkpoints")
    target = latest if version is None else version
    if target < 0:
        raise VersionNotFoundError(f"invalid version {target}")
    if target > latest:
        raise VersionNotFoundError(f"version {target} does not exist: the latest version of {where} is {latest}")
    cp = checkpoint if checkpoint is not None else (listing.best_checkpoint(target) if use_checkpoint else None)
    start = 0 if cp is None else cp.version + 1
    commits: list[tuple[int, StoredObject]] = []
    for v in range(start, target + 1):
        p = listing.commits.get(v)
        if p is None:
            if cp is None and v == start:
                earliest = listing.earliest_commit_version
                raise VersionNotFoundError(
                    f"cannot reconstruct version {target} of {where}: no checkpoint at or before it and "
                    f"commit {v} is missing (earliest available commit: {earliest}, "
                    f"checkpoints: {sorted(listing.checkpoints)})"
                )
            raise CorruptLogError(f"cannot reconstruct version {target} of {where}: commit file {commit_file_name(v)} is missing")
        commits.append((v, StoredObject(listing.storage, p)))
    return LogSegment(storage=listing.storage, version=target, checkpoint=cp, commits=tuple(commits))


#: Beyond this many commits after the hinted checkpoint, one listing is cheaper than a stat each.
_HINT_MAX_COMMITS = 1000


def segment_from_last_checkpoint(location: TableLocation, version: int) -> LogSegment | None:
    """The segment for `version` found through `_last_checkpoint`, without listing the whole log.

    On a local filesystem it stats the hinted classic checkpoint and each commit
    after it; on an object store it lists from the hinted version on. None when the
    hint is absent, newer than `version`, multi-part, or leads to a missing
    file: the caller then lists the log (`list_log` + `log_segment`).
    Any complete checkpoint at or before `version` gives the same state, so an
    older hint is still correct, only slower.
    """
    storage = table_storage(location)
    lc = read_last_checkpoint(storage)
    if lc is None or lc.version > version or lc.parts not in (None, 1) or version - lc.version > _HINT_MAX_COMMITS:
        return None
    ckpt = StoredObject(storage, checkpoint_key(lc.version))
    ref = CheckpointRef(lc.version, (ckpt,), "classic")
    if not storage.is_local:
        listing = list_log(storage, from_version=lc.version)
        if ref not in listing.checkpoints.get(lc.version, []):
            return None
        try:
            return log_segment(listing, version, checkpoint=ref)
        except (VersionNotFoundError, CorruptLogError):
            return None
    if not ckpt.exists():
        return None
    commits: list[tuple[int, StoredObject]] = []
    for v in range(lc.version + 1, version + 1):
        key = commit_key(v)
        if not storage.exists(key):
            return None
        commits.append((v, StoredObject(storage, key)))
    return LogSegment(storage=storage, version=version, checkpoint=ref, commits=tuple(commits))


def iter_commits(segment: LogSegment) -> Iterator[tuple[int, list[Action]]]:
    """(version, actions) for each commit of the segment, oldest first."""
    for v, obj in segment.commits:
        yield v, read_commit(obj)
