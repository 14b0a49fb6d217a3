"""The door of a proposals partition: each consumed message becomes a proposal to decide, a rejection, and/or a
dead letter, before anything is decided.

A proposal for a table of another partition (murmur2(table id) % partitions) is rejected with WRONG_PARTITION; a
table location this coordinator may not serve is refused (`TableLocations.problem`); a proposal recorded by
reference has its staged actions loaded (the rules only see whole proposals); a multi-table transaction's parts are
checked and decided together; the writer's signature headers are handed to the rules (`rules.authentication`).
Adopt, release and drop requests and resumptions are recognised by their control header.

Poison is bounded: a dead letter carries at most `dead_letter_max_bytes` of the raw message (full size and SHA-256
in headers). A message Kafka refused to record the answer of is decoded degraded
(`deltacoord.coordinator.kafka.batch_transaction`): a rejection, and at most a dead letter without bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message

from deltacoord.coordinator.kafka.batch_transaction import FULL, HEADERS_ONLY
from deltacoord.coordinator.kafka.control import ADOPT, DROP, RELEASE, RESUME
from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.coordinator.rules.authentication import Signature
from deltacoord.coordinator.rules.batch import Submitted, part_rejection, rejection
from deltacoord.coordinator.settings import DEAD_LETTER_ERROR_CHARS, DEAD_LETTER_KEY_BYTES, CoordinatorSettings
from deltacoord.reader.staged_commits import StagedCommitTooLargeError, load_proposal
from deltacoord.schemas.actions import CommitInfo
from deltacoord.schemas.codec import decode_proposal
from deltacoord.schemas.errors import DecodeError, InvalidProposalError
from deltacoord.schemas.messages import TRANSACTION_KEY, Decision, MultiTable, Proposal
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    H_CONTROL,
    H_ERROR,
    H_PROPOSAL_ID,
    H_RAW_SHA256,
    H_RAW_SIZE,
    H_REPLY_PARTITION,
    H_SIGNATURE,
    H_SIGNER,
    H_SOURCE,
    H_TABLE_ID,
    H_WAIT,
    WAIT_RATIFIED,
    header,
    partition_for,
    spans_partitions_message,
)
from deltacoord.schemas.staged import StagedCommitError
from deltacoord.storage.table import StorageError

log = logging.getLogger(__name__)

#: Ids longer than this (from headers or a decoded proposal) are not echoed into a degraded rejection.
MAX_ECHOED_ID_CHARS = 1024


def _header(msg: Message, name: str) -> str | None:
    v = header(msg, name)
    return None if v is None else v.decode("utf-8", errors="replace")


@dataclass
class DeadLetter:
    """What is recorded of an undecodable message: a bounded prefix of its bytes, its size and hash."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]


@dataclass
class Decoded:
    """One consumed message: a proposal to decide, or a rejection and/or a dead letter."""

    offset: int
    submitted: Submitted | None = None
    rejected: Decision | None = None
    dead: DeadLetter | None = None
    #: The replies-topic partition the writer reads (header `deltacoord.reply_partition`), if valid.
    reply: int | None = None
    #: The writer returns at ratification (header `deltacoord.wait: ratified`): its reply goes at once.
    ratified_only: bool = False
    #: An operator's request to resume this table (`deltacoord table resume`).
    resume: str | None = None
    #: `adopt`, `release` or `drop`: `submitted` is that request (`deltacoord table adopt|release|drop`), answered on
    #: its own.
    request: str | None = None
    #: A multi-table transaction's other parts (`submitted` is its first), decided together with it.
    parts: list[Submitted] = field(default_factory=list)
    #: Their rejections, when the message was refused at the edge (`rejected` is the first part's).
    parts_rejected: list[Decision] = field(default_factory=list)
    #: Why deciding it would hold the deciding thread long (`deltacoord.coordinator.kafka.holds`); its staged actions
    #: are then not loaded yet (`Door.loaded`).
    expensive: str | None = None

    def all_submitted(self) -> list[Submitted]:
        return [] if self.submitted is None else [self.submitted, *self.parts]

    def all_rejected(self) -> list[Decision]:
        return [] if self.rejected is None else [self.rejected, *self.parts_rejected]


def dead_letter(raw: bytes | None, key: bytes | None, error: str, source: str, keep_bytes: int) -> DeadLetter:
    """A dead letter holding at most `keep_bytes` of `raw` (0: none); full size and SHA-256 in headers."""
    size = len(raw) if raw is not None else 0
    digest = hashlib.sha256(raw).hexdigest() if raw is not None else ""
    value = raw[:keep_bytes] if raw is not None and keep_bytes > 0 else None
    headers: list[tuple[str, str | bytes | None]] = [
        (H_ERROR, error.encode("utf-8", errors="replace")[:DEAD_LETTER_ERROR_CHARS]), (H_SOURCE, source),
        (H_RAW_SIZE, str(size)), (H_RAW_SHA256, digest),
    ]
    return DeadLetter(value, key[:DEAD_LETTER_KEY_BYTES] if key is not None else None, headers)


