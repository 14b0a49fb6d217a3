"""Validation of a proposal on its own: every reason code, and what is deliberately allowed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from deltacoord.coordinator.rules.conflicts import decide
from deltacoord.coordinator.rules.outcomes import Accepted, Rejected
from deltacoord.coordinator.rules.state import TableState
from deltacoord.coordinator.rules.table_features import domain_metadata_error
from deltacoord.coordinator.rules.validate import (
    REASONS,
    check_txn_versions,
    path_problem,
    plain_relative_paths,
    proposal_error,
    validate_proposal,
)
from deltacoord.schemas.actions import AddFile, CommitInfo, DeletionVector, Protocol
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import FileRead, Proposal
from tests.unit.builders import (
    DOMAINS_PROTOCOL,
    NOW,
    TABLE_ID,
    TABLE_URI,
    Harness,
    add,
    cdc,
    domain,
    dv_id,
    metadata,
    proposal,
    protocol,
    remove,
    txn,
)


@dataclass
class Case:
    id: str
    reason: str
    build: Callable[[Harness], Proposal]
    harness: Callable[[], Harness] = Harness


#: Partition columns of every type whose values readers parse.
TYPED = {"d": "date", "n": "long", "i": "integer", "b": "byte", "x": "double", "m": "decimal(10,2)", "ts": "timestamp",
         "flag": "boolean", "s": "string"}


def _plain() -> Harness:
    return Harness()


def _dated() -> Harness:
    return Harness(("date",))


def _append_only() -> Harness:
    return Harness(config={"delta.appendOnly": "true"}, files=[add("a.parquet")])


def _domains() -> Harness:
    return Harness(proto=DOMAINS_PROTOCOL)


def _with_txn() -> Harness:
    h = Harness()
    h.must_commit(proposal(0, [txn("q", 5)], operation="STREAMING UPDATE"))
    return h


def _nested(levels: int) -> object:
    v: object = 1
    for _ in range(levels):
        v = {"k": v}
    return v


CASES = [
    Case("other-table", "TABLE_MISMATCH", lambda h: proposal(0, [add("a.parquet")], table_id="tbl-other")),
    Case("read-version-below-minus-one", "BAD_READ_VERSION", lambda h: proposal(-2, [add("a.parquet")])),
    Case("read-version-ahead", "READ_VERSION_AHEAD", lambda h: proposal(h.head + 1, [add("a.parquet")])),
    Case("txn-id-mismatch", "TXN_ID_MISMATCH",
         lambda h: proposal(0, [add("a.parquet")], proposal_id="p-1", commit_info={"txnId": "p-2"})),
    # A writer naming other proposal ids as its version's would have them answered as duplicates, never committed.
    Case("coalesced-commits-set-by-a-writer", "TXN_ID_MISMATCH",
         lambda h: proposal(0, [add("a.parquet")], proposal_id="p-1",
                            commit_info={"txnId": "p-1", "coalescedCommits": [{"txnId": "victim"}]})),
    Case("commit-info-nested-17-deep", "COMMIT_INFO_TOO_DEEP",
         lambda h: proposal(0, [add("a.parquet")], proposal_id="p-1", commit_info={"txnId": "p-1", "x": _nested(16)})),
    Case("commit-info-over-64k", "COMMIT_INFO_TOO_LARGE",
         lambda h: proposal(0, [add("a.parquet")], proposal_id="p-1", commit_info={"txnId": "p-1", "x": "y" * 70_000})),
    Case("predicate-nested-65-deep", "BAD_PREDICATE",
         lambda h: proposal(0, [add("a.parquet")], predicates=["(" * 65 + "date = 'a'" + ")" * 65])),
    Case("65-predicates", "BAD_PREDICATE",
         lambda h: proposal(0, [add("a.parquet")], predicates=["date = 'a'"] * 65)),
    Case("empty-proposal-id", "BAD_PROPOSAL_ID", lambda h: proposal(0, [], proposal_id="", commit_info={})),
    Case("commit-info-in-actions", "COMMIT_INFO_IN_ACTIONS",
         lambda h: proposal(0, [CommitInfo({"operation": "WRITE"}), add("a.parquet")])),
    Case("not-an-action", "UNKNOWN_ACTION",
         lambda h: proposal(0, [FileRead("a.parquet")])),  # type: ignore[list-item]
    Case("two-metadata", "MULTIPLE_METADATA", lambda h: proposal(0, [metadata(), metadata()])),
    Case("two-protocols", "MULTIPLE_PROTOCOL", lambda h: proposal(0, [protocol(2, 3), protocol(1, 4)])),
    Case("reader-4", "UNSUPPORTED_PROTOCOL", lambda h: proposal(0, [protocol(4, 7)])),
    Case("writer-8", "UNSUPPORTED_PROTOCOL", lambda h: proposal(0, [protocol(3, 8)])),
    Case("writer-0", "UNSUPPORTED_PROTOCOL", lambda h: proposal(0, [Protocol(1, 0)])),
    Case("app-id-two-versions", "DUPLICATE_APP_ID", lambda h: proposal(0, [txn("app", 1), txn("app", 2)])),
    Case("domain-twice", "DUPLICATE_DOMAIN", lambda h: proposal(0, [domain("d"), domain("d", "{}", True)]), _domains),
    Case("domain-without-feature", "MISSING_TABLE_FEATURE", lambda h: proposal(0, [domain("app.cfg")])),
    Case("add-twice", "DUPLICATE_FILE_ACTION", lambda h: proposal(0, [add("a.parquet"), add("a.parquet")])),
    Case("remove-twice", "DUPLICATE_FILE_ACTION", lambda h: proposal(0, [remove("a.parquet"), remove("a.parquet")])),
    Case("add-twice-same-dv", "DUPLICATE_FILE_ACTION",
         lambda h: proposal(0, [add("a.parquet", dv="x"), add("a.parquet", dv="x")])),
    Case("add-and-remove-same-key", "ADD_AND_REMOVE_SAME_FILE",
         lambda h: proposal(0, [remove("a.parquet"), add("a.parquet")])),
    Case("negative-add-size", "NEGATIVE_SIZE",
         lambda h: proposal(0, [AddFile("a.parquet", {}, -1, NOW, True)])),
    # Stats Delta readers cannot parse (delta-rs: "Kernel error: Json error" for the whole table).
    *(Case(f"bad-stats-{name}", "BAD_STATS",
           lambda h, s=stats: proposal(0, [AddFile("a.parquet", {}, 1, NOW, True, stats=s)]))  # type: ignore[misc]
      for name, stats in [
          ("empty", ""), ("not-json", "{{{{not json"), ("float-count", '{"numRecords":1e308}'),
          ("string-count", '{"numRecords":"1"}'), ("negative-count", '{"numRecords":-1}'),
          ("huge-count", '{"numRecords":9223372036854775808}'), ("array", "[1]"), ("nan", '{"numRecords":NaN}'),
          ("infinite-max", '{"numRecords":1,"maxValues":{"x":1e999}}'), ("min-not-object", '{"minValues":3}'),
          ("null-count-float", '{"nullCount":{"x":0.5}}'), ("nested-null-count", '{"nullCount":{"s":{"a":-2}}}'),
          ("tight-bounds", '{"tightBounds":"yes"}'), ("list-value", '{"maxValues":{"x":[1]}}'),
      ]),
    Case("dotdot", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("../other/a.parquet")])),
    Case("dotdot-inside", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("x/../../a.parquet")])),
    Case("dotdot-encoded", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("x/%2E%2E/%2e%2e/a.parquet")])),
    Case("absolute-outside", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("/etc/passwd")])),
    Case("other-bucket", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("s3://other/warehouse/orders/a.parquet")])),
    Case("sibling-prefix", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("s3://lake/warehouse/orders2/a.parquet")])),
    Case("absolute-with-dotdot", "PATH_ESCAPES_TABLE",
         lambda h: proposal(0, [add("s3://lake/warehouse/orders/../secrets/a.parquet")])),
    Case("other-scheme", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("hdfs://nn/warehouse/orders/a.parquet")])),
    Case("into-delta-log", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("_delta_log/00000000000000000009.json")])),
    Case("remove-escapes", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [remove("../x.parquet")])),
    Case("empty-path", "PATH_ESCAPES_TABLE", lambda h: proposal(0, [add("")])),
    Case("newline-in-path", "BAD_FILE_PATH", lambda h: proposal(0, [add("ctl\nline.parquet")])),
    Case("partition-values-missing", "PARTITION_VALUES_MISMATCH", lambda h: proposal(0, [add("a.parquet")]), _dated),
    Case("partition-values-extra", "PARTITION_VALUES_MISMATCH",
         lambda h: proposal(0, [add("a.parquet", date="2024-01-01", country="US")]), _dated),
    Case("partition-values-on-unpartitioned", "PARTITION_VALUES_MISMATCH",
         lambda h: proposal(0, [add("a.parquet", date="2024-01-01")])),
    # Partition values a reader parses for every scan (delta-rs, Spark fail the table's reads on one that is not).
    *(Case(f"partition-value-{name}", "PARTITION_VALUES_MISMATCH",
           lambda h, c=col, v=value: proposal(0, [add("a.parquet", **{c: v})]),  # type: ignore[misc]
           lambda c=col: Harness((c,), md=metadata((c,), columns=TYPED)))  # type: ignore[misc]
      for name, col, value in [
          ("date-text", "d", "yesterday"), ("date-month-13", "d", "2024-13-01"), ("long-text", "n", "12x"),
          ("int-overflow", "i", "2147483648"), ("byte-overflow", "b", "128"), ("long-spaces", "n", " 5"),
          ("double-text", "x", "one"), ("decimal-scale", "m", "1.234"), ("decimal-digits", "m", "123456789"),
          ("timestamp-text", "ts", "noon"), ("boolean-yes", "flag", "yes"),
      ]),
    # Deletion-vector descriptors a reader cannot read.
    *(Case(f"dv-{name}", "BAD_DELETION_VECTOR",
           lambda h, d=dv: proposal(0, [AddFile("a.parquet", {}, 1, NOW, True, deletion_vector=d)]))  # type: ignore[misc]
      for name, dv in [
          ("storage-type", DeletionVector("x", dv_id("a"), 40, 3)),
          ("u-not-z85", DeletionVector("u", "ab" + "~" * 20, 40, 3)),
          ("u-too-short", DeletionVector("u", "dv-a", 40, 3)),
          ("negative-size", DeletionVector("u", dv_id("a"), -1, 3)),
          ("negative-cardinality", DeletionVector("u", dv_id("a"), 40, -3)),
          ("negative-offset", DeletionVector("u", dv_id("a"), 40, 3, offset=-1)),
          ("inline-not-z85", DeletionVector("i", "~~~~~", 5, 1)),
          ("inline-with-offset", DeletionVector("i", "00000", 5, 1, offset=1)),
          ("path-outside", DeletionVector("p", "s3://other/dv.bin", 40, 3, offset=1)),
          ("path-empty", DeletionVector("p", "", 40, 3, offset=1)),
      ]),
    Case("isolation-level-bogus", "BAD_ISOLATION_LEVEL",
         lambda h: proposal(0, [metadata(isolation="SnapshotIsolation")], changes_data=False)),
    Case("isolation-level-case", "BAD_ISOLATION_LEVEL",
         lambda h: proposal(0, [metadata(isolation="serializable")], changes_data=False)),
    Case("conflict-profile-bogus", "BAD_CONFLICT_PROFILE",
         lambda h: proposal(0, [metadata().__class__(id="m", schema_string=metadata().schema_string,
                                                     configuration={"deltacoord.conflictProfile": "oracle"})],
                            changes_data=False)),
    Case("coalesce-bogus", "BAD_TABLE_PROPERTY",
         lambda h: proposal(0, [metadata(config={"deltacoord.coalesce": "yes"})], changes_data=False)),
    Case("schema-not-json", "BAD_SCHEMA",
         lambda h: proposal(0, [metadata().__class__(id="m", schema_string="{not json", partition_columns=("a",))])),
    Case("partition-column-not-in-schema", "BAD_SCHEMA", lambda h: proposal(0, [metadata(("nope",))])),
    Case("append-only", "APPEND_ONLY", lambda h: proposal(1, [remove("a.parquet")]), _append_only),
    Case("bad-predicate", "BAD_PREDICATE", lambda h: proposal(0, [], predicates=["date >"]), _dated),
    Case("create-without-metadata", "MISSING_METADATA",
         lambda h: proposal(-1, [protocol()]), lambda: _empty_harness()),
    Case("create-without-protocol", "MISSING_PROTOCOL",
         lambda h: proposal(-1, [metadata()]), lambda: _empty_harness()),
    Case("unknown-table", "UNKNOWN_TABLE", lambda h: proposal(0, [add("a.parquet")]), lambda: _empty_harness()),
    Case("stale-txn-equal", "STALE_TXN_VERSION", lambda h: proposal(h.head, [txn("q", 5)]), _with_txn),
    Case("partition-values-not-a-map", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [AddFile("a.parquet", None, 1, NOW, True)])),  # type: ignore[arg-type]
    Case("stale-txn-lower", "STALE_TXN_VERSION", lambda h: proposal(h.head, [txn("q", 2)]), _with_txn),
    # A remove's fields as the rules read them (a plain remove is checked on a fast path: these must leave it).
    Case("remove-path-not-a-string", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), path=7)])),
    Case("remove-size-a-boolean", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), size=True)])),
    Case("remove-size-a-string", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), size="1")])),
    Case("remove-data-change-not-a-boolean", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), data_change=1)])),
    Case("remove-partition-value-not-a-string", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), partition_values={"date": 1})])),
    Case("remove-partition-values-not-a-map", "MALFORMED_PROPOSAL",
         lambda h: proposal(0, [replace(remove("a.parquet"), partition_values=["date"])])),
]


def _empty_harness() -> Harness:
    h = Harness.__new__(Harness)
    h.state = TableState.empty(TABLE_ID, TABLE_URI)
    h.clock = NOW
    return h


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reason_codes(case: Case) -> None:
    h = case.harness()
    p = case.build(h)
    before = h.state.version
    r = decide(h.state, p, NOW)
    assert isinstance(r, Rejected), f"{case.id}: expected {case.reason}, got {r}"
    assert isinstance(r.error, InvalidProposalError)
    assert r.error.reason == case.reason, str(r.error)
    assert r.reason == case.reason and r.winning_version is None
    assert not r.retryable
    assert str(r.error).startswith(case.reason + ": ")
    assert h.state.version == before


@pytest.mark.parametrize("stats", [
    None, "{}", '{"numRecords":0}', '{"numRecords":3,"minValues":{"id":1,"s":{"a":"x"},"f":-1.5e300,"b":true},'
    '"maxValues":{"id":3,"d":"2024-01-01"},"nullCount":{"id":0,"s":{"a":1}},"tightBounds":false}',
    '{"numRecords":1,"minValues":{"x":null},"futureKey":[1,2]}',
])
def test_stats_delta_readers_parse_are_accepted(stats: str | None) -> None:
    h = Harness()
    validate_proposal(h.state, proposal(0, [AddFile("a.parquet", {}, 1, NOW, True, stats=stats)]))


@pytest.mark.parametrize(("col", "value"), [
    ("d", "2024-02-29"), ("n", "-9223372036854775808"), ("i", "2147483647"), ("b", "-128"), ("x", "1.0E10"),
    ("x", "NaN"), ("x", "-Infinity"), ("m", "10.50"), ("m", "-99999999.99"), ("m", "1E+1"),
    ("ts", "2024-01-01 00:00:00"), ("ts", "2024-01-01 00:00:00.123456"), ("ts", "2024-01-01T00:00:00.000000Z"),
    ("flag", "true"), ("flag", "FALSE"), ("s", " any text "), ("n", None), ("d", ""),
])
def test_partition_values_delta_writers_write_are_accepted(col: str, value: str | None) -> None:
    h = Harness((col,), md=metadata((col,), columns=TYPED))
    validate_proposal(h.state, proposal(0, [add("a.parquet", **{col: value})]))


def test_deletion_vectors_delta_writers_write_are_accepted() -> None:
    h = Harness()
    for dv in (DeletionVector("u", dv_id("ab"), 40, 3, offset=1, max_row_index=9), DeletionVector("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 6),
               DeletionVector("p", f"{TABLE_URI}/dv/x.bin", 40, 3, offset=1)):
        validate_proposal(h.state, proposal(0, [AddFile("a.parquet", {}, 1, NOW, True, deletion_vector=dv)]))


def test_every_reason_code_is_exercised() -> None:
    assert {c.reason for c in CASES} == set(REASONS)


def test_validate_raises_and_proposal_error_returns() -> None:
    h = Harness()
    bad = proposal(0, [add("../x.parquet")])
    with pytest.raises(InvalidProposalError):
        validate_proposal(h.state, bad)
    err = proposal_error(h.state, bad)
    assert err is not None and err.reason == "PATH_ESCAPES_TABLE" and "../x.parquet" in str(err)
    assert proposal_error(h.state, proposal(0, [add("ok.parquet")])) is None


# -- what is allowed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "part-00000-1b2c.c000.snappy.parquet",
        "date=2024-01-01/country=US/part-0.parquet",
        "date=2024-01-01%2012%3A00%3A00/part-0.parquet",
        "s3://lake/warehouse/orders/date=2024-01-01/abs.parquet",
        "S3://lake/warehouse/orders/abs.parquet",
        "x..y/file..parquet",
        "deletion_vector_0b1c.bin",
    ],
)
def test_paths_inside_the_table_are_allowed(path: str) -> None:
    assert path_problem(path, TABLE_URI) is None


def test_path_root_is_the_coordinators_not_the_proposals() -> None:
    """A proposal claiming a wider table_uri cannot widen what counts as inside the table."""
    h = Harness()
    p = proposal(0, [add("s3://lake/elsewhere/a.parquet")], table_uri="s3://lake")
    err = proposal_error(h.state, p)
    assert err is not None and err.reason == "PATH_ESCAPES_TABLE"


def test_file_uri_forms_are_normalised() -> None:
    assert path_problem("file:/tmp/t/a.parquet", "file:///tmp/t") is None
    assert path_problem("/tmp/t/a.parquet", "file:/tmp/t/") is None
    assert path_problem("file:///tmp/t2/a.parquet", "/tmp/t") is not None


def test_identical_set_transactions_are_allowed() -> None:
    """Spark de-duplicates identical SetTransactions (OTS 'removes duplicate SetTransactions')."""
    h = Harness()
    assert proposal_error(h.state, proposal(0, [txn("a", 1), txn("a", 1)])) is None


def test_dv_update_of_one_file_is_not_add_and_remove_of_the_same_key() -> None:
    h = Harness(files=[add("a.parquet", dv="d1")])
    p = proposal(1, [remove("a.parquet", dv="d1"), add("a.parquet", dv="d2")])
    assert proposal_error(h.state, p) is None


def test_a_file_added_and_removed_is_named_first_by_path_whether_or_not_it_has_a_deletion_vector() -> None:
    h = Harness(files=[add("a.parquet"), add("b.parquet", dv="d1"), add("c.parquet")])
    p = proposal(1, [remove("c.parquet"), add("c.parquet"), remove("b.parquet", dv="d1"), add("b.parquet", dv="d1"),
                     remove("a.parquet"), add("a.parquet", dv="d2")])
    assert str(proposal_error(h.state, p)) == (
        f"ADD_AND_REMOVE_SAME_FILE: file 'b.parquet' (dv u{dv_id('d1')}) is both added and removed")
    p = proposal(1, [remove("c.parquet"), add("c.parquet"), remove("a.parquet"), add("a.parquet", dv="d2")])
    assert str(proposal_error(h.state, p)) == "ADD_AND_REMOVE_SAME_FILE: file 'c.parquet' (dv None) is both added and removed"


def test_append_only_allows_data_change_false_removes() -> None:
    h = _append_only()
    p = proposal(1, [remove("a.parquet", data_change=False), add("b.parquet", data_change=False)],
                 operation="OPTIMIZE", changes_data=False)
    assert isinstance(decide(h.state, p, NOW), Accepted)


def test_txn_version_greater_than_recorded_is_fine() -> None:
    h = _with_txn()
    assert check_txn_versions(h.state, proposal(h.head, [txn("q", 6)])) is None
    assert check_txn_versions(h.state, proposal(h.head, [txn("new-app", 0)])) is None
    err = check_txn_versions(h.state, proposal(h.head, [txn("q", 5)]))
    assert err is not None and err.reason == "STALE_TXN_VERSION"


def test_valid_isolation_levels_and_default() -> None:
    for level in ("Serializable", "WriteSerializable"):
        h = Harness(isolation=level)
        r = decide(h.state, proposal(0, [add("a.parquet")]), NOW)
        assert isinstance(r, Accepted) and r.commit_info.values["isolationLevel"] == level
    r = decide(Harness().state, proposal(0, [add("a.parquet")]), NOW)
    assert isinstance(r, Accepted) and r.commit_info.values["isolationLevel"] == "WriteSerializable"


def test_supported_protocols() -> None:
    h = Harness()
    for reader, writer in ((1, 2), (2, 5), (3, 7)):
        p = proposal(0, [Protocol(reader, writer)], changes_data=False)
        assert proposal_error(h.state, p) is None


def test_creation_with_files_and_partitions_in_first_commit() -> None:
    """spark-OTS 'can set partition columns in first commit'."""
    st = TableState.empty(TABLE_ID, TABLE_URI)
    p = proposal(-1, [protocol(), metadata(("country",)), add("country=US/a.parquet", country="US")],
                 operation="CREATE TABLE AS SELECT")
    r = decide(st, p, NOW)
    assert isinstance(r, Accepted) and r.version == 0
    st.apply(r.version, r.actions)
    assert st.metadata is not None and st.metadata.partition_columns == ("country",)
    assert st.live_file_count == 1


def test_predicates_are_validated_against_read_time_schema() -> None:
    """A predicate typed for the read-time schema stays valid even if it would not parse against new columns."""
    h = Harness(("part",))
    assert proposal_error(h.state, proposal(0, [], predicates=["part = 3"])) is None
    err = proposal_error(h.state, proposal(0, [], predicates=["part = 'three'"]))
    assert err is not None and err.reason == "BAD_PREDICATE"


# -- table features -------------------------------------------------------------------------------------------


def test_domain_metadata_needs_the_domain_metadata_writer_feature() -> None:
    """PROTOCOL.md: domainMetadata actions only on tables whose protocol names the feature (a tombstone too);
    a commit may add the feature and use it at once; a legacy protocol never has it."""
    p = proposal(0, [domain("app.cfg")])
    gone = proposal(0, [domain("app.cfg", removed=True)])
    for proto in (protocol(), protocol(1, 6), Protocol(3, 7, ("deletionVectors",), ("appendOnly", "deletionVectors")), None):
        for q in (p, gone):
            err = domain_metadata_error(proto, q)
            assert err is not None and err.reason == "MISSING_TABLE_FEATURE", proto
            assert "app.cfg" in str(err) and "domainMetadata writer feature" in str(err)
    assert domain_metadata_error(DOMAINS_PROTOCOL, p) is None
    assert domain_metadata_error(protocol(), proposal(0, [add("a.parquet")])) is None
    h = Harness()
    assert proposal_error(h.state, proposal(0, [DOMAINS_PROTOCOL, domain("app.cfg")], changes_data=False)) is None
    err = proposal_error(h.state, p)
    assert err is not None and err.reason == "MISSING_TABLE_FEATURE"
    assert isinstance(decide(Harness(proto=DOMAINS_PROTOCOL).state, p, NOW), Accepted)


# -- control characters in action paths --------------------------------------------------------------------


@pytest.mark.parametrize(("path", "named"), [
    ("ctl\nline.parquet", "U+000A (LF, a newline) at index 3"),
    ("a\tb.parquet", "U+0009 (tab)"),
    ("date=x\r/a.parquet", "U+000D (CR)"),
    ("a\x7fb.parquet", "U+007F (DEL)"),
    ("a\x85b.parquet", "U+0085 (NEL)"),
    ("a\x9b[2J.parquet", "U+009B"),
    ("a\x00b.parquet", "U+0000 (NUL)"),
    ("a%0Ab.parquet", "percent-encoded control character, U+000A"),
    ("a%7fb.parquet", "percent-encoded control character, U+007F"),
    ("s3://lake/warehouse/orders/ctl\nline.parquet", "U+000A"),
])
def test_a_control_character_in_an_action_path_is_refused_by_its_own_code(path: str, named: str) -> None:
    h = Harness()
    for action in (add(path), remove(path), cdc(path)):
        err = proposal_error(h.state, proposal(0, [action]))
        assert err is not None and err.reason == "BAD_FILE_PATH", (action, err)
        assert named in str(err) and repr(path) in str(err)
    assert path_problem(path, TABLE_URI) is not None  # so the added-files check leaves it to validation


@pytest.mark.parametrize("path", [
    "date=a%250A/part-0.parquet",  # a partition value's newline, Hive-escaped then URI-encoded (Delta, Spark)
    "nel%C2%85line.parquet",  # a C1 control percent-encoded, as Spark's URI encoding writes one
    "caf%C3%A9/\u00e9t\u00e9\u00a0x.parquet",  # non-ASCII text, even a no-break space, is not a control
])
def test_encoded_or_printable_paths_are_not_control_characters(path: str) -> None:
    h = Harness()
    assert proposal_error(h.state, proposal(0, [add(path)])) is None


# -- a large commit's paths, scanned at once ----------------------------------------------------------------

#: Every path a commit may not hold, and the allowed ones that the one scan of a large commit hands to `path_problem`.
_REFUSED_PATHS = ["../other/a.parquet", "x/../../a.parquet", "x/%2E%2E/%2e%2e/a.parquet", "/etc/passwd",
                  "s3://other/warehouse/orders/a.parquet", "s3://lake/warehouse/orders2/a.parquet",
                  "_delta_log/00000000000000000009.json", "", "ctl\nline.parquet", "a\x85b.parquet", "a%0Ab.parquet",
                  "x\\..\\..\\a.parquet", "%5Fdelta_log/x.json"]
_ALLOWED_PATHS = ["date=2024-01-01%2012%3A00%3A00/part-0.parquet", "s3://lake/warehouse/orders/date=2024-01-01/a.parquet",
                  "x..y/file..parquet", "nel%C2%85line.parquet", "a//b.parquet", "dir/", "x_delta_log/a.parquet"]


@pytest.mark.parametrize("kind", ["add", "remove", "cdc"])
@pytest.mark.parametrize("at", [0, 150, 299])
def test_a_large_commit_refuses_each_path_as_a_commit_of_one_file_does(kind: str, at: int) -> None:
    """A commit of hundreds of files has its paths scanned at once (`plain_relative_paths`): wherever a bad path sits,
    the refusal is the one the file alone gets, reason and message."""
    h = Harness()
    make = {"add": add, "remove": remove, "cdc": cdc}[kind]
    for bad in _REFUSED_PATHS:
        alone = proposal_error(h.state, proposal(0, [make(bad)]))
        assert alone is not None, bad
        actions = [make(f"part-{i:05d}.parquet") for i in range(300)]
        actions[at] = make(bad)
        err = proposal_error(h.state, proposal(0, actions))
        assert err is not None and (err.reason, str(err)) == (alone.reason, str(alone)), bad
        # One file among many other actions: its path alone is scanned.
        err = proposal_error(h.state, proposal(0, [*(txn(f"app-{i}", 1) for i in range(100)), make(bad)]))
        assert err is not None and (err.reason, str(err)) == (alone.reason, str(alone)), bad
    for good in _ALLOWED_PATHS:
        assert proposal_error(h.state, proposal(0, [make(good)])) is None, good
        actions = [make(f"part-{i:05d}.parquet") for i in range(300)]
        actions[at] = make(good)
        assert proposal_error(h.state, proposal(0, actions)) is None, good


@pytest.mark.parametrize("pv", [None, {}, {"date": "2024-01-01"}, {"date": None}])
def test_a_plain_remove_is_accepted_with_or_without_partition_values(pv: dict[str, str | None] | None) -> None:
    h = Harness(("date",), files=[add("a.parquet", date="2024-01-01")])
    h.must_commit(proposal(h.head, [replace(remove("a.parquet"), partition_values=pv, size=None)]))
    assert h.state.live_file_count == 0


@pytest.mark.parametrize("slice_paths", [1, 2, 3, 1000])
def test_paths_scanned_a_slice_at_a_time_answer_as_one_scan(slice_paths: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plain_relative_paths` joins a slice of paths at a time (a million paths are never one string): a mark that
    one join of them all would hold across two paths (`//`, `/_delta_log`) is still seen at a slice's edge."""
    import deltacoord.coordinator.rules.validate as mod

    monkeypatch.setattr(mod, "PATHS_SLICE", slice_paths)
    plain = [f"part-{i}.parquet" for i in range(6)]
    assert plain_relative_paths(plain) and plain_relative_paths(iter(plain))
    assert not plain_relative_paths([])
    for bad in ["", "dir/", "/abs.parquet", "_delta_log/x.json", "a%20b.parquet", "x..y", "c:d", "a\\b", "a\nb"]:
        for at in range(len(plain) + 1):
            assert not plain_relative_paths([*plain[:at], bad, *plain[at:]]), (bad, at)
