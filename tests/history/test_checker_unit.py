"""The history checker on hand-made histories: clean ones pass, injected anomalies are caught."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import pytest

from tests.history.checker import (
    SERIALIZABLE,
    WRITE_SERIALIZABLE,
    DecisionRec,
    FileRec,
    Report,
    Row,
    RowKV,
    Txn,
    check_history,
    expected_conflict,
    txns_from_records,
)

_ids = itertools.count()


def _pid() -> str:
    return f"{next(_ids):08d}-proposal"


class History:
    """Builds a history and its commits-topic decisions, one step at a time."""

    def __init__(self, isolation: str = SERIALIZABLE) -> None:
        self.isolation = isolation
        self.txns: list[Txn] = []
        self.decisions: list[DecisionRec] = []
        self.states: list[dict[str, FileRec]] = []  # live files after each version
        self._files = itertools.count()
        self.commit(Txn(_pid(), "create", -1, counter_new=0, changes_data=False))

    @property
    def head(self) -> int:
        return len(self.states) - 1

    def _file(self, p: int, rows: Sequence[RowKV], data_change: bool = True) -> FileRec:
        return FileRec(f"p={p}/part-{next(self._files)}.parquet", p, tuple(rows), data_change)

    def files(self, p: int, version: int) -> list[FileRec]:
        return [f for f in self.states[version].values() if f.p == p]

    # -- transactions (not yet decided) -----------------------------------------------
    def append(self, p: int, rows: Sequence[RowKV], read_version: int | None = None) -> Txn:
        t = Txn(_pid(), "append", self.head if read_version is None else read_version, added=(self._file(p, rows),))
        self.txns.append(t)
        return t

    def _reading(self, op: str, p: int, read_version: int) -> tuple[Txn, list[FileRec]]:
        read = self.files(p, read_version)
        t = Txn(_pid(), op, read_version, read_partitions=frozenset({p}), read_predicates=(f"p = {p}",),
                read_files={f.path: f.rows for f in read})
        self.txns.append(t)
        return t, read

    def update(self, p: int, read_version: int | None = None) -> Txn:
        """UPDATE SET v = v + 1 WHERE p = <p>: rewrites every file of the partition."""
        t, read = self._reading("update", p, self.head if read_version is None else read_version)
        t.removed = tuple(read)
        t.added = tuple(self._file(p, [(k, v + 1) for k, v in f.rows]) for f in read)
        return t

    def optimize(self, p: int, read_version: int | None = None) -> Txn:
        t, read = self._reading("optimize", p, self.head if read_version is None else read_version)
        t.removed = tuple(FileRec(f.path, f.p, f.rows, False) for f in read)
        t.added = (self._file(p, [r for f in read for r in f.rows], data_change=False),)
        t.changes_data = False
        return t

    def metadata(self, counter_read: int, read_version: int | None = None) -> Txn:
        t = Txn(_pid(), "metadata", self.head if read_version is None else read_version, counter_read=counter_read,
                counter_new=counter_read + 1, changes_data=False)
        self.txns.append(t)
        return t

    # -- decisions ----------------------------------------------------------------------
    def commit(self, t: Txn, *, version: int | None = None, told: bool = True) -> int:
        v = self.head + 1 if version is None else version
        if t not in self.txns:
            self.txns.append(t)
        if told:
            t.outcome, t.version = "committed", v
        self.decisions.append(DecisionRec(
            t.proposal_id, True, v, added_paths=frozenset(f.path for f in t.added),
            removed_paths=frozenset(f.path for f in t.removed), has_metadata=t.has_metadata))
        state = dict(self.states[-1]) if self.states else {}
        for f in t.removed:
            state.pop(f.path, None)
        for f in t.added:
            state[f.path] = f
        self.states.append(state)
        return v

    def reject(self, t: Txn, error_type: str, winning_version: int) -> None:
        t.outcome, t.error_type, t.winning_version = "rejected", error_type, winning_version
        self.decisions.append(DecisionRec(t.proposal_id, False, error_type=error_type, winning_version=winning_version))

    def final_rows(self) -> Counter[Row]:
        return Counter((f.p, k, v) for f in self.states[-1].values() for k, v in f.rows)

    def check(self, final: Counter[Row] | None = None) -> Report:
        return check_history(self.txns, self.decisions, self.isolation, table="t",
                             final_rows={"reader": self.final_rows() if final is None else final})


def _base(isolation: str = SERIALIZABLE) -> History:
    """v1: rows 1, 2 in p=0; v2: row 3 in p=1."""
    h = History(isolation)
    h.commit(h.append(0, [(1, 10), (2, 20)]))
    h.commit(h.append(1, [(3, 30)]))
    return h


def _only(rep: Report, *, lost: int = 0, duplicated: int = 0, false_conflicts: int = 0, anomalies: int = 0) -> None:
    got = (len(rep.lost), len(rep.duplicated), len(rep.false_conflicts), len(rep.anomalies))
    assert got == (lost, duplicated, false_conflicts, anomalies), rep.summary(50)


# -- clean histories ---------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", [SERIALIZABLE, WRITE_SERIALIZABLE])
def test_a_clean_history_passes(isolation: str) -> None:
    h = _base(isolation)
    u0 = h.update(0, read_version=2)
    u1 = h.update(1, read_version=2)  # concurrent with u0 but on another partition
    h.commit(u0)
    h.commit(u1)  # v4: u0's files are in p=0 only, no conflict
    late = h.update(0, read_version=2)  # read p=0 before u0 committed
    h.reject(late, "ConcurrentAppendException", 3)  # u0's adds come first in the append check
    opt = h.optimize(1, read_version=4)
    app = h.append(1, [(4, 40)], read_version=4)
    h.commit(app)
    h.commit(opt)  # SnapshotIsolation: the concurrent append into p=1 does not matter
    m = h.metadata(0)
    stale = h.append(0, [(5, 50)], read_version=h.head)
    h.commit(m)
    h.reject(stale, "MetadataChangedException", m.version or -1)
    rep = h.check()
    _only(rep)
    assert rep.committed == 8 and rep.rejected == Counter({"ConcurrentAppendException": 1, "MetadataChangedException": 1})
    assert rep.reorderings == 0


def test_write_serializable_allows_an_update_serialized_before_a_concurrent_blind_append() -> None:
    h = _base(WRITE_SERIALIZABLE)
    u = h.update(0, read_version=2)
    h.commit(h.append(0, [(9, 90)]))  # v3: blind append into the partition u read
    h.commit(u)  # v4: allowed under WriteSerializable
    rep = h.check()
    _only(rep)
    assert rep.reorderings == 1


def test_the_same_reordering_is_an_anomaly_under_serializable() -> None:
    h = _base(SERIALIZABLE)
    u = h.update(0, read_version=2)
    h.commit(h.append(0, [(9, 90)]))
    h.commit(u)
    rep = h.check()
    assert not rep.ok
    text = " ".join(rep.anomalies)
    assert "not Serializable" in text and "ConcurrentAppendException" in text


# -- injected anomalies ----------------------------------------------------------------------


def test_a_lost_update_is_caught() -> None:
    h = _base()
    a = h.update(0, read_version=2)
    b = h.update(0, read_version=2)  # both read rows 1, 2 at v2
    h.commit(a)
    h.commit(b)  # accepted although a removed what b read: b's increment overwrites a's
    rep = h.check()
    assert not rep.ok
    text = "\n".join(rep.anomalies)
    assert "already removed" in text  # the replay: b removes files a had removed
    assert "not serializable" in text  # b's reads were changed before it committed
    assert "committed although Delta raises ConcurrentAppendException" in text
    assert "more than once" in text  # rows 1 and 2 exist twice at the head


def test_a_false_conflict_is_caught() -> None:
    h = _base()
    u = h.update(0, read_version=2)
    h.commit(h.append(1, [(7, 70)]))  # v3 touches only p=1
    h.reject(u, "ConcurrentAppendException", 3)
    rep = h.check()
    _only(rep, false_conflicts=1)
    assert "no commit in v3..v3 conflicts" in rep.false_conflicts[0]


def test_a_blind_append_is_no_conflict_for_write_serializable() -> None:
    h = _base(WRITE_SERIALIZABLE)
    u = h.update(0, read_version=2)
    h.commit(h.append(0, [(7, 70)]))
    h.reject(u, "ConcurrentAppendException", 3)
    _only(h.check(), false_conflicts=1)
    # ... but it is one under Serializable.
    h2 = _base(SERIALIZABLE)
    u2 = h2.update(0, read_version=2)
    h2.commit(h2.append(0, [(7, 70)]))
    h2.reject(u2, "ConcurrentAppendException", 3)
    _only(h2.check())


def test_a_conflict_of_the_wrong_type_or_winner_is_caught() -> None:
    h = _base()
    u = h.update(0, read_version=2)
    w = h.update(0, read_version=2)
    h.commit(w)  # v3 adds to p=0 and removes what u read: the append check fires first
    h.reject(u, "ConcurrentDeleteReadException", 3)
    rep = h.check()
    _only(rep, anomalies=1)
    assert "give ConcurrentAppendException at v3" in rep.anomalies[0]


def test_a_duplicate_commit_is_caught() -> None:
    h = _base()
    a = h.append(2, [(5, 50)])
    h.commit(a)
    h.commit(a, told=False)  # the same proposal ratified again at v4
    rep = h.check()
    assert len(rep.duplicated) == 1 and "committed 2 times" in rep.duplicated[0]
    assert any("re-adds" in x for x in rep.anomalies)


def test_a_lost_acknowledged_commit_is_caught() -> None:
    h = _base()
    a = h.append(2, [(5, 50)])
    a.outcome, a.version = "committed", 3  # the writer was told v3 ...
    rep = h.check()  # ... but the commits topic never had it
    _only(rep, lost=1)
    assert "told committed at v3" in rep.lost[0]


def test_a_commit_missing_the_files_it_added_is_caught() -> None:
    h = _base()
    a = h.append(2, [(5, 50)])
    h.commit(a)
    d = h.decisions[-1]
    h.decisions[-1] = DecisionRec(d.proposal_id, True, d.version)  # ratified without its add
    rep = h.check(final=Counter())
    assert len(rep.lost) == 1 and "lacks its added files" in rep.lost[0]


def test_unknown_outcomes_are_resolved_from_the_topic() -> None:
    h = _base()
    stale = h.append(2, [(4, 40)], read_version=2)
    h.commit(h.metadata(0))  # v3
    h.reject(stale, "MetadataChangedException", 3)
    committed = h.append(2, [(5, 50)])
    h.commit(committed, told=False)  # v4
    undelivered = h.append(3, [(6, 60)])  # never reached Kafka: no decision, and none is owed
    lost = h.append(3, [(7, 70)])
    lost.delivered = True  # acknowledged by Kafka, so it must be decided
    for t in (stale, committed, undelivered, lost):
        t.outcome = "unknown"
    rep = h.check()
    assert rep.unknown_resolved == Counter({"committed": 1, "rejected": 1, "undelivered": 1})
    _only(rep, lost=1)
    assert "never decided" in rep.lost[0]


def test_a_version_gap_and_a_phantom_commit_are_caught() -> None:
    h = _base()
    ghost = Txn(_pid(), "append", 2)
    h.decisions.append(DecisionRec(ghost.proposal_id, True, 4))  # v3 missing, and nobody proposed this
    rep = h.check()
    text = " ".join(rep.anomalies)
    assert "not contiguous" in text and "no writer proposed" in text and "no version 3" in text


def test_a_lost_metadata_update_is_caught() -> None:
    h = _base()
    a = h.metadata(0, read_version=2)
    b = h.metadata(0, read_version=2)
    h.commit(a)
    h.commit(b)
    rep = h.check()
    text = " ".join(rep.anomalies)
    assert "lost metadata update" in text and "MetadataChangedException" in text


def test_a_final_table_that_differs_is_caught() -> None:
    h = _base()
    final = h.final_rows()
    final[(0, 1, 10)] -= 1
    final[(0, 1, 11)] += 1
    rep = h.check(final=+final)
    _only(rep, anomalies=1)
    assert "missing (p=0,k=1,v=10)" in rep.anomalies[0] and "extra (p=0,k=1,v=11)" in rep.anomalies[0]


def test_a_read_of_the_wrong_version_is_caught() -> None:
    h = _base()
    u = h.update(1, read_version=1)  # claims v1, but its files are those of v2 (p=1 was empty at v1)
    u.read_version = 1
    u.read_files = {f.path: f.rows for f in h.files(1, 2)}
    h.commit(u)
    rep = h.check()
    assert any("are not version 1" in x for x in rep.anomalies)


# -- the rule model and the record format ------------------------------------------------------


def test_expected_conflict_follows_delta_rules() -> None:
    h = _base()
    opt = h.optimize(0, read_version=2)
    app0 = h.append(0, [(8, 80)])
    upd = h.update(0, read_version=2)
    # A compaction (SnapshotIsolation) ignores appends, loses to a removal of a file it read.
    assert expected_conflict(opt, [(3, app0)], SERIALIZABLE) is None
    assert expected_conflict(opt, [(3, upd)], SERIALIZABLE) == ("ConcurrentDeleteReadException", 3)
    # A data-changing reader loses to a compaction's adds first (Delta counts dataChange=false adds).
    assert expected_conflict(upd, [(3, opt)], WRITE_SERIALIZABLE) == ("ConcurrentAppendException", 3)
    # The first winner decides.
    meta = h.metadata(0)
    assert expected_conflict(upd, [(3, app0), (4, meta)], WRITE_SERIALIZABLE) == ("MetadataChangedException", 4)
    assert expected_conflict(upd, [(3, app0), (4, meta)], SERIALIZABLE) == ("ConcurrentAppendException", 3)
    # Blind appends conflict only with metadata changes.
    assert expected_conflict(app0, [(3, upd), (4, opt)], SERIALIZABLE) is None
    # A winner that only removes: delete-read when the file was read, else delete-delete.
    remover = Txn(_pid(), "delete", 2, read_partitions=frozenset({1}), read_predicates=("p = 1",),
                  removed=tuple(h.files(0, 2)))
    assert expected_conflict(upd, [(3, remover)], SERIALIZABLE) == ("ConcurrentDeleteReadException", 3)
    blind_remover = Txn(_pid(), "delete", 2, read_partitions=frozenset({1}), read_predicates=("p = 1",),
                        removed=tuple(h.files(0, 2)))
    assert expected_conflict(blind_remover, [(3, remover)], SERIALIZABLE) == ("ConcurrentDeleteDeleteException", 3)


def test_records_fold_into_transactions() -> None:
    recs: list[dict[str, object]] = [
        {"type": "invoke", "writer": 3, "seq": 7, "table": "file:///t", "proposal_id": "a", "op": "update",
         "read_version": 4, "read_partitions": [1], "read_predicates": ["p = 1"], "read_whole": False,
         "read_files": {"p=1/x": [[1, 2]]}, "added": [{"path": "p=1/y", "p": 1, "rows": [[1, 3]], "data_change": True}],
         "removed": [{"path": "p=1/x", "p": 1, "rows": [[1, 2]], "data_change": True}], "counter_read": None,
         "counter_new": None, "changes_data": True},
        {"type": "invoke", "writer": 3, "seq": 8, "proposal_id": "b", "op": "append", "read_version": 5,
         "added": [{"path": "p=0/z", "p": 0, "rows": [[9, 9]]}]},
        {"type": "proposed", "proposal_id": "b"},
        {"type": "complete", "proposal_id": "a", "outcome": "rejected", "error_type": "ConcurrentAppendException",
         "winning_version": 5},
    ]
    a, b = txns_from_records(recs)
    assert a.read_partitions == {1} and a.read_files == {"p=1/x": ((1, 2),)} and a.removed[0].rows == ((1, 2),)
    assert (a.outcome, a.error_type, a.winning_version) == ("rejected", "ConcurrentAppendException", 5)
    assert b.is_blind and not a.is_blind and b.outcome == "unknown" and b.delivered is True


# -- re-sent proposal ids and proposals never sent ---------------------------------------------------------------


def _repeat(d: DecisionRec) -> DecisionRec:
    """The coordinator's answer to a proposal id decided before: its first decision again."""
    if d.committed:
        return DecisionRec(d.proposal_id, True, d.version, duplicate_of=d.version)
    return DecisionRec(d.proposal_id, False, error_type=d.error_type, reason_code=d.reason_code,
                       winning_version=d.winning_version)


