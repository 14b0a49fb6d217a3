"""Avro wire codec for commit proposals and decisions (single-object encoding).

Every message on the proposals and commits topics is one Avro datum in the
Avro *single-object encoding*::

    C3 01 | CRC-64-AVRO fingerprint (8 bytes, little-endian) | Avro binary body

The fingerprint is fastavro's ``fingerprint(to_parsing_canonical_form(schema),
"CRC-64-AVRO")`` of the writer's schema, so a reader knows exactly which
schema wrote the body. The schemas live in ``schemas/avro/``, one named type
per ``<full name>.avsc`` file, and are documented there field by field. They
are loaded in dependency order once, at import.

Decoding looks the fingerprint up in a small registry of known writer schemas:
the current ones, plus older (or otherwise different) versions registered with
:func:`register_writer_schema`. A message from an older writer is read through
Avro schema resolution against the current reader schema, so fields it lacks
take their defaults. Each registered schema is checked against the reader when
it is registered; a message from a writer schema the reader cannot resolve
(a required field missing, a field of an incompatible type) is rejected with
a message that names the field.

Everything that goes wrong while decoding raises
:class:`deltacoord.schemas.errors.DecodeError` with a message naming the problem (bad
marker, too short, unknown fingerprint, truncated or garbage body and where,
unresolvable writer schema, trailing bytes, a decoded value that is not a valid
action or message); nothing from fastavro, ``struct``, ``json`` or the codecs
escapes. Encoding validates the message against the schema and raises
:class:`EncodeError` (a ``ValueError``) instead of letting fastavro silently
coerce a wrongly typed value (it would write ``5.5`` as ``5``).

Corruption is caught as far as Avro allows, not completely: the format has no
checksum (Kafka's record-batch CRC covers transport), and fastavro's fast path
accepts a few malformed encodings (a negative union or enum index, a boolean
byte other than 0/1), so some bit flips decode to a different valid message.
When fastavro does fail, a strict walker re-reads the body to say where.

Performance: the coordinator decodes every proposal, so the decode path does
only a dictionary lookup of the fingerprint, one ``schemaless_reader`` call on
the pre-parsed schema and direct construction of the dataclasses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Final, Literal, NoReturn

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, load_schema_ordered, parse_schema, to_parsing_canonical_form
from fastavro.validation import validate

from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.errors import DecodeError, EncodeError
from deltacoord.schemas.messages import Decision, FileRead, MultiTable, Outcome, Proposal, StagedActions

__all__ = [
    "DECISION_FINGERPRINT",
    "DECISION_SCHEMA",
    "HEADER_SIZE",
    "NAMESPACE",
    "PROPOSAL_FINGERPRINT",
    "PROPOSAL_SCHEMA",
    "SINGLE_OBJECT_MARKER",
    "EncodeError",
    "MessageName",
    "WriterSchema",
    "decode_decision",
    "decode_proposal",
    "encode_decision",
    "encode_proposal",
    "known_writer_schemas",
    "load_message_schema",
    "register_writer_schema",
    "schema_fingerprint",
    "unregister_writer_schema",
]

Record = dict[str, Any]
MessageName = Literal["CommitProposal", "CommitDecision"]


#: Avro single-object encoding marker (format version 1).
SINGLE_OBJECT_MARKER: Final = b"\xc3\x01"
#: Marker plus the 8-byte fingerprint.
HEADER_SIZE: Final = 10
NAMESPACE: Final = "io.deltacoord.v1"
_AVRO_DIR: Final = Path(__file__).resolve().with_name("avro")

# Dependency order: every file only references names defined by files before it.
_ACTION_TYPES: Final = (
    "DeletionVectorDescriptor",
    "AddFile",
    "RemoveFile",
    "AddCDCFile",
    "Metadata",
    "Protocol",
    "SetTransaction",
    "DomainMetadata",
    "CommitInfo",
    "Action",
)
_SCHEMA_FILES: Final[dict[str, tuple[str, ...]]] = {
    "CommitProposal": (*_ACTION_TYPES, "FileRead", "StagedActions", "MultiTableTransaction", "CommitProposal"),
    "CommitDecision": (*_ACTION_TYPES, "Outcome", "StagedActions", "CommitDecision"),
}


def load_message_schema(message: MessageName) -> Any:
    """The parsed, self-contained schema of a message, loaded from ``schemas/avro``."""
    files = [str(_AVRO_DIR / f"{NAMESPACE}.{name}.avsc") for name in _SCHEMA_FILES[message]]
    return load_schema_ordered(files)


def schema_fingerprint(schema: Any) -> bytes:
    """The 8 fingerprint bytes of a schema as they appear on the wire (CRC-64-AVRO, little-endian)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


PROPOSAL_SCHEMA: Final = load_message_schema("CommitProposal")
DECISION_SCHEMA: Final = load_message_schema("CommitDecision")
PROPOSAL_FINGERPRINT: Final = schema_fingerprint(PROPOSAL_SCHEMA)
DECISION_FINGERPRINT: Final = schema_fingerprint(DECISION_SCHEMA)
_READERS: Final[dict[str, Any]] = {"CommitProposal": PROPOSAL_SCHEMA, "CommitDecision": DECISION_SCHEMA}
_CURRENT: Final[dict[str, bytes]] = {"CommitProposal": PROPOSAL_FINGERPRINT, "CommitDecision": DECISION_FINGERPRINT}


