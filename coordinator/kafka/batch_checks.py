"""A batch's decisions, checked against the tables' stores before they are recorded.

`decide_batch` (pure) decides the batch; what it cannot know is in the stores, asked here, and the batch is decided
again without what they refuse until every check holds:

* Nothing acknowledged is invisible: before a batch that ratifies version v of a table is recorded,
  `_delta_log/<v>.json` must be absent (one HEAD, or a stat, per table and batch, asked only while the table's
  version v-1 is published, and not just after this process created it: see `BatchChecks.probe`). A file there was written around the coordinator: the table
  halts and the batch is decided again without it, so no writer is told COMMITTED for a version readers would
  never see. The same question is asked of a table one of whose proposals read a version beyond its head
  (READ_VERSION_AHEAD): a writer can only have read such a version from a `<v>.json` written around the
  coordinator, so the table halts at that proposal rather than rejecting every writer that read the foreign
  version. A store that cannot answer rejects that table's proposals of the batch (STORAGE_UNAVAILABLE, retryable).
* One location, one table: a creation the batch accepts claims the table's location in its own store
  (`deltacoord.reader.claim`, `claim_problem`); a location another table id holds refuses it
  (TABLE_LOCATION_TAKEN), as a creation over a Delta table the coordinator does not decide is refused
  (TABLE_EXISTS_UNCOORDINATED). A table's first commit in this process checks its claim (`confirm_claims`): a
  table from before claims claims its location then, one whose location another id holds halts.
* Large commits are staged in the table's store by reference (`deltacoord.schemas.staged`); a store that does not
  take the file rejects that table's proposals of the batch.
* A decision that cannot be encoded is a fault of this code on its table: the table halts, the others go on.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

from deltacoord.coordinator.delta_log.publisher import Publisher
from deltacoord.coordinator.kafka.control import control_kind
from deltacoord.coordinator.kafka.partition_tables import PartitionTables
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.coordinator.rules.batch import Overlay, Submitted, decide_batch
from deltacoord.coordinator.rules.validate import path_problem
from deltacoord.reader.claim import CLAIM_KEY, Claim, ClaimError, claim, read_claim
from deltacoord.reader.log import TableNotFoundError, commit_key, list_log_from_hint, newest_commit_version
from deltacoord.reader.staged_commits import delete_writer_staged, on_the_wire, stage_decision
from deltacoord.schemas.actions import AddCDCFile, AddFile
from deltacoord.schemas.codec import encode_decision
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.staged import DECISION_INLINE_MAX_ACTIONS
from deltacoord.storage.table import StorageError

log = logging.getLogger(__name__)


#: How long after this process created a table's `<v-1>.json` its `<v>.json` is taken as absent without asking the
#: store (`BatchChecks.probe`): a writer committing in a loop proposes well within it.
FREE_AFTER_OWN_PUT_S = 2.0


@functools.cache
def probe_pool() -> ThreadPoolExecutor:
    """Threads that ask several tables' stores at once whether a version exists (`probe`), shared by partitions."""
    return ThreadPoolExecutor(max_workers=16, thread_name_prefix="deltacoord-probe")


def added_files_problem(locations: TableLocations, table_uri: str, files: Sequence[AddFile | AddCDCFile]) -> str | None:
    """Why an added file is not in the table's storage with its declared size, or None (the storage edge's `head`,
    through the coordinator's own storage options for the table's location).

    Paths validation will refuse (outside the table, into `_delta_log`) are left to it.
    """
    from deltacoord.storage.table import ObjectNotFoundError

    try:
        storage = locations.storage(table_uri)
    except (StorageError, TableLocationError, ValueError) as e:
        return f"the table's storage at {table_uri} cannot be opened to check the added files: {e}"
    for f in files:
        if path_problem(f.path, table_uri) is not None:
            continue
        if "://" in f.path or f.path.startswith(("/", "file:")):
            return f"added file {f.path} is given as an absolute path: a table that verifies added files takes relative paths"
        key = unquote(f.path)
        try:
            info = storage.head(key)
        except ObjectNotFoundError:
            return f"added file {f.path} does not exist in {table_uri}"
        except (StorageError, OSError) as e:
            return f"added file {f.path} could not be checked: {e}"
        if info.size != f.size:
            return f"added file {f.path} has {info.size} bytes, not the {f.size} the proposal declares"
    return None


