"""Conflict scenarios ported from Delta Spark and delta-rs tests, in this project's words and data.

Sources (each scenario's `src` names one):
* spark-OTS: delta-io/delta OptimisticTransactionSuite (+ its legacy `check(...)` cases and the
  dynamic-partition-overwrite cases);
* spark-CC: delta-io/delta ConflictChecker.scala / OptimisticTransaction.scala behaviour as
  summarised in /work/shared/notes/delta-semantics.md (check order, downgrade, blind appends);
* rs-CC: delta-io/delta-rs crates/core/src/kernel/transaction/conflict_checker.rs tests.
Where delta-rs and Delta Spark disagree we follow Delta Spark and say so (`DIVERGES from delta-rs`).
Where this engine deliberately deviates from Delta Spark the scenario says `DEVIATION`.

Each scenario: a table (partitioning, isolation, seed files at v1), commits that win the race
(applied as another engine wrote them, with the given commitInfo), then the current
transaction, read at the version before the winners, is decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from deltacoord.coordinator.rules.checked import can_downgrade_to_snapshot_isolation
from deltacoord.coordinator.rules.conflicts import check, decide
from deltacoord.coordinator.rules.outcomes import Accepted, Duplicate, Rejected
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, DomainMetadata, Metadata, Protocol, SetTransaction
from deltacoord.schemas.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    InvalidProposalError,
    MetadataChangedException,
    ProtocolChangedException,
)
from deltacoord.schemas.messages import FileRead
from deltacoord.schemas.properties import SNAPSHOT_ISOLATION
from tests.unit.builders import (
    DOMAINS_PROTOCOL,
    NOW,
    TABLE_ID,
    TABLE_URI,
    Harness,
    add,
    cdc,
    domain,
    metadata,
    proposal,
    protocol,
    removal_of,
    remove,
    txn,
)

S, WS = "Serializable", "WriteSerializable"
ANY = object()  # "do not check"


@dataclass
class W:
    """A winning commit, as written by some other engine."""

    actions: tuple[Action, ...]
    op: str | None = "WRITE"
    blind: bool | None = False
    with_commit_info: bool = True


def w(*actions: Action, op: str | None = "WRITE", blind: bool | None = False, ci: bool = True) -> W:
    return W(tuple(actions), op, blind, ci)


@dataclass
class Sc:
    id: str
    src: str
    doc: str
    winners: list[W]
    current: dict[str, Any]
    expect: type[Exception] | None
    partition_by: tuple[str, ...] = ()
    isolation: str | None = None
    setup: tuple[AddFile, ...] = ()
    md: Metadata | None = None
    hint: Any = ANY
    winning_version: Any = ANY
    winning_op: Any = ANY
    message: str | None = None
    level: str | None = None  # isolationLevel recorded when accepted
    extra: dict[str, Any] = field(default_factory=dict)


# -- files used across scenarios --------------------------------------------------------------------------
A = add("a.parquet")
B = add("b.parquet")
X1 = add("x=1/a.parquet", x=1)
X2 = add("x=2/a.parquet", x=2)
D1 = add("date=2024-01-01/f1.parquet", date="2024-01-01")
D2 = add("date=2024-01-02/f2.parquet", date="2024-01-02")
SMALL = add("small.parquet", stats='{"numRecords":5,"minValues":{"amount":1},"maxValues":{"amount":10}}')
BIG = add("big.parquet", stats='{"numRecords":5,"minValues":{"amount":100},"maxValues":{"amount":10000}}')


def dml(*actions: Action, preds: tuple[str, ...] = (), files: tuple[AddFile, ...] = (), op: str = "DELETE", **kw: Any) -> dict[str, Any]:
    return {"actions": actions, "predicates": preds, "read_files": files, "operation": op, **kw}


SCENARIOS: list[Sc] = [
    # ------------------------------------------------------------------ Delta Spark OptimisticTransactionSuite
    Sc("ots-append-append", "spark-OTS 'append / append'", "two blind appends never conflict",
       [w(add("w.parquet"), blind=True)], {"actions": (add("c.parquet"),)}, None, isolation=S),
    Sc("ots-disjoint-txns", "spark-OTS 'disjoint txns'", "reading app id t1 is unaffected by a winner writing t2",
       [w(txn("t2", 0))], {"actions": (), "app_ids": ("t1",)}, None, isolation=S),
    Sc("ots-disjoint-delete-read", "spark-OTS 'disjoint delete / read'",
       "the winner deletes a file in x=2, the txn read only x=1",
       [w(removal_of(X2))], {"actions": (), "predicates": ("x = 1",)}, None,
       partition_by=("x",), isolation=S, setup=(X2,)),
    Sc("ots-disjoint-add-read", "spark-OTS 'disjoint add / read'",
       "the winner appends to x=2; the txn read and writes x=1",
       [w(add("x=2/w.parquet", x=2), op="TRUNCATE", blind=True)],
       {"actions": (add("x=1/c.parquet", x=1),), "predicates": ("x = 1",)}, None, partition_by=("x",), isolation=S),
    Sc("ots-delete-delete", "spark-OTS 'delete / delete'", "both delete file a",
       [w(removal_of(A), op="DELETE")], {"actions": (removal_of(A),)}, ConcurrentDeleteDeleteException,
       setup=(A,), isolation=S, winning_version=2, winning_op="DELETE"),
    Sc("ots-add-read-write", "spark-OTS 'add / read + write'",
       "the winner (TRUNCATE, blind) adds to x=1 which the txn read and writes; Serializable",
       [w(add("x=1/w.parquet", x=1), op="TRUNCATE", blind=True)],
       {"actions": (add("x=1/c.parquet", x=1),), "predicates": ("x = 1",)}, ConcurrentAppendException,
       partition_by=("x",), isolation=S, hint="[x=1]", winning_version=1, winning_op="TRUNCATE",
       message="TRUNCATE committed at version 1"),
    Sc("ots-add-read-no-write", "spark-OTS 'add / read + no write'",
       "same, but the txn writes nothing: empty txn at Serializable is downgraded to SnapshotIsolation",
       [w(add("x=1/w.parquet", x=1), op="TRUNCATE", blind=True)],
       {"actions": (), "predicates": ("x = 1",)}, None, partition_by=("x",), isolation=S, level=SNAPSHOT_ISOLATION),
    Sc("ots-two-reads-one-write", "spark-OTS 'add in part=2 / read from part=1,2 and write to part=1'",
       "two recorded predicates x=1 and x=2; a winner file in x=1 conflicts although the txn writes x=2",
       [w(add("x=1/w.parquet", x=1), blind=True)],
       {"actions": (add("x=2/c.parquet", x=2),), "predicates": ("x = 1", "x = 2")}, ConcurrentAppendException,
       partition_by=("x",), isolation=S, hint="[x=1]"),
    Sc("ots-delete-read", "spark-OTS 'delete / read'", "the winner deletes a file the txn read in x=1",
       [w(removal_of(X1), op="TRUNCATE")],
       {"actions": (), "predicates": ("x = 1",), "read_files": (X1,)}, ConcurrentDeleteReadException,
       partition_by=("x",), isolation=S, setup=(X1,), hint="[x=1]", winning_version=2, winning_op="TRUNCATE"),
    Sc("ots-schema-change", "spark-OTS 'schema change'", "a winner metaData fails the txn",
       [w(metadata(columns={"order_id": "long", "note": "string"}), op="ADD COLUMNS")],
       {"actions": ()}, MetadataChangedException, isolation=S, winning_op="ADD COLUMNS"),
    Sc("ots-conflicting-txns", "spark-OTS 'conflicting txns'", "the txn read app id t1 and the winner wrote t1",
       [w(txn("t1", 0), op="STREAMING UPDATE")], {"actions": (), "app_ids": ("t1",)}, ConcurrentTransactionException,
       isolation=S),
    Sc("ots-upgrade-upgrade", "spark-OTS 'upgrade / upgrade'", "both change the protocol",
       [w(protocol(1, 3), op="UPGRADE PROTOCOL")], {"actions": (protocol(1, 3),), "changes_data": False},
       ProtocolChangedException, isolation=S),
    Sc("ots-taint-whole-table", "spark-OTS 'taint whole table'",
       "readWholeTable disallows any concurrent append, even one disjoint from the earlier filter",
       [w(add("x=3/w.parquet", x=3))],
       {"actions": (add("x=4/c.parquet", x=4),), "predicates": ("x = 1",), "whole_table": True},
       ConcurrentAppendException, partition_by=("x",), isolation=S, setup=(X2,), hint="[x=3]"),
    Sc("ots-taint-whole-table-remove", "spark-OTS 'taint whole table + concurrent remove'",
       "readWholeTable disallows any concurrent remove",
       [w(removal_of(A), op="DELETE")], {"actions": (add("b.parquet"),), "whole_table": True},
       ConcurrentDeleteReadException, isolation=S, setup=(A,), hint=None),
    Sc("ots-dpo-append-same-partition", "spark-OTS dynamic partition overwrite 'concurrent append in same partition'",
       "DPO records a predicate on part=0 (no read files) and replaces part=0; the winner appends to part=0",
       [w(add("part=0/y.parquet", part=0), op="Manual Update")],
       {"actions": (removal_of(add("part=0/a.parquet", part=0)), add("part=0/x.parquet", part=0)),
        "predicates": ("part = 0",), "operation": "WRITE"},
       ConcurrentAppendException, partition_by=("part",),
       setup=(add("part=0/a.parquet", part=0), add("part=1/b.parquet", part=1)),
       hint="[part=0]", winning_version=2, winning_op="Manual Update"),
    Sc("ots-dpo-append-other-partition", "spark-OTS DPO 'concurrent append in different partition'",
       "the winner appends to part=1 only",
       [w(add("part=1/y.parquet", part=1), op="Manual Update")],
       {"actions": (removal_of(add("part=0/a.parquet", part=0)), add("part=0/x.parquet", part=0)),
        "predicates": ("part = 0",)},
       None, partition_by=("part",), setup=(add("part=0/a.parquet", part=0), add("part=1/b.parquet", part=1))),
    Sc("ots-dpo-delete-same-partition", "spark-OTS DPO 'concurrent delete in same partition'",
       "the winner deletes the part=0 file the DPO replaces: delete-delete (the DPO did not record read files)",
       [w(removal_of(add("part=0/a.parquet", part=0)), op="Manual Update")],
       {"actions": (removal_of(add("part=0/a.parquet", part=0)), add("part=0/x.parquet", part=0)),
        "predicates": ("part = 0",)},
       ConcurrentDeleteDeleteException, partition_by=("part",),
       setup=(add("part=0/a.parquet", part=0), add("part=1/b.parquet", part=1)), hint="[part=0]", winning_version=2),
    Sc("ots-dpo-delete-other-partition", "spark-OTS DPO 'concurrent delete in different partition'",
       "the winner deletes the part=1 file",
       [w(removal_of(add("part=1/b.parquet", part=1)), op="Manual Update")],
       {"actions": (removal_of(add("part=0/a.parquet", part=0)), add("part=0/x.parquet", part=0)),
        "predicates": ("part = 0",)},
       None, partition_by=("part",), setup=(add("part=0/a.parquet", part=0), add("part=1/b.parquet", part=1))),
    Sc("ots-dpo-partition-column-named-partitionValues", "spark-OTS DPO with partition column [partitionValues]",
       "a partition column literally named partitionValues is an ordinary column",
       [w(AddFile("partitionValues=0/y.parquet", {"partitionValues": "0"}, 1, 1, True))],
       {"actions": (AddFile("partitionValues=0/x.parquet", {"partitionValues": "0"}, 1, 1, True),),
        "predicates": ("partitionValues = 0",)},
       ConcurrentAppendException,
       md=metadata(("partitionValues",), columns={"partitionValues": "integer", "value": "integer"}),
       hint="[partitionValues=0]"),
    Sc("ots-winning-operation-observable", "spark-OTS 'conflict event logs winningTxnOperation'",
       "the conflict names the winner's operation (TRUNCATE)",
       [w(add("x=1/a.parquet", x=1), op="TRUNCATE", blind=True)],
       {"actions": (add("x=1/b.parquet", x=1),), "predicates": ("x = 1",), "operation": "TRUNCATE"},
       ConcurrentAppendException, partition_by=("x",), isolation=S, winning_op="TRUNCATE"),
    Sc("ots-feature-enablement", "spark-OTS 'concurrent feature enablement ... should conflict'",
       "DEVIATION: any winner protocol fails the txn (Spark: only fail-concurrent features or own protocol)",
       [w(Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)), op="SET TBLPROPERTIES")],
       {"actions": (add("x=1/t.parquet", x=1),), "operation": "WRITE"}, ProtocolChangedException,
       partition_by=("x",), message="protocol version of the Delta table has been changed"),
    # ------------------------------------------------------------------ delta-rs conflict_checker tests
    Sc("rs-append-append", "rs-CC test_allowed_concurrent_actions 'append - append'", "blind appends",
       [w(add("w.parquet"), blind=True)], {"actions": (add("c.parquet"),)}, None),
    Sc("rs-disjoint-delete-read", "rs-CC 'disjoint delete - read'",
       "the winner deletes the small file; the txn read only the big one",
       [w(removal_of(SMALL))], {"actions": (), "predicates": ("amount > 10",), "read_files": (BIG,)}, None,
       setup=(SMALL, BIG)),
    Sc("rs-disjoint-add-read-stats", "rs-CC 'disjoint add - read'",
       "DIVERGES from delta-rs: delta-rs prunes the winner's file by its stats (1..10 vs amount > 10); Spark "
       "ignores stats, so on an unpartitioned table any appended file conflicts",
       [w(add("w.parquet", stats='{"numRecords":1,"minValues":{"amount":1},"maxValues":{"amount":10}}'))],
       {"actions": (removal_of(BIG), add("big2.parquet")), "predicates": ("amount > 10",), "read_files": (BIG,),
        "operation": "UPDATE"},
       ConcurrentAppendException, setup=(BIG,), hint=None),
    Sc("rs-delete-delete", "rs-CC 'delete - delete'", "both remove the same file",
       [w(removal_of(SMALL))], {"actions": (removal_of(SMALL),)}, ConcurrentDeleteDeleteException, setup=(SMALL,)),
    Sc("rs-add-read-write", "rs-CC 'add / read + write'", "a file added that the txn should have read",
       [w(add("w.parquet"))], {"actions": (add("c.parquet"),), "predicates": ("amount <= 10",)},
       ConcurrentAppendException),
    Sc("rs-delete-read", "rs-CC 'delete / read'", "the txn read a file the winner removed",
       [w(removal_of(SMALL))], {"actions": (), "predicates": ("amount <= 10",), "read_files": (SMALL,)},
       ConcurrentDeleteReadException, setup=(SMALL,)),
    Sc("rs-schema-change", "rs-CC 'schema change'", "winner metadata",
       [w(metadata())], {"actions": ()}, MetadataChangedException),
    Sc("rs-upgrade-upgrade", "rs-CC 'upgrade / upgrade'", "both write a protocol",
       [w(protocol(1, 4))], {"actions": (protocol(1, 4),), "changes_data": False}, ProtocolChangedException),
    Sc("rs-taint-whole-table", "rs-CC 'taint whole table'", "predicate matches nothing, but the whole table was read",
       [w(add("w.parquet"))], {"actions": (add("c.parquet"),), "predicates": ("amount < 0",), "whole_table": True},
       ConcurrentAppendException, setup=(SMALL,)),
    Sc("rs-taint-whole-table-remove", "rs-CC 'taint whole table + concurrent remove'", "any remove conflicts",
       [w(removal_of(SMALL))], {"actions": (add("c.parquet"),), "whole_table": True},
       ConcurrentDeleteReadException, setup=(SMALL,)),
    Sc("rs-optimize-with-datachange-add-not-downgraded", "rs-CC test_can_downgrade_to_snapshot_isolation",
       "an OPTIMIZE whose add has dataChange=true is not downgraded (recorded at the table level)",
       [], {"actions": (add("o.parquet"),), "operation": "OPTIMIZE", "changes_data": False}, None, level=WS),
    Sc("rs-diverge-delete-read-datachange-false", "rs-CC check_for_deleted_files_against_current_txn_read_files",
       "DIVERGES from delta-rs (which ignores dataChange=false removes): Spark counts every remove",
       [w(removal_of(SMALL, data_change=False), add("compact.parquet", data_change=False), op="OPTIMIZE")],
       {"actions": (), "read_files": (SMALL,), "predicates": ("true",), "changes_data": False},
       ConcurrentDeleteReadException, setup=(SMALL,), winning_op="OPTIMIZE"),
    Sc("rs-diverge-app-id-written-not-read", "rs-CC check_for_updated_application_transaction_ids",
       "DIVERGES from delta-rs (which treats written app ids as read): Spark only checks ids the txn read; "
       "the txn's version 6 is newer than the winner's 5, so it commits",
       [w(txn("sink", 5), add("w.parquet"), op="STREAMING UPDATE")],
       {"actions": (txn("sink", 6), add("c.parquet")), "operation": "STREAMING UPDATE"}, None),
    Sc("rs-diverge-predicate-less-append", "rs-CC TransactionInfo read files",
       "DIVERGES from delta-rs (a predicate-less txn reads all files there): a blind append survives a delete",
       [w(removal_of(SMALL), op="DELETE")], {"actions": (add("c.parquet"),)}, None, setup=(SMALL,)),
    Sc("rs-diverge-downgrade-on-own-actions", "rs-CC can_downgrade_to_snapshot_isolation call site",
       "DIVERGES from delta-rs (which evaluates the winner's actions): the downgrade looks at the txn's own "
       "actions, so an OPTIMIZE ignores a winner's data-changing append",
       [w(add("w.parquet"), op="MERGE")],
       {"actions": (removal_of(SMALL, False), add("o.parquet", data_change=False)), "read_files": (SMALL,),
        "predicates": ("true",), "operation": "OPTIMIZE", "changes_data": False},
       None, setup=(SMALL,), level=SNAPSHOT_ISOLATION),
    # ------------------------------------------------------------------ check order (spark-CC checkConflicts)
    Sc("cc-order-protocol-before-metadata", "spark-CC checkConflicts order",
       "a winner with protocol and metaData reports ProtocolChanged",
       [w(protocol(1, 3), metadata(), op="ALTER")], {"actions": (metadata(),), "changes_data": False},
       ProtocolChangedException),
    Sc("cc-order-metadata-before-domain", "spark-CC checkConflicts order", "metaData before domain metadata",
       [w(metadata(), domain("app.cfg"))], {"actions": (domain("app.cfg"),), "changes_data": False},
       MetadataChangedException),
    Sc("cc-order-domain-before-app-ids", "spark-CC checkConflicts order", "domain metadata before app ids",
       [w(domain("app.cfg"), txn("t1", 3))], {"actions": (domain("app.cfg"),), "app_ids": ("t1",)},
       ConcurrentTransactionException, message="A conflicting metadata domain app.cfg is added."),
    Sc("cc-order-app-ids-before-appends", "spark-CC checkConflicts order", "app ids before appends",
       [w(txn("t1", 3), add("w.parquet"))], {"actions": (add("c.parquet"),), "app_ids": ("t1",), "predicates": ("true",)},
       ConcurrentTransactionException),
    Sc("cc-order-appends-before-delete-read", "spark-CC checkConflicts order",
       "a winner that adds a matching file and removes a read file reports the append",
       [w(removal_of(SMALL), add("w.parquet"), op="UPDATE")],
       dml(removal_of(SMALL), preds=("amount > 1",), files=(SMALL,)), ConcurrentAppendException, setup=(SMALL,)),
    Sc("cc-order-delete-read-before-delete-delete", "spark-CC checkConflicts order",
       "a winner removing a file the txn both read and removes reports delete-read",
       [w(removal_of(SMALL), op="DELETE")], dml(removal_of(SMALL), files=(SMALL,), preds=("amount > 1",)),
       ConcurrentDeleteReadException, setup=(SMALL,)),
    Sc("cc-first-failing-winner-reported", "spark-CC resolveConflicts (one checker per winner, in order)",
       "winners v2 (harmless), v3 and v4 (both conflicting): v3 is reported",
       [w(txn("other", 1)), w(add("w3.parquet")), w(add("w4.parquet"))],
       dml(removal_of(SMALL), preds=("amount > 1",), files=(SMALL,)), ConcurrentAppendException,
       setup=(SMALL,), winning_version=3),
    Sc("cc-all-winners-disjoint", "spark-CC resolveConflicts", "three disjoint winners: commit at head+1",
       [w(add("date=2024-01-02/w1.parquet", date="2024-01-02")), w(txn("t9", 1)), w(removal_of(D2))],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), None,
       partition_by=("date",), setup=(D1, D2), extra={"version": 5}),
    # ------------------------------------------------------------------ domain metadata
    Sc("cc-domain-same", "spark-CC checkIfDomainMetadataConflict", "both write domain app.cfg",
       [w(domain("app.cfg", '{"v":1}'))], {"actions": (domain("app.cfg", '{"v":2}'),), "changes_data": False},
       ConcurrentTransactionException, message="A conflicting metadata domain app.cfg is added."),
    Sc("cc-domain-different", "spark-CC checkIfDomainMetadataConflict", "different domains do not conflict",
       [w(domain("app.one"))], {"actions": (domain("app.two"),), "changes_data": False}, None),
    Sc("cc-domain-row-tracking", "spark-CC checkIfDomainMetadataConflict (delta.rowTracking excepted)",
       "DEVIATION on a table without the rowTracking feature (with it the coordinator assigns row ids, "
       "test_row_ids): two row-id assignments are a retryable "
       "ConcurrentWriteException",
       [w(domain("delta.rowTracking", '{"rowIdHighWaterMark":10}'), add("w.parquet"))],
       {"actions": (domain("delta.rowTracking", '{"rowIdHighWaterMark":12}'), add("c.parquet"))},
       ConcurrentWriteException),
    # ------------------------------------------------------------------ blind appends and isolation
    Sc("cc-ws-ignores-blind-winner", "spark-CC checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn",
       "WriteSerializable: a blind-append winner never conflicts",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), blind=True)],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), None,
       partition_by=("date",), isolation=WS, setup=(D1,), level=WS),
    Sc("cc-serializable-counts-blind-winner", "spark-CC appends", "Serializable: blind-append adds count",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), blind=True)],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), isolation=S, setup=(D1,), hint="[date=2024-01-01]"),
    Sc("cc-ws-metadata-txn-counts-blind-winner", "spark-CC appends (WriteSerializable if metadataChanged)",
       "WriteSerializable, but the txn changes metadata: blind-append adds count",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), blind=True)],
       dml(metadata(("date",), isolation=WS, config={"app.owner": "x"}), removal_of(D1),
           preds=("date = '2024-01-01'",), files=(D1,)),
       ConcurrentAppendException, partition_by=("date",), isolation=WS, setup=(D1,)),
    Sc("cc-winner-without-commit-info", "spark-CC WinningCommitSummary (missing commitInfo => not blind)",
       "a winner with no commitInfo counts as a non-blind append; its operation shows as TRANSACTION",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), ci=False)],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), isolation=WS, setup=(D1,), winning_op=None, message="TRANSACTION committed"),
    Sc("cc-winner-without-blind-flag", "spark-CC isBlindAppend missing => false",
       "a commitInfo without isBlindAppend is not blind",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), blind=None)],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), isolation=WS, setup=(D1,)),
    Sc("cc-optimize-output-is-an-append", "spark-CC changedDataAddedFiles (dataChange not consulted)",
       "an OPTIMIZE winner's dataChange=false output conflicts with a DELETE reading that partition",
       [w(removal_of(add("date=2024-01-01/old.parquet", date="2024-01-01"), False),
          add("date=2024-01-01/opt.parquet", date="2024-01-01", data_change=False), op="OPTIMIZE")],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), isolation=WS, setup=(D1, add("date=2024-01-01/old.parquet", date="2024-01-01")),
       winning_op="OPTIMIZE"),
    Sc("cc-snapshot-isolation-skips-appends", "spark-TH canDowngradeToSnapshotIsolation",
       "an OPTIMIZE (dataChange=false) is not checked for appends",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="MERGE")],
       {"actions": (removal_of(D1, False), add("date=2024-01-01/o.parquet", date="2024-01-01", data_change=False)),
        "predicates": ("date = '2024-01-01'",), "read_files": (D1,), "operation": "OPTIMIZE", "changes_data": False},
       None, partition_by=("date",), isolation=S, setup=(D1,), level=SNAPSHOT_ISOLATION),
    Sc("cc-snapshot-isolation-still-delete-read", "spark OptimizeConflictSuite behaviour via spark-CC",
       "an OPTIMIZE still loses to a DELETE of a file it compacted",
       [w(removal_of(D1), op="DELETE")],
       {"actions": (removal_of(D1, False), add("date=2024-01-01/o.parquet", date="2024-01-01", data_change=False)),
        "predicates": ("date = '2024-01-01'",), "read_files": (D1,), "operation": "OPTIMIZE", "changes_data": False},
       ConcurrentDeleteReadException, partition_by=("date",), setup=(D1,), hint="[date=2024-01-01]"),
    Sc("cc-empty-txn-ws-changes-data", "spark-TH downgrade (WriteSerializable needs !changesData)",
       "an empty DELETE at WriteSerializable is not downgraded and sees a non-blind append",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (), "predicates": ("date = '2024-01-01'",), "operation": "DELETE"}, ConcurrentAppendException,
       partition_by=("date",), isolation=WS),
    Sc("cc-empty-txn-ws-no-data-change", "spark-TH downgrade", "an empty no-data-change txn is downgraded",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (), "predicates": ("date = '2024-01-01'",), "operation": "SET TBLPROPERTIES",
        "changes_data": False}, None, partition_by=("date",), isolation=WS, level=SNAPSHOT_ISOLATION),
    Sc("cc-set-transaction-never-downgraded", "spark-TH downgrade (SetTransaction present)",
       "a streaming commit with dataChange=false files is still checked for appends",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (txn("q1", 4), add("date=2024-01-01/s.parquet", date="2024-01-01", data_change=False)),
        "predicates": ("date = '2024-01-01'",), "changes_data": False, "operation": "STREAMING UPDATE"},
       ConcurrentAppendException, partition_by=("date",), isolation=WS),
    Sc("cc-row-tracking-domain-allows-downgrade", "spark-TH downgrade (delta.rowTracking excepted)",
       "a compaction carrying only the delta.rowTracking domain is still downgraded",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (domain("delta.rowTracking", '{"rowIdHighWaterMark":3}'), removal_of(D1, False),
                    add("date=2024-01-01/o.parquet", date="2024-01-01", data_change=False)),
        "predicates": ("date = '2024-01-01'",), "read_files": (D1,), "operation": "OPTIMIZE", "changes_data": False},
       None, partition_by=("date",), isolation=WS, setup=(D1,), level=SNAPSHOT_ISOLATION),
    Sc("cc-other-domain-blocks-downgrade", "spark-TH downgrade (other domains)",
       "a compaction that also writes a user domain is not downgraded",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (domain("app.cfg"), removal_of(D1, False),
                    add("date=2024-01-01/o.parquet", date="2024-01-01", data_change=False)),
        "predicates": ("date = '2024-01-01'",), "read_files": (D1,), "operation": "OPTIMIZE", "changes_data": False},
       ConcurrentAppendException, partition_by=("date",), isolation=WS, setup=(D1,)),
    Sc("cc-cdc-file-is-no-data-change", "spark-TH downgrade (AddCDCFile.dataChange is false)",
       "a no-data-change txn writing a CDC file is downgraded",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       {"actions": (removal_of(D1, False), cdc("_change_data/c.parquet", date="2024-01-01")),
        "predicates": ("date = '2024-01-01'",), "operation": "REORG", "changes_data": False},
       None, partition_by=("date",), isolation=S, setup=(D1,), level=SNAPSHOT_ISOLATION),
    Sc("cc-winner-cdc-file-is-not-an-added-file", "spark-CC checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn",
       "a winner's change data file in the partition the txn read is no added file: no conflict",
       [w(removal_of(D2), cdc("_change_data/date=2024-01-01/c.parquet", date="2024-01-01"), op="DELETE")],
       dml(removal_of(D1), cdc("_change_data/date=2024-01-01/d.parquet", date="2024-01-01"),
           preds=("date = '2024-01-01'",), files=(D1,)),
       None, partition_by=("date",), isolation=S, setup=(D1, D2)),
    Sc("cc-winner-cdc-with-add-still-conflicts", "spark-CC checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn",
       "the winner's rewritten file (not its change data file) is what conflicts with the read partition",
       [w(removal_of(D2), add("date=2024-01-01/n.parquet", date="2024-01-01"),
          cdc("_change_data/date=2024-01-01/c.parquet", date="2024-01-01"), op="UPDATE")],
       dml(removal_of(D1), preds=("date = '2024-01-01'",), files=(D1,)),
       ConcurrentAppendException, partition_by=("date",), isolation=S, setup=(D1, D2)),
    # ------------------------------------------------------------------ partition predicate matching
    Sc("cc-partitioned-without-predicates-matches-nothing", "spark-CC getFirstFileMatchingPartitionPredicates",
       "a partitioned table and no recorded predicate: appends never match",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       dml(removal_of(D1), files=(D1,)), None, partition_by=("date",), isolation=S, setup=(D1,)),
    Sc("cc-unpartitioned-without-predicates-any-file", "spark-CC getFirstFileMatchingPartitionPredicates",
       "an unpartitioned table: a non-blind txn conflicts with any appended file, predicates or not",
       [w(add("w.parquet"), op="UPDATE")], dml(removal_of(A)), ConcurrentAppendException, isolation=S, setup=(A,),
       hint=None),
    Sc("cc-data-predicate-widened", "spark-OTX trackReadPredicates (data filters dropped)",
       "a predicate on a data column becomes TRUE: an append in any partition conflicts",
       [w(add("date=2024-01-02/w.parquet", date="2024-01-02"), op="UPDATE")],
       dml(removal_of(D1), preds=("amount > 5",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), setup=(D1,), hint="[date=2024-01-02]"),
    Sc("cc-mixed-conjunct-keeps-partition-part", "spark-OTX isPredicatePartitionColumnsOnly per conjunct",
       "date = '2024-01-01' AND amount > 5 keeps the date conjunct: a 2024-01-02 append is disjoint",
       [w(add("date=2024-01-02/w.parquet", date="2024-01-02"), op="UPDATE")],
       dml(removal_of(D1), preds=("date = '2024-01-01' AND amount > 5",), files=(D1,)), None,
       partition_by=("date",), setup=(D1,)),
    Sc("cc-or-with-data-column-widens", "spark-OTX splitConjunctivePredicates",
       "date = '2024-01-01' OR amount > 5 is one conjunct naming a data column: widened to TRUE",
       [w(add("date=2024-01-02/w.parquet", date="2024-01-02"), op="UPDATE")],
       dml(removal_of(D1), preds=("date = '2024-01-01' OR amount > 5",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), setup=(D1,)),
    Sc("cc-null-partition-not-matched-by-inequality", "SQL three-valued logic (Spark filterFileList)",
       "part <> 1 is NULL for a NULL partition value: no match",
       [w(add("part=__HIVE_DEFAULT_PARTITION__/w.parquet", part=None), op="UPDATE")],
       dml(add("part=2/c.parquet", part=2), preds=("part <> 1",)), None, partition_by=("part",)),
    Sc("cc-null-partition-is-null", "SQL three-valued logic", "part IS NULL matches a NULL partition value",
       [w(add("part=__HIVE_DEFAULT_PARTITION__/w.parquet", part=None), op="UPDATE")],
       dml(add("part=2/c.parquet", part=2), preds=("part IS NULL",)), ConcurrentAppendException,
       partition_by=("part",), hint="[part=null]"),
    Sc("cc-integer-partition-typed", "Delta partition value typing",
       "part > 9 compares numerically: '10' matches (a string compare would not)",
       [w(add("part=10/w.parquet", part=10), op="UPDATE")], dml(add("part=12/c.parquet", part=12), preds=("part > 9",)),
       ConcurrentAppendException, partition_by=("part",), hint="[part=10]"),
    Sc("cc-unparsable-partition-value", "spark-OTS 'filterFiles falls back ... when partition parsing fails'",
       "DEVIATION: a partition value that does not parse as the column type matches (conservative)",
       [w(add("part=oops/w.parquet", part="oops"), op="UPDATE")], dml(add("part=1/c.parquet", part=1), preds=("part = 1",)),
       ConcurrentAppendException, partition_by=("part",)),
    Sc("cc-timestamp-partition-normalised", "spark-OTS 'filterFiles for timestamp partitions with different formats'",
       "a partition value '2000-01-01 12:00:00' equals the literal '2000-01-01T12:00:00.000000Z'",
       [w(AddFile("ts=a/w.parquet", {"ts": "2000-01-01 12:00:00"}, 1, 1, True), op="UPDATE")],
       {"actions": (AddFile("ts=b/c.parquet", {"ts": "2000-01-01 12:00:00"}, 1, 1, True),),
        "predicates": ("ts = '2000-01-01T12:00:00.000000Z'",)},
       ConcurrentAppendException, md=metadata(("ts",), columns={"ts": "timestamp", "v": "integer"})),
    Sc("cc-column-mapping-physical-names", "PROTOCOL column mapping: partitionValues keyed by physical name",
       "a predicate on the logical name matches a file keyed by the physical name",
       [w(AddFile("d/w.parquet", {"col-7f3a": "2024-01-01"}, 1, 1, True), op="UPDATE")],
       {"actions": (AddFile("d/c.parquet", {"col-7f3a": "2024-01-01"}, 1, 1, True),),
        "predicates": ("date = '2024-01-01'",)},
       ConcurrentAppendException,
       md=metadata(("date",), physical={"date": "col-7f3a"}, config={"delta.columnMapping.mode": "name"}),
       hint="[date=2024-01-01]"),
    Sc("cc-column-names-case-insensitive", "Spark spark.sql.caseSensitive=false",
       "DATE = '2024-01-01' names the partition column date",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       dml(removal_of(D1), preds=("DATE = '2024-01-01'",), files=(D1,)), ConcurrentAppendException,
       partition_by=("date",), setup=(D1,)),
    Sc("cc-false-predicate-matches-nothing", "spark-CC (predicate evaluation)", "a FALSE read predicate reads nothing",
       [w(add("date=2024-01-01/w.parquet", date="2024-01-01"), op="UPDATE")],
       dml(add("date=2024-01-03/c.parquet", date="2024-01-03"), preds=("false",)), None, partition_by=("date",)),
    # ------------------------------------------------------------------ delete checks
    Sc("cc-delete-read-hint-from-read-file", "spark-CC checkForDeletedFilesAgainstCurrentTxnReadFiles",
       "the partition hint comes from the read file's partition values",
       [w(removal_of(D2), op="DELETE")],
       {"actions": (), "read_files": (D2,), "predicates": ("date = '2024-01-02'",), "changes_data": False},
       ConcurrentDeleteReadException, partition_by=("date",), setup=(D1, D2), hint="[date=2024-01-02]",
       winning_op="DELETE"),
    Sc("cc-delete-delete-hint-from-own-remove", "spark-CC checkForDeletedFilesAgainstCurrentTxnDeletedFiles",
       "the partition hint comes from the txn's own remove",
       [w(removal_of(D2), op="DELETE")], dml(removal_of(D2)), ConcurrentDeleteDeleteException,
       partition_by=("date",), setup=(D1, D2), hint="[date=2024-01-02]"),
    Sc("cc-dv-updates-same-path-delete-delete", "spark-CC delete-delete matches by path only",
       "two deletion-vector updates of one file (different DV ids) conflict",
       [w(removal_of(D1), add(D1.path, dv="dv-winner", date="2024-01-01"), op="DELETE")],
       dml(removal_of(D1), add(D1.path, dv="dv-current", date="2024-01-01")), ConcurrentDeleteDeleteException,
       partition_by=("date",), setup=(D1,)),
    Sc("cc-delete-read-ignores-dv-id", "spark-CC delete-read matches by path only",
       "the txn read a file whose DV the winner replaced",
       [w(removal_of(D1), add(D1.path, dv="dv-w", date="2024-01-01"), op="DELETE")],
       {"actions": (), "read_files": (D1,), "changes_data": False, "operation": "OPTIMIZE"},
       ConcurrentDeleteReadException, partition_by=("date",), setup=(D1,)),
    Sc("cc-delete-delete-datachange-false-winner", "spark-CC removedFiles (any dataChange)",
       "an OPTIMIZE winner's dataChange=false remove still collides with the txn's remove",
       [w(removal_of(D1, False), add("date=2024-01-01/o.parquet", date="2024-01-01", data_change=False),
          op="OPTIMIZE")],
       dml(removal_of(D1)), ConcurrentDeleteDeleteException, partition_by=("date",), setup=(D1,)),
    Sc("cc-removed-unread-file-ok", "spark-CC delete checks", "a winner removing a file nobody read is harmless",
       [w(removal_of(D2), op="DELETE")], dml(removal_of(D1), files=(D1,)), None, partition_by=("date",),
       setup=(D1, D2)),
    # ------------------------------------------------------------------ protocol / metadata deviations
    Sc("cc-winner-protocol-adds-feature", "spark-CC checkProtocolCompatibility",
       "DEVIATION: Spark lets a txn without a protocol action adopt a feature-adding winner; the seed "
       "documents say protocol changes fail concurrent writes, so we fail it",
       [w(Protocol(1, 7, None, ("appendOnly", "invariants", "changeDataFeed")), op="SET TBLPROPERTIES")],
       {"actions": (add("c.parquet"),)}, ProtocolChangedException),
    Sc("cc-winner-metadata-allow-listed-config", "spark-CC attemptToResolveMetadataConflicts allow-list",
       "DEVIATION: Spark allows a winner that only enables deletion vectors; we fail on any metaData "
       "(as delta-rs and Kernel do, and as the seed documents state)",
       [w(metadata(config={"delta.enableDeletionVectors": "true"}), op="SET TBLPROPERTIES")],
       {"actions": (add("c.parquet"),)}, MetadataChangedException),
]


def _writes_domains(sc: Sc) -> bool:
    actions = [*(a for win in sc.winners for a in win.actions), *sc.current.get("actions", ())]
    return any(isinstance(a, DomainMetadata) for a in actions)


def _run(sc: Sc) -> tuple[Harness, Accepted | Rejected | Duplicate, int]:
    # A table whose commits write domainMetadata declares the feature (PROTOCOL.md requires it).
    h = Harness(sc.partition_by, isolation=sc.isolation, files=sc.setup, md=sc.md,
                proto=DOMAINS_PROTOCOL if _writes_domains(sc) else None)
    rv = h.head
    for win in sc.winners:
        h.commit_raw(win.actions, operation=win.op, blind=win.blind, with_commit_info=win.with_commit_info)
    r = h.decide(proposal(rv, **sc.current))
    return h, r, rv


def test_there_are_at_least_sixty_ported_scenarios() -> None:
    assert len(SCENARIOS) >= 60
    assert len({s.id for s in SCENARIOS}) == len(SCENARIOS)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_ported_scenario(sc: Sc) -> None:
    h, r, rv = _run(sc)
    if sc.expect is None:
        assert isinstance(r, Accepted), f"{sc.src}: {sc.doc}: expected a commit, got {r}"
        assert r.version == h.head + 1
        assert r.version == sc.extra.get("version", r.version)
        if sc.level is not None:
            assert r.commit_info.values["isolationLevel"] == sc.level
        return
    assert isinstance(r, Rejected), f"{sc.src}: {sc.doc}: expected {sc.expect.__name__}, got {r}"
    assert type(r.error) is sc.expect, f"{sc.src}: expected {sc.expect.__name__}, got {r.error!r}"
    assert isinstance(r.error, DeltaConcurrentModificationException)
    assert r.winning_version is not None and rv < r.winning_version <= h.head
    assert r.error.winning_version == r.winning_version
    if sc.winning_version is not ANY:
        assert r.winning_version == sc.winning_version
    if sc.winning_op is not ANY:
        assert r.error.winning_operation == sc.winning_op
    if sc.hint is not ANY:
        assert r.error.partition == sc.hint
    if sc.message is not None:
        assert sc.message in str(r.error)


# ============================================================================================ rebase fix-ups


def test_rebase_commit_info_first_with_fixups() -> None:
    """spark-OTX commitInfo fields: the accepted commit = same actions at head+1, commitInfo first."""
    h = Harness(("date",), files=[D1])
    p = proposal(
        1,
        [removal_of(D1), add("date=2024-01-01/n.parquet", date="2024-01-01")],
        operation="DELETE",
        predicates=["date = '2024-01-01'"],
        read_files=[D1],
        operation_parameters={"predicate": '["(date = 2024-01-01)"]'},
        commit_info={"engineInfo": "spark/4.0", "userMetadata": "nightly", "isolationLevel": "bogus",
                     "readVersion": 99, "isBlindAppend": True},
    )
    h.commit_raw([add("date=2024-01-02/o.parquet", date="2024-01-02")], blind=True)
    r = h.decide(p, now_ms=NOW + 42)
    assert isinstance(r, Accepted)
    assert r.version == 3
    ci = r.actions[0]
    assert isinstance(ci, CommitInfo)
    assert r.actions[1:] == p.actions
    v = ci.values
    assert list(v)[:3] == ["timestamp", "operation", "operationParameters"]
    assert v["timestamp"] == NOW + 42
    assert v["operation"] == "DELETE"
    assert v["operationParameters"] == {"predicate": '["(date = 2024-01-01)"]'}
    assert v["readVersion"] == 1  # the proposal's read version, not the writer's claim
    assert v["isolationLevel"] == WS
    assert v["isBlindAppend"] is False
    assert v["txnId"] == p.proposal_id
    assert v["engineInfo"] == "spark/4.0" and v["userMetadata"] == "nightly"
    assert "inCommitTimestamp" not in v


def test_rebase_creation_omits_read_version_and_records_blind_append() -> None:
    st = TableState.empty(TABLE_ID, TABLE_URI)
    p = proposal(-1, [protocol(), metadata(), add("a.parquet")], operation="CREATE TABLE AS SELECT")
    r = decide(st, p, NOW)
    assert isinstance(r, Accepted) and r.version == 0
    v = r.commit_info.values
    assert "readVersion" not in v
    assert v["isBlindAppend"] is True
    assert v["isolationLevel"] == WS  # creation carries metaData: never downgraded


def test_rebase_deduplicates_identical_set_transactions() -> None:
    """spark-OTS 'removes duplicate SetTransactions'."""
    h = Harness()
    p = proposal(0, [txn("app", 1), txn("app", 1), add("a.parquet")], operation="STREAMING UPDATE")
    r = h.must_commit(p)
    txns = [a for a in r.actions if isinstance(a, SetTransaction)]
    assert txns == [txn("app", 1)]
    assert h.state.app_versions == {"app": 1}


def test_every_commit_gets_the_proposal_id_as_txn_id() -> None:
    """spark-OTS 'every transaction should use a unique identifier in the commit'."""
    h = Harness()
    a = h.must_commit(proposal(0, [], operation="MANUAL UPDATE", changes_data=False))
    b = h.must_commit(proposal(0, [], operation="MANUAL UPDATE", changes_data=False))
    assert a.commit_info.values["txnId"] != b.commit_info.values["txnId"]
    assert (a.version, b.version) == (1, 2)
    assert a.commit_info.values["isolationLevel"] == SNAPSHOT_ISOLATION


def test_isolation_level_recorded_is_never_missing() -> None:
    """spark-OTS 'isolation level shouldn't be null'."""
    h = Harness(isolation=S)
    r = h.must_commit(proposal(0, [add("a.parquet")]))
    assert r.commit_info.values["isolationLevel"] == S


