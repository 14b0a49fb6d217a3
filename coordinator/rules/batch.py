"""The batch decision: `decide_batch(states, proposals, now) -> (decisions, overlay)`, pure.

A batch is decided in order, as if one proposal at a time (group commit): a
later proposal sees the earlier acceptances of the same batch. Those
acceptances are tentative until the batch's Kafka transaction commits, so they
are kept in an `Overlay` and never written to the live `TableState`s: a table
the batch commits to is forked once (O(1), see `TableState.fork`) and the
forks take the batch's commits. The caller then either applies the overlay to
the live states (`Overlay.apply_to`, after the transaction committed) or drops
it (the transaction aborted: nothing to undo, nothing to re-read).

Per proposal: a proposal id decided before is answered with its first
decision (`earlier`, see `deltacoord.coordinator.rules.decided`); then authentication
(`authentication.py`), admission (`admission.py`), then `profiles.decide`
(redelivery, validation, the conflict checks of the table's profile, the rebase). An exception raised
while deciding one proposal is a bug of this code, not bad input; it is
contained to that proposal's table: the batch is decided again with the table
halted (`Overlay.halts` says which and why; the caller persists the halt), so
the other tables go on and the daemon does not crash-loop on the same record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence, Set
from dataclasses import dataclass, field, replace

from deltacoord.coordinator.rules.admission import admission_error
from deltacoord.coordinator.rules.authentication import Signature, authentication_error
from deltacoord.coordinator.rules.coalesce import Group, coalescable
from deltacoord.coordinator.rules.outcomes import Accepted, Duplicate, Rejected
from deltacoord.coordinator.rules.profiles import decide
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, CommitInfo, Metadata
from deltacoord.schemas.errors import DeltaCoordError, InvalidProposalError
from deltacoord.schemas.messages import SIBLING_REJECTED, Decision, Outcome, Proposal
from deltacoord.schemas.properties import TableProperties
from deltacoord.schemas.reasons import ReasonCode

log = logging.getLogger(__name__)

#: Checks that a table's added files exist as declared: (table uri, files) -> why not, or None.
FileCheck = Callable[[str, Sequence[AddFile | AddCDCFile]], str | None]
#: The first decision of a proposal id decided before this batch: (table id, proposal id) -> decision, or None.
EarlierDecision = Callable[[str, str], Decision | None]

_NOTHING_HALTED: Mapping[str, str] = {}
_NOTHING_REFUSED: Mapping[str, InvalidProposalError] = {}
_NO_FAILED: Mapping[str, Decision] = {}


@dataclass(frozen=True, slots=True)
class Submitted:
    """A decoded proposal, when it was submitted (its Kafka record's timestamp in ms; 0: unknown) and its signature."""

    proposal: Proposal
    at_ms: int = 0
    signature: Signature | None = None


@dataclass(frozen=True, slots=True)
class TentativeCommit:
    table_id: str
    version: int
    actions: tuple[Action, ...]


@dataclass
class Overlay:
    """A batch's tentative commits, over the live table states it was decided against."""

    #: Table id -> its state at the end of the batch: a fork of the live state, or a table the batch created.
    tables: dict[str, TableState] = field(default_factory=dict)
    #: Tables the batch created (absent from the live states).
    created: list[str] = field(default_factory=list)
    #: Every acceptance of the batch, in decision order.
    commits: list[TentativeCommit] = field(default_factory=list)
    #: Tables halted while deciding this batch (a fault of this code on that table) -> why.
    halts: dict[str, str] = field(default_factory=dict)
    #: Table id -> the index in `commits` of its newest commit.
    _newest: dict[str, int] = field(default_factory=dict)

    def state(self, live: Mapping[str, TableState], table_id: str) -> TableState | None:
        """A table as the batch sees it so far."""
        st = self.tables.get(table_id)
        return st if st is not None else live.get(table_id)

    def accept(self, live: Mapping[str, TableState], state: TableState, accepted: Accepted) -> None:
        """Record an acceptance on `state` (what `state()` returned, or a new empty state)."""
        tid = state.table_id
        if tid not in self.tables:
            if tid in live:
                state = state.fork()
            else:
                self.created.append(tid)
            self.tables[tid] = state
        self.tables[tid].apply(accepted.version, accepted.actions)
        self._newest[tid] = len(self.commits)
        self.commits.append(TentativeCommit(tid, accepted.version, accepted.actions))

    def coalesce(self, live: Mapping[str, TableState], table_id: str, version: int, commit: tuple[Action, ...],
                 added: tuple[Action, ...] | None) -> None:
        """Make the table's newest commit of the batch, `version`, hold `commit` (an accepted commit joined it,
        `deltacoord.coordinator.rules.coalesce`): the table's state grows that version by `added`, what the join
        adds to it (`TableState.extend`, O(the join)). When the version cannot grow so (`added` is None, or
        `extend` refuses it) the state is made again: the live state with the batch's commits of the table."""
        i = self._newest[table_id]
        assert self.commits[i].version == version
        self.commits[i] = TentativeCommit(table_id, version, commit)
        if added is not None:
            ci = commit[0]
            assert isinstance(ci, CommitInfo)
            try:
                self.tables[table_id].extend(version, ci, added)
                return
            except ValueError:
                pass
        st = live[table_id].fork()
        for c in self.commits:
            if c.table_id == table_id:
                st.apply(c.version, c.actions)
        self.tables[table_id] = st

    def apply_to(self, live: MutableMapping[str, TableState]) -> None:
        """Make the batch's commits live (after its transaction committed), in O(the batch's changes).

        `live` must hold the states the batch was decided against, unchanged since.
        """
        created = set(self.created)
        for tid, st in self.tables.items():
            if tid in created:
                live[tid] = st
            else:
                live[tid].absorb(st)


def rejection(table_id: str, table_uri: str, proposal_id: str, err: DeltaCoordError, winning_version: int | None,
              now_ms: int) -> Decision:
    """The decision refusing a proposal: Delta's exception name, or the reason code of invalid input."""
    return Decision(
        table_id=table_id, table_uri=table_uri, proposal_id=proposal_id, outcome=Outcome.REJECTED,
        error_type=type(err).__name__, error_message=str(err),
        reason_code=getattr(err, "reason", None), winning_version=winning_version, decided_at_ms=now_ms,
    )


def verifies_added_files(state: TableState | None, p: Proposal) -> bool:
    """Whether the table (as the proposal would leave it, when it changes the metadata) verifies added files."""
    md = next((a for a in p.actions if isinstance(a, Metadata)), None)
    if md is None and state is not None:
        md = state.metadata
    return TableProperties.of(md).verify_added_files


def decide_one(live: Mapping[str, TableState], overlay: Overlay, p: Proposal, now_ms: int,
               halted: Mapping[str, str] = _NOTHING_HALTED, signature: Signature | None = None,
               check_files: FileCheck | None = None,
               refused_creates: Mapping[str, InvalidProposalError] = _NOTHING_REFUSED) -> Decision:
    """Decide one proposal against the live states plus the overlay, recording an acceptance in the overlay."""
    d, accepted = _judged(live, overlay, p, now_ms, halted, signature, check_files, refused_creates)
    if accepted is not None:
        overlay.accept(live, *accepted)
    return d


def _judged(live: Mapping[str, TableState], overlay: Overlay, p: Proposal, now_ms: int, halted: Mapping[str, str],
            signature: Signature | None, check_files: FileCheck | None,
            refused_creates: Mapping[str, InvalidProposalError]) -> tuple[Decision, tuple[TableState, Accepted] | None]:
    """`decide_one`'s decision, and when accepted the state it was decided on and the acceptance, not yet
    recorded in the overlay."""
    st = overlay.state(live, p.table_id)
    err = authentication_error(st, p, signature) or admission_error(st, p, halted)
    if err is None and st is None and p.read_version < 0:
        err = refused_creates.get(p.table_id)
    if err is None and check_files is not None and verifies_added_files(st, p):
        files = [a for a in p.actions if isinstance(a, (AddFile, AddCDCFile))]
        why = check_files(st.table_uri if st is not None else p.table_uri, files) if files else None
        if why is not None:
            err = InvalidProposalError(ReasonCode.ADDED_FILE_MISSING, why)
    if err is not None:
        return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, now_ms), None
    if st is None:
        st = TableState.empty(p.table_id, p.table_uri)
    result = decide(st, p, now_ms)
    if isinstance(result, Accepted):
        return Decision(
            table_id=p.table_id, table_uri=p.table_uri, proposal_id=p.proposal_id, outcome=Outcome.COMMITTED,
            version=result.version, actions=result.actions, decided_at_ms=now_ms,
        ), (st, result)
    if isinstance(result, Duplicate):
        return Decision(
            table_id=p.table_id, table_uri=p.table_uri, proposal_id=p.proposal_id, outcome=Outcome.COMMITTED,
            version=result.version, duplicate_of=result.version, decided_at_ms=now_ms,
        ), None
    assert isinstance(result, Rejected)
    return rejection(p.table_id, p.table_uri, p.proposal_id, result.error, result.winning_version, now_ms), None


