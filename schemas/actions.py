"""Delta Lake log actions as typed dataclasses, and their exact JSON form.

The JSON form is the one PROTOCOL.md defines for `_delta_log/<version>.json`
(one action per line, camelCase keys). Serialisation is deterministic so that a
commit re-published from the commits topic is byte-identical to the first copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

PartitionValues = Mapping[str, "str | None"]
#: The partition values of every unpartitioned file read from JSON: one shared empty dict rather than one each
#: (64 bytes a file, 64 MB for a commit of a million). Never changed: `PartitionValues` is a read-only Mapping.
NO_PARTITION_VALUES: dict[str, str | None] = {}
#: `json.loads` without its per-call argument checks.
_DECODE = json.JSONDecoder().decode
#: The C scanner `_DECODE` runs: `_SCAN(line, 0)` is (the value, where it ends), without `decode`'s two whitespace
#: matches per call. A line it does not take whole (leading or trailing whitespace, not JSON) goes to `_DECODE`.
_SCAN: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009 - set in __init__, not in the stubs


#: The fields of a plain add and remove (as `_file_line` writes them), which `from_json` takes positionally.
_PLAIN_ADD_KEYS = frozenset({"path", "partitionValues", "size", "modificationTime", "dataChange", "stats"})
_PLAIN_REMOVE_KEYS = frozenset({"path", "deletionTimestamp", "dataChange", "extendedFileMetadata", "partitionValues",
                                "size", "stats"})


def _compact(d: dict[str, Any]) -> dict[str, Any]:
    """Drop optional keys whose value is None: Delta omits absent optionals."""
    return {k: v for k, v in d.items() if v is not None}


def _put_file_extras(body: dict[str, Any], stats: str | None, tags: Mapping[str, str] | None,
                     dv: DeletionVector | None, base_row_id: int | None, default_row_commit_version: int | None) -> None:
    """The optional fields `add` and `remove` share, added to `body` when present, in Delta's order (no dict of
    Nones to compact: a commit may hold a million of them)."""
    if stats is not None:
        body["stats"] = stats
    if tags is not None:
        body["tags"] = dict(tags)
    if dv is not None:
        body["deletionVector"] = dv.to_json()
    if base_row_id is not None:
        body["baseRowId"] = base_row_id
    if default_row_commit_version is not None:
        body["defaultRowCommitVersion"] = default_row_commit_version


@dataclass(frozen=True, slots=True)
class DeletionVector:
    """Descriptor of a deletion vector attached to a data file."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None
    max_row_index: int | None = None

    def unique_id(self) -> str:
        """Delta's DV unique id: storage type + path (+ '@offset')."""
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def fields(self) -> dict[str, Any]:
        """Every field by its Delta name, absent ones as None: the form of fixed schemas (Arrow, Avro)."""
        return {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
            "offset": self.offset,
            "sizeInBytes": self.size_in_bytes,
            "cardinality": self.cardinality,
            "maxRowIndex": self.max_row_index,
        }

    def to_json(self) -> dict[str, Any]:
        return _compact(self.fields())

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DeletionVector:
        return DeletionVector(
            storage_type=d["storageType"],
            path_or_inline_dv=d["pathOrInlineDv"],
            offset=d.get("offset"),
            size_in_bytes=d["sizeInBytes"],
            cardinality=d["cardinality"],
            max_row_index=d.get("maxRowIndex"),
        )


def _dv(d: Mapping[str, Any] | None) -> DeletionVector | None:
    return None if d is None else DeletionVector.from_json(d)


