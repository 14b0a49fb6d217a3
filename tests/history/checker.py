"""Check a recorded history against the committed order on the commits topic.

Pure functions: no Kafka, no files. The inputs are the transactions the writers
recorded (`Txn`, from `txns_from_records`) and the decisions of one table in
commits-topic order (`DecisionRec`, from `decision_record`). `check_history`
returns a `Report`; `Report.ok` is the verdict.

What is checked (per table):

* **Decisions.** Each proposal id has at most one decision and commits at most
  once (*duplicated*); committed versions are contiguous from 0 in topic order;
  every committed version belongs to a recorded transaction (no phantom
  commits) and carries exactly the files that transaction added and removed
  (*lost* write otherwise); an outcome a writer was told (committed at v,
  rejected with X) is the one on the topic; an ``unknown`` outcome is resolved
  from the topic, and a proposal Kafka acknowledged without any decision is
  *lost*.
* **Replay.** The committed transactions are applied in log order at file and
  row level: a transaction may only remove files that are live (a lost update
  shows up as a remove of a file already removed), added paths are new, each
  metadata change read the latest counter, and every file a transaction read
  holds the rows its writer recorded.
* **Reads and isolation.** A committed transaction that read partitions *P* at
  version *r* and committed at *v* must have read exactly version *r* of *P*,
  and *P* must not have changed between *r* and *v - 1*: under Serializable
  nothing may differ; under WriteSerializable the only difference allowed is
  rows added by blind appends committed in between (the transaction is then
  serialized before them: a *reordering*, counted, not an anomaly).
  Compactions (dataChange=false, SnapshotIsolation) only need their removed
  files to be live, which the replay checks.
* **Conflicts.** Delta's rules are recomputed independently from the recorded
  reads and writes (per winner in version order: metadata -> appends ->
  delete-read -> delete-delete, with Delta's blind-append exemption under
  WriteSerializable and the SnapshotIsolation downgrade): a rejection whose
  winners (read version + 1 .. head at decision time) fire no check is a
  *false conflict*; one where another check or winner fires first is an
  anomaly, and so is a commit that should have conflicted. A STORAGE_UNAVAILABLE
  refusal (the store did not answer) is counted, not checked: nothing conflicted.
* **Re-sent ids.** A writer retrying an unknown outcome re-sends its proposal
  id; the coordinator answers each repeat with the id's first decision. Such
  repeats are counted (``repeat_answers``); a repeat of an id sent once, or one
  that differs from the first decision, is an anomaly. A proposal its writer was
  told never reached Kafka (``not_sent``) must have no decision at all.
* **Final state.** The row multiset of the replay at the head equals what each
  reader given in `final_rows` sees; row ids are unique.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deltacoord.schemas.actions import AddFile, Metadata, RemoveFile
from deltacoord.schemas.messages import Decision

#: Refusals that are not conflicts but a documented, retryable answer: the coordinator could not reach the table's
#: store to check the version it would ratify (`deltacoord.coordinator.kafka.batch_checks`), so it ratified nothing.
RETRYABLE_REFUSALS = frozenset({"STORAGE_UNAVAILABLE"})

SERIALIZABLE = "Serializable"
WRITE_SERIALIZABLE = "WriteSerializable"
SNAPSHOT_ISOLATION = "SnapshotIsolation"

CONFLICT_TYPES = frozenset({
    "ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
    "MetadataChangedException", "ProtocolChangedException", "ConcurrentTransactionException",
    "ConcurrentWriteException",
})

RowKV = tuple[int, int]
Row = tuple[int, int, int]  # (p, k, v)


@dataclass(frozen=True)
class FileRec:
    """A data file as its writer recorded it: partition and (k, v) rows."""

    path: str
    p: int
    rows: tuple[RowKV, ...]
    data_change: bool = True


@dataclass
class Txn:
    """One proposed transaction of the history and the outcome its writer saw."""

    proposal_id: str
    op: str
    read_version: int
    table: str = ""
    read_partitions: frozenset[int] = frozenset()
    read_predicates: tuple[str, ...] = ()
    read_whole: bool = False
    read_files: Mapping[str, tuple[RowKV, ...]] = field(default_factory=dict)
    added: tuple[FileRec, ...] = ()
    removed: tuple[FileRec, ...] = ()
    counter_read: int | None = None
    counter_new: int | None = None
    changes_data: bool = True
    writer: int = 0
    seq: int = 0
    #: committed / rejected / unknown / not_sent (ProposalNotSentError), as the writer saw it.
    outcome: str = "unknown"
    version: int | None = None
    error_type: str | None = None
    winning_version: int | None = None
    #: For unknown outcomes: True when Kafka acknowledged the proposal (it must get a decision).
    delivered: bool | None = None
    #: Times the writer sent the proposal (a retry of an unknown outcome re-sends it with the same id).
    attempts: int = 1

    @property
    def has_metadata(self) -> bool:
        return self.op in ("metadata", "create")

    @property
    def is_blind(self) -> bool:
        """Delta's isBlindAppend: only adds among the file actions, and nothing read."""
        return not (self.removed or self.read_files or self.read_partitions or self.read_whole or self.read_predicates)

    def level(self, table_level: str) -> str:
        """Delta's canDowngradeToSnapshotIsolation applied to the table's level."""
        files = (*self.added, *self.removed)
        if self.has_metadata or any(f.data_change for f in files):
            return table_level
        if table_level == SERIALIZABLE or not self.changes_data:
            return SNAPSHOT_ISOLATION
        return table_level

    def describe(self) -> str:
        return f"{self.op} {self.proposal_id[:8]} (writer {self.writer} #{self.seq}, read v{self.read_version})"


