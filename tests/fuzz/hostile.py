"""Hostile input for the decoder and the coordinator, generated from a `random.Random`.

Everything is driven by one `Random`, so the integration barrage is seeded and
reproducible, and hypothesis can drive the same generators through
`st.randoms()` (it then shrinks a failure to a small choice sequence).

Two kinds of hostile message:

* `hostile_proposal(rng, ctx)`: a well-formed proposal (it encodes as valid
  Avro) whose content is hostile, built so that it can never commit, with the
  reason code the coordinator must reject it with;
* `hostile_bytes(rng, ctx)`: bytes that must not decode (raw garbage,
  truncations, wrong fingerprints, bit flips, a decision where a proposal
  belongs, valid Avro whose commitInfo is not a JSON object, ...). Bit flips can
  decode to another valid message (Avro has no checksum), so callers classify
  with `decode_proposal` and keep only what fails.
"""

from __future__ import annotations

import dataclasses
import json
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from fastavro import schemaless_writer

from deltacoord.schemas.actions import (
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.codec import (
    DECISION_FINGERPRINT,
    PROPOSAL_FINGERPRINT,
    PROPOSAL_SCHEMA,
    SINGLE_OBJECT_MARKER,
    encode_decision,
    encode_proposal,
)
from deltacoord.schemas.messages import Decision, FileRead, Outcome, Proposal

SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "date", "type": "string", "nullable": True, "metadata": {}},
        ],
    },
    separators=(",", ":"),
)

_NASTY = [
    "", " ", "\x00", "\x7f", "\u202e", "\ufeff", "\U0001f4a9", "é", "\U0001d518\U0001d52b\U0001d526", "'", '"', "\\", "%00", "%2e%2e",
    "${jndi:ldap://x}", "<script>", "'; DROP TABLE t; --", "\n", "\r\n", "\t", "NaN", "-0", "9" * 40,
]


@dataclass(frozen=True)
class TableCtx:
    """The table hostile proposals aim at (it exists, partitioned by `date`, at version >= `read_version`)."""

    table_id: str
    table_uri: str
    read_version: int = 0


def nasty_text(rng: random.Random, max_len: int = 40) -> str:
    """A short string mixing printable text with control, bidi, astral and injection-looking pieces."""
    parts = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.5:
            parts.append(rng.choice(_NASTY))
        else:
            parts.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 12))))
    return "".join(parts)[:max_len]


def _file_name(rng: random.Random) -> str:
    return f"part-{rng.randrange(10**6):05d}-{uuid.UUID(int=rng.getrandbits(128))}.parquet"


def _add(rng: random.Random, path: str | None = None, size: int | None = None, pv: dict[str, str | None] | None = None) -> AddFile:
    return AddFile(
        path=path if path is not None else f"date=2024-01-01/{_file_name(rng)}",
        partition_values={"date": "2024-01-01"} if pv is None else pv,
        size=rng.randrange(1, 10**9) if size is None else size,
        modification_time=rng.randrange(-(2**63), 2**63),
        data_change=rng.random() < 0.5,
        # Hostile text inside stats Delta readers can parse: stats they cannot parse are a case of their own.
        stats=rng.choice([None, "{}", json.dumps({"numRecords": 1, "minValues": {"s": nasty_text(rng)},
                                                  nasty_text(rng) or "k": nasty_text(rng)})]),
        tags=rng.choice([None, {}, {nasty_text(rng): nasty_text(rng)}]),
    )


def _escaping_path(rng: random.Random) -> str:
    name = _file_name(rng)
    return rng.choice([
        f"{'../' * rng.randint(1, 40)}etc/{name}",
        f"date=2024-01-01/../../{name}",
        f"date=2024-01-01/%2e%2e/%2E%2E/{name}",
        f"..\\..\\{name}",
        f"/etc/{name}",
        "/etc/passwd",
        f"file:///tmp/elsewhere/{name}",
        f"file://evil-host/share/{name}",
        f"s3://bucket/{name}",
        f"hdfs://namenode:8020/{name}",
        f"https://example.invalid/{name}",
        "javascript:alert(1)",
        f"_delta_log/{rng.randrange(10**6):020d}.json",
        f"date=2024-01-01/a\x00{name}",
        f"\\\\server\\share\\{name}",
    ])


def _protocol_bad(rng: random.Random) -> Protocol:
    return rng.choice([
        Protocol(99, 99),
        Protocol(99, 2),
        Protocol(1, 99),
        Protocol(0, 0),
        Protocol(-(2**31), 2**31 - 1),
        Protocol(3, 7, ("evilFeature",), ("evilFeature",)),  # supported versions, unknown features: allowed by validation
    ])