def test_a_re_sent_id_answered_with_its_first_decision_is_clean() -> None:
    """A writer retrying an unknown outcome with the same proposal id gets the first decision again
    (a commit as a duplicate of its version, a rejection as the same rejection): not a second decision."""
    h = _base()
    a = h.append(2, [(5, 50)])
    h.commit(a)
    h.decisions.append(_repeat(h.decisions[-1]))
    stale = h.metadata(0, read_version=2)
    h.commit(h.metadata(0))  # v4
    h.reject(stale, "MetadataChangedException", 4)
    h.decisions.append(_repeat(h.decisions[-1]))
    a.attempts = stale.attempts = 2
    rep = h.check()
    _only(rep)
    assert rep.repeat_answers == 2 and rep.rejected == Counter({"MetadataChangedException": 1})


def test_repeats_the_writer_never_sent_or_that_differ_are_caught() -> None:
    h = _base()
    a = h.append(2, [(5, 50)])
    h.commit(a)
    h.decisions.append(_repeat(h.decisions[-1]))  # a repeat, but the writer sent the id once
    b = h.append(3, [(6, 60)])
    h.commit(b)
    b.attempts = 2
    h.decisions.append(DecisionRec(b.proposal_id, True, 3, duplicate_of=3))  # answered with another version
    rep = h.check()
    _only(rep, anomalies=2)
    assert rep.repeat_answers == 0 and all("has 2 decisions" in x for x in rep.anomalies)