# ============================================================================================ in-commit timestamps

ICT = {"delta.enableInCommitTimestamps": "true"}


def test_ict_is_now_when_clock_moves_forward() -> None:
    h = Harness(config=ICT)
    r = h.must_commit(proposal(0, [add("a.parquet")]), now_ms=NOW + 10_000)
    assert r.commit_info.values["inCommitTimestamp"] == NOW + 10_000
    assert list(r.commit_info.values)[:2] == ["timestamp", "inCommitTimestamp"]
    assert h.state.last_ict == NOW + 10_000


def test_ict_is_monotonic_when_clock_goes_back() -> None:
    """PROTOCOL ICT: inCommitTimestamp = max(now, previous ICT + 1)."""
    h = Harness(config=ICT)
    first = h.must_commit(proposal(0, [add("a.parquet")]), now_ms=NOW + 50_000)
    second = h.must_commit(proposal(1, [add("b.parquet")]), now_ms=NOW + 20_000)  # clock skew
    third = h.must_commit(proposal(2, [add("c.parquet")]), now_ms=NOW + 50_000)  # same ms as first
    assert first.commit_info.values["inCommitTimestamp"] == NOW + 50_000
    assert second.commit_info.values["inCommitTimestamp"] == NOW + 50_001
    assert third.commit_info.values["inCommitTimestamp"] == NOW + 50_002
    assert second.commit_info.values["timestamp"] == NOW + 20_000  # wall clock kept as written