def _metadata(rng: random.Random, **overrides: Any) -> Metadata:
    md = Metadata(id=str(uuid.UUID(int=rng.getrandbits(128))), schema_string=SCHEMA_STRING, partition_columns=("date",))
    return dataclasses.replace(md, **overrides)


#: A generator of hostile actions: (actions, expected reason) for the table at ctx.read_version.
Case = tuple[tuple[Action, ...], str]


def _case_path(rng: random.Random) -> Case:
    kind = rng.randrange(3)
    p = _escaping_path(rng)
    # A control character (the NUL one) is refused for itself, before where the path leads is asked.
    reason = "BAD_FILE_PATH" if "\x00" in p else "PATH_ESCAPES_TABLE"
    if kind == 0:
        return (_add(rng, path=p),), reason
    if kind == 1:
        return (RemoveFile(p, rng.randrange(2**40), True),), reason
    return (AddCDCFile(p, {"date": "2024-01-01"}, 10),), reason


def _case_negative(rng: random.Random) -> Case:
    size = -rng.randint(1, 2**63)
    kind = rng.randrange(3)
    if kind == 0:
        return (_add(rng, size=size),), "NEGATIVE_SIZE"
    if kind == 1:
        return (RemoveFile(f"date=2024-01-01/{_file_name(rng)}", 0, True, size=size),), "NEGATIVE_SIZE"
    return (AddCDCFile(f"_change_data/{_file_name(rng)}", {}, size),), "NEGATIVE_SIZE"


def _case_duplicates(rng: random.Random) -> Case:
    a = _add(rng)
    kind = rng.randrange(6)
    if kind == 0:
        return (a, a), "DUPLICATE_FILE_ACTION"
    if kind == 1:
        r = a.to_remove(1)
        return (r, r), "DUPLICATE_FILE_ACTION"
    if kind == 2:
        return (a, a.to_remove(1)), "ADD_AND_REMOVE_SAME_FILE"
    if kind == 3:
        return (_metadata(rng), _metadata(rng)), "MULTIPLE_METADATA"
    if kind == 4:
        return (Protocol(1, 2), Protocol(1, 2)), "MULTIPLE_PROTOCOL"
    if rng.random() < 0.5:
        app = nasty_text(rng) or "app"
        return (SetTransaction(app, 1), SetTransaction(app, 2)), "DUPLICATE_APP_ID"
    dom = nasty_text(rng) or "dom"
    return (DomainMetadata(dom, "{}"), DomainMetadata(dom, "[]")), "DUPLICATE_DOMAIN"


def _case_protocol(rng: random.Random) -> Case:
    p = _protocol_bad(rng)
    if p.min_reader_version == 3 and p.min_writer_version == 7:
        p = Protocol(99, 99)
    return (p,), "UNSUPPORTED_PROTOCOL"


def _case_unknown_action(rng: random.Random) -> Case:
    ci = CommitInfo({"operation": nasty_text(rng), "txnId": nasty_text(rng)})
    return (_add(rng), ci), "COMMIT_INFO_IN_ACTIONS"


def _case_bad_stats(rng: random.Random) -> Case:
    bad = rng.choice(["", "not json", '{"numRecords":-5}', '{"numRecords":1e308}', "{" * 5000, "[]", "NaN",
                      '{"maxValues":{"x":Infinity}}', '{"nullCount":{"x":"1"}}', "not json " + nasty_text(rng)])
    return (dataclasses.replace(_add(rng), stats=bad),), "BAD_STATS"


def _case_partition_values(rng: random.Random) -> Case:
    pvs: list[dict[str, str | None]] = [
        {},
        {"date": "2024-01-01", "evil": "x"},
        {"nope": "2024-01-01"},
        {"DATE": "2024-01-01"},
        {nasty_text(rng) + "\x00": None},
        {f"c{i}": str(i) for i in range(rng.randint(2, 200))},
    ]
    return (_add(rng, pv=rng.choice(pvs)),), "PARTITION_VALUES_MISMATCH"