def claim_problem(locations: TableLocations, table_id: str, table_uri: str, request_id: str, at_ms: int, *,
                  creating: bool) -> InvalidProposalError | None:
    """Claim the table's location for `table_id` as it is created (`creating`) or adopted, or say why not
    (`deltacoord.reader.claim`): another table id holds the location (TABLE_LOCATION_TAKEN), a creation would land on a
    Delta table the coordinator does not decide (TABLE_EXISTS_UNCOORDINATED), the store did not answer
    (STORAGE_UNAVAILABLE). The storage edge of a creation's or an adoption's decision; None once claimed."""
    doing = "create" if creating else "adopt"
    try:
        storage = locations.storage(table_uri)
        holder = read_claim(storage)
        if creating and (holder is None or holder.table_id == table_id):
            try:
                head = list_log_from_hint(storage).latest_version
            except TableNotFoundError:
                head = None
            if head is not None:
                return InvalidProposalError(ReasonCode.TABLE_EXISTS_UNCOORDINATED, (
                    f"a Delta table already exists at {table_uri} (version {head}) and this coordinator does not decide "
                    f"it: table {table_id} was not created over it. To put that table under coordination, adopt it: "
                    f"`deltacoord table adopt {table_uri}` (Python: Table(uri, ...).adopt()); to make a new table, "
                    "choose an empty location"))
        if holder is None:
            holder = claim(storage, Claim(table_id, at_ms, request_id))
    except TableLocationError as e:
        return e
    except ClaimError as e:
        return InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
            f"table {table_id} cannot {doing} {table_uri}: the location's claim cannot be read ({e}). If no "
            f"coordinated table uses that location, remove {table_uri}/{CLAIM_KEY} and retry"))
    except (StorageError, OSError, ValueError) as e:
        return InvalidProposalError(ReasonCode.STORAGE_UNAVAILABLE, (
            f"the claim of {table_uri} (which table id holds the location) could not be checked or written ({e}); "
            f"table {table_id} was not {'created' if creating else 'adopted'}, retry"))
    if holder.table_id != table_id:
        return InvalidProposalError(ReasonCode.TABLE_LOCATION_TAKEN, (
            f"{table_uri} is the location of table id {holder.table_id!r} (claimed by {holder.claimed_by or 'a request'}"
            f" in {CLAIM_KEY}), so table id {table_id!r} may not {doing} it: two table ids over one _delta_log would "
            f"both ratify the same versions, and only one of each can be published. Write the table under its own id: "
            f"Table(uri, table_id={holder.table_id!r}) (CLI: --table-id {holder.table_id!r}; a local table's id is "
            f"its file:// URI by default). If table {holder.table_id!r} is gone, release it first (`deltacoord table "
            f"release {table_uri} --table-id {holder.table_id!r}`), which frees the location"))
    return None