@dataclass(frozen=True, slots=True)
class AddFile:
    """`add`: a data file that becomes part of the table."""

    path: str
    partition_values: PartitionValues
    size: int
    modification_time: int
    data_change: bool
    stats: str | None = None
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None

    def num_records(self) -> int | None:
        """The file's physical row count from its stats (None when they give no integer)."""
        if not self.stats:
            return None
        try:
            n = json.loads(self.stats).get("numRecords")
        except (ValueError, AttributeError):
            return None
        return n if type(n) is int else None

    def key(self) -> tuple[str, str | None]:
        """Logical file key: (path, deletion vector unique id)."""
        return (self.path, self.deletion_vector.unique_id() if self.deletion_vector else None)

    def to_json(self) -> dict[str, Any]:
        # The optional keys are added when present (a commit of a million files: no dict of Nones to compact).
        body: dict[str, Any] = {"path": self.path, "partitionValues": dict(self.partition_values), "size": self.size,
                                "modificationTime": self.modification_time, "dataChange": self.data_change}
        if None in (self.path, self.size, self.modification_time, self.data_change):
            body = _compact(body)
        _put_file_extras(body, self.stats, self.tags, self.deletion_vector, self.base_row_id,
                         self.default_row_commit_version)
        if self.clustering_provider is not None:
            body["clusteringProvider"] = self.clustering_provider
        return {"add": body}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AddFile:
        pv = d.get("partitionValues")
        if d.keys() == _PLAIN_ADD_KEYS:  # most adds: the same fields, positionally (a million in a commit)
            return plain_add(d["path"], dict(pv) if pv else NO_PARTITION_VALUES, d["size"],  # type: ignore[no-any-return]
                              d["modificationTime"], d["dataChange"], d["stats"])
        return AddFile(
            path=d["path"],
            partition_values=dict(pv) if pv else NO_PARTITION_VALUES,
            size=d["size"],
            modification_time=d["modificationTime"],
            data_change=d["dataChange"],
            stats=d.get("stats"),
            tags=d.get("tags"),
            deletion_vector=_dv(d.get("deletionVector")),
            base_row_id=d.get("baseRowId"),
            default_row_commit_version=d.get("defaultRowCommitVersion"),
            clustering_provider=d.get("clusteringProvider"),
        )

    def to_remove(self, deletion_timestamp: int, data_change: bool = True) -> RemoveFile:
        """The `remove` that logically deletes this file (extended metadata kept)."""
        return RemoveFile(
            path=self.path,
            deletion_timestamp=deletion_timestamp,
            data_change=data_change,
            extended_file_metadata=True,
            partition_values=self.partition_values,
            size=self.size,
            stats=self.stats,
            tags=self.tags,
            deletion_vector=self.deletion_vector,
            base_row_id=self.base_row_id,
            default_row_commit_version=self.default_row_commit_version,
        )


@dataclass(frozen=True, slots=True)
class RemoveFile:
    """`remove`: a data file logically deleted from the table (a tombstone)."""

    path: str
    deletion_timestamp: int | None
    data_change: bool
    extended_file_metadata: bool | None = None
    partition_values: PartitionValues | None = None
    size: int | None = None
    stats: str | None = None
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    def key(self) -> tuple[str, str | None]:
        return (self.path, self.deletion_vector.unique_id() if self.deletion_vector else None)

    def to_json(self) -> dict[str, Any]:
        # As `AddFile.to_json`: the optional keys are added when present, in the same order.
        body: dict[str, Any] = {"path": self.path, "deletionTimestamp": self.deletion_timestamp,
                                "dataChange": self.data_change}
        if None in (self.path, self.deletion_timestamp, self.data_change):
            body = _compact(body)
        if self.extended_file_metadata is not None:
            body["extendedFileMetadata"] = self.extended_file_metadata
        if self.partition_values is not None:
            body["partitionValues"] = dict(self.partition_values)
        if self.size is not None:
            body["size"] = self.size
        _put_file_extras(body, self.stats, self.tags, self.deletion_vector, self.base_row_id,
                         self.default_row_commit_version)
        return {"remove": body}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RemoveFile:
        pv = d.get("partitionValues")
        if d.keys() == _PLAIN_REMOVE_KEYS:  # an overwrite's removes: the same fields, positionally
            return plain_remove(d["path"], d["deletionTimestamp"], d["dataChange"],  # type: ignore[no-any-return]
                                 d["extendedFileMetadata"],
                                 dict(pv) if pv else (None if pv is None else NO_PARTITION_VALUES), d["size"],
                                 d["stats"])
        return RemoveFile(
            path=d["path"],
            deletion_timestamp=d.get("deletionTimestamp"),
            data_change=d["dataChange"],
            extended_file_metadata=d.get("extendedFileMetadata"),
            partition_values=dict(pv) if pv else (None if pv is None else NO_PARTITION_VALUES),
            size=d.get("size"),
            stats=d.get("stats"),
            tags=d.get("tags"),
            deletion_vector=_dv(d.get("deletionVector")),
            base_row_id=d.get("baseRowId"),
            default_row_commit_version=d.get("defaultRowCommitVersion"),
        )


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    """`cdc`: a change-data file; never part of a snapshot."""

    path: str
    partition_values: PartitionValues
    size: int
    data_change: bool = False
    tags: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "cdc": _compact(
                {
                    "path": self.path,
                    "partitionValues": dict(self.partition_values),
                    "size": self.size,
                    "dataChange": self.data_change,
                    "tags": None if self.tags is None else dict(self.tags),
                }
            )
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AddCDCFile:
        return AddCDCFile(
            path=d["path"],
            partition_values=dict(d.get("partitionValues") or {}),
            size=d["size"],
            data_change=d.get("dataChange", False),
            tags=d.get("tags"),
        )