# ---------------------------------------------------------------------------
# Registry of known writer schemas
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A writer schema this process can recognise by fingerprint."""

    message: MessageName
    fingerprint: bytes
    canonical_form: str
    #: The parsed writer schema.
    parsed: Any
    #: The reader schema to resolve against; None when the writer schema is the current one.
    reader: Any
    #: Why messages written with this schema cannot be read, or None when they can.
    incompatibility: str | None
    #: Union branches / enum symbols of the writer the reader cannot read, by (schema path, index).
    unreadable: Mapping[tuple[str, int], str]


_REGISTRY: dict[bytes, WriterSchema] = {}


def _add_current(message: MessageName) -> None:
    schema = _READERS[message]
    fp = _CURRENT[message]
    _REGISTRY[fp] = WriterSchema(message, fp, to_parsing_canonical_form(schema), schema, None, None, {})


_add_current("CommitProposal")
_add_current("CommitDecision")


def register_writer_schema(message: MessageName, schema: Mapping[str, Any] | str) -> bytes:
    """Make messages written with `schema` (an older or other version of `message`) decodable.

    `schema` is a self-contained schema (dict or JSON text). It is checked
    against the current reader schema now; if Avro schema resolution cannot
    work (a reader field without default missing from it, a field whose type
    cannot be promoted), it is still registered, and decoding its messages
    raises a DecodeError that says which field is the problem. Returns the
    fingerprint. Registering a current schema is a no-op.
    """
    if message not in _READERS:
        raise ValueError(f"unknown message {message!r}; expected one of {sorted(_READERS)}")
    raw = json.loads(schema) if isinstance(schema, str) else dict(schema)
    parsed = parse_schema(raw, named_schemas={})
    fp = schema_fingerprint(parsed)
    existing = _REGISTRY.get(fp)
    if existing is not None:
        if existing.message != message:
            raise ValueError(f"schema {fp.hex()} is already registered for {existing.message}")
        return fp
    reader = _READERS[message]
    problem, unreadable = _resolution_problem(parsed, reader)
    _REGISTRY[fp] = WriterSchema(message, fp, to_parsing_canonical_form(parsed), parsed, reader, problem, unreadable)
    return fp


def unregister_writer_schema(fp: bytes) -> None:
    """Forget a registered writer schema (the current schemas cannot be removed)."""
    if fp in _CURRENT.values():
        raise ValueError(f"{fp.hex()} is a current schema and cannot be unregistered")
    _REGISTRY.pop(fp, None)


def known_writer_schemas() -> dict[bytes, WriterSchema]:
    """A snapshot of the registry, by fingerprint."""
    return dict(_REGISTRY)


# ---------------------------------------------------------------------------
# Static schema resolution check (Avro spec, "Schema Resolution")
# ---------------------------------------------------------------------------

_PROMOTIONS: Final = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)
_NAMED: Final = frozenset({"record", "error", "enum", "fixed"})


def _named_types(schema: Any) -> dict[str, Any]:
    named = schema.get("__named_schemas") if isinstance(schema, dict) else None
    return dict(named) if named else {}


def _deref(schema: Any, named: Mapping[str, Any]) -> Any:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, dict) and schema.get("type") in named and len(schema) == 1:
        return named[schema["type"]]
    return schema


def _type_of(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        t = schema["type"]
        return t if isinstance(t, str) else _type_of(t)
    return str(schema)


def _describe(schema: Any) -> str:
    t = _type_of(schema)
    if t in _NAMED:
        return f"{t} {schema['name'].rsplit('.', 1)[-1]}"
    if t == "union":
        return "[" + ", ".join(_describe(s) for s in schema) + "]"
    if t == "array":
        return f"array<{_describe(schema['items'])}>"
    if t == "map":
        return f"map<{_describe(schema['values'])}>"
    return t


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _names_match(w: Any, r: Any) -> bool:
    wn = w["name"]
    return bool(wn == r["name"] or wn in r.get("aliases", ()) or _short(wn) == _short(r["name"]))


def _matches(w: Any, r: Any) -> bool:
    """Avro's shallow 'schemas match' test used to pick a reader union branch."""
    wt, rt = _type_of(w), _type_of(r)
    if wt in _NAMED or rt in _NAMED:
        return wt == rt and _names_match(w, r)
    return wt == rt or (wt, rt) in _PROMOTIONS


def _branch_path(path: str, branch: Any) -> str:
    return f"{path}<{_short(branch['name'])}>" if _type_of(branch) in _NAMED else path


#: (schema path of a writer union or enum, branch/symbol index) -> why the reader cannot read it.
Unreadable = dict[tuple[str, int], str]