class BatchChecks:
    """Decides a partition's batches with the store checks of the module docstring."""

    def __init__(self, partition: int, publisher: Publisher, tables: PartitionTables) -> None:
        self.partition = partition
        self.publisher = publisher
        self.tables = tables
        #: Tables whose proposals of the batch being decided waited for their lane (the daemon's `_linger`): their
        #: appends share versions even if the lane emptied meanwhile.
        self.paced: frozenset[str] = frozenset()

    def decide(self, proposals: Sequence[Submitted], now_ms: int, told_when_ratified: Collection[str] | None = None,
               ) -> tuple[list[Decision], Overlay, dict[int, bytes]]:
        """The batch's decisions, its overlay, and the decisions encoded (by id()); tables the checks halt are
        halted (in the publisher's halts, to be recorded with the batch). `told_when_ratified`: the tables some of
        whose writers hear their outcome before it is published (None: any may; see `probe`)."""
        states = self.tables.states
        check_files = functools.partial(added_files_problem, self.publisher.locations)
        halted = self.publisher.halted_tables()
        # Tables whose store has not taken every ratified version: their compatible appends share versions.
        busy = self.publisher.lagging({x.proposal.table_id for x in proposals}) | self.paced
        decided, overlay = decide_batch(states, proposals, now_ms, halted=halted, check_files=check_files,
                                        earlier=self.earlier_decision, busy=busy)
        claims: dict[str, InvalidProposalError | None] = {}
        refused: dict[str, InvalidProposalError] = {}
        probed: dict[tuple[str, int], str | None] = {}
        unavailable: set[str] = set()
        while True:
            taken = self.claim_created(overlay, proposals, claims)
            if taken:
                refused.update(taken)
                decided, overlay = decide_batch(states, proposals, now_ms, halted=halted, check_files=check_files,
                                                earlier=self.earlier_decision, refused_creates=refused, busy=busy)
                continue
            ahead = {d.table_id for d in decided if d.reason_code == ReasonCode.READ_VERSION_AHEAD.value}
            foreign, cannot = self.probe(overlay, probed, ahead, told_when_ratified)
            foreign.update(self.confirm_claims(overlay))
            if not foreign and not cannot:
                decided, cannot = self.by_reference(decided, proposals)
            encoded = self.encode_all(decided, foreign)
            if not foreign and not cannot:
                break
            if all(t in halted for t in [*foreign, *cannot]):
                # An invariant of this loop, not a user's condition: a table halted here decides nothing more, so
                # its decisions cannot still be in the batch; the partition stops rather than spin.
                raise RuntimeError(f"partition {self.partition}: the decisions of halted tables {sorted(foreign)} cannot be "
                                   "encoded either")
            for tid, why in foreign.items():
                uri = overlay.tables[tid].table_uri if tid in overlay.tables else self._uri_of(tid, proposals)
                log.error("partition %d: %s: %s", self.partition, tid, why)
                self.halt(tid, uri, why)
            unavailable.update(cannot)
            halted = {**halted, **foreign, **cannot}
            decided, overlay = decide_batch(states, proposals, now_ms, halted=halted, check_files=check_files,
                                            earlier=self.earlier_decision, refused_creates=refused, busy=busy)
        if unavailable:
            decided = [dataclasses.replace(d, reason_code=ReasonCode.STORAGE_UNAVAILABLE.value)
                       if d.table_id in unavailable and d.reason_code == ReasonCode.TABLE_HALTED.value
                       and d.table_id not in self.publisher.halted_tables() else d for d in decided]
        hints: dict[str, str] = {}
        decided = [self.with_table_hint(d, hints) if d.reason_code == ReasonCode.UNKNOWN_TABLE.value else d
                   for d in decided]
        for tid, why in overlay.halts.items():
            self.halt(tid, self._uri_of(tid, proposals), why)
        return decided, overlay, encoded

    def halt(self, table_id: str, table_uri: str, why: str) -> None:
        """Halt a table from the deciding thread: its halt record goes with the next transaction of the partition."""
        st = self.tables.states.get(table_id)
        self.publisher.halt(table_id, table_uri, why, notify=False, head=st.version if st is not None else -1)

    def earlier_decision(self, table_id: str, proposal_id: str) -> Decision | None:
        """The first decision of a proposal id, for deciding proposals: an adoption or release record answered a
        control request, and is no answer to a proposal that reuses its id (recovery would fold the copy as one)."""
        first = self.tables.decided.get(table_id, proposal_id)
        return None if first is None or control_kind(first) is not None else first

    def _uri_of(self, table_id: str, proposals: Sequence[Submitted]) -> str:
        st = self.tables.states.get(table_id)
        if st is not None:
            return st.table_uri
        return next((p.proposal.table_uri for p in proposals if p.proposal.table_id == table_id), "")

    @staticmethod
    def encode_all(decided: Sequence[Decision], faults: dict[str, str]) -> dict[int, bytes]:
        """Encode the batch's decisions (by id()); a table whose decision cannot be encoded goes to `faults`."""
        out: dict[int, bytes] = {}
        for d in decided:
            if d.table_id in faults:
                continue
            try:
                out[id(d)] = encode_decision(on_the_wire(d))
            except Exception as e:  # a fault of this code on that table
                log.exception("encoding the decision of %s for table %s failed", d.proposal_id[:100], d.table_id[:200])
                faults[d.table_id] = (f"encoding a decision of this table failed unexpectedly ({type(e).__name__}: {e}); "
                                      "the table is halted so that the other tables go on. Report it with the log")
        return out

    def probe(self, overlay: Overlay, probed: dict[tuple[str, int], str | None],
              ahead: Collection[str] = (), told_when_ratified: Collection[str] | None = None,
              ) -> tuple[dict[str, str], dict[str, str]]:
        """Tables the batch would ratify a version of, or whose proposals read beyond their head (`ahead`), whose
        `<v>.json` (v: the version after the head) already exists (foreign, why), and those whose store cannot say
        (unavailable, why). `probed` caches answers within the batch.

        A table whose lane has not published its newest ratified version yet is not asked: a Delta writer writes
        the version after the newest it lists, so `<v>.json` cannot appear around the coordinator before
        `<v-1>.json`, which is ours and unpublished; one written there meets our publication, which halts the table
        (and tells its writers the version is unpublished). Under load, when each question would cost the deciding
        thread a store round trip per batch, the lanes are busy and nothing is asked.

        Nor is a table asked whose `<v-1>.json` this process created less than `FREE_AFTER_OWN_PUT_S` ago, when
        every writer of its proposals hears their outcome only once their version is published: `<v>.json` was
        surely absent when that PUT began, and one written since meets our publication as above (a writer that
        finds its version without a reply checks that the file names its proposal). So a table written by one
        writer at a time (an idle lane at each commit) pays no round trip on the deciding thread. Tables of
        `told_when_ratified` (see `PartitionCoordinator._told_when_ratified`) are asked, as are all when it is
        None."""
        foreign: dict[str, str] = {}
        unavailable: dict[str, str] = {}
        states = self.tables.states
        uris = {**{tid: states[tid].table_uri for tid in ahead if tid in states}, **{
            tid: st.table_uri for tid, st in overlay.tables.items()}}
        lagging = self.publisher.lagging(uris)
        keys = {tid: (tid, live.version + 1 if (live := states.get(tid)) is not None else 0) for tid in uris
                if tid not in lagging}
        if told_when_ratified is not None:
            now = time.monotonic()
            keys = {tid: key for tid, key in keys.items()
                    if tid in ahead or tid in told_when_ratified or not self._known_free(tid, key[1], now)}
        # (table id, next version) -> table URI, for the keys not asked yet in this batch
        todo = {key: uris[key[0]] for key in keys.values() if key not in probed}

        def ask(key: tuple[str, int]) -> tuple[tuple[str, int], bool | Exception]:
            try:
                return key, self.publisher.locations.storage(todo[key]).exists(commit_key(key[1]))
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                return key, e

        # The tables' stores are asked at once: on an object store each question is a round trip.
        answers = list(map(ask, todo)) if len(todo) < 2 else list(probe_pool().map(ask, todo))
        for (tid, v), found in answers:
            if isinstance(found, Exception):
                unavailable[tid] = (f"the table's storage could not be checked for a version {v} written around the "
                                    f"coordinator ({found}); nothing was decided, retry")
                probed[(tid, v)] = "unavailable"
            else:
                probed[(tid, v)] = None if not found else (
                    f"_delta_log/{commit_key(v).rsplit('/', 1)[-1]} exists, but version {v} was not ratified: it was "
                    "written around the coordinator, and a commit as that version would be invisible. The table is "
                    "halted; see 'Recover a halted table'")
        for tid, key in keys.items():
            why = probed[key]
            if why == "unavailable":
                unavailable.setdefault(tid, "the table's storage could not be checked; retry")
            elif why is not None:
                foreign[tid] = why
        return foreign, unavailable

    def _known_free(self, table_id: str, version: int, now: float) -> bool:
        """Whether this process created the table's `<version-1>.json` less than `FREE_AFTER_OWN_PUT_S` before `now`
        (`Publisher.free_since`), so `<version>.json` is taken as absent without asking the store (`probe`)."""
        since = self.publisher.free_since(table_id, version)
        return since is not None and now - since < FREE_AFTER_OWN_PUT_S

    def claim_created(self, overlay: Overlay, proposals: Sequence[Submitted],
                       claims: dict[str, InvalidProposalError | None]) -> dict[str, InvalidProposalError]:
        """Claim the location of each table the batch creates (`claim_problem`); the tables refused, with why.
        `claims` caches answers within the batch."""
        refused: dict[str, InvalidProposalError] = {}
        for tid in overlay.created:
            if tid not in claims:
                st = overlay.tables[tid]
                by = next((x.proposal.proposal_id for x in proposals if x.proposal.table_id == tid
                           and x.proposal.read_version < 0), "")
                claims[tid] = claim_problem(self.publisher.locations, tid, st.table_uri, by, int(time.time() * 1000),
                                            creating=True)
                if claims[tid] is not None:
                    log.warning("partition %d: the creation of table %s at %s is refused: %s", self.partition, tid[:200],
                                st.table_uri[:500], str(claims[tid])[:500])
            why = claims[tid]
            if why is not None:
                refused[tid] = why
            else:
                self.tables.claimed.add(tid)
        return refused

    def confirm_claims(self, overlay: Overlay) -> dict[str, str]:
        """Tables the batch commits to whose location another table id holds -> why (they halt). A table not seen
        yet in this process claims its location if nobody does (one created or adopted before claims existed);
        a store that does not answer is asked again at the next batch."""
        todo = [(tid, st.table_uri) for tid, st in overlay.tables.items()
                if tid not in self.tables.claimed and tid not in overlay.created]
        now_ms = int(time.time() * 1000)

        def ask(item: tuple[str, str]) -> tuple[str, str, Claim | Exception]:
            tid, uri = item
            try:
                return tid, uri, claim(self.publisher.locations.storage(uri), Claim(tid, now_ms, "a commit"))
            except (TableLocationError, StorageError, OSError, ValueError) as e:
                return tid, uri, e

        taken: dict[str, str] = {}
        answers = list(map(ask, todo)) if len(todo) < 2 else list(probe_pool().map(ask, todo))
        for tid, uri, holder in answers:
            if isinstance(holder, Exception):
                log.info("partition %d: the claim of %s could not be checked (%s); asking again at the next batch",
                         self.partition, uri[:500], holder)
            elif holder.table_id == tid:
                self.tables.claimed.add(tid)
            else:
                taken[tid] = (
                    f"{uri} is the location of table id {holder.table_id!r} ({CLAIM_KEY}), not of this table ({tid!r}): "
                    "two table ids over one _delta_log would both ratify the same versions, so this one is halted "
                    "before it ratifies any. Keep one of them: release the other (`deltacoord table release ... "
                    "--table-id ...`), or, if this table is the one to keep, remove the claim and resume it")
        return taken

    def by_reference(self, decided: Sequence[Decision],
                      proposals: Sequence[Submitted]) -> tuple[list[Decision], dict[str, str]]:
        """Large commits are recorded by reference (`deltacoord.schemas.staged`): the whole commit is staged in the table's
        store before the transaction that ratifies it, and the decision names it by digest. Versions of proposals
        that came by reference, and any with more actions than a message should hold. Tables whose store did not
        take the file are returned with why (their batch is decided again without them: nothing is ratified)."""
        by_ref = {(x.proposal.table_id, x.proposal.proposal_id): x.proposal for x in proposals
                  if x.proposal.staged is not None}
        out: list[Decision] = []
        cannot: dict[str, str] = {}
        for d in decided:
            if (d.holds_version and d.staged is None
                    and ((d.table_id, d.proposal_id) in by_ref or len(d.actions) > DECISION_INLINE_MAX_ACTIONS)):
                try:
                    d = stage_decision(self.publisher.locations.storage(d.table_uri), d, by_ref.get((d.table_id, d.proposal_id)))
                except (TableLocationError, StorageError, OSError) as e:
                    cannot[d.table_id] = (f"the table's store did not take the staged commit of version {d.version} "
                                          f"({e}); nothing was decided, retry")
            out.append(d)
        return out, cannot

    def drop_writer_staged(self, proposals: Sequence[Submitted]) -> None:
        """Once decided and recorded, a proposal's staged actions are not needed (the decision holds or names
        the commit): deleted off the deciding thread. One left by a crash is swept by VACUUM."""
        staged = [x.proposal for x in proposals if x.proposal.staged is not None]
        if not staged:
            return

        def drop(p: Proposal) -> None:
            assert p.staged is not None
            try:
                delete_writer_staged(self.publisher.locations.storage(p.table_uri), p.proposal_id, p.staged)
            except (TableLocationError, StorageError, OSError) as e:
                log.warning("partition %d: deleting the staged actions of %s failed (%s); VACUUM removes them",
                            self.partition, p.proposal_id[:100], e)

        for p in staged:
            probe_pool().submit(drop, p)

    def with_table_hint(self, d: Decision, hints: dict[str, str]) -> Decision:
        """An UNKNOWN_TABLE rejection with what to do: adopt the Delta table found at its location, or create one."""
        uri = d.table_uri
        if uri not in hints:
            try:
                head = newest_commit_version(self.publisher.locations.storage(uri))
            except (TableLocationError, StorageError, OSError, ValueError):
                head = None
            if head is None:
                hints[uri] = (f" If a Delta table exists at {uri}, adopt it: `deltacoord table adopt {uri}`; else create "
                              f"it: `deltacoord table create {uri} --schema ...`")
            elif head >= 0:
                hints[uri] = (f" A Delta table exists at {uri} (version {head}), but this coordinator does not decide its "
                              f"commits: put it under coordination with `deltacoord table adopt {uri}` (Python: "
                              "Table(uri, ...).adopt())")
            else:
                hints[uri] = (f" There is no Delta table at {uri}: create it first with `deltacoord table create {uri} "
                              "--schema ...` (Python: Table(uri, ...).create(schema))")
        return dataclasses.replace(d, error_message=f"{d.error_message or ''}{hints[uri]}")