class _TableFault(Exception):
    """An unexpected error deciding a proposal of `table_id`."""

    def __init__(self, table_id: str, table_uri: str, cause: Exception) -> None:
        super().__init__(table_id)
        self.table_id, self.table_uri, self.cause = table_id, table_uri, cause


def claims_its_id(d: Decision) -> bool:
    """Whether a decision is the one answer of its proposal id from now on. A message that failed
    authentication proved nothing about who sent it: remembering its refusal would let anyone who saw a
    genuine proposal's id pre-empt it, so the id stays free for the signed proposal."""
    return d.reason_code != ReasonCode.WRITER_NOT_AUTHENTICATED


def repeated(first: Decision, now_ms: int) -> Decision:
    """The answer to a proposal id decided before: its first decision (a commit answered as a duplicate of it)."""
    if first.committed and first.version is not None:
        return Decision(table_id=first.table_id, table_uri=first.table_uri, proposal_id=first.proposal_id,
                        outcome=Outcome.COMMITTED, version=first.version, duplicate_of=first.version, decided_at_ms=now_ms)
    return Decision(table_id=first.table_id, table_uri=first.table_uri, proposal_id=first.proposal_id,
                    outcome=Outcome.REJECTED, error_type=first.error_type, error_message=first.error_message,
                    reason_code=first.reason_code, winning_version=first.winning_version, decided_at_ms=now_ms)