def _resolution_problem(writer: Any, reader: Any) -> tuple[str | None, Unreadable]:
    """Why data written with `writer` can never be read as `reader` (or None), plus data-dependent gaps.

    A reader field without default that the writer lacks, or a field whose
    writer type cannot be promoted to the reader type, is a static problem. A
    writer union branch or enum symbol the reader has no counterpart for only
    fails for messages that use it (a newer writer's new action type): those
    are returned by schema path so decoding can name them.
    """
    wn, rn = _named_types(writer), _named_types(reader)
    seen: set[tuple[str, str]] = set()
    unreadable: Unreadable = {}

    def check(w: Any, r: Any, path: str) -> str | None:
        w, r = _deref(w, wn), _deref(r, rn)
        wt, rt = _type_of(w), _type_of(r)
        if wt == "union":
            readable = False
            for i, wb in enumerate(w):
                wb = _deref(wb, wn)
                candidates = [_deref(rb, rn) for rb in r] if rt == "union" else [r]
                rb = next((c for c in candidates if _matches(wb, c)), None)
                if rb is None:
                    unreadable[(path, i)] = (
                        f"the writer's union branch {_describe(wb)} has no counterpart in the reader's union "
                        "(written by a newer writer?)"
                    )
                    continue
                problem = check(wb, rb, _branch_path(path, rb))
                if problem is not None:
                    return problem
                readable = True
            if readable:
                return None
            return f"{path}: no branch of the writer's {_describe(w)} can be read as {_describe(r)}"
        if rt == "union":
            rb = next((c for c in (_deref(x, rn) for x in r) if _matches(w, c)), None)
            if rb is None:
                return f"{path}: wrong type: the writer has {_describe(w)}, which matches no branch of the reader's {_describe(r)}"
            return check(w, rb, _branch_path(path, rb))
        if not _matches(w, r):
            return f"{path}: wrong type: the writer has {_describe(w)}, the reader needs {_describe(r)}"
        if rt in ("record", "error"):
            key = (w["name"], r["name"])
            if key in seen:
                return None
            seen.add(key)
            w_fields = {f["name"]: f for f in w["fields"]}
            for rf in r["fields"]:
                fpath = f"{path}.{rf['name']}"
                wf = w_fields.get(rf["name"])
                if wf is None:
                    wf = next((w_fields[a] for a in rf.get("aliases", ()) if a in w_fields), None)
                if wf is None:
                    if "default" not in rf:
                        return f"{fpath}: required field ({_describe(rf['type'])}, no default) is missing from the writer schema"
                    continue
                problem = check(wf["type"], rf["type"], fpath)
                if problem is not None:
                    return problem
            return None
        if rt == "enum" and "default" not in r:
            for i, symbol in enumerate(w["symbols"]):
                if symbol not in r["symbols"]:
                    unreadable[(path, i)] = f"the writer's enum symbol {symbol!r} is unknown to the reader"
        if rt == "array":
            return check(w["items"], r["items"], f"{path}[]")
        if rt == "map":
            return check(w["values"], r["values"], f"{path}{{}}")
        if rt == "fixed" and w["size"] != r["size"]:
            return f"{path}: fixed size {w['size']} cannot be read as size {r['size']}"
        return None

    root = _deref(reader, rn)
    problem = check(writer, reader, _short(root["name"]) if _type_of(root) in _NAMED else "message")
    return problem, unreadable


# ---------------------------------------------------------------------------
# Error diagnosis: walk the body by hand (error path only) to say where it breaks
# ---------------------------------------------------------------------------


class _BodyError(Exception):
    pass


#: fastavro's own messages can embed whole schemas; keep what we pass on short.
_MAX_DETAIL: Final = 300
#: A larger array/map block count than fits in the rest of the message is called garbage, not truncation.
_PLAUSIBLE_BLOCK: Final = 1 << 16