def _case_bad_metadata(rng: random.Random) -> Case:
    kind = rng.randrange(3)
    if kind == 0:
        if rng.random() < 0.1:
            # A field name that is not a string.
            return (_metadata(rng, schema_string='{"type":"struct","fields":[{"name":1}]}'),), "BAD_SCHEMA"
        bad = rng.choice(["not json", "[]", "{}", "{" * 5000, "NaN", "null", nasty_text(rng)])
        return (_metadata(rng, schema_string=bad),), "BAD_SCHEMA"
    if kind == 1:
        return (_metadata(rng, partition_columns=("no_such_column",)),), "BAD_SCHEMA"
    return (_metadata(rng, configuration={"delta.isolationLevel": rng.choice(["Chaos", "", "serializable", nasty_text(rng)])}),), "BAD_ISOLATION_LEVEL"


_ACTION_CASES: tuple[Callable[[random.Random], Case], ...] = (
    _case_path, _case_path, _case_negative, _case_duplicates, _case_protocol, _case_unknown_action,
    _case_partition_values, _case_bad_metadata, _case_bad_stats,
)


def _bad_predicate(rng: random.Random) -> str:
    depth = rng.randint(200, 3_000)
    return rng.choice([
        "(" * depth + "date = '2024-01-01'" + ")" * depth,
        "NOT " * depth + "date = '2024-01-01'",
        "date = '2024-01-01' AND (",
        "date IN (" + ",".join("'a'" for _ in range(rng.randint(1, 50))) + " AND",
        "x" * 70_000,
        "date = '" + nasty_text(rng) + "' OR ) (",
        "SELECT * FROM t; DROP TABLE t",
        "'",
        "date = 'a' " + "AND date = 'b' " * 100 + "AND (",
    ])


def _base(rng: random.Random, ctx: TableCtx, actions: tuple[Action, ...], **kw: Any) -> Proposal:
    pid = str(uuid.UUID(int=rng.getrandbits(128)))
    info: dict[str, Any] = {"operation": "WRITE", "txnId": pid}
    if rng.random() < 0.3:
        info[nasty_text(rng) or "k"] = rng.choice([None, True, 1.5, -(2**70), [1, [2, [3]]], {"a": {"b": {"c": nasty_text(rng)}}}])
    kw.setdefault("read_version", ctx.read_version)
    return Proposal(
        table_id=ctx.table_id, table_uri=ctx.table_uri, proposal_id=pid,
        operation=rng.choice(["WRITE", "DELETE", "MERGE", nasty_text(rng)]), changes_data=rng.random() < 0.5,
        actions=actions, commit_info=CommitInfo(info),
        writer=rng.choice([None, "fuzz", nasty_text(rng)]),
        operation_parameters=rng.choice([{}, {nasty_text(rng): nasty_text(rng)}]),
        **kw,
    )