def test_ict_follows_winner_ict_after_rebase() -> None:
    """spark-CC ICT: a rebased txn's ICT exceeds the winner's."""
    h = Harness(config=ICT)
    rv = h.head
    h.commit_raw([add("w.parquet")], commit_info={"inCommitTimestamp": NOW + 900_000})
    r = h.decide(proposal(rv, [add("c.parquet")]), now_ms=NOW + 1)
    assert isinstance(r, Accepted)
    assert r.commit_info.values["inCommitTimestamp"] == NOW + 900_001


def test_ict_enablement_version_and_timestamp_rewritten_to_the_real_commit() -> None:
    """spark-CC: when the txn enables ICT and was rebased, enablement version/timestamp move to the new version."""
    h = Harness()
    rv = h.head
    h.commit_raw([add("w.parquet")], commit_info={"timestamp": NOW + 5})
    h.commit_raw([add("w2.parquet")], commit_info={"timestamp": NOW + 500_000})
    enabling = metadata(config={**ICT, "delta.inCommitTimestampEnablementVersion": "1",
                                "delta.inCommitTimestampEnablementTimestamp": "123"})
    r = h.decide(proposal(rv, [enabling], operation="SET TBLPROPERTIES", changes_data=False), now_ms=NOW + 7)
    assert isinstance(r, Accepted) and r.version == 3
    ict = r.commit_info.values["inCommitTimestamp"]
    assert ict == NOW + 500_001  # after the previous commit's timestamp
    md = r.actions[1]
    assert isinstance(md, Metadata)
    assert md.configuration["delta.inCommitTimestampEnablementVersion"] == "3"
    assert md.configuration["delta.inCommitTimestampEnablementTimestamp"] == str(ict)