class Door:
    """Decodes the messages of one proposals partition (see the module docstring)."""

    def __init__(self, settings: CoordinatorSettings, partition: int, num_partitions: int, locations: TableLocations,
                 tables: PartitionTables, degraded: Mapping[int, tuple[int, str]],
                 reply_partitions: Callable[[], int], expensive: Callable[[Proposal], str | None] = lambda p: None) -> None:
        self.settings = settings
        self.partition = partition
        #: The proposals topic's partition count (0: unknown, the partition check is off).
        self.num_partitions = num_partitions
        self.locations = locations
        self.tables = tables
        #: Offset -> (degradation step, why) of messages Kafka refused to record as they were.
        self.degraded = degraded
        #: The replies topic's partition count (0: no replies topic).
        self.reply_partitions = reply_partitions
        #: Why a proposal is expensive to decide (`deltacoord.coordinator.kafka.holds.expensive`), or None.
        self.expensive = expensive

    def decode_batch(self, batch: Sequence[Message]) -> list[Decoded]:
        decoded = [self._decode(m) for m in batch]
        for m, x in zip(batch, decoded, strict=True):
            x.reply = self._reply_partition(m)
            x.ratified_only = header(m, H_WAIT) == WAIT_RATIFIED
        return decoded

    def _reply_partition(self, m: Message) -> int | None:
        """The valid reply partition a message names, or None (no replies topic, no or a bad header)."""
        n = self.reply_partitions()
        raw = header(m, H_REPLY_PARTITION)
        if n <= 0 or raw is None or not raw.isdigit() or len(raw) > 9:
            return None
        p = int(raw)
        return p if p < n else None

    def _decode(self, m: Message) -> Decoded:
        offset = m.offset()
        assert offset is not None
        x = self._decode_fully(m, offset)
        step, why = self.degraded.get(offset, (FULL, ""))
        if step == FULL:
            return x
        # Kafka refused to record this message's answer as it was: a rejection (a decodable proposal
        # is not decided) and at most a dead letter without bytes.
        rejected = x.rejected
        parts_rejected = x.parts_rejected
        if x.submitted is not None:
            p = x.submitted.proposal
            at = x.submitted.at_ms or int(time.time() * 1000)
            rejected = rejection(p.table_id, p.table_uri, p.proposal_id, InvalidProposalError(
                ReasonCode.UNRECORDABLE, f"Kafka refused to record this proposal's decision ({why}); the proposal was "
                "not decided: make it smaller"), None, at)
            parts_rejected = [part_rejection(q.proposal, rejected, at) for q in x.parts]
        if rejected is not None and max(len(rejected.table_id), len(rejected.proposal_id), len(rejected.table_uri)) > MAX_ECHOED_ID_CHARS:
            rejected = None
        dead = None
        if step == HEADERS_ONLY:
            error = f"{_error_of(x, rejected)}; not recorded with its bytes: {why}"
            dead = dead_letter(m.value(), None, error, _source(m), 0)
        return Decoded(offset, rejected=rejected, dead=dead, parts_rejected=parts_rejected if rejected else [])

    def _load_staged(self, p: Proposal, at_ms: int) -> Proposal | Decision:
        """The proposal with its staged actions loaded (the Kafka edge: the rules only see whole proposals), or its
        rejection (STAGED_COMMIT_INVALID, or STORAGE_UNAVAILABLE when the store does not answer). A proposal
        decided before (a redelivery after its staged file was deleted) goes on to be answered as decided."""
        known = self._known(p)
        if known:
            return p  # a redelivery: answered with its first decision, nothing to load
        try:
            return load_proposal(self.locations.storage(p.table_uri), p, self.settings.max_staged_bytes)
        except StagedCommitError as e:
            if known:
                return p
            reason = ReasonCode.OVERSIZE if isinstance(e, StagedCommitTooLargeError) else ReasonCode.STAGED_COMMIT_INVALID
            err = InvalidProposalError(reason, f"{e}; nothing was decided")
        except (TableLocationError, StorageError, OSError) as e:
            if known:
                return p
            err = InvalidProposalError(ReasonCode.STORAGE_UNAVAILABLE, (
                f"the proposal's staged actions could not be read ({e}); nothing was decided, retry"))
        log.warning("partition %d: refused proposal %s for table %s: %s", self.partition, p.proposal_id[:100],
                    p.table_id[:200], err)
        return rejection(p.table_id, p.table_uri, p.proposal_id, err, None, at_ms)

    def _known(self, p: Proposal) -> bool:
        """Whether `p`'s id was decided before (a redelivery, answered with its first decision)."""
        st = self.tables.states.get(p.table_id)
        return self.tables.decided.get(p.table_id, p.proposal_id) is not None or (
            st is not None and st.committed_version_of(p.proposal_id) is not None)

    def loaded(self, x: Decoded) -> Decoded:
        """An expensive proposal (`Decoded.expensive`) with its staged actions loaded, or its rejection: the loading the
        door left to the hold's worker thread."""
        if x.submitted is None or x.submitted.proposal.staged is None or x.submitted.proposal.actions:
            return x
        s = x.submitted
        got = self._load_staged(s.proposal, s.at_ms or int(time.time() * 1000))
        if isinstance(got, Decision):
            return dataclasses.replace(x, submitted=None, rejected=got)
        return dataclasses.replace(x, submitted=Submitted(got, s.at_ms, s.signature))

    def _decode_fully(self, m: Message, offset: int) -> Decoded:
        raw = m.value()
        at_ms = max(0, m.timestamp()[1])
        source = _source(m)
        control = header(m, H_CONTROL)
        request: str | None = None
        if control is not None:
            table_id = _header(m, H_TABLE_ID)
            if control == RESUME.encode() and table_id:
                log.warning("partition %d: %s asks to resume table %s", self.partition, source, table_id[:200])
                return Decoded(offset, resume=table_id)
            if control not in (ADOPT.encode(), RELEASE.encode(), DROP.encode()):
                error = (f"a control message that is not a resume request with a table id, nor an adopt, release or drop "
                         f"request "
                         f"(control={control[:100]!r})")
                return Decoded(offset, dead=dead_letter(raw, m.key(), error, source, self.settings.dead_letter_max_bytes))
            request = control.decode()
        try:
            if raw is None:
                raise DecodeError("empty message (no value)")
            if len(raw) > self.settings.max_proposal_bytes:
                raise InvalidProposalError(
                    ReasonCode.OVERSIZE,
                    f"proposal of {len(raw)} bytes exceeds the limit of {self.settings.max_proposal_bytes} bytes",
                )
            p = decode_proposal(raw)
        except (DecodeError, InvalidProposalError) as e:
            dead = dead_letter(raw, m.key(), str(e), source, self.settings.dead_letter_max_bytes)
            hdr_pid, hdr_tid = _header(m, H_PROPOSAL_ID), _header(m, H_TABLE_ID)
            if hdr_pid and hdr_tid and max(len(hdr_pid), len(hdr_tid)) <= MAX_ECHOED_ID_CHARS:
                # The writer said who it is: tell it, so it does not wait for nothing.
                err = e if isinstance(e, InvalidProposalError) else InvalidProposalError(ReasonCode.UNDECODABLE, str(e))
                return Decoded(offset, rejected=rejection(hdr_tid, "", hdr_pid, err, None, at_ms or int(time.time() * 1000)),
                                dead=dead)
            return Decoded(offset, dead=dead)
        if p.transaction is not None and request is None:
            signer, signature = header(m, H_SIGNER), header(m, H_SIGNATURE)
            sig = None
            if signer is not None and signature is not None:
                sig = Signature(signer.decode("utf-8", errors="replace"), signature, raw)
            return self._decode_transaction(p, offset, at_ms or int(time.time() * 1000), sig)
        if self.num_partitions > 0:
            home = partition_for(p.table_id, self.num_partitions)
            if home != self.partition:
                log.warning("partition %d: proposal %s for table %s arrived at %s, but the table's partition is %d of %d; "
                            "rejected (WRONG_PARTITION)", self.partition, p.proposal_id[:100], p.table_id[:200], source,
                            home, self.num_partitions)
                err = InvalidProposalError(ReasonCode.WRONG_PARTITION, (
                    f"table {p.table_id} belongs to partition {home} of {self.num_partitions} "
                    f"(murmur2(table id) % partitions), not {self.partition}: nothing was decided. Is the writer's "
                    "partition count stale (topics changed)?"))
                return Decoded(offset, rejected=rejection(p.table_id, p.table_uri, p.proposal_id, err, None,
                                                           at_ms or int(time.time() * 1000)))
        # The door: a table location this coordinator may not serve is refused before anything is decided.
        refused = self.locations.problem(p.table_uri)
        if refused is not None:
            log.warning("partition %d: refused proposal %s for table %s: %s %s", self.partition, p.proposal_id[:100],
                        p.table_id[:200], refused.reason, str(refused)[:500])
            return Decoded(offset, rejected=rejection(p.table_id, p.table_uri, p.proposal_id, refused, None,
                                                       at_ms or int(time.time() * 1000)))
        signer, signature = header(m, H_SIGNER), header(m, H_SIGNATURE)
        sig = None
        if signer is not None and signature is not None:
            sig = Signature(signer.decode("utf-8", errors="replace"), signature, raw)
        why = self.expensive(p) if request is None else None
        if why is not None and self._known(p):
            why = None  # a redelivery: answered with its first decision, nothing to load or decide
        if why is not None:  # loaded and decided by a hold's worker (`deltacoord.coordinator.kafka.holds`)
            return Decoded(offset, submitted=Submitted(p, at_ms, sig), expensive=why)
        if p.staged is not None:
            loaded = self._load_staged(p, at_ms or int(time.time() * 1000))
            if isinstance(loaded, Decision):
                return Decoded(offset, rejected=loaded)
            p = loaded
        if request is not None:
            log.warning("partition %d: %s asks to %s table %s", self.partition, source, request, p.table_id[:200])
        return Decoded(offset, submitted=Submitted(p, at_ms, sig), request=request)

    def _decode_transaction(self, p: Proposal, offset: int, at_ms: int, sig: Signature | None) -> Decoded:
        """A multi-table transaction's message: its parts to decide together (each stamped with the transaction in
        its commitInfo), or all of them refused with the reason one of them is."""
        assert p.transaction is not None
        tx = p.transaction
        parts = [dataclasses.replace(q, transaction=tx.without_parts()) for q in p.parts]
        err: InvalidProposalError | None = None
        failing = parts[0]
        ids = [q.table_id for q in parts]
        if tuple(ids) != tx.tables or len(set(ids)) != len(ids) or any(
                q.transaction is None or q.transaction.id != tx.id or q.transaction.tables != tx.tables for q in parts):
            err = InvalidProposalError(ReasonCode.BAD_TRANSACTION, (
                f"multi-table transaction {tx.id} is not well formed: its tables {list(tx.tables)} must be its parts' "
                f"tables {ids}, each once, and every part must name the transaction; nothing was decided"))
        homes = {q.table_id: partition_for(q.table_id, self.num_partitions) for q in parts} if self.num_partitions > 0 else {}
        if err is None and any(h != self.partition for h in homes.values()):
            failing = next(q for q in parts if homes[q.table_id] != self.partition)
            err = InvalidProposalError(ReasonCode.TRANSACTION_SPANS_PARTITIONS, spans_partitions_message(
                tx.id, homes, self.num_partitions) + "; nothing was decided")
        if err is None:
            for q in parts:
                refused = self.locations.problem(q.table_uri)
                if refused is not None:
                    failing, err = q, refused
                    break
        loaded: list[Proposal] = []
        if err is None:
            for q in parts:
                if q.staged is not None:
                    got = self._load_staged(q, at_ms)
                    if isinstance(got, Decision):
                        return self._refused_transaction(parts, q, got, offset, at_ms)
                    q = got
                loaded.append(_stamped(q, tx))
        if err is not None:
            log.warning("partition %d: refused multi-table transaction %s: %s %s", self.partition, tx.id[:100],
                        err.reason, str(err)[:500])
            failure = rejection(failing.table_id, failing.table_uri, failing.proposal_id, err, None, at_ms)
            return self._refused_transaction(parts, failing, failure, offset, at_ms)
        first, *rest = [Submitted(q, at_ms, sig) for q in loaded]
        return Decoded(offset, submitted=first, parts=rest)

    @staticmethod
    def _refused_transaction(parts: Sequence[Proposal], failing: Proposal, failure: Decision, offset: int,
                             at_ms: int) -> Decoded:
        first, *rest = [failure if q is failing else part_rejection(q, failure, at_ms) for q in parts]
        return Decoded(offset, rejected=first, parts_rejected=rest)



def _stamped(p: Proposal, tx: MultiTable) -> Proposal:
    """A part whose commitInfo records its transaction (`TRANSACTION_KEY`), so `history` shows which versions go
    together: the coordinator's stamp, whatever the writer put there."""
    values = {**p.commit_info.values, TRANSACTION_KEY: {"id": tx.id, "tables": list(tx.tables)}}
    return dataclasses.replace(p, commit_info=CommitInfo(values))


def _source(m: Message) -> str:
    return f"{m.topic()}/{m.partition()}@{m.offset()}"


def _error_of(x: Decoded, rejected: Decision | None) -> str:
    """What went wrong with a degraded message, for its dead letter."""
    if x.dead is not None:
        for k, v in x.dead.headers:
            if k == H_ERROR and isinstance(v, bytes):
                return v.decode("utf-8", errors="replace")
    if rejected is not None and rejected.error_message:
        return rejected.error_message
    return "a proposal whose decision Kafka refused to record"