def hostile_proposal(rng: random.Random, ctx: TableCtx, *, huge: int = 0) -> tuple[Proposal, str]:
    """A valid-Avro proposal that must be rejected, and the reason code it must get.

    `huge` > 0 adds a string of about that many characters to a field that does
    not change the verdict (writer, operation parameters, a read file, a stats string).
    """
    kind = rng.randrange(10)
    if kind <= 3:
        actions, reason = rng.choice(_ACTION_CASES)(rng)
        p = _base(rng, ctx, actions)
    elif kind == 4:
        p = _base(rng, ctx, (_add(rng),), read_version=ctx.read_version + rng.randint(10**6, 2**62))
        reason = "READ_VERSION_AHEAD"
    elif kind == 5:
        p = _base(rng, ctx, (_add(rng),), read_version=-rng.randint(2, 2**63))
        reason = "BAD_READ_VERSION"
    elif kind == 6:
        p = _base(rng, ctx, (_add(rng),))
        p = dataclasses.replace(p, commit_info=CommitInfo({"txnId": rng.choice(["", "other", nasty_text(rng) + "!"])}))
        reason = "TXN_ID_MISMATCH"
    elif kind == 7:
        p = _base(rng, ctx, (), read_predicates=tuple(_bad_predicate(rng) for _ in range(rng.randint(1, 3))))
        reason = "BAD_PREDICATE"
    elif kind == 8:
        # A location the coordinator's door refuses (no `..`, no NUL, absolute, a served scheme; the barrage's
        # coordinator has no table_roots, so it serves local tables only) is refused before anything else.
        if rng.random() < 0.5:
            other, reason = rng.choice([(f"file:///nowhere/{uuid.UUID(int=rng.getrandbits(128))}", "UNKNOWN_TABLE"),
                                        (nasty_text(rng) + "\x00x", "BAD_TABLE_URI"), ("é" * 300, "BAD_TABLE_URI")])
            p = dataclasses.replace(_base(rng, ctx, (_add(rng),)), table_id=other, table_uri=other)
        else:
            uri, reason = rng.choice([("file:///elsewhere", "TABLE_URI_MISMATCH"), ("s3://b/t", "TABLE_OUTSIDE_ROOTS"),
                                      ("", "BAD_TABLE_URI")])
            p = dataclasses.replace(_base(rng, ctx, (_add(rng),)), table_uri=uri)
    else:
        # A creation of a new table that is itself invalid (so nothing is created).
        new_id = f"file:///tmp/fuzz-created/{uuid.UUID(int=rng.getrandbits(128))}"
        sub = rng.randrange(3)
        if sub == 0:
            actions, reason = (_metadata(rng),), "MISSING_PROTOCOL"
        elif sub == 1:
            actions, reason = (Protocol(1, 2),), "MISSING_METADATA"
        else:
            case_actions, reason = _case_bad_metadata(rng)
            actions = (*case_actions, Protocol(1, 2))
        p = dataclasses.replace(_base(rng, ctx, actions, read_version=-1), table_id=new_id, table_uri=new_id)
    if huge:
        blob = "".join(rng.choice(string.ascii_letters) for _ in range(64)) * (huge // 64 + 1)
        where = rng.randrange(3)
        if where == 0:
            p = dataclasses.replace(p, writer=blob)
        elif where == 1:
            p = dataclasses.replace(p, operation_parameters={"blob": blob})
        else:
            p = dataclasses.replace(p, read_files=(FileRead(blob, {"date": blob}),))
    return p, reason


# --------------------------------------------------------------------------- undecodable bytes


def _raw_proposal(record_overrides: dict[str, Any]) -> bytes:
    """A body written with the current schema from a raw record (bypassing the dataclasses)."""
    record: dict[str, Any] = {
        "tableId": "t", "tableUri": "file:///t", "proposalId": "p", "readVersion": 0, "operation": "WRITE",
        "changesData": True, "actions": [], "commitInfo": {"valuesJson": "{}"}, "readPredicates": [], "readFiles": [],
        "readWholeTable": False, "readAppIds": [], "writer": None, "operationParameters": {},
    }
    record.update(record_overrides)
    fo = BytesIO()
    fo.write(SINGLE_OBJECT_MARKER + PROPOSAL_FINGERPRINT)
    schemaless_writer(fo, PROPOSAL_SCHEMA, record)
    return fo.getvalue()


def hostile_bytes(rng: random.Random, ctx: TableCtx) -> tuple[bytes, str]:
    """Bytes that (usually) do not decode as a proposal, and a name for how they were made."""
    valid = encode_proposal(hostile_proposal(rng, ctx)[0])
    kind = rng.randrange(11)
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300)), "random"
    if kind == 1:
        return SINGLE_OBJECT_MARKER + rng.randbytes(rng.randint(0, 300)), "random-after-marker"
    if kind == 2:
        return valid[: rng.randrange(len(valid))], "truncated"
    if kind == 3:
        fp = rng.randbytes(8)
        while fp in (PROPOSAL_FINGERPRINT, DECISION_FINGERPRINT):
            fp = rng.randbytes(8)
        return SINGLE_OBJECT_MARKER + fp + valid[10:], "wrong-fingerprint"
    if kind == 4:
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data), "bit-flips"
    if kind == 5:
        return valid + rng.randbytes(rng.randint(1, 20)), "trailing-bytes"
    if kind == 6:
        d = Decision(ctx.table_id, ctx.table_uri, str(uuid.UUID(int=rng.getrandbits(128))), Outcome.REJECTED,
                     error_type="X", reason_code="Y", decided_at_ms=1)
        return encode_decision(d), "decision-not-proposal"
    if kind == 7:
        values_json = rng.choice(["[1]", "null", "not json", "[" * 100_000 + "]" * 100_000, "{" * 50, '"str"', "1e999"])
        return _raw_proposal({"commitInfo": {"valuesJson": values_json}}), "commit-info-not-object"
    if kind == 8:
        return valid[:10] + b"\xff" * rng.randint(1, 64), "garbage-body"
    if kind == 9:
        # A string whose length prefix claims far more bytes than the message has.
        return SINGLE_OBJECT_MARKER + PROPOSAL_FINGERPRINT + b"\xfe\xff\xff\xff\x0f" + b"x" * 10, "huge-length-prefix"
    return rng.choice([b"", b"\xc3", b"\xc3\x01", SINGLE_OBJECT_MARKER + PROPOSAL_FINGERPRINT]), "too-short"