def test_no_ict_without_the_table_property() -> None:
    h = Harness(config={"delta.enableInCommitTimestamps": "false"})
    r = h.must_commit(proposal(0, [add("a.parquet")]))
    assert "inCommitTimestamp" not in r.commit_info.values


# ============================================================================================ redelivery / window


def test_redelivered_proposal_returns_original_version() -> None:
    h = Harness()
    p = proposal(0, [add("a.parquet")])
    first = h.must_commit(p)
    h.must_commit(proposal(1, [add("b.parquet")]))
    again = h.decide(p)
    assert again == Duplicate(first.version)
    assert h.head == 2


def test_redelivery_wins_over_validation_that_would_now_fail() -> None:
    """A streaming batch's own SetTransaction makes its redelivery 'stale'; it is still a Duplicate."""
    h = Harness()
    p = proposal(0, [txn("q", 7), add("a.parquet")], operation="STREAMING UPDATE")
    v = h.must_commit(p).version
    assert h.decide(p) == Duplicate(v)
    fresh_copy = proposal(1, [txn("q", 7), add("a2.parquet")], operation="STREAMING UPDATE")
    r = h.decide(fresh_copy)
    assert isinstance(r, Rejected) and isinstance(r.error, InvalidProposalError)
    assert r.error.reason == "STALE_TXN_VERSION"