@dataclass(frozen=True)
class DecisionRec:
    """What the checker needs of one decision on the commits topic."""

    proposal_id: str
    committed: bool
    version: int | None = None
    error_type: str | None = None
    reason_code: str | None = None
    winning_version: int | None = None
    duplicate_of: int | None = None
    added_paths: frozenset[str] = frozenset()
    removed_paths: frozenset[str] = frozenset()
    has_metadata: bool = False


def decision_record(d: Decision) -> DecisionRec:
    return DecisionRec(
        proposal_id=d.proposal_id, committed=d.committed, version=d.version, error_type=d.error_type,
        reason_code=d.reason_code, winning_version=d.winning_version, duplicate_of=d.duplicate_of,
        added_paths=frozenset(a.path for a in d.actions if isinstance(a, AddFile)),
        removed_paths=frozenset(a.path for a in d.actions if isinstance(a, RemoveFile)),
        has_metadata=any(isinstance(a, Metadata) for a in d.actions),
    )


def decisions_for(decisions: Iterable[Decision], table_id: str) -> list[DecisionRec]:
    return [decision_record(d) for d in decisions if d.table_id == table_id]


def _rows(raw: Iterable[Sequence[int]]) -> tuple[RowKV, ...]:
    return tuple((int(r[0]), int(r[1])) for r in raw)


def _files(raw: Iterable[Mapping[str, Any]]) -> tuple[FileRec, ...]:
    return tuple(FileRec(f["path"], int(f["p"]), _rows(f["rows"]), bool(f.get("data_change", True))) for f in raw)


def txns_from_records(records: Iterable[Mapping[str, Any]]) -> list[Txn]:
    """Fold invoke / proposed / complete records into transactions (in invoke order)."""
    txns: dict[str, Txn] = {}
    for r in records:
        kind = r.get("type")
        if kind == "invoke":
            txns[r["proposal_id"]] = Txn(
                proposal_id=r["proposal_id"], op=r["op"], read_version=int(r["read_version"]), table=r.get("table", ""),
                read_partitions=frozenset(int(p) for p in r.get("read_partitions", ())),
                read_predicates=tuple(r.get("read_predicates", ())), read_whole=bool(r.get("read_whole", False)),
                read_files={p: _rows(rows) for p, rows in r.get("read_files", {}).items()},
                added=_files(r.get("added", ())), removed=_files(r.get("removed", ())),
                counter_read=r.get("counter_read"), counter_new=r.get("counter_new"),
                changes_data=bool(r.get("changes_data", True)), writer=int(r.get("writer", 0)), seq=int(r.get("seq", 0)),
            )
        elif kind == "proposed":
            t = txns.get(r["proposal_id"])
            if t is not None:
                t.delivered = True
        elif kind == "complete":
            t = txns.get(r["proposal_id"])
            if t is None:
                continue
            t.outcome = r["outcome"]
            t.version = r.get("version")
            t.error_type = r.get("error_type")
            t.winning_version = r.get("winning_version")
            if r.get("delivered") is not None:
                t.delivered = bool(r["delivered"])
            t.attempts = int(r.get("attempts", 1))
    return list(txns.values())