def decide_batch(states: Mapping[str, TableState], proposals: Sequence[Proposal | Submitted], now: int, *,
                 halted: Mapping[str, str] = _NOTHING_HALTED,
                 check_files: FileCheck | None = None,
                 earlier: EarlierDecision | None = None,
                 refused_creates: Mapping[str, InvalidProposalError] = _NOTHING_REFUSED,
                 busy: Set[str] = frozenset()) -> tuple[list[Decision], Overlay]:
    """Decide `proposals` in order against `states` (never modified); one decision per proposal.

    A proposal is decided at its submission time when known (`Submitted.at_ms`),
    else at `now` (ms). `halted` maps table ids whose publication is halted to why.
    `check_files` verifies added files for tables with `deltacoord.verifyAddedFiles`.
    `earlier` finds the first decision of a proposal id decided before the batch.
    `refused_creates` maps table ids whose creation (read version -1, table unknown) the storage edge refused
    to why (its location is another table id's, or holds an uncoordinated Delta table: `deltacoord.reader.claim`).
    `busy` holds the tables whose store has not taken every ratified version yet: their compatible appends
    share versions (`deltacoord.coordinator.rules.coalesce`).
    """
    halts: dict[str, str] = {}
    failed: dict[str, Decision] = {}
    while True:
        try:
            decisions, overlay = _decide_all(states, proposals, now, {**halted, **halts}, check_files, earlier,
                                             refused_creates, busy, failed)
        except _PartRefused as r:
            failed[r.txid] = r.decision
            continue
        except _TableFault as f:
            why = (f"deciding a proposal of this table failed unexpectedly ({type(f.cause).__name__}: {f.cause}); the "
                   "table is halted so that the other tables go on. Report it with the coordinator's log")
            log.error("halting table %s: %s", f.table_id, why, exc_info=f.cause)
            halts[f.table_id] = why
            continue
        overlay.halts = halts
        return decisions, overlay