@dataclass(frozen=True, slots=True)
class Metadata:
    """`metaData`: schema, partitioning and table properties."""

    id: str
    schema_string: str
    partition_columns: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    description: str | None = None
    format_provider: str = "parquet"
    format_options: Mapping[str, str] = field(default_factory=dict)
    created_time: int | None = None

    def schema(self) -> dict[str, Any]:
        """The table schema as Delta's JSON struct type."""
        parsed: dict[str, Any] = json.loads(self.schema_string)
        return parsed

    def to_json(self) -> dict[str, Any]:
        return {
            "metaData": _compact(
                {
                    "id": self.id,
                    "name": self.name,
                    "description": self.description,
                    "format": {"provider": self.format_provider, "options": dict(self.format_options)},
                    "schemaString": self.schema_string,
                    "partitionColumns": list(self.partition_columns),
                    "configuration": dict(self.configuration),
                    "createdTime": self.created_time,
                }
            )
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Metadata:
        fmt = d.get("format") or {}
        return Metadata(
            id=d["id"],
            name=d.get("name"),
            description=d.get("description"),
            format_provider=fmt.get("provider", "parquet"),
            format_options=dict(fmt.get("options") or {}),
            schema_string=d["schemaString"],
            partition_columns=tuple(d.get("partitionColumns") or ()),
            configuration=dict(d.get("configuration") or {}),
            created_time=d.get("createdTime"),
        )


@dataclass(frozen=True, slots=True)
class Protocol:
    """`protocol`: reader/writer versions and table features."""

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": _compact(
                {
                    "minReaderVersion": self.min_reader_version,
                    "minWriterVersion": self.min_writer_version,
                    "readerFeatures": None if self.reader_features is None else list(self.reader_features),
                    "writerFeatures": None if self.writer_features is None else list(self.writer_features),
                }
            )
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Protocol:
        rf = d.get("readerFeatures")
        wf = d.get("writerFeatures")
        return Protocol(
            min_reader_version=d["minReaderVersion"],
            min_writer_version=d["minWriterVersion"],
            reader_features=None if rf is None else tuple(rf),
            writer_features=None if wf is None else tuple(wf),
        )


@dataclass(frozen=True, slots=True)
class SetTransaction:
    """`txn`: the latest version an application (appId) committed."""

    app_id: str
    version: int
    last_updated: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"txn": _compact({"appId": self.app_id, "version": self.version, "lastUpdated": self.last_updated})}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SetTransaction:
        return SetTransaction(app_id=d["appId"], version=d["version"], last_updated=d.get("lastUpdated"))


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    """`domainMetadata`: named configuration; `removed` is a tombstone."""

    domain: str
    configuration: str
    removed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"domainMetadata": {"domain": self.domain, "configuration": self.configuration, "removed": self.removed}}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DomainMetadata:
        return DomainMetadata(domain=d["domain"], configuration=d.get("configuration", ""), removed=d.get("removed", False))