class _BodyWalker:
    """A strict Avro binary walker over the writer schema that reports the first bad spot.

    `path` names the datum (with array indexes), `spath` the schema position
    (as _resolution_problem names it) to look up branches the reader lacks.
    """

    def __init__(
        self, data: bytes, pos: int, named: Mapping[str, Any], unreadable: Mapping[tuple[str, int], str]
    ) -> None:
        self.data = data
        self.pos = pos
        self.named = named
        self.unreadable = unreadable

    def fail(self, what: str, path: str) -> NoReturn:
        raise _BodyError(f"{what} at offset {self.pos} while reading {path}")

    def take(self, n: int, path: str, what: str) -> bytes:
        left = len(self.data) - self.pos
        if n > left:
            self.fail(f"truncated: {what} needs {n} byte(s), only {left} left", path)
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def varint(self, path: str, what: str) -> int:
        start = self.pos
        shift = acc = 0
        while True:
            if self.pos >= len(self.data):
                self.pos = start
                self.fail(f"truncated: the {what} (a varint) runs past the end", path)
            b = self.data[self.pos]
            self.pos += 1
            acc |= (b & 0x7F) << shift
            if not b & 0x80:
                return (acc >> 1) ^ -(acc & 1)
            shift += 7
            if shift >= 70:
                self.pos = start
                self.fail(f"garbage: the {what} is a varint longer than 10 bytes", path)

    def read(self, schema: Any, path: str, spath: str) -> None:
        schema = _deref(schema, self.named)
        t = _type_of(schema)
        if t == "null":
            return
        if t == "boolean":
            b = self.take(1, path, "a boolean")[0]
            if b > 1:
                self.pos -= 1
                self.fail(f"garbage: boolean byte 0x{b:02x} is neither 0 nor 1", path)
        elif t in ("int", "long"):
            self.varint(path, t)
        elif t == "float":
            self.take(4, path, "a float")
        elif t == "double":
            self.take(8, path, "a double")
        elif t in ("bytes", "string"):
            start = self.pos
            n = self.varint(path, f"{t} length")
            if n < 0:
                self.pos = start
                self.fail(f"garbage: negative {t} length {n}", path)
            raw = self.take(n, path, f"a {t} of length {n}")
            if t == "string":
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    self.pos -= n - e.start
                    self.fail(f"garbage: invalid UTF-8 in string ({e.reason})", path)
        elif t == "fixed":
            self.take(schema["size"], path, f"a fixed of size {schema['size']}")
        elif t == "enum":
            start = self.pos
            i = self.varint(path, "enum index")
            if not 0 <= i < len(schema["symbols"]):
                self.pos = start
                self.fail(f"garbage: enum index {i} out of range 0..{len(schema['symbols']) - 1}", path)
            if (spath, i) in self.unreadable:
                self.pos = start
                self.fail(f"unreadable: {self.unreadable[spath, i]}", path)
        elif t == "union":
            start = self.pos
            i = self.varint(path, "union branch index")
            if not 0 <= i < len(schema):
                self.pos = start
                self.fail(f"garbage: union branch index {i} out of range 0..{len(schema) - 1}", path)
            if (spath, i) in self.unreadable:
                self.pos = start
                self.fail(f"unreadable: {self.unreadable[spath, i]}", path)
            branch = _deref(schema[i], self.named)
            self.read(branch, _branch_path(path, branch), _branch_path(spath, branch))
        elif t in ("record", "error"):
            for f in schema["fields"]:
                self.read(f["type"], f"{path}.{f['name']}", f"{spath}.{f['name']}")
        elif t in ("array", "map"):
            index = 0
            while True:
                start = self.pos
                count = self.varint(path, f"{t} block count")
                if count == 0:
                    return
                if count < 0:
                    count = -count
                    self.varint(path, f"{t} block byte size")
                left = len(self.data) - self.pos
                if count > left:  # every item of our schemas takes at least one byte
                    self.pos = start
                    kind = "truncated" if count <= _PLAUSIBLE_BLOCK else "garbage"
                    self.fail(f"{kind}: {t} block of {count} item(s) but only {left} byte(s) left", path)
                for _ in range(count):
                    item = f"{path}[{index}]"
                    if t == "map":
                        self.read("string", f"{item} (key)", spath)
                        self.read(schema["values"], item, f"{spath}{{}}")
                    else:
                        self.read(schema["items"], item, f"{spath}[]")
                    index += 1
        else:  # pragma: no cover - parse_schema rejects unknown types
            self.fail(f"unsupported schema type {t!r}", path)


def _diagnose(data: bytes, ws: WriterSchema, error: BaseException) -> str:
    head = f"{ws.message} body does not decode with writer schema {ws.fingerprint.hex()}"
    walker = _BodyWalker(data, HEADER_SIZE, _named_types(ws.parsed), ws.unreadable)
    try:
        walker.read(ws.parsed, ws.message, ws.message)
    except _BodyError as e:
        return f"{head}: {e}"
    except RecursionError:
        pass
    detail = str(error)
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL] + "..."
    return f"{head}: {type(error).__name__}: {detail}"


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def _header(data: bytes, message: MessageName) -> tuple[bytes, WriterSchema]:
    """Check marker and length, and look the writer schema up; returns the data as bytes."""
    if not isinstance(data, bytes):
        if not isinstance(data, (bytearray, memoryview)):
            hint = " (a Kafka tombstone?)" if data is None else ""
            raise DecodeError(f"{message}: expected bytes, got {type(data).__name__}{hint}")
        data = bytes(data)
    if data[:2] != SINGLE_OBJECT_MARKER:
        if len(data) < 2 and SINGLE_OBJECT_MARKER.startswith(data):
            raise DecodeError(
                f"{message}: message too short: {len(data)} byte(s); need a {HEADER_SIZE}-byte header "
                "(marker + 8-byte schema fingerprint) and a body"
            )
        raise DecodeError(f"{message}: not Avro single-object encoded: marker is {data[:2].hex()!r}, expected 'c301'")
    if len(data) <= HEADER_SIZE:
        raise DecodeError(
            f"{message}: message too short: {len(data)} byte(s); need a {HEADER_SIZE}-byte header "
            "(marker + 8-byte schema fingerprint) and a body"
        )
    fp = data[2:HEADER_SIZE]
    ws = _REGISTRY.get(fp)
    if ws is None:
        known = ", ".join(sorted(f.hex() for f, w in _REGISTRY.items() if w.message == message))
        raise DecodeError(
            f"{message}: unknown writer schema fingerprint {fp.hex()} (CRC-64-AVRO, little-endian as on the wire); "
            f"known {message} schemas: {known}"
        )
    if ws.message != message:
        raise DecodeError(f"{message}: message was written with a {ws.message} schema ({fp.hex()}), not {message}")
    if ws.incompatibility is not None:
        raise DecodeError(f"{message}: cannot read messages written with schema {fp.hex()}: {ws.incompatibility}")
    return data, ws