def test_txn_index_is_bounded() -> None:
    h = Harness(txn_index_limit=3)
    ids = [h.must_commit(proposal(h.head, [add(f"f{i}.parquet")])).commit_info.values["txnId"] for i in range(5)]
    assert h.state.committed_version_of(ids[-1]) == 5
    assert h.state.committed_version_of(ids[-3]) == 3
    assert h.state.committed_version_of(ids[0]) is None  # evicted: older than the bound


def test_read_version_older_than_window_is_retryable_concurrent_write() -> None:
    h = Harness(max_window_commits=3)
    for i in range(6):
        h.must_commit(proposal(h.head, [add(f"f{i}.parquet")]))
    assert h.head == 6 and h.state.oldest_retained_version == 4
    ok = h.decide(proposal(3, [add("c.parquet")]))  # needs 4..6: retained
    assert isinstance(ok, Accepted)
    r = h.decide(proposal(2, [add("d.parquet")]))  # needs 3..6: 3 is gone
    assert isinstance(r, Rejected) and type(r.error) is ConcurrentWriteException
    assert r.retryable
    msg = str(r.error)
    assert "too old" in msg and "fresh snapshot" in msg and "read version 2" in msg


def test_window_bounded_by_file_actions() -> None:
    h = Harness(max_window_files=10)
    h.must_commit(proposal(0, [add(f"a{i}.parquet") for i in range(6)]))
    h.must_commit(proposal(1, [add(f"b{i}.parquet") for i in range(6)]))
    assert h.state.window_size == 1 and h.state.oldest_retained_version == 2
    h.must_commit(proposal(2, [add(f"c{i}.parquet") for i in range(20)]))  # bigger than the bound: newest is kept
    assert h.state.window_size == 1 and h.state.oldest_retained_version == 3
    assert h.state.live_file_count == 32