def _unpack(item: Proposal | Submitted, now: int) -> tuple[Proposal, int, Signature | None]:
    if isinstance(item, Submitted):
        return item.proposal, item.at_ms or now, item.signature
    return item, now, None


def _decide_all(states: Mapping[str, TableState], proposals: Sequence[Proposal | Submitted], now: int,
                halted: Mapping[str, str], check_files: FileCheck | None,
                earlier: EarlierDecision | None,
                refused_creates: Mapping[str, InvalidProposalError],
                busy: Set[str] = frozenset(),
                failed: Mapping[str, Decision] = _NO_FAILED) -> tuple[list[Decision], Overlay]:
    overlay = Overlay()
    decisions: list[Decision] = []
    seen: dict[tuple[str, str], Decision] = {}
    groups: dict[str, Group] = {}  # per busy table, the version being coalesced
    joined: dict[int, tuple[Action, ...]] = {}  # a coalesced version's leader (its index) -> the version's commit
    i = 0
    while i < len(proposals):
        p, at, sig = _unpack(proposals[i], now)
        if p.transaction is not None:
            j = i + 1  # the edge hands a transaction's parts over together, in order
            while j < len(proposals) and _same_transaction(_unpack(proposals[j], now)[0], p):
                j += 1
            parts = [_unpack(x, now) for x in proposals[i:j]]
            for q, _at, _sig in parts:
                groups.pop(q.table_id, None)  # a part is never coalesced, nor is anything folded into its version
            decisions.extend(_decide_transaction(states, overlay, parts, seen, halted, check_files, earlier,
                                                 refused_creates, failed))
            i = j
            continue
        i += 1
        key = (p.table_id, p.proposal_id)
        first = seen.get(key) or (earlier(*key) if earlier is not None else None)
        if first is not None:
            decisions.append(repeated(first, at))
            continue
        try:
            d, accepted = _judged(states, overlay, p, at, halted, sig, check_files, refused_creates)
            if accepted is not None:
                if p.table_id in busy:
                    d = _coalesce(states, overlay, groups, decisions, joined, p, d, *accepted)
                else:
                    overlay.accept(states, *accepted)
        except Exception as e:
            raise _TableFault(p.table_id, p.table_uri, e) from e
        if claims_its_id(d):
            seen[key] = d
        decisions.append(d)
    for leader, commit in joined.items():  # once per version, not once per join
        decisions[leader] = replace(decisions[leader], actions=commit)
    return decisions, overlay


def _same_transaction(q: Proposal, p: Proposal) -> bool:
    return q.transaction is not None and p.transaction is not None and q.transaction.id == p.transaction.id


def _decide_transaction(live: Mapping[str, TableState], overlay: Overlay,
                        parts: Sequence[tuple[Proposal, int, Signature | None]], seen: dict[tuple[str, str], Decision],
                        halted: Mapping[str, str], check_files: FileCheck | None, earlier: EarlierDecision | None,
                        refused_creates: Mapping[str, InvalidProposalError],
                        failed: Mapping[str, Decision]) -> list[Decision]:
    """Every part of one multi-table transaction, each by its table's own rules at the same point of the order:
    all accepted, or all rejected with the failing part's reason. A part refused after earlier parts were
    accepted restarts the batch (`_PartRefused`) with the transaction known to fail, so no overlay is undone."""
    p0 = parts[0][0]
    assert p0.transaction is not None
    txid = p0.transaction.id
    firsts = [seen.get((p.table_id, p.proposal_id)) or (earlier(p.table_id, p.proposal_id) if earlier is not None else None)
              for p, _at, _sig in parts]
    if any(f is not None for f in firsts):  # a redelivery: every part was decided in one Kafka transaction
        out = []
        for (p, at, _sig), first in zip(parts, firsts, strict=True):
            if first is None:
                first = rejection(p.table_id, p.table_uri, p.proposal_id, InvalidProposalError(
                    ReasonCode.BAD_TRANSACTION, f"multi-table transaction {txid} was decided before without this part"),
                    None, at)
            out.append(repeated(first, at))
        return out
    failure = failed.get(txid)
    if failure is None:
        decided: list[Decision] = []
        for p, at, sig in parts:
            try:
                d = decide_one(live, overlay, p, at, halted, sig, check_files, refused_creates)
            except Exception as e:
                raise _TableFault(p.table_id, p.table_uri, e) from e
            decided.append(d)
            if not d.committed:
                break
        repeats = [d.duplicate_of is not None for d in decided]
        if len(decided) == len(parts) and all(d.committed for d in decided) and (all(repeats) or not any(repeats)):
            for (p, _at, _sig), d in zip(parts, decided, strict=True):
                seen[(p.table_id, p.proposal_id)] = d
            return decided  # all accepted, or all committed before (a redelivery)
        failure = decided[-1] if not decided[-1].committed else next(d for d in decided if d.duplicate_of is not None)
        if any(d.committed and d.duplicate_of is None for d in decided):
            raise _PartRefused(txid, failure)  # the overlay holds accepted parts: decide the batch again
    assert failure is not None
    out = []
    for p, at, _sig in parts:
        d = failure if p.proposal_id == failure.proposal_id and p.table_id == failure.table_id else \
            part_rejection(p, failure, at)
        if claims_its_id(d):
            seen[(p.table_id, p.proposal_id)] = d
        out.append(d)
    return out