def _read_body(data: bytes, ws: WriterSchema) -> Record:
    fo = BytesIO(data)
    fo.seek(HEADER_SIZE)
    try:
        record = schemaless_reader(fo, ws.parsed, ws.reader, True, True)
    except Exception as e:  # fastavro raises many types on bad input; all become DecodeError
        raise DecodeError(_diagnose(data, ws, e)) from e
    end = fo.tell()
    if end != len(data):
        raise DecodeError(
            f"{ws.message}: {len(data) - end} trailing byte(s) after the body (the body ends at offset {end} "
            f"of {len(data)})"
        )
    if not isinstance(record, dict):
        raise DecodeError(f"{ws.message}: body decoded to {type(record).__name__}, not a record")
    return record


class _Malformed(Exception):
    """A decoded record that does not map onto the dataclasses (becomes DecodeError)."""


def _dv_from(r: Record | None) -> DeletionVector | None:
    if r is None:
        return None
    return DeletionVector(
        storage_type=r["storageType"],
        path_or_inline_dv=r["pathOrInlineDv"],
        size_in_bytes=r["sizeInBytes"],
        cardinality=r["cardinality"],
        offset=r["offset"],
        max_row_index=r["maxRowIndex"],
    )


def _add_from(r: Record) -> AddFile:
    dv = r["deletionVector"]
    return AddFile(
        path=r["path"],
        partition_values=r["partitionValues"],
        size=r["size"],
        modification_time=r["modificationTime"],
        data_change=r["dataChange"],
        stats=r["stats"],
        tags=r["tags"],
        deletion_vector=None if dv is None else _dv_from(dv),
        base_row_id=r["baseRowId"],
        default_row_commit_version=r["defaultRowCommitVersion"],
        clustering_provider=r["clusteringProvider"],
    )


def _remove_from(r: Record) -> RemoveFile:
    dv = r["deletionVector"]
    return RemoveFile(
        path=r["path"],
        deletion_timestamp=r["deletionTimestamp"],
        data_change=r["dataChange"],
        extended_file_metadata=r["extendedFileMetadata"],
        partition_values=r["partitionValues"],
        size=r["size"],
        stats=r["stats"],
        tags=r["tags"],
        deletion_vector=None if dv is None else _dv_from(dv),
        base_row_id=r["baseRowId"],
        default_row_commit_version=r["defaultRowCommitVersion"],
    )


def _cdc_from(r: Record) -> AddCDCFile:
    return AddCDCFile(
        path=r["path"],
        partition_values=r["partitionValues"],
        size=r["size"],
        data_change=r["dataChange"],
        tags=r["tags"],
    )


def _metadata_from(r: Record) -> Metadata:
    return Metadata(
        id=r["id"],
        schema_string=r["schemaString"],
        partition_columns=tuple(r["partitionColumns"]),
        configuration=r["configuration"],
        name=r["name"],
        description=r["description"],
        format_provider=r["formatProvider"],
        format_options=r["formatOptions"],
        created_time=r["createdTime"],
    )


def _protocol_from(r: Record) -> Protocol:
    rf, wf = r["readerFeatures"], r["writerFeatures"]
    return Protocol(
        min_reader_version=r["minReaderVersion"],
        min_writer_version=r["minWriterVersion"],
        reader_features=None if rf is None else tuple(rf),
        writer_features=None if wf is None else tuple(wf),
    )


def _txn_from(r: Record) -> SetTransaction:
    return SetTransaction(app_id=r["appId"], version=r["version"], last_updated=r["lastUpdated"])


def _domain_from(r: Record) -> DomainMetadata:
    return DomainMetadata(domain=r["domain"], configuration=r["configuration"], removed=r["removed"])