@dataclass
class Report:
    """The verdict on one table's history."""

    table: str
    isolation: str
    transactions: int = 0
    committed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    #: How proposals whose writer saw no outcome ended: committed / rejected / undelivered.
    unknown_resolved: Counter[str] = field(default_factory=Counter)
    committed_by_op: Counter[str] = field(default_factory=Counter)
    #: WriteSerializable: committed transactions serialized before a concurrent blind append.
    reorderings: int = 0
    #: Answers to re-sent proposal ids that repeat the id's first decision (not second decisions).
    repeat_answers: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    false_conflicts: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.false_conflicts or self.anomalies)

    def summary(self, examples: int = 10) -> dict[str, Any]:
        return {
            "table": self.table, "isolation": self.isolation, "transactions": self.transactions,
            "committed": self.committed, "committed_by_op": dict(sorted(self.committed_by_op.items())),
            "rejected": dict(sorted(self.rejected.items())), "unknown_resolved": dict(sorted(self.unknown_resolved.items())),
            "reorderings": self.reorderings, "repeat_answers": self.repeat_answers,
            "lost": len(self.lost), "duplicated": len(self.duplicated), "false_conflicts": len(self.false_conflicts),
            "anomalies": len(self.anomalies),
            "examples": (self.lost + self.duplicated + self.false_conflicts + self.anomalies)[:examples],
        }


# -- Delta's conflict rules, recomputed from the history ------------------------------------


def expected_conflict(t: Txn, winners: Sequence[tuple[int, Txn]], table_level: str) -> tuple[str, int] | None:
    """The (exception, winning version) Delta's checker raises for `t` against `winners`, or None.

    Winner by winner in version order; within a winner: metadata, appends,
    delete-read, delete-delete (protocol, domain and app-id checks never fire in
    this workload: nobody changes the protocol, domains or app ids).
    """
    level = t.level(table_level)
    read_paths = set(t.read_files)
    own_removes = {f.path for f in t.removed}
    for v, w in winners:
        if w.has_metadata:
            return "MetadataChangedException", v
        if (w.added and not t.is_blind and level != SNAPSHOT_ISOLATION
                and (not w.is_blind or level == SERIALIZABLE or t.has_metadata)
                and (t.read_whole or any(f.p in t.read_partitions for f in w.added))):
            return "ConcurrentAppendException", v
        removed = {f.path for f in w.removed}
        if removed:
            if read_paths & removed or t.read_whole:
                return "ConcurrentDeleteReadException", v
            if own_removes & removed:
                return "ConcurrentDeleteDeleteException", v
    return None


# -- the check ----------------------------------------------------------------------------


class _Replay:
    """File and row state of the table at every committed version."""

    def __init__(self) -> None:
        self.files: dict[str, FileRec] = {}  # every file ever committed, by path
        self.live: set[str] = set()
        self.by_version: list[dict[int, frozenset[str]]] = []  # partition -> live paths, per version
        self.counter: int | None = None

    def rows(self, parts: Iterable[int] | None, version: int) -> Counter[Row]:
        out: Counter[Row] = Counter()
        if version < 0:
            return out
        state = self.by_version[version]
        for p in state if parts is None else parts:
            for path in state.get(p, frozenset()):
                f = self.files[path]
                out.update((f.p, k, v) for k, v in f.rows)
        return out

    def paths(self, parts: Iterable[int] | None, version: int) -> set[str]:
        state = self.by_version[version] if version >= 0 else {}
        return {path for p in (state if parts is None else parts) for path in state.get(p, frozenset())}