def test_creation_race_second_creator_gets_protocol_changed_v0() -> None:
    """Delta: 'multiple writers are writing to an empty directory' -> ProtocolChangedException at version 0."""
    st = TableState.empty(TABLE_ID, TABLE_URI)
    one = proposal(-1, [protocol(), metadata()], operation="CREATE TABLE")
    two = proposal(-1, [protocol(), metadata()], operation="CREATE TABLE")
    r1 = decide(st, one, NOW)
    r2 = decide(st, two, NOW)
    assert isinstance(r1, Accepted) and isinstance(r2, Accepted)  # both see no table yet
    st.apply(r1.version, r1.actions)
    r2 = decide(st, two, NOW + 1)
    assert isinstance(r2, Rejected) and type(r2.error) is ProtocolChangedException
    assert r2.winning_version == 0 and r2.error.winning_version == 0
    assert "writing to an empty directory" in str(r2.error)
    assert "CREATE TABLE committed at version 0" in str(r2.error)
    assert not r2.retryable


def test_creation_race_after_version_zero_left_the_window() -> None:
    h = Harness(max_window_commits=2)
    for i in range(4):
        h.must_commit(proposal(h.head, [add(f"f{i}.parquet")]))
    r = h.decide(proposal(-1, [protocol(), metadata()], operation="CREATE TABLE"))
    assert isinstance(r, Rejected) and type(r.error) is ProtocolChangedException and r.winning_version == 0