def part_rejection(p: Proposal, failure: Decision, at_ms: int) -> Decision:
    """The rejection of a part whose sibling was refused: the sibling's reason, naming its table."""
    assert p.transaction is not None
    failing = failure.table_uri or failure.table_id
    error_type: str | None
    reason: str | None
    if failure.committed:  # a part whose proposal id committed before, alone: the transaction cannot be whole
        error_type, reason, why = InvalidProposalError.__name__, ReasonCode.BAD_TRANSACTION.value, (
            f"its part on table {failing} reuses proposal id {failure.proposal_id}, committed before")
    else:
        error_type, reason, why = failure.error_type, failure.reason_code, (
            f"its part on table {failing} was refused: {failure.error_message}")
    return Decision(table_id=p.table_id, table_uri=p.table_uri, proposal_id=p.proposal_id, outcome=Outcome.REJECTED,
                    error_type=error_type, error_message=f"{SIBLING_REJECTED} {p.transaction.id}: {why}",
                    reason_code=reason, decided_at_ms=at_ms)


class _PartRefused(Exception):
    """A part of a multi-table transaction refused after its earlier parts were accepted into the overlay."""

    def __init__(self, txid: str, decision: Decision) -> None:
        super().__init__(txid)
        self.txid, self.decision = txid, decision


def _coalesce(live: Mapping[str, TableState], overlay: Overlay, groups: dict[str, Group], decisions: list[Decision],
              joined: dict[int, tuple[Action, ...]], p: Proposal, d: Decision, st: TableState,
              accepted: Accepted) -> Decision:
    """Fold an accepted commit of a busy table (decided on `st`) into the version its batch is coalescing, when it
    may (`deltacoord.coordinator.rules.coalesce`), else record it as its own version; the decision as it stands
    (`coalesced_into` the leader's when folded). The leader's decision is given the version's whole commit when
    the batch is decided (`joined` holds it meanwhile)."""
    tid = p.table_id
    assert d.version is not None
    props = TableProperties.of(st.metadata)
    if tid not in live or not props.coalesce or props.maxcompute or not coalescable(p, d.actions):
        groups.pop(tid, None)
        overlay.accept(live, st, accepted)
        return d
    g = groups.get(tid)
    size = g.takes(d.actions) if g is not None and g.version == d.version - 1 else None
    if g is None or size is None:
        groups[tid] = Group.open(d.version, len(decisions), d.actions)
        overlay.accept(live, st, accepted)
        return d
    merged, added = g.join(d.actions, size)
    overlay.coalesce(live, tid, g.version, merged, added)
    joined[g.leader] = merged
    return replace(d, version=g.version, actions=(), coalesced_into=decisions[g.leader].proposal_id)


__all__ = [
    "EarlierDecision",
    "FileCheck",
    "Overlay",
    "Submitted",
    "TentativeCommit",
    "claims_its_id",
    "decide_batch",
    "decide_one",
    "part_rejection",
    "rejection",
    "repeated",
    "verifies_added_files",
]
