"""Operators' requests on a table, answered by its partition loop: adopt a Delta table, release one to
uncoordinated writers, drop one (`deltacoord table adopt|release|drop`).

Each request is answered in a transaction of its own with a control record (`deltacoord.coordinator.kafka.control`)
or a rejection; what it changes in the partition's tables (`done`) happens only once that transaction committed. A
request id decided before (a resend, or a captured request replayed later) gets its first answer and changes
nothing. An adoption claims the table's location (`batch_checks.claim_problem`); a release and a drop free it.
Resumptions of halted tables rebuild the partition (`deltacoord.coordinator.kafka.partition`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from deltacoord.coordinator.delta_log.adoption import StateLoader, StateLoadError, adoption_problems
from deltacoord.coordinator.delta_log.publisher import Publisher
from deltacoord.coordinator.delta_log.table_files import delete_table_files
from deltacoord.coordinator.kafka.batch_checks import claim_problem
from deltacoord.coordinator.kafka.control import (
    ADOPT,
    CONTROL_PREFIX,
    DROP,
    RELEASE,
    adoption_record,
    control_kind,
    drop_record,
    is_request_id,
    release_record,
)
from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.locations import TableLocationError
from deltacoord.coordinator.metrics import Metrics
from deltacoord.coordinator.rules.admission import admission_error
from deltacoord.coordinator.rules.authentication import Signature, authentication_error
from deltacoord.coordinator.rules.batch import rejection, repeated
from deltacoord.reader.claim import CLAIM_KEY, drop_claim, read_claim
from deltacoord.reader.log import newest_commit_version
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import DROP_DELETE_FILES
from deltacoord.schemas.table_features import coordinated
from deltacoord.storage.table import StorageError

log = logging.getLogger(__name__)

#: How long a release waits for the publisher to publish every ratified version of the table.
RELEASE_PUBLISH_WAIT_S = 30.0

#: A request's answer, and what it changes once its transaction committed (None: nothing).
Answer = tuple[Decision, Callable[[], None] | None]


class TableRequests:
    """Answers adopt, release and drop requests for the tables of one partition."""

    def __init__(self, partition: int, tables: PartitionTables, publisher: Publisher, metrics: Metrics,
                 load_state: StateLoader, heartbeat: Callable[[], None], on_dropped: Callable[[str], None]) -> None:
        self.partition = partition
        self.tables = tables
        self.publisher = publisher
        self.metrics = metrics
        #: Reads a table's published state for adoption (the daemon's checkpoint worker, or in this process).
        self.load_state = load_state
        self._heartbeat = heartbeat
        #: Forgets where a dropped table's versions were recorded (state snapshots must not go back to them).
        self._on_dropped = on_dropped

    def answer(self, request: str, p: Proposal, sig: Signature | None, at_ms: int) -> Answer:
        """The answer to an adopt, release or drop request (its first answer again when its id was decided before)."""
        again = self._answered_before(p, request, at_ms)
        if again is not None:
            return again, None
        if request == ADOPT:
            return self._adopt(p, sig, at_ms)
        if request == DROP:
            return self._drop(p, sig, at_ms)
        return self._release(p, sig, at_ms)

    def released_error(self, table_id: str) -> InvalidProposalError:
        uri, head = self.tables.released[table_id]
        return InvalidProposalError(ReasonCode.TABLE_RELEASED, (
            f"table {table_id} was released from coordination at version {head}: deltacoord no longer decides its "
            f"commits. To commit through deltacoord again, stop its uncoordinated writers and adopt it: "
            f"`deltacoord table adopt {uri}` (Python: Table(uri, ...).adopt())"))

    def _answered_before(self, p: Proposal, request: str, at_ms: int) -> Decision | None:
        """The first answer again, when this request id was decided before (in the decided-ids window): an adoption
        or release record marked `duplicate_of` (recovery folds nothing of it), or the first rejection."""
        first = self.tables.decided.get(p.table_id, p.proposal_id)
        if first is None:
            return None
        kind = control_kind(first)
        if kind == request:
            return dataclasses.replace(first, duplicate_of=first.winning_version if first.winning_version is not None
                                       else -1, decided_at_ms=at_ms)
        if kind is None and not first.committed:
            return repeated(first, at_ms)
        return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
            f"the {request} request's id {p.proposal_id[:100]!r} was already used by another "
            f"{kind + ' request' if kind else 'proposal'} of table {p.table_id}: nothing was done. Send a new request "
            "(each `deltacoord table adopt|release|drop` makes a new id)"), at_ms)[0]

    def _refused(self, p: Proposal, reason: ReasonCode, why: str, at_ms: int) -> tuple[Decision, None]:
        return rejection(p.table_id, p.table_uri, p.proposal_id, InvalidProposalError(reason, why), None, at_ms), None

    def _adopt(self, p: Proposal, sig: Signature | None, at_ms: int) -> Answer:
        """Put an existing Delta table under coordination at its current version: read its state through this
        coordinator's own storage edge, check that it can be coordinated, answer with the adoption record."""
        tid, uri = p.table_id, p.table_uri
        if not is_request_id(p.proposal_id, ADOPT):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"an adopt request's proposal id must be {CONTROL_PREFIX}{ADOPT}:<uuid>, not {p.proposal_id[:100]!r}"), at_ms)
        st = self.tables.states.get(tid)
        if st is not None:
            if st.table_uri == uri and st.version == p.read_version:  # asked again (an answer lost): the same answer
                again = adoption_record(tid, uri, p.proposal_id, st.version, (
                    f"already coordinated at version {st.version}; nothing changed"), at_ms)
                return dataclasses.replace(again, duplicate_of=st.version), None
            return self._refused(p, ReasonCode.TABLE_ALREADY_COORDINATED, (
                f"table {tid} at {st.table_uri} is already under this coordinator (version {st.version}, the request saw "
                f"{p.read_version}): its writers commit through deltacoord; there is nothing to adopt"), at_ms)
        try:
            storage = self.publisher.locations.storage(uri)
            loaded = self.load_state(storage, None)
        except TableLocationError as e:
            return rejection(tid, uri, p.proposal_id, e, None, at_ms), None
        except StateLoadError as e:
            if e.kind == "missing":
                return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                    f"there is no Delta table at {uri} to adopt (no _delta_log with a commit or checkpoint). To make a new "
                    f"table there: `deltacoord table create {uri} --schema ...` (Python: Table(uri, ...).create(schema))"),
                    at_ms)
            if e.kind == "unreadable":
                return self._refused(p, ReasonCode.UNREADABLE_TABLE, f"the table cannot be adopted: {e}", at_ms)
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, f"the table was not adopted, retry: {e}", at_ms)
        if p.read_version != loaded.version:  # a delayed or replayed request is not taken for a fresh one
            return self._refused(p, ReasonCode.STALE_CONTROL_REQUEST, (
                f"the adopt request saw table {uri} at version {p.read_version}, but its log is at version "
                f"{loaded.version}: the request is older than the table's latest commits (sent long ago, or replayed), "
                "or its writer read another view of the store. Nothing was adopted; send a new request (`deltacoord "
                "table adopt` reads the current version)"), at_ms)
        problems = adoption_problems(loaded.protocol, loaded.metadata)
        if problems:
            return self._refused(p, ReasonCode.UNSUPPORTED_TABLE_FEATURE, (
                f"table {uri} (version {loaded.version}) cannot be coordinated: {'; '.join(problems)}. Keep writing it "
                "with an engine that supports these features, or change the table so it no longer needs them"), at_ms)
        adopted = loaded.table_state(tid, uri)
        err = authentication_error(adopted, p, sig) or admission_error(adopted, p, {})
        if err is None:  # one location, one table: another table id holding it refuses the adoption
            err = claim_problem(self.publisher.locations, tid, uri, p.proposal_id, at_ms, creating=False)
        if err is not None:
            return rejection(tid, uri, p.proposal_id, err, None, at_ms), None
        source = f"checkpoint {loaded.checkpoint_version} and the commits after it" if loaded.checkpoint_version is not None \
            else "its commits"
        d = adoption_record(tid, uri, p.proposal_id, loaded.version, (
            f"adopted at version {loaded.version} ({loaded.num_files} live files, read from {source}); this coordinator "
            f"decides version {loaded.version + 1} on"), at_ms)

        def done() -> None:
            self.tables.states[tid] = adopted
            self.tables.claimed.add(tid)
            self.tables.released.pop(tid, None)
            self.publisher.resume(tid)  # a halt of the unknown table (a creation onto its log) is lifted
            self.publisher.mark_published(tid, loaded.version)
            self.metrics.tables.inc()

        return d, done

    def _release(self, p: Proposal, sig: Signature | None, at_ms: int) -> Answer:
        """Hand a table back to uncoordinated writers once everything ratified is in `_delta_log`."""
        tid = p.table_id
        if not is_request_id(p.proposal_id, RELEASE):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"a release request's proposal id must be {CONTROL_PREFIX}{RELEASE}:<uuid>, not {p.proposal_id[:100]!r}"),
                at_ms)
        st = self.tables.states.get(tid)
        if st is None:
            if tid in self.tables.released:  # asked again: the same answer
                uri, head = self.tables.released[tid]
                return dataclasses.replace(release_record(tid, uri, p.proposal_id, head, at_ms), duplicate_of=head), None
            return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                f"table {tid} is not under this coordinator: there is nothing to release"), at_ms)
        halted = self.publisher.halted(tid)
        if halted is not None:
            return self._refused(p, ReasonCode.TABLE_HALTED, (
                f"table {tid} is halted ({halted}); repair and resume it (`deltacoord table resume`) before releasing it, "
                "so that everything ratified is published first"), at_ms)
        err = authentication_error(st, p, sig) or admission_error(st, p, {})
        if err is not None:
            return rejection(tid, p.table_uri, p.proposal_id, err, None, at_ms), None
        published = self._wait_published(tid, st.version)
        halted = self.publisher.halted(tid)
        if halted is not None:
            return self._refused(p, ReasonCode.TABLE_HALTED, (
                f"table {tid} halted while its ratified versions were being published ({halted}); it was not released"),
                at_ms)
        if published < st.version:
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                f"versions up to {st.version} are ratified but _delta_log holds only up to {published} after "
                f"{RELEASE_PUBLISH_WAIT_S:.0f}s: the table was not released (uncoordinated writers would overwrite what "
                "the publisher still owes). Retry once the publisher caught up"), at_ms)
        head, uri = st.version, st.table_uri
        d = release_record(tid, uri, p.proposal_id, head, at_ms)

        def done() -> None:
            self.tables.states.pop(tid, None)
            self.tables.released[tid] = (uri, head)
            self.publisher.forget([tid])
            self.metrics.tables.dec()
            self.tables.claimed.discard(tid)
            try:  # the location is free: any table id may adopt it again
                drop_claim(self.publisher.locations.storage(uri), tid)
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                log.warning("partition %d: table %s is released, but its claim %s/%s could not be removed (%s): "
                            "adopting the location under another table id is refused until it is removed",
                            self.partition, tid[:200], uri[:500], CLAIM_KEY, e)

        return d, done

    def _drop(self, p: Proposal, sig: Signature | None, at_ms: int) -> Answer:
        """Forget a table for good (Delta's DROP TABLE for a path table): once every version it ratified is
        published (or it is halted), optionally delete its files (`deleteFiles`), then record the drop; recovery
        and state snapshots never bring it back, and a table created later at its location starts from nothing.

        Keeping the files keeps a Delta table the coordinator no longer decides: its log must not carry the
        `deltacoord-coordinated` writer feature any more (the writer drops it first, as for a release), unless the
        log is gone. A halted table may be dropped (a table whose files were deleted is halted)."""
        tid = p.table_id
        if not is_request_id(p.proposal_id, DROP):
            return self._refused(p, ReasonCode.BAD_PROPOSAL_ID, (
                f"a drop request's proposal id must be {CONTROL_PREFIX}{DROP}:<uuid>, not {p.proposal_id[:100]!r}"), at_ms)
        delete = p.operation_parameters.get(DROP_DELETE_FILES) == "true"
        st = self.tables.states.get(tid)
        if st is None and tid not in self.tables.released:
            return self._refused(p, ReasonCode.UNKNOWN_TABLE, (
                f"table {tid} is not under this coordinator: there is nothing to drop (it was never created here, or "
                f"was dropped already). Files left at {p.table_uri} are no table of the coordinator's: delete them, or "
                f"adopt the Delta table they hold (`deltacoord table adopt {p.table_uri}`)"), at_ms)
        if st is not None:
            uri, head = st.table_uri, st.version
            err = authentication_error(st, p, sig) or admission_error(st, p, {})
            if err is not None:
                return rejection(tid, p.table_uri, p.proposal_id, err, None, at_ms), None
            if self.publisher.halted(tid) is None:
                published = self._wait_published(tid, st.version)
                if self.publisher.halted(tid) is None and published < st.version:
                    return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                        f"versions up to {st.version} are ratified but _delta_log holds only up to {published} after "
                        f"{RELEASE_PUBLISH_WAIT_S:.0f}s: the table was not dropped. Retry once the publisher caught up"),
                        at_ms)
        else:
            uri, head = self.tables.released[tid]
            if delete:
                return self._refused(p, ReasonCode.TABLE_RELEASED, (
                    f"table {tid} was released at version {head}: its files are its uncoordinated writers' now, and the "
                    "coordinator does not delete them. Drop it without --delete-files (the coordinator forgets it), "
                    "and delete the files with the tools that write the table"), at_ms)
        try:
            storage = self.publisher.locations.storage(uri)
            holder = read_claim(storage)
            on_disk = newest_commit_version(storage)
        except TableLocationError as e:
            return rejection(tid, p.table_uri, p.proposal_id, e, None, at_ms), None
        except (StorageError, OSError, ValueError) as e:
            return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                f"the table's storage at {uri} could not be read ({e}); nothing was dropped, retry"), at_ms)
        if holder is not None and holder.table_id != tid:
            return self._refused(p, ReasonCode.TABLE_LOCATION_TAKEN, (
                f"{uri} is now the location of table id {holder.table_id!r} ({CLAIM_KEY}), not of {tid!r}: nothing was "
                f"dropped (nor deleted). Drop that table under its own id (--table-id {holder.table_id!r})"), at_ms)
        if p.read_version != on_disk:  # a delayed or replayed request is not taken for a fresh one
            return self._refused(p, ReasonCode.STALE_CONTROL_REQUEST, (
                f"the drop request saw {uri} at version {p.read_version}, but its _delta_log is at version {on_disk}: "
                "the request is older than the table's latest commits (sent long ago, or replayed), or its writer read "
                "another view of the store. Nothing was dropped; send a new request (`deltacoord table drop` reads the "
                "current version)"), at_ms)
        if (not delete and st is not None and on_disk >= 0 and st.protocol is not None and coordinated(st.protocol)):
            halted = self.publisher.halted(tid)
            return self._refused(p, ReasonCode.TABLE_HALTED if halted else ReasonCode.TABLE_ALREADY_COORDINATED, (
                f"table {tid} keeps its files, and its log still carries the deltacoord-coordinated writer feature, which "
                "would keep Delta writers out of a table no coordinator decides. " + (
                    f"The table is halted ({halted}): resume it (`deltacoord table resume`) so that the feature can be "
                    "dropped first, or delete its files with the drop (`deltacoord table drop --delete-files`)"
                    if halted else "Drop it through `deltacoord table drop` or Table.drop(), which drop the feature "
                    "first, or delete its files with the drop (--delete-files)")), at_ms)
        deleted = 0
        if delete:
            try:
                deleted = delete_table_files(storage)
            except (StorageError, OSError) as e:
                return self._refused(p, ReasonCode.STORAGE_UNAVAILABLE, (
                    f"deleting the files of {uri} failed ({e}); the table was not dropped and some of its files may be "
                    "gone: drop it again (with --delete-files) to finish"), at_ms)
        what = (f"its {deleted} files were deleted" if delete else
                "its files are kept (an uncoordinated Delta table, if it has a log)" if on_disk >= 0 else
                "it had no files left")
        d = drop_record(tid, uri, p.proposal_id, head, (
            f"dropped at version {head}: the coordinator forgot the table, and {what}; a table created at {uri} "
            "starts from version 0"), at_ms)

        def done() -> None:
            if self.tables.states.pop(tid, None) is not None:
                self.metrics.tables.dec()
            self.tables.released.pop(tid, None)
            self.publisher.reset(tid)
            self.tables.claimed.discard(tid)
            self._on_dropped(tid)  # a snapshot must not send recovery back to where its versions were recorded
            self.metrics.halted_tables.set(self.publisher.halted_count())
            if not delete:
                try:  # the location is free (files kept: any table id may adopt it)
                    drop_claim(storage, tid)
                except (StorageError, OSError, ValueError) as e:
                    log.warning("partition %d: table %s is dropped, but its claim %s/%s could not be removed (%s)",
                                self.partition, tid[:200], uri[:500], CLAIM_KEY, e)

        return d, done

    def _wait_published(self, table_id: str, version: int) -> int:
        """The table's published version once it reaches `version`, or after RELEASE_PUBLISH_WAIT_S (or a halt)."""
        deadline = time.monotonic() + RELEASE_PUBLISH_WAIT_S
        while True:
            published = self.publisher.published_version(table_id)
            if published >= version or self.publisher.halted(table_id) is not None or time.monotonic() >= deadline:
                return published
            self._heartbeat()
            time.sleep(0.01)