def test_decide_does_not_mutate_state() -> None:
    h = Harness(("date",), files=[D1])
    before = (h.head, h.state.live_file_count, dict(h.state.app_versions), h.state.window_size)
    r = h.decide(proposal(1, [txn("q", 1), removal_of(D1), add("date=2024-01-01/z.parquet", date="2024-01-01")]))
    assert isinstance(r, Accepted)
    assert (h.head, h.state.live_file_count, dict(h.state.app_versions), h.state.window_size) == before


def test_check_is_pure_and_usable_directly() -> None:
    h = Harness(("date",), files=[D1])
    h.commit_raw([add("date=2024-01-01/w.parquet", date="2024-01-01")], operation="MERGE")
    p = proposal(1, [removal_of(D1)], predicates=["date = '2024-01-01'"], read_files=[D1])
    winners = h.state.winners_since(1)
    assert [x.version for x in winners] == [2]
    r = check(h.state, winners, p, NOW)
    assert isinstance(r, Rejected) and type(r.error) is ConcurrentAppendException
    assert check(h.state, [], p, NOW) == Accepted(3, check(h.state, [], p, NOW).actions)  # type: ignore[union-attr]


def test_bad_predicate_is_rejected_not_raised() -> None:
    h = Harness(("date",))
    r = h.decide(proposal(0, [], predicates=["date = = 3"]))
    assert isinstance(r, Rejected) and isinstance(r.error, InvalidProposalError)
    assert r.error.reason == "BAD_PREDICATE" and "date = = 3" in str(r.error)