def test_a_proposal_the_writer_was_told_never_reached_kafka_must_have_no_decision() -> None:
    """ProposalNotSentError deletes the staged files: a decision for it would reference missing files."""
    h = _base()
    sent = h.append(2, [(5, 50)])
    h.commit(sent, told=False)
    never = h.append(3, [(6, 60)])
    sent.outcome = never.outcome = "not_sent"
    rep = h.check()
    _only(rep, anomalies=1)
    assert "never reached Kafka" in rep.anomalies[0] and rep.unknown_resolved == Counter({"not sent": 1})


def test_a_storage_unavailable_refusal_is_counted_not_an_anomaly() -> None:
    """The coordinator refuses a table's proposals while the store does not answer (retryable); an
    invalid-proposal rejection of another reason stays an anomaly."""
    h = _base()
    a, b = h.append(2, [(5, 50)]), h.append(3, [(6, 60)])
    for t, reason in ((a, "STORAGE_UNAVAILABLE"), (b, "STAGED_COMMIT_INVALID")):
        t.outcome, t.error_type = "rejected", "InvalidProposalError"
        h.decisions.append(DecisionRec(t.proposal_id, False, error_type="InvalidProposalError", reason_code=reason))
    rep = h.check()
    _only(rep, anomalies=1)
    assert "STAGED_COMMIT_INVALID" in rep.anomalies[0]
    assert rep.rejected == Counter({"STORAGE_UNAVAILABLE": 1, "InvalidProposalError": 1})