def _commit_info_from(r: Record) -> CommitInfo:
    text = r["valuesJson"]
    try:
        values = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise _Malformed(f"commitInfo.valuesJson is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise _Malformed(f"commitInfo.valuesJson must be a JSON object, got {type(values).__name__}")
    return CommitInfo(values)


_ACTION_READERS: Final[dict[str, Callable[[Record], Action]]] = {
    f"{NAMESPACE}.AddFile": _add_from,
    f"{NAMESPACE}.RemoveFile": _remove_from,
    f"{NAMESPACE}.AddCDCFile": _cdc_from,
    f"{NAMESPACE}.Metadata": _metadata_from,
    f"{NAMESPACE}.Protocol": _protocol_from,
    f"{NAMESPACE}.SetTransaction": _txn_from,
    f"{NAMESPACE}.DomainMetadata": _domain_from,
    f"{NAMESPACE}.CommitInfo": _commit_info_from,
}


def _action_from(wrapper: Record) -> Action:
    branch = wrapper["action"]
    if type(branch) is not tuple or len(branch) != 2:
        raise _Malformed(f"action is not a named union branch: {type(branch).__name__}")
    name, body = branch
    reader = _ACTION_READERS.get(name)
    if reader is None:
        raise _Malformed(
            f"union branch {name!r} is not a known Delta action (known: {', '.join(map(_short, _ACTION_READERS))})"
        )
    return reader(body)


def _actions_from(items: list[Record]) -> tuple[Action, ...]:
    try:
        return tuple([_action_from(a) for a in items])
    except (_Malformed, KeyError, TypeError, ValueError, AttributeError):
        pass
    for i, a in enumerate(items):  # error path: find the culprit to name it
        try:
            _action_from(a)
        except (_Malformed, KeyError, TypeError, ValueError, AttributeError) as e:
            raise _Malformed(f"actions[{i}]: {_explain(e)}") from e
    raise _Malformed("actions: invalid")  # pragma: no cover - the loop above re-raises


def _explain(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    if isinstance(e, _Malformed):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _convert(message: MessageName, fn: Callable[[Record], Any], record: Record) -> Any:
    try:
        return fn(record)
    except (_Malformed, KeyError, TypeError, ValueError, AttributeError) as e:
        raise DecodeError(f"{message}: decoded body is not a valid {message}: {_explain(e)}") from e


def _proposal_from(r: Record) -> Proposal:
    return Proposal(
        table_id=r["tableId"],
        table_uri=r["tableUri"],
        proposal_id=r["proposalId"],
        read_version=r["readVersion"],
        operation=r["operation"],
        changes_data=r["changesData"],
        actions=_actions_from(r["actions"]),
        commit_info=_commit_info_from(r["commitInfo"]),
        read_predicates=tuple(r["readPredicates"]),
        read_files=tuple([FileRead(f["path"], f["partitionValues"]) for f in r["readFiles"]]),
        read_whole_table=r["readWholeTable"],
        read_app_ids=tuple(r["readAppIds"]),
        writer=r["writer"],
        operation_parameters=r["operationParameters"],
        staged=_staged_from(r.get("stagedActions")),
        transaction=_transaction_from(r.get("transaction")),
    )


def _transaction_from(r: Record | None) -> MultiTable | None:
    """A multi-table transaction; its parts are proposals of their own (each single-object encoded)."""
    if r is None:
        return None
    parts = tuple(decode_proposal(raw) for raw in r["parts"])
    if any(p.transaction is None or p.transaction.parts for p in parts):
        raise DecodeError("a part of a multi-table transaction must name the transaction and carry no parts itself")
    return MultiTable(r["id"], tuple(r["tables"]), parts)


def _transaction_rec(t: MultiTable | None) -> Record | None:
    if t is None:
        return None
    return {"id": t.id, "tables": list(t.tables), "parts": [encode_proposal(p) for p in t.parts]}


_OUTCOMES: Final = {o.value: o for o in Outcome}


def _staged_from(r: Record | None) -> StagedActions | None:
    if r is None:
        return None
    return StagedActions(sha256=r["sha256"], count=r["count"], size=r["size"])


def _staged_rec(s: StagedActions | None) -> Record | None:
    if s is None:
        return None
    return {"sha256": s.sha256, "count": s.count, "size": s.size}


def _outcome_from(symbol: str) -> Outcome:
    outcome = _OUTCOMES.get(symbol)
    if outcome is None:
        raise _Malformed(f"unknown outcome {symbol!r}")
    return outcome


def _decision_from(r: Record) -> Decision:
    return Decision(
        table_id=r["tableId"],
        table_uri=r["tableUri"],
        proposal_id=r["proposalId"],
        outcome=_outcome_from(r["outcome"]),
        version=r["version"],
        actions=_actions_from(r["actions"]),
        error_type=r["errorType"],
        error_message=r["errorMessage"],
        reason_code=r["reasonCode"],
        winning_version=r["winningVersion"],
        duplicate_of=r["duplicateOf"],
        decided_at_ms=r["decidedAtMs"],
        staged=_staged_from(r.get("stagedCommit")),
        coalesced_into=r.get("coalescedInto"),
    )


def decode_proposal(data: bytes) -> Proposal:
    """Decode a single-object encoded CommitProposal; raises DecodeError on anything invalid."""
    data, ws = _header(data, "CommitProposal")
    record = _read_body(data, ws)
    proposal: Proposal = _convert("CommitProposal", _proposal_from, record)
    return proposal


def decode_decision(data: bytes) -> Decision:
    """Decode a single-object encoded CommitDecision; raises DecodeError on anything invalid."""
    data, ws = _header(data, "CommitDecision")
    record = _read_body(data, ws)
    decision: Decision = _convert("CommitDecision", _decision_from, record)
    return decision


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------


def _opt_map(m: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if m is None else dict(m)


def _dv_rec(dv: DeletionVector | None) -> Record | None:
    return None if dv is None else dv.fields()


def _add_rec(a: AddFile) -> Record:
    return {
        "path": a.path,
        "partitionValues": dict(a.partition_values),
        "size": a.size,
        "modificationTime": a.modification_time,
        "dataChange": a.data_change,
        "stats": a.stats,
        "tags": _opt_map(a.tags),
        "deletionVector": _dv_rec(a.deletion_vector),
        "baseRowId": a.base_row_id,
        "defaultRowCommitVersion": a.default_row_commit_version,
        "clusteringProvider": a.clustering_provider,
    }


def _remove_rec(a: RemoveFile) -> Record:
    return {
        "path": a.path,
        "deletionTimestamp": a.deletion_timestamp,
        "dataChange": a.data_change,
        "extendedFileMetadata": a.extended_file_metadata,
        "partitionValues": _opt_map(a.partition_values),
        "size": a.size,
        "stats": a.stats,
        "tags": _opt_map(a.tags),
        "deletionVector": _dv_rec(a.deletion_vector),
        "baseRowId": a.base_row_id,
        "defaultRowCommitVersion": a.default_row_commit_version,
    }


def _cdc_rec(a: AddCDCFile) -> Record:
    return {
        "path": a.path,
        "partitionValues": dict(a.partition_values),
        "size": a.size,
        "dataChange": a.data_change,
        "tags": _opt_map(a.tags),
    }


def _metadata_rec(a: Metadata) -> Record:
    return {
        "id": a.id,
        "schemaString": a.schema_string,
        "partitionColumns": list(a.partition_columns),
        "configuration": dict(a.configuration),
        "name": a.name,
        "description": a.description,
        "formatProvider": a.format_provider,
        "formatOptions": dict(a.format_options),
        "createdTime": a.created_time,
    }


def _protocol_rec(a: Protocol) -> Record:
    return {
        "minReaderVersion": a.min_reader_version,
        "minWriterVersion": a.min_writer_version,
        "readerFeatures": None if a.reader_features is None else list(a.reader_features),
        "writerFeatures": None if a.writer_features is None else list(a.writer_features),
    }


def _txn_rec(a: SetTransaction) -> Record:
    return {"appId": a.app_id, "version": a.version, "lastUpdated": a.last_updated}


def _domain_rec(a: DomainMetadata) -> Record:
    return {"domain": a.domain, "configuration": a.configuration, "removed": a.removed}


def _commit_info_rec(a: CommitInfo) -> Record:
    if not isinstance(a, CommitInfo):
        raise EncodeError(f"commit info must be a CommitInfo, got {type(a).__name__}")
    try:
        text = json.dumps(dict(a.values), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise EncodeError(f"commitInfo values are not JSON-serialisable: {e}") from e
    return {"valuesJson": text}


_ACTION_WRITERS: Final[dict[type, tuple[str, Callable[[Any], Record]]]] = {
    AddFile: (f"{NAMESPACE}.AddFile", _add_rec),
    RemoveFile: (f"{NAMESPACE}.RemoveFile", _remove_rec),
    AddCDCFile: (f"{NAMESPACE}.AddCDCFile", _cdc_rec),
    Metadata: (f"{NAMESPACE}.Metadata", _metadata_rec),
    Protocol: (f"{NAMESPACE}.Protocol", _protocol_rec),
    SetTransaction: (f"{NAMESPACE}.SetTransaction", _txn_rec),
    DomainMetadata: (f"{NAMESPACE}.DomainMetadata", _domain_rec),
    CommitInfo: (f"{NAMESPACE}.CommitInfo", _commit_info_rec),
}


def _actions_rec(actions: Any) -> list[Record]:
    out = []
    for i, a in enumerate(actions):
        entry = _ACTION_WRITERS.get(type(a))
        if entry is None:
            raise EncodeError(f"actions[{i}] is not a Delta action: {type(a).__name__}")
        name, to_record = entry
        out.append({"action": (name, to_record(a))})
    return out


def _proposal_rec(p: Proposal) -> Record:
    return {
        "tableId": p.table_id,
        "tableUri": p.table_uri,
        "proposalId": p.proposal_id,
        "readVersion": p.read_version,
        "operation": p.operation,
        "changesData": p.changes_data,
        "actions": _actions_rec(p.actions),
        "commitInfo": _commit_info_rec(p.commit_info),
        "readPredicates": list(p.read_predicates),
        "readFiles": [{"path": f.path, "partitionValues": dict(f.partition_values)} for f in p.read_files],
        "readWholeTable": p.read_whole_table,
        "readAppIds": list(p.read_app_ids),
        "writer": p.writer,
        "operationParameters": dict(p.operation_parameters),
        "stagedActions": _staged_rec(p.staged),
        "transaction": _transaction_rec(p.transaction),
    }


def _decision_rec(d: Decision) -> Record:
    outcome = d.outcome
    if not isinstance(outcome, Outcome):
        raise EncodeError(f"Decision.outcome must be an Outcome, got {outcome!r}")
    return {
        "tableId": d.table_id,
        "tableUri": d.table_uri,
        "proposalId": d.proposal_id,
        "outcome": outcome.value,
        "version": d.version,
        "actions": _actions_rec(d.actions),
        "errorType": d.error_type,
        "errorMessage": d.error_message,
        "reasonCode": d.reason_code,
        "winningVersion": d.winning_version,
        "duplicateOf": d.duplicate_of,
        "decidedAtMs": d.decided_at_ms,
        "stagedCommit": _staged_rec(d.staged),
        "coalescedInto": d.coalesced_into,
    }


#: What plain values a field's Avro type takes (`_plain_spec`): None, a bool, any string, enum symbols, the
#: int range, an empty list.
_PlainSpec = tuple[bool, bool, bool, frozenset[str], int, int, bool]
_NOTHING: Final[_PlainSpec] = (False, False, False, frozenset(), 0, -1, False)


def _plain_spec(t: Any) -> _PlainSpec:
    """The plain values of Avro type `t` that fastavro's `validate` passes, by exact built-in type: null, boolean,
    string, enum symbols, long and int in range, an empty array, and a union's branches together; nothing of a
    record, a map, a fixed or a logical type (`validate` answers for those)."""
    if isinstance(t, list):
        specs = [_plain_spec(b) for b in t]
        ranges = [(s[4], s[5]) for s in specs if s[4] <= s[5]]
        return (any(s[0] for s in specs), any(s[1] for s in specs), any(s[2] for s in specs),
                frozenset().union(*(s[3] for s in specs)), min((r[0] for r in ranges), default=0),
                max((r[1] for r in ranges), default=-1), any(s[6] for s in specs))
    if isinstance(t, dict):
        kind = t.get("type")
        if "logicalType" in t:
            return _NOTHING
        if kind == "enum":
            return (False, False, False, frozenset(t["symbols"]), 0, -1, False)
        if kind == "array":
            return (False, False, False, frozenset(), 0, -1, True)
        return _plain_spec(kind) if kind in ("null", "boolean", "string", "long", "int") else _NOTHING
    return {"null": (True, False, False, frozenset(), 0, -1, False),
            "boolean": (False, True, False, frozenset(), 0, -1, False),
            "string": (False, False, True, frozenset(), 0, -1, False),
            "long": (False, False, False, frozenset(), -(2**63), 2**63 - 1, False),
            "int": (False, False, False, frozenset(), -(2**31), 2**31 - 1, False)}.get(t, _NOTHING) \
        if isinstance(t, str) else _NOTHING


#: Per message, its fields' plain values (`_plain_spec`): a record every field of which holds one is valid, so
#: `_encode` skips fastavro's `validate` for it (the decision of a coalesced commit, a rejection: no actions).
_PLAIN_FIELDS: Final[dict[str, tuple[tuple[str, _PlainSpec], ...]]] = {
    m: tuple((f["name"], _plain_spec(f["type"])) for f in schema["fields"]) for m, schema in _READERS.items()}


def _plainly_valid(message: MessageName, record: Record) -> bool:
    """Whether the record is one `validate` passes, told by `_PLAIN_FIELDS` alone (False: ask `validate`)."""
    if type(record) is not dict or "-type" in record:
        return False
    for name, (null, boolean, any_str, symbols, lo, hi, empty_list) in _PLAIN_FIELDS[message]:
        if name not in record:
            return False
        v = record[name]
        t = type(v)
        if t is str:
            ok = any_str or v in symbols
        elif t is int:
            ok = lo <= v <= hi
        elif v is None:
            ok = null
        elif t is bool:
            ok = boolean
        elif t is list:
            ok = empty_list and not v
        else:
            return False
        if not ok:
            return False
    return True


def _encode(message: MessageName, build: Callable[[Any], Record], obj: Any) -> bytes:
    try:
        record = build(obj)
    except EncodeError:
        raise
    except (AttributeError, TypeError, ValueError) as e:
        raise EncodeError(f"{message}: cannot build the record from {type(obj).__name__}: {e}") from e
    schema = _READERS[message]
    # The quiet check first: with raise_errors=True fastavro builds (and drops) an error for every
    # union branch a value does not take, which cost most of an encode. Only a bad record is checked again
    # for its message. A record of plain fields is valid without asking (`_plainly_valid`).
    try:
        valid = _plainly_valid(message, record) or validate(record, schema, raise_errors=False)
    except Exception:  # a value fastavro's checks themselves choke on
        valid = False
    if not valid:
        try:
            validate(record, schema, raise_errors=True)
        except Exception as e:  # fastavro's ValidationError lists every bad field
            errors = getattr(e, "errors", None)
            detail = "; ".join(map(str, errors)) if errors else f"{type(e).__name__}: {e}"
            raise EncodeError(f"{message} does not match its schema: {detail}") from e
        raise EncodeError(f"{message} does not match its schema")
    fo = BytesIO()
    fo.write(SINGLE_OBJECT_MARKER)
    fo.write(_CURRENT[message])
    try:
        schemaless_writer(fo, schema, record)
    except Exception as e:  # e.g. a string that is not encodable as UTF-8 (lone surrogate)
        raise EncodeError(f"{message}: {type(e).__name__}: {e}") from e
    return fo.getvalue()


def encode_proposal(p: Proposal) -> bytes:
    """Single-object encode a proposal with the current CommitProposal schema."""
    if not isinstance(p, Proposal):
        raise EncodeError(f"expected a Proposal, got {type(p).__name__}")
    return _encode("CommitProposal", _proposal_rec, p)


def encode_decision(d: Decision) -> bytes:
    """Single-object encode a decision with the current CommitDecision schema."""
    if not isinstance(d, Decision):
        raise EncodeError(f"expected a Decision, got {type(d).__name__}")
    return _encode("CommitDecision", _decision_rec, d)


def _register_history() -> None:
    """Messages written by earlier versions of this project stay readable: their schemas (kept in
    ``schemas/avro/history`` by canonical form, named ``<message>.<fingerprint>.json``) lack only fields
    added since with defaults, which Avro resolution fills in."""
    for f in sorted((_AVRO_DIR / "history").glob("*.json")):
        message = f.name.split(".", 1)[0]
        # RuntimeError: a file shipped with the package is wrong (an internal invariant, no user input).
        if message not in _READERS:
            raise RuntimeError(f"{f}: unknown message {message!r}")
        fp = register_writer_schema(message, f.read_text())  # type: ignore[arg-type]
        if fp.hex() != f.name.split(".")[1] or _REGISTRY[fp].incompatibility is not None:
            raise RuntimeError(f"{f}: fingerprint {fp.hex()} or resolution ({_REGISTRY[fp].incompatibility}) is wrong")


_register_history()