def test_conflicting_streaming_instances_get_concurrent_transaction_not_stale() -> None:
    """Two instances of one query both read appId q at version 4 and propose 5: the loser gets Delta's
    ConcurrentTransactionException (checked before the exactly-once STALE_TXN_VERSION rule)."""
    h = Harness()
    h.must_commit(proposal(0, [txn("q", 4)], operation="STREAMING UPDATE"))
    rv = h.head
    a = proposal(rv, [txn("q", 5), add("a.parquet")], app_ids=["q"], operation="STREAMING UPDATE")
    b = proposal(rv, [txn("q", 5), add("b.parquet")], app_ids=["q"], operation="STREAMING UPDATE")
    h.must_commit(a)
    r = h.decide(b)
    assert isinstance(r, Rejected) and type(r.error) is ConcurrentTransactionException


# ============================================================================================ downgrade rule


@pytest.mark.parametrize(
    ("actions", "changes_data", "level", "expected"),
    [
        ((), True, S, True),
        ((), True, WS, False),
        ((), False, WS, True),
        ((add("a", data_change=False), remove("b", data_change=False)), False, WS, True),
        ((add("a", data_change=False), remove("b", data_change=False)), True, WS, False),
        ((add("a", data_change=True),), False, S, False),
        ((remove("b", data_change=True),), False, S, False),
        ((cdc("c"),), False, S, True),
        ((txn("q", 1),), False, S, False),
        ((metadata(),), False, S, False),
        ((protocol(),), False, S, False),
        ((domain("app.x"),), False, S, False),
        ((domain("delta.rowTracking"), add("a", data_change=False)), False, S, True),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_can_downgrade_to_snapshot_isolation_table(
    actions: tuple[Action, ...], changes_data: bool, level: str, expected: bool
) -> None:
    """spark-TH canDowngradeToSnapshotIsolation, case by case."""
    assert can_downgrade_to_snapshot_isolation(actions, changes_data, level) is expected


def test_state_tracks_live_files_domains_and_app_ids() -> None:
    h = Harness(proto=DOMAINS_PROTOCOL)
    h.must_commit(proposal(0, [add("a.parquet"), add("b.parquet", dv="d1"), domain("app.x"), txn("q", 3)]))
    assert h.state.live_file_count == 2
    assert h.state.is_live(add("b.parquet", dv="d1")) and not h.state.is_live(add("b.parquet"))
    h.must_commit(proposal(1, [removal_of(add("b.parquet", dv="d1")), add("b.parquet", dv="d2"),
                               domain("app.x", removed=True)]))
    assert h.state.live_file_count == 2
    assert "app.x" not in h.state.domains and h.state.app_versions == {"q": 3}
    w = h.state.winners_since(1)[0]
    assert w.removed_paths == frozenset({"b.parquet"}) and w.domains == frozenset({"app.x"})


def test_restore_from_snapshot_has_empty_window() -> None:
    files = [add(f"f{i}.parquet") for i in range(10)]
    st = TableState.restore(TABLE_ID, TABLE_URI, version=41, protocol=protocol(), metadata=metadata(),
                            live_files=files, app_versions={"q": 2}, committed_txn_ids=[("p-old", 40)])
    assert st.live_file_count == 10 and st.version == 41 and st.committed_version_of("p-old") == 40
    assert isinstance(decide(st, proposal(41, [add("n.parquet")]), NOW), Accepted)
    r = decide(st, proposal(40, [add("n.parquet")]), NOW)
    assert isinstance(r, Rejected) and type(r.error) is ConcurrentWriteException
    assert decide(st, proposal(40, [], proposal_id="p-old"), NOW) == Duplicate(40)


def test_apply_rejects_out_of_order_versions() -> None:
    h = Harness()
    with pytest.raises(ValueError):
        h.state.apply(5, [add("x.parquet")])
    with pytest.raises(ValueError):
        h.state.winners_since(7)


def test_read_file_hint_uses_file_read_values() -> None:
    h = Harness(("date",), files=[D1])
    h.commit_raw([removal_of(D1)], operation="DELETE")
    r = h.decide(proposal(1, [], read_files=[FileRead(D1.path, {"date": "2024-01-01"})], changes_data=False))
    assert isinstance(r, Rejected) and r.error.partition == "[date=2024-01-01]"  # type: ignore[attr-defined]


# ============================================================================================ stated decisions


def test_decision_any_winner_protocol_fails_the_transaction() -> None:
    """DECISION: any winning `protocol` action fails the current transaction with ProtocolChangedException.

    The seed documents (000/004, 'Important') say changes to the table protocol make concurrent writes
    fail. Delta Spark is more lenient: a transaction WITHOUT its own protocol action may adopt a winner
    that only ADDS features (it fails only when both write a protocol, the winner drops features, or the
    feature is marked failConcurrentTransactionsAtUpgrade). We follow the seed documents.
    """
    h = Harness(("date",), files=[D1])
    rv = h.head
    h.commit_raw([Protocol(1, 7, None, ("appendOnly", "invariants", "checkConstraints"))], operation="ADD CONSTRAINT")
    blind = proposal(rv, [add("date=2024-01-03/n.parquet", date="2024-01-03")])  # even a blind append
    r = h.decide(blind)
    assert isinstance(r, Rejected) and type(r.error) is ProtocolChangedException
    assert r.winning_version == rv + 1 and not r.retryable
    assert "ADD CONSTRAINT committed at version 2" in str(r.error)


def test_decision_any_winner_metadata_fails_the_transaction() -> None:
    """DECISION: any winning `metaData` action fails the current transaction with MetadataChangedException.

    The seed documents say metadata changes (table properties, schema) fail all concurrent writes;
    delta-rs and Delta Kernel do the same. Delta Spark has an allow-list it resolves instead
    (enabling row tracking, deletion vectors, in-commit timestamps, column mapping none->name, v2
    checkpoints, the identity high-water mark) when the current transaction has no metaData itself.
    """
    h = Harness()
    rv = h.head
    h.commit_raw([metadata(config={"delta.enableRowTracking": "true"})], operation="SET TBLPROPERTIES")
    r = h.decide(proposal(rv, [add("n.parquet")]))
    assert isinstance(r, Rejected) and type(r.error) is MetadataChangedException
    assert r.retryable and r.winning_version == rv + 1