#: The commitInfo key listing the commits coalesced into one version, each its own commitInfo.
COALESCED_KEY = "coalescedCommits"


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """`commitInfo`: free-form provenance; a few keys matter to conflict checks.

    `values` holds the JSON object as written (key order preserved), so fields
    written by other engines survive a round trip.
    """

    values: Mapping[str, Any]

    @property
    def operation(self) -> str | None:
        op = self.values.get("operation")
        return op if isinstance(op, str) else None

    @property
    def txn_id(self) -> str | None:
        t = self.values.get("txnId")
        return t if isinstance(t, str) else None

    @property
    def txn_ids(self) -> tuple[str, ...]:
        """The proposal ids this commit records: its txnId, then those of the commits coalesced into its version
        (`coalescedCommits`, see `deltacoord.coordinator.rules.coalesce`)."""
        ids = [] if self.txn_id is None else [self.txn_id]
        parts = self.values.get(COALESCED_KEY)
        if isinstance(parts, list):
            for part in parts:
                t = part.get("txnId") if isinstance(part, Mapping) else None
                if isinstance(t, str) and t not in ids:
                    ids.append(t)
        return tuple(ids)

    @property
    def is_blind_append(self) -> bool:
        """A missing flag means not blind, as Delta Spark reads it."""
        return self.values.get("isBlindAppend") is True

    @property
    def in_commit_timestamp(self) -> int | None:
        t = self.values.get("inCommitTimestamp")
        return t if isinstance(t, int) else None

    @property
    def timestamp(self) -> int | None:
        t = self.values.get("timestamp")
        return t if isinstance(t, int) else None

    def with_values(self, **updates: Any) -> CommitInfo:
        """A copy with keys set (None removes a key)."""
        merged = dict(self.values)
        for k, v in updates.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        return CommitInfo(merged)

    def to_json(self) -> dict[str, Any]:
        return {"commitInfo": dict(self.values)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CommitInfo:
        return CommitInfo(dict(d))


def _slot_maker(cls: type, given: int) -> Any:
    """A constructor of the frozen, slotted dataclass `cls` from its first `given` fields, positionally (the others
    take their defaults), that sets each slot through its descriptor. The dataclass's own `__init__` goes through
    `object.__setattr__` per field, about half of what parsing a plain commit line cost; the object is the same
    (`tests/unit/test_actions.py`). Only for classes without `__post_init__` whose other fields have plain defaults."""
    fs = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(f.default is dataclasses.MISSING for f in fs[given:]):
        raise TypeError(f"{cls.__name__} needs its own __init__: it has a __post_init__ or a field without a plain default")
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    body = []
    for i, f in enumerate(fs):
        ns[f"_s{i}"] = cls.__dict__[f.name].__set__
        if i >= given:
            ns[f"_d{i}"] = f.default
        body.append(f"    _s{i}(o, {'v' if i < given else '_d'}{i})")
    args = ", ".join(f"v{i}" for i in range(given))
    exec(f"def make({args}):\n    o = _new(_cls)\n" + "\n".join(body) + "\n    return o", ns)
    return ns["make"]


#: A plain add and remove as `from_json` reads them (the fields of `_PLAIN_ADD_KEYS`, `_PLAIN_REMOVE_KEYS`), also
#: built column-wise by `deltacoord.schemas.action_lines`.
plain_add = _slot_maker(AddFile, 6)
plain_remove = _slot_maker(RemoveFile, 7)


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many acyclic objects.

    Building 100k AddFiles (with their dicts) set off generation-2 collections
    that traversed every object built so far: a third of the time. Actions hold
    no reference cycles, so nothing is left for the collector to find later.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


Action: TypeAlias = AddFile | RemoveFile | AddCDCFile | Metadata | Protocol | SetTransaction | DomainMetadata | CommitInfo
FileAction: TypeAlias = AddFile | RemoveFile | AddCDCFile

_PARSERS: dict[str, Any] = {
    "add": AddFile.from_json,
    "remove": RemoveFile.from_json,
    "cdc": AddCDCFile.from_json,
    "metaData": Metadata.from_json,
    "protocol": Protocol.from_json,
    "txn": SetTransaction.from_json,
    "domainMetadata": DomainMetadata.from_json,
    "commitInfo": CommitInfo.from_json,
}

#: Action keys that may appear in a log but carry nothing a snapshot needs.
IGNORED_ACTION_KEYS = frozenset({"checkpointMetadata", "sidecar"})


class ActionParseError(ValueError):
    """A log line is not a Delta action this project understands."""


def action_from_json(d: Mapping[str, Any]) -> Action | None:
    """Parse one JSON action object; None for actions a snapshot ignores."""
    if len(d) != 1:
        raise ActionParseError(f"an action line must have exactly one key, got {sorted(d)}")
    (key, body), = d.items()
    parser = _PARSERS.get(key)
    if parser is None:
        if key in IGNORED_ACTION_KEYS:
            return None
        raise ActionParseError(f"unknown action {key!r}")
    try:
        return parser(body)  # type: ignore[no-any-return]
    except (KeyError, TypeError, AttributeError) as e:
        raise ActionParseError(f"malformed {key!r} action: missing or bad field {e}") from e


#: One encoder for every line: `json.dumps` with separators builds a new encoder per call.
_LINE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
#: Lines encoded together before their bytes join the file: a commit of a million actions never holds its
#: text as lines, one string and bytes at once (three copies), only the bytes and one chunk.
_CHUNK_LINES = 4096


#: The JSON of one string as `_LINE` writes it (the C encoder's, `ensure_ascii=False`).
_STRING: Any = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring
_BOOL = {True: "true", False: "false"}
#: The two for modules that write action lines without the action objects (`deltacoord.schemas.remove_lines`).
json_text = _LINE
json_string_text = _STRING


def _file_line(a: Action) -> str | None:
    """`_LINE(a.to_json())` of a plain add or remove (exact built-in types; no tags, deletion vector, row ids or
    clustering), written field by field without a dict per action: a commit of a million files is encoded
    several times over (staged by its writer, staged and published by the coordinator). None: not such a one."""
    t = type(a)
    if t is AddFile:
        assert isinstance(a, AddFile)
        stats = a.stats
        if not (type(a.path) is str and type(a.size) is int and type(a.modification_time) is int
                and type(a.data_change) is bool and (stats is None or type(stats) is str) and a.tags is None
                and a.deletion_vector is None and a.base_row_id is None and a.default_row_commit_version is None
                and a.clustering_provider is None):
            return None
        pv = a.partition_values
        tail = "}}" if stats is None else f',"stats":{_STRING(stats)}}}}}'
        return (f'{{"add":{{"path":{_STRING(a.path)},"partitionValues":{_LINE(dict(pv)) if pv else "{}"},'
                f'"size":{int.__repr__(a.size)},"modificationTime":{int.__repr__(a.modification_time)},'
                f'"dataChange":{_BOOL[a.data_change]}{tail}')
    if t is RemoveFile:
        assert isinstance(a, RemoveFile)
        stats, ext, values, size = a.stats, a.extended_file_metadata, a.partition_values, a.size
        if not (type(a.path) is str and type(a.deletion_timestamp) is int and type(a.data_change) is bool
                and (ext is None or type(ext) is bool) and (size is None or type(size) is int)
                and (stats is None or type(stats) is str) and a.tags is None and a.deletion_vector is None
                and a.base_row_id is None and a.default_row_commit_version is None):
            return None
        if ext is not None and values is not None and size is not None and stats is not None:  # an overwrite's: one string
            return (f'{{"remove":{{"path":{_STRING(a.path)},"deletionTimestamp":{int.__repr__(a.deletion_timestamp)},'
                    f'"dataChange":{_BOOL[a.data_change]},"extendedFileMetadata":{_BOOL[ext]},'
                    f'"partitionValues":{_LINE(dict(values)) if values else "{}"},"size":{int.__repr__(size)},'
                    f'"stats":{_STRING(stats)}}}}}')
        parts = [f'{{"remove":{{"path":{_STRING(a.path)},"deletionTimestamp":{int.__repr__(a.deletion_timestamp)},'
                 f'"dataChange":{_BOOL[a.data_change]}']
        if ext is not None:
            parts.append(f',"extendedFileMetadata":{_BOOL[ext]}')
        if values is not None:
            parts.append(f',"partitionValues":{_LINE(dict(values)) if values else "{}"}')
        if size is not None:
            parts.append(f',"size":{int.__repr__(size)}')
        if stats is not None:
            parts.append(f',"stats":{_STRING(stats)}')
        parts.append("}}")
        return "".join(parts)
    return None


def iter_json_lines(actions: Iterable[Action]) -> Iterator[bytes]:
    """A commit file's bytes in chunks of newline-terminated lines (`commit_to_json_lines` is their join)."""
    chunk: list[str] = []
    for a in actions:
        line = _file_line(a)
        chunk.append(_LINE(a.to_json()) if line is None else line)
        if len(chunk) == _CHUNK_LINES:
            chunk.append("")
            yield "\n".join(chunk).encode("utf-8")
            chunk = []
    if chunk:
        chunk.append("")
        yield "\n".join(chunk).encode("utf-8")


def commit_to_json_lines(actions: Iterable[Action]) -> bytes:
    """Serialise a commit file: one compact JSON object per line, newline-terminated."""
    out = io.BytesIO()
    for part in iter_json_lines(actions):
        out.write(part)
    return out.getvalue()


def json_lines(text: str) -> list[str]:
    """The lines of newline-delimited JSON.

    Split on "\n" only: `str.splitlines` also splits on U+0085, U+2028 and
    U+2029, which a JSON string may hold unescaped (our own commits write
    non-ASCII raw), so it would cut such a path in two. A trailing "\r" is
    whitespace to the JSON parser.
    """
    return text.split("\n")


#: Bytes of a commit file decoded at a time by `parse_commit`: a large file is never held as one string.
_PARSE_CHUNK_BYTES = 1 << 20
#: From this size on (about 3,000 files), the plain file lines of a commit are read by Arrow first
#: (`deltacoord.schemas.action_lines`). Arrow is imported then (about 30 MB of the coordinator's deciding process,
#: which holds it only once it has loaded a commit this large): below, its first import costs more than it saves.
ARROW_LINES_MIN_BYTES = 1 << 20


def commit_lines(data: bytes | str) -> Iterator[str]:
    """The lines of a commit file (`json_lines`, less the empty one after its last newline), decoded a piece at a
    time: a large file is never held as one string and a list of its lines beside its bytes."""
    if isinstance(data, str):
        lines = json_lines(data)
        if data.endswith("\n"):
            lines.pop()
        yield from lines
        return
    view = memoryview(data)
    start, n = 0, len(data)
    while start < n:
        # A piece ends at a newline: one byte of a UTF-8 character is never a newline, so no character is cut.
        end = data.find(b"\n", min(start + _PARSE_CHUNK_BYTES, n) - 1)
        end = n if end < 0 else end + 1
        lines = json_lines(str(view[start:end], "utf-8"))
        if end > start and data[end - 1] == 0x0A:
            lines.pop()  # the piece's last newline ends its last line, it starts none
        yield from lines
        start = end


def parse_commit(data: bytes | str) -> list[Action]:
    """Parse a commit file's lines into actions (blank lines ignored)."""
    return list(_parse_lines(commit_lines(data)))


def decode_line(line: str) -> Any:
    """`json.loads` of one commit line (json.JSONDecodeError when it is not JSON): the scanner's value when it
    takes the line whole, else the decoder's, which says why it cannot."""
    try:
        obj, end = _SCAN(line, 0)
    except (StopIteration, ValueError):  # the decoder says why, with the error's own words
        end = -1
    return obj if end == len(line) else _DECODE(line)


#: Distinct partition values shared by one parse (`_parse_lines`); beyond them each file keeps its own.
SHARED_PARTITION_VALUES = 65_536


def _parse_lines(lines: Iterable[str]) -> Iterator[Action]:
    # Files of one partition share one partition-values dict (a commit's files lie in few partitions): a dict, its
    # keys and values each are about 300 bytes a file, 300 MB for a million. Only equal dicts in the same key order
    # are shared, so each file's line is written back the same; `PartitionValues` is a read-only Mapping.
    shared: dict[tuple[tuple[str, Any], ...], PartitionValues] = {}
    for lineno, line in enumerate(lines, 1):
        if not line or line.isspace():
            continue
        try:
            obj = decode_line(line)
        except json.JSONDecodeError as e:
            raise ActionParseError(f"line {lineno} is not JSON: {e}") from e
        action = action_from_json(obj)
        if action is None:
            continue
        if type(action) is AddFile or type(action) is RemoveFile:
            pv = action.partition_values
            if pv:
                try:
                    one = shared.get(key := tuple(pv.items()))
                except TypeError:  # a value that is not hashable (validation refuses it): kept as it is
                    one = pv
                if one is None:
                    if len(shared) < SHARED_PARTITION_VALUES:
                        shared[key] = pv
                elif one is not pv:
                    object.__setattr__(action, "partition_values", one)
        yield action


def commit_piece_lines(pieces: Iterable[bytes]) -> Iterator[str]:
    """`commit_lines` of a file given as pieces cut anywhere (as a stream reads it): a line may span pieces."""
    pending: list[bytes] = []  # a line's start, joined once its newline comes (a long line is not copied per piece)
    for piece in pieces:
        cut = piece.rfind(b"\n") + 1
        if not cut:
            pending.append(piece)
            continue
        head = b"".join((*pending, piece[:cut])) if pending else piece[:cut]
        pending = [piece[cut:]] if cut < len(piece) else []
        yield from commit_lines(head)
    if pending:
        yield from commit_lines(b"".join(pending))


def parse_commit_pieces(pieces: Iterable[bytes]) -> Iterator[Action]:
    """`parse_commit` of a file read a piece at a time: only one piece and the actions are held, never the file."""
    return _parse_lines(commit_piece_lines(pieces))