def _fmt_rows(rows: Counter[Row], n: int = 4) -> str:
    items = sorted(rows.elements())
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(f"(p={p},k={k},v={v})" for p, k, v in items[:n]) + more


def _repeats(first: DecisionRec, again: DecisionRec) -> bool:
    """Whether `again` answers a re-sent proposal id with its first decision: a commit as a duplicate of the
    first commit's version, a rejection as the same rejection."""
    if first.committed:
        return again.committed and again.duplicate_of is not None and again.version == first.version
    return (not again.committed and again.error_type == first.error_type and again.reason_code == first.reason_code
            and again.winning_version == first.winning_version)


def check_history(txns: Sequence[Txn], decisions: Sequence[DecisionRec], isolation: str, *, table: str = "",
                  final_rows: Mapping[str, Counter[Row]] | None = None) -> Report:
    """Check one table's history; `decisions` are that table's decisions in commits-topic order."""
    rep = Report(table=table, isolation=isolation, transactions=len(txns))
    by_id: dict[str, Txn] = {}
    for t in txns:
        if t.proposal_id in by_id:
            rep.anomalies.append(f"proposal id {t.proposal_id} was recorded twice by the writers")
        by_id[t.proposal_id] = t

    # 1. Decisions: one per proposal, contiguous versions, heads at rejection time.
    per_pid: dict[str, list[DecisionRec]] = defaultdict(list)
    order: dict[int, DecisionRec] = {}
    rejections: list[tuple[DecisionRec, int]] = []
    head = -1
    for d in decisions:
        per_pid[d.proposal_id].append(d)
        if d.committed and d.duplicate_of is None:
            assert d.version is not None
            if d.version != head + 1:
                rep.anomalies.append(f"commits topic: version {d.version} follows version {head} (not contiguous)")
            if d.version in order:
                rep.duplicated.append(f"version {d.version} decided twice ({order[d.version].proposal_id[:8]} and {d.proposal_id[:8]})")
            order[d.version] = d
            head = max(head, d.version)
        elif not d.committed and not per_pid[d.proposal_id][:-1]:
            rejections.append((d, head))  # a re-sent id's later rejections repeat the first (checked below)
    for pid, ds in per_pid.items():
        versions = [d.version for d in ds if d.committed and d.duplicate_of is None]
        if len(versions) > 1:
            rep.duplicated.append(f"proposal {pid[:8]} committed {len(versions)} times (versions {versions})")
        elif len(ds) > 1 and pid in by_id and by_id[pid].attempts > 1 and all(_repeats(ds[0], d) for d in ds[1:]):
            rep.repeat_answers += len(ds) - 1  # the writer re-sent the id: each repeat got the first decision
        elif len(ds) > 1:
            kinds = ["committed" if d.committed and d.duplicate_of is None else "duplicate answer" if d.committed
                     else f"rejected ({d.error_type or d.reason_code})" for d in ds]
            rep.anomalies.append(f"proposal {pid[:8]} has {len(ds)} decisions: {kinds}")
    for v in range(head + 1):
        if v not in order:
            rep.anomalies.append(f"commits topic has no version {v} (head {head})")

    # 2. Decisions against what the writers recorded and were told.
    txn_at: dict[int, Txn] = {}
    for v, d in sorted(order.items()):
        found = by_id.get(d.proposal_id)
        if found is None:
            rep.anomalies.append(f"version {v} commits proposal {d.proposal_id[:8]} that no writer proposed")
            continue
        t = found
        txn_at[v] = t
        rep.committed += 1
        rep.committed_by_op[t.op] += 1
        want_add = frozenset(f.path for f in t.added)
        want_rm = frozenset(f.path for f in t.removed)
        if want_add - d.added_paths:
            rep.lost.append(f"version {v} ({t.describe()}) lacks its added files {sorted(want_add - d.added_paths)[:3]}")
        if d.added_paths - want_add or d.removed_paths != want_rm:
            rep.anomalies.append(f"version {v} ({t.describe()}) is not the proposed commit: "
                                 f"extra adds {sorted(d.added_paths - want_add)[:3]}, removes {sorted(d.removed_paths ^ want_rm)[:3]} differ")
        if t.has_metadata != d.has_metadata:
            rep.anomalies.append(f"version {v} ({t.describe()}): metaData action {'missing' if t.has_metadata else 'added'}")
    for t in txns:
        ds = per_pid.get(t.proposal_id, [])
        first = next((d for d in ds if not (d.committed and d.duplicate_of is not None)), None)
        if t.outcome == "committed":
            if first is None or not first.committed:
                rep.lost.append(f"{t.describe()}: the writer was told committed at v{t.version}, the commits topic has "
                                f"{'no decision' if first is None else 'a rejection'}")
            elif first.version != t.version:
                rep.anomalies.append(f"{t.describe()}: the writer was told v{t.version}, the topic says v{first.version}")
        elif t.outcome == "rejected":
            if first is None:
                rep.anomalies.append(f"{t.describe()}: the writer was told rejected, the topic has no decision")
            elif first.committed:
                rep.anomalies.append(f"{t.describe()}: the writer was told rejected, the topic committed it at v{first.version}")
            elif first.error_type != t.error_type:
                rep.anomalies.append(f"{t.describe()}: the writer was told {t.error_type}, the topic says {first.error_type}")
        elif t.outcome == "not_sent":
            if first is not None:  # its staged files were deleted when the writer was told so
                rep.anomalies.append(f"{t.describe()}: the writer was told the proposal never reached Kafka, the topic "
                                     f"{'committed it at v' + str(first.version) if first.committed else 'rejected it'}")
            else:
                rep.unknown_resolved["not sent"] += 1
        else:
            if first is None:
                if t.delivered:
                    rep.lost.append(f"{t.describe()}: acknowledged by Kafka but never decided")
                else:
                    rep.unknown_resolved["undelivered"] += 1
            else:
                rep.unknown_resolved["committed" if first.committed else "rejected"] += 1

    # 3. Replay in log order.
    replay = _Replay()
    for v in range(head + 1):
        prev = replay.by_version[-1] if replay.by_version else {}
        state = dict(prev)
        at_v = txn_at.get(v)
        if at_v is None:
            replay.by_version.append(state)
            continue
        t = at_v
        touched: set[int] = set()
        for f in t.removed:
            if f.path not in replay.live:
                known = replay.files.get(f.path)
                why = "was never committed" if known is None else "was already removed (a lost update or double delete)"
                rep.anomalies.append(f"version {v} ({t.describe()}) removes {f.path} which {why}")
                continue
            replay.live.discard(f.path)
            touched.add(replay.files[f.path].p)
        for f in t.added:
            if f.path in replay.files:
                rep.anomalies.append(f"version {v} ({t.describe()}) re-adds {f.path}")
            replay.files[f.path] = f
            replay.live.add(f.path)
            touched.add(f.p)
        for p in touched:
            state[p] = frozenset(path for path in replay.live if replay.files[path].p == p)
        if t.op == "create":
            replay.counter = t.counter_new
        elif t.op == "metadata":
            if t.counter_read != replay.counter:
                rep.anomalies.append(f"version {v} ({t.describe()}) incremented counter {t.counter_read}, but the "
                                     f"table's counter was {replay.counter} (a lost metadata update)")
            replay.counter = t.counter_new
        replay.by_version.append(state)

    # 4. Reads, isolation and missed conflicts of committed transactions.
    for v, t in sorted(txn_at.items()):
        r = t.read_version
        if t.op == "create":
            continue
        if r >= v or r < 0:
            rep.anomalies.append(f"version {v} ({t.describe()}) read version {r}, not before its own")
            continue
        winners = [(u, txn_at[u]) for u in range(r + 1, v) if u in txn_at]
        missed = expected_conflict(t, winners, isolation)
        if missed is not None:
            rep.anomalies.append(f"version {v} ({t.describe()}) committed although Delta raises {missed[0]} "
                                 f"(winner v{missed[1]})")
        if not (t.read_partitions or t.read_whole):
            continue
        parts = None if t.read_whole else sorted(t.read_partitions)
        seen = set(t.read_files)
        at_r = replay.paths(parts, r)
        if seen != at_r:
            rep.anomalies.append(f"version {v} ({t.describe()}) read files {len(seen)} that are not version {r} of "
                                 f"partitions {parts} ({len(at_r)} files; missing {sorted(at_r - seen)[:2]}, extra {sorted(seen - at_r)[:2]})")
        for path, rows in t.read_files.items():
            written = replay.files.get(path)
            if written is not None and sorted(written.rows) != sorted(rows):
                rep.anomalies.append(f"version {v} ({t.describe()}) read {path} with rows that differ from what its writer wrote")
        if t.level(isolation) == SNAPSHOT_ISOLATION:
            continue  # no data change: only its removes must still be live (the replay checks them)
        before = replay.rows(parts, r)
        at = replay.rows(parts, v - 1)
        gone = before - at
        new = at - before
        between = [u for u, w in winners if parts is None or any(f.p in t.read_partitions for f in (*w.added, *w.removed))]
        if gone:
            rep.anomalies.append(f"version {v} ({t.describe()}) is not serializable: rows it read at v{r} were changed "
                                 f"by v{between} before it committed: {_fmt_rows(gone)}")
        if new:
            blind: Counter[Row] = Counter()
            for _u, w in winners:
                if w.is_blind:
                    blind.update((f.p, k, val) for f in w.added for k, val in f.rows if parts is None or f.p in t.read_partitions)
            if isolation == WRITE_SERIALIZABLE and not (new - blind):
                rep.reorderings += 1
            else:
                rep.anomalies.append(f"version {v} ({t.describe()}) is not {isolation}: rows appeared in the partitions it "
                                     f"read between v{r} and v{v - 1} (by v{between}): {_fmt_rows(new - blind if isolation == WRITE_SERIALIZABLE else new)}")

    # 5. Rejections: a real conflict, of the type given, with the winner named.
    for d, h in rejections:
        rejected = by_id.get(d.proposal_id)
        if rejected is None:
            rep.anomalies.append(f"rejection of proposal {d.proposal_id[:8]} that no writer proposed")
            continue
        t = rejected
        if d.reason_code in RETRYABLE_REFUSALS:
            rep.rejected[d.reason_code] += 1
            continue  # the store did not answer when the batch was decided: refused, to be retried with a new id
        rep.rejected[d.error_type or d.reason_code or "?"] += 1
        if d.error_type not in CONFLICT_TYPES:
            rep.anomalies.append(f"{t.describe()} rejected as invalid: {d.reason_code or d.error_type}")
            continue
        if t.read_version > h:
            rep.anomalies.append(f"{t.describe()} read v{t.read_version}, beyond the head v{h} when it was rejected")
            continue
        winners = [(u, txn_at[u]) for u in range(t.read_version + 1, h + 1) if u in txn_at]
        exp = expected_conflict(t, winners, isolation)
        if exp is None:
            rep.false_conflicts.append(f"{t.describe()} rejected with {d.error_type} (winner v{d.winning_version}) but "
                                       f"no commit in v{t.read_version + 1}..v{h} conflicts with it")
        elif exp[0] != d.error_type or exp[1] != d.winning_version:
            rep.anomalies.append(f"{t.describe()} rejected with {d.error_type} at v{d.winning_version}; Delta's rules "
                                 f"give {exp[0]} at v{exp[1]}")

    # 6. The final table.
    expected = replay.rows(None, head)
    keys = Counter(k for _p, k, _v in expected.elements())
    dup_keys = [k for k, n in keys.items() if n > 1]
    if dup_keys:
        rep.anomalies.append(f"row ids present more than once at the head: {sorted(dup_keys)[:5]}")
    for name, actual in (final_rows or {}).items():
        missing = expected - actual
        extra = actual - expected
        if missing or extra:
            rep.anomalies.append(f"{name} at the head differs from the committed transactions applied in log order: "
                                 f"missing {_fmt_rows(missing)}; extra {_fmt_rows(extra)}")
    return rep
