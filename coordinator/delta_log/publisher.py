"""Publication of ratified commits to `_delta_log`, strictly in version order.

A version is ratified once its decision is committed in Kafka; publication is
its view for Delta readers, written with `files.put_if_absent` (a conditional
write on object stores). An existing identical file is fine (re-publication
after a crash or by a fenced peer); a different one means someone wrote around
the coordinator, so the table halts and nothing is overwritten. A table this
coordinator may not write (outside its `table_roots`, a bad URI, storage
options that cannot reach it) halts too, as does a local filesystem that
cannot create a name atomically. Other I/O errors (a full disk, a read-only
mount, a store that does not answer) are retried until they clear. An
unexpected error publishing one table halts that table only; the thread goes
on with the others. Halts are kept in the process's one record of halts
(`deltacoord.coordinator.halts`), from which the partition loops persist them
(`deltacoord.coordinator.kafka.control`); every halt is also reported to `on_halted`.

A version decided by this process carries its decision's place on the commits
topic (`stable_at`); it is published only once `stable` says Kafka's
`read_committed` readers see that record (see `deltacoord.coordinator.kafka.stability`), so
`_delta_log` never runs ahead of the commits topic.

Each table publishes in a lane of its own: its versions strictly in order, one
table's store at a time on one thread, while up to `lanes` tables publish at once.
On an object store every conditional PUT is a round trip (20-60 ms on S3), so a
single queue would cap a coordinator at one version per round trip over all its
tables, and one slow or throttled bucket would hold every other table back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deltacoord.coordinator.delta_log.files import (
    HardLinksRefusedError,
    Put,
    put_if_absent,
    put_many_if_absent,
    temp_file_for,
)
from deltacoord.coordinator.faults import fault_armed, fault_point
from deltacoord.coordinator.halts import Halts
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.coordinator.metrics import TableGauges
from deltacoord.coordinator.stable_wait import StableCheck, StableWait
from deltacoord.reader.log import commit_key
from deltacoord.reader.staged_commits import copy_decided, is_published_as, sweep_decided
from deltacoord.schemas.actions import Action, commit_to_json_lines
from deltacoord.schemas.messages import StagedActions
from deltacoord.schemas.staged import StagedCommitError, decided_key
from deltacoord.storage.table import StorageConfigError, StorageError, StoredObject, TableStorage

log = logging.getLogger(__name__)

#: Versions published together at most (one flush on a local filesystem).
MAX_BATCH = 64
#: Tables publishing at once (each a conditional PUT in flight on an object store).
DEFAULT_LANES = 16
#: How long a stopping publisher still waits for Kafka to make a decision readable; then it leaves it unpublished.
STOP_WAIT_S = 5.0
#: Weight of the newest figure in the moving averages of a PUT's and a hand-over's duration (`Publisher.paced`).
_EWMA = 0.2


@dataclass(frozen=True)
class PublishTask:
    table_id: str
    table_uri: str
    version: int
    actions: tuple[Action, ...]
    #: (commits partition, offset) of the decision when this process recorded it; None when read back from Kafka.
    stable_at: tuple[int, int] | None = None
    #: (proposal id, reference) of a commit recorded by reference: its staged file is deleted once published.
    staged: tuple[str, StagedActions] | None = None
    #: The version's bytes when already serialised (a commit staged by reference): not serialised again.
    data: bytes | None = None
    #: When (wall clock, s) the deciding thread began the batch that ratified it: how long a decision takes to reach
    #: the lane is measured from it (`Publisher.paced`). None: not measured (read back from Kafka, tests).
    decided_at: float | None = None

    def __post_init__(self) -> None:
        if self.staged is not None and self.data is not None and len(self.data) != self.staged[1].size:
            raise ValueError(f"{self.table_id} v{self.version}: the bytes to publish are not the staged commit")
        if self.staged is not None and self.data is not None and len(self.actions) != self.staged[1].count:
            raise ValueError(f"{self.table_id} v{self.version}: a decision recorded by reference must be resolved "
                             f"before it is published ({len(self.actions)} of {self.staged[1].count} actions)")

    @property
    def from_staged_file(self) -> bool:
        """Published from the coordinator's staged commit, copied a piece at a time: the task holds neither its
        bytes nor its file actions (`actions` keeps the few others, for the hooks), so a commit of a million
        files waiting to be published holds no memory for them."""
        return self.staged is not None and self.data is None


@dataclass
class TablePublication:
    """What the publisher knows of one table."""

    ratified: int = -1
    published: int = -1
    #: Since when (monotonic) a version of the table has been tried without being published; None: not trying.
    trying_since: float | None = None
    #: The last error of that attempt (None: none yet, the store has not answered).
    last_error: str | None = None
    uri: str = ""
    #: How long the table's store takes a version (s, a moving average of the PUTs that succeeded at once).
    put_s: float | None = None
    #: (v, t): this publisher created `<v-1>.json` (a put-if-absent that found nothing there) with attempts that
    #: started at monotonic t, so no Delta writer can have written `<v>.json` before t: one writes the version after
    #: the newest it lists (`Publisher.free_since`).
    next_free: tuple[int, float] | None = None


@dataclass(frozen=True)
class PublishFailure:
    """A table whose publication has not succeeded for a while (what `/healthz` names)."""

    table_id: str
    table_uri: str
    version: int
    seconds: float
    error: str | None


#: Called after version v of a table is published: (table_id, table_uri, version, actions, how many actions the
#: version holds; a version published from a staged file keeps only its few non-file actions in `actions`).
PublishedHook = Callable[[str, str, int, Sequence[Action], int], None]
#: Called when a ratified version will not be published because its table is halted: (task, why).
UnpublishedHook = Callable[[PublishTask, str], None]
#: Called when a table halts: (table_id, table_uri, why).
HaltedHook = Callable[[str, str, str], None]


@dataclass
class Publisher:
    """A thread that publishes ratified versions in order, off the deciding path."""

    fsync: bool = True
    on_published: PublishedHook | None = None
    on_unpublished: UnpublishedHook | None = None
    on_halted: HaltedHook | None = None
    #: The process's halts (shared with the partition loops): a halted table is neither decided nor published.
    halts: Halts = field(default_factory=Halts)
    #: Where tables may be written and with which storage options (default: local tables anywhere).
    locations: TableLocations = field(default_factory=TableLocations)
    #: Whether a decision's record is readable; None: every submitted version counts as readable.
    stable: StableCheck | None = None
    tables: dict[str, TablePublication] = field(default_factory=dict)
    #: Tables publishing at once; a table's versions are published in order, by one lane at a time.
    lanes: int = DEFAULT_LANES
    #: Versions handed over together (one decided batch's: one wake-up of the dispatcher per batch).
    _q: queue.Queue[list[PublishTask] | None] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None
    #: Tables whose lane should run, taken by the lane threads (None ends one).
    _ready: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _lane_threads: list[threading.Thread] = field(default_factory=list)
    #: Per table, the versions waiting for its lane (in order); a table is in `_busy` while a lane runs it.
    _lane_q: dict[str, deque[PublishTask]] = field(default_factory=dict)
    _busy: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _idle: threading.Condition = field(init=False)
    _pending: int = 0
    _abandoned: bool = False
    _stopping: bool = False
    _wait: StableWait | None = None
    _forgotten: set[str] = field(default_factory=set)
    #: How long a decided version takes to reach its lane (s, a moving average; None: not measured yet): the
    #: decision, its Kafka transaction, the wait until Kafka's readers see it.
    handover_s: float | None = None

    def __post_init__(self) -> None:
        self._idle = threading.Condition(self._lock)

    def start(self) -> None:
        if self.stable is not None:
            self._wait = StableWait(self.stable, "publication")
        if self.lanes < 1:
            raise ValueError(f"publish lanes must be 1 or more, got {self.lanes}")
        # Daemon threads, as the dispatcher: a store that never answers must not keep the process from exiting.
        self._lane_threads = [threading.Thread(target=self._lane_worker, name=f"deltacoord-publish-lane-{i}", daemon=True)
                              for i in range(self.lanes)]
        for t in self._lane_threads:
            t.start()
        self._thread = threading.Thread(target=self._run, name="deltacoord-publisher", daemon=True)
        self._thread.start()

    def submit(self, task: PublishTask) -> None:
        """Queue a ratified version; versions of a table must be submitted in order."""
        self.submit_all((task,))

    def submit_all(self, tasks: Sequence[PublishTask]) -> None:
        """Queue ratified versions (a decided batch's, in order) with one hand-off to the publisher's thread."""
        if not tasks:
            return
        with self._lock:
            for task in tasks:
                self._forgotten.discard(task.table_id)
                t = self.tables.setdefault(task.table_id, TablePublication())
                t.ratified = max(t.ratified, task.version)
                t.uri = task.table_uri or t.uri
            self._pending += len(tasks)
        self._q.put(list(tasks))

    def unstable_for(self, now: float | None = None) -> tuple[int, int, float] | None:
        """(partition, offset, seconds) while publication waits for Kafka to make a record readable."""
        return None if self._wait is None else self._wait.waited(now)

    def lag(self) -> int:
        """Ratified but not yet published versions, over all tables."""
        with self._lock:
            return sum(max(0, t.ratified - t.published) for tid, t in self.tables.items() if not self._is_halted(tid))

    def failing(self, longer_than_s: float, now: float | None = None) -> list[PublishFailure]:
        """Tables (not halted) whose next version has been tried for more than `longer_than_s` without being
        published: a full or read-only disk, a store that refuses or does not answer."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return [PublishFailure(tid, t.uri, t.published + 1, now - t.trying_since, t.last_error)
                    for tid, t in self.tables.items()
                    if not self._is_halted(tid) and t.trying_since is not None and now - t.trying_since > longer_than_s]

    def _trying(self, task: PublishTask, error: BaseException | None = None) -> None:
        """Note an attempt to publish `task` (from its first try until it is published), with its error if any."""
        with self._lock:
            t = self.tables.get(task.table_id)
            if t is None:
                return
            if t.trying_since is None:
                t.trying_since = time.monotonic()
            t.uri = task.table_uri
            if error is not None:
                t.last_error = f"{type(error).__name__}: {error}"

    def lagging(self, table_ids: Iterable[str], by: int = 1) -> frozenset[str]:
        """Tables (of `table_ids`, not halted) with at least `by` ratified versions their store has not taken yet:
        a lane busy with them (what makes a table's next commits share versions, `deltacoord.coordinator.rules.coalesce`)."""
        with self._lock:
            return frozenset(tid for tid in table_ids if (t := self.tables.get(tid)) is not None
                             and not self._is_halted(tid) and t.ratified - t.published >= by)

    def paced(self, table_ids: Iterable[str], now: float | None = None) -> frozenset[str]:
        """Tables (of `table_ids`, not halted) whose next version, were it decided now, would only wait in the lane
        behind another: one version queued behind the one in flight, or one in flight (or about to start) that
        lands later than a version decided now could reach the lane (its PUT started less than the store's PUT
        time less the hand-over time ago). Their proposals are best decided later, together (group commit), so
        that the version they share reaches the lane as the one in flight lands. A store faster than the
        hand-over (a local disk) paces only at one version queued."""
        now = time.monotonic() if now is None else now
        handover = self.handover_s or 0.0
        out = []
        with self._lock:
            for tid in table_ids:
                t = self.tables.get(tid)
                if t is None or self._is_halted(tid):
                    continue
                behind = t.ratified - t.published
                in_flight = behind == 1 and t.put_s is not None and t.put_s > handover
                if behind >= 2 or (in_flight and (t.trying_since is None or now < t.trying_since + (t.put_s or 0) - handover)):
                    out.append(tid)
        return frozenset(out)

    def behind(self, versions: Mapping[str, int]) -> list[str]:
        """Tables (of `versions`, table id -> version) whose version is not published yet and not halted."""
        with self._lock:
            return [tid for tid, v in versions.items()
                    if (t := self.tables.get(tid)) is None or (not self._is_halted(tid) and t.published < v)]

    def free_since(self, table_id: str, version: int) -> float | None:
        """Since when (monotonic) `<version>.json` of the table was surely absent, when this publisher created the
        version before it and published nothing since (None: not known). A re-publication that found its bytes there
        already, or versions recovery found, prove nothing: something may have listed them long ago."""
        with self._lock:
            t = self.tables.get(table_id)
            if t is None or t.next_free is None or t.next_free[0] != version or t.published != version - 1:
                return None
            return t.next_free[1]

    def mark_published(self, table_id: str, version: int) -> None:
        """What recovery found in `_delta_log`: versions up to `version` need no publication."""
        with self._lock:
            self._forgotten.discard(table_id)
            t = self.tables.setdefault(table_id, TablePublication())
            t.published = max(t.published, version)
            t.ratified = max(t.ratified, version)

    def published_version(self, table_id: str) -> int:
        """The newest version of the table this publisher published (-1: none, or unknown)."""
        with self._lock:
            t = self.tables.get(table_id)
            return -1 if t is None else t.published

    def _is_halted(self, table_id: str) -> bool:
        return self.halts.why(table_id) is not None

    def halted(self, table_id: str) -> str | None:
        return self.halts.why(table_id)

    def halted_tables(self) -> dict[str, str]:
        """Table id -> why its publication is halted (a copy: admission reads it once per batch)."""
        return self.halts.tables()

    def table_gauges(self) -> list[TableGauges]:
        """Each table's versions and halt, labelled by its URI (its id until a version names the URI)."""
        halted = self.halts.tables()
        with self._lock:
            return [TableGauges(t.uri or tid, t.ratified, t.published, tid in halted) for tid, t in self.tables.items()]

    def halted_count(self) -> int:
        return self.halts.count()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted task was handled."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def stop(self, timeout_s: float = 60.0) -> None:
        """Publish what is queued, then end the threads."""
        if self._thread is None:
            return
        self._stopping = True
        self._q.put(None)
        self._thread.join(timeout_s)
        self._thread = None
        self.wait_idle(timeout_s)  # the lanes finish what the dispatcher handed them
        for _ in self._lane_threads:
            self._ready.put(None)
        self._lane_threads = []

    def forget(self, table_ids: Iterable[str]) -> None:
        """Stop publishing these tables (their partition moved to another coordinator)."""
        with self._lock:
            for t in table_ids:
                self.tables.pop(t, None)
                self._forgotten.add(t)
        self.halts.forget(table_ids)

    def reset(self, table_id: str) -> None:
        """Forget all of a dropped table (its versions, its halt) and publish a table created later under the same
        id from version 0 on. The caller waited for the table's lane to be idle (published or halted)."""
        with self._lock:
            self.tables.pop(table_id, None)
            self.halts.reset(table_id)
            self._forgotten.discard(table_id)
            queued = self._lane_q.get(table_id)
            if queued:  # versions of the dropped table still waiting (its halt held them): never published
                self._pending -= len(queued)
                queued.clear()
                self._idle.notify_all()

    def abandon(self) -> None:
        """Drop what is queued and end the thread (a fenced coordinator publishes nothing)."""
        self._abandoned = True
        self.stop(timeout_s=5.0)

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            batch, stop = list(first), False
            while len(batch) < MAX_BATCH:  # what the decider queued meanwhile is published together
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.extend(nxt)
            if not self._await_stable(batch):
                # Abandoned, or stopping while Kafka still hides a decision: publish and tell nothing of it
                # (the next owner reads the commits topic and publishes what is there).
                with self._idle:
                    self._pending -= len(batch)
                    self._idle.notify_all()
                if stop:
                    return
                continue
            self._to_lanes(batch)
            if stop:
                return

    def _to_lanes(self, tasks: Sequence[PublishTask]) -> None:
        """Queue readable versions for their tables' lanes, starting each lane that does not run."""
        start: list[str] = []
        now = time.time()
        with self._lock:
            for task in tasks:
                if task.decided_at is not None:
                    took = max(0.0, now - task.decided_at)
                    self.handover_s = took if self.handover_s is None else \
                        self.handover_s + _EWMA * (took - self.handover_s)
                self._lane_q.setdefault(task.table_id, deque()).append(task)
                if task.table_id not in self._busy:
                    self._busy.add(task.table_id)
                    start.append(task.table_id)
        for table_id in start:
            self._ready.put(table_id)

    def _lane_worker(self) -> None:
        while (table_id := self._ready.get()) is not None:
            self._lane(table_id)

    def _lane(self, table_id: str) -> None:
        """Publish the table's queued versions in order until none is left (one lane per table at a time)."""
        while True:
            with self._lock:
                q = self._lane_q.get(table_id)
                if not q:
                    self._lane_q.pop(table_id, None)
                    self._busy.discard(table_id)
                    return
                tasks = [q.popleft() for _ in range(min(len(q), MAX_BATCH))]
            try:
                self._publish_many(tasks)
            except Exception as e:  # a bug, or a failure nothing here handles: it stops this table only
                first = tasks[0]
                log.exception("publishing %s v%d failed unexpectedly", first.table_id, first.version)
                self._halt(first, (
                    f"publishing version {first.version} failed unexpectedly ({type(e).__name__}: {e}). The table "
                    "is halted; versions from this one on are not published"))
                for t in tasks[1:]:
                    try:
                        self._publish(t)  # reported unpublished: the table is halted
                    except Exception:
                        log.exception("reporting %s v%d unpublished failed", t.table_id, t.version)
            finally:
                with self._idle:
                    self._pending -= len(tasks)
                    self._idle.notify_all()

    def _await_stable(self, batch: Sequence[PublishTask]) -> bool:
        """Wait until every decision of `batch` recorded by this process is readable on the commits topic.
        False when abandoned, or stopping and Kafka kept one hidden for `STOP_WAIT_S`."""
        need: dict[int, int] = {}
        for t in batch:
            if t.stable_at is not None:
                p, o = t.stable_at
                need[p] = max(need.get(p, -1), o)
        if self._wait is None or not need:
            return True

        def give_up(waited: float) -> bool:
            return self._abandoned or (self._stopping and waited > STOP_WAIT_S)

        if self._wait.until(need, give_up):
            return True
        log.error("stopping with decisions on commits partitions %s not readable in Kafka: their versions stay "
                  "unpublished", sorted(need))
        return False

    def _publish_many(self, tasks: list[PublishTask]) -> None:
        """Publish a table's consecutive versions; on a local filesystem with one flush for all of them
        (`files.put_many_if_absent`), elsewhere (and for one version) one put each (`_publish`)."""
        todo = [t for t in tasks if not self._skip(t)]
        storage = self._flush_together_on(todo)
        if storage is None:
            for t in tasks:
                self._publish(t)
            return
        items = [(commit_key(t.version), t.data if t.data is not None else commit_to_json_lines(t.actions)) for t in todo]
        self._trying(todo[0])
        try:
            outcomes = put_many_if_absent(storage, items, fsync=self.fsync)
        except HardLinksRefusedError as e:
            self._halt(todo[0], f"{e}. The table is halted; nothing was written.")
            for t in todo[1:]:
                self._publish(t)
            return
        except (OSError, StorageError) as e:
            self._trying(todo[0], e)
            log.warning("publishing %d versions of %s together failed (%s); publishing them one by one",
                        len(todo), todo[0].table_uri, e)
            outcomes = []
        for t, outcome in zip(todo, outcomes, strict=False):
            if outcome is Put.DIFFERENT:
                self._publish(t)  # compares again and halts the table
                break
            self._published(t, outcome)
        for t in todo[len(outcomes):]:
            self._publish(t)

    def _flush_together_on(self, todo: list[PublishTask]) -> TableStorage | None:
        """The local storage `todo` (two versions or more) can be flushed to at once; None: one put each, as
        for one version, an armed fault (it counts passes one version at a time), a location that cannot be
        opened (the first put halts the table, the rest are reported unpublished) or an object store (one
        conditional PUT per version)."""
        if len(todo) < 2 or fault_armed("publish") or any(t.from_staged_file for t in todo):
            return None
        try:
            storage = self.locations.storage(todo[0].table_uri)
        except (TableLocationError, StorageConfigError):
            return None
        return storage if storage.is_local else None

    def _skip(self, task: PublishTask) -> bool:
        with self._lock:
            t = self.tables.get(task.table_id)
            return (self._abandoned or task.table_id in self._forgotten or self._is_halted(task.table_id)
                    or (t is not None and task.version <= t.published))

    def halt(self, table_id: str, table_uri: str, why: str, *, notify: bool = True, recorded: bool = False,
             head: int | None = None) -> None:
        """Stop publishing (and deciding) `table_id` (in `halts`, to be recorded on the commits topic unless
        `recorded`); `notify`: report it to `on_halted` (False: the deciding thread halts it itself)."""
        with self._lock:
            if notify and table_id in self._forgotten:
                return  # its partition moved: the new owner finds the cause itself
            self._forgotten.discard(table_id)
            t = self.tables.setdefault(table_id, TablePublication())
            t.trying_since = t.last_error = None
            first = self.halts.halt(table_id, table_uri, why, recorded=recorded, head=head)
        if first:
            log.error("halting table %s: %s", table_id, why)
        if notify and self.on_halted is not None:
            self.on_halted(table_id, table_uri, why)

    def resume(self, table_id: str) -> None:
        """Lift a halt in memory (the caller persisted the resumption and republishes what it held back)."""
        self.halts.lift(table_id)

    def _halt(self, task: PublishTask, why: str) -> None:
        self.halt(task.table_id, task.table_uri, why)
        self._unpublished(task, why)

    def _unpublished(self, task: PublishTask, why: str) -> None:
        """Tell the writer waiting for `task`'s publication that it will not happen (its table is halted)."""
        if self.on_unpublished is not None:
            try:
                self.on_unpublished(task, why)
            except Exception:
                log.exception("unpublished hook failed for %s v%d", task.table_id, task.version)

    def _publish(self, task: PublishTask) -> None:
        with self._lock:
            t = self.tables.setdefault(task.table_id, TablePublication())
        if self._gone(task, t):
            return
        if fault_point("publish"):  # the fault harness's crash, not a condition anyone meets
            raise RuntimeError(f"injected fault: the publisher dies before publishing {task.table_id} v{task.version}")
        data = None if task.from_staged_file else task.data if task.data is not None else commit_to_json_lines(task.actions)
        try:
            storage = self.locations.storage(task.table_uri)
        except (TableLocationError, StorageConfigError) as e:
            self._halt(task, f"{e}. The table is halted; nothing was written.")
            return
        path = StoredObject(storage, commit_key(task.version))
        # Retry transient I/O errors (disk full, read-only mount, a store that does not answer)
        # until they clear: deciding goes on meanwhile and the lag metric shows the backlog.
        delay = 0.05
        self._trying(task)
        while True:
            try:
                outcome = put_if_absent(path, data, fsync=self.fsync) if data is not None else self._put_staged(task, path)
                break
            except HardLinksRefusedError as e:
                self._halt(task, f"{e}. The table is halted; nothing was written.")
                return
            except StagedCommitError as e:
                self._halt(task, f"{e}. The table is halted; nothing was written.")
                return
            except (OSError, StorageError) as e:
                if self._abandoned:
                    return
                self._trying(task, e)
                log.warning("publishing %s failed (%s); retrying in %.2fs", path, e, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                if self._gone(task, t):
                    return
        if outcome is Put.DIFFERENT:
            size = len(data) if data is not None else task.staged[1].size if task.staged is not None else 0
            self._halt(task, (
                f"{path} already exists with different content (expected {size} bytes): something wrote to this "
                "table around the coordinator. The table is halted; nothing was overwritten."))
            return
        self._published(task, outcome)

    def _gone(self, task: PublishTask, t: TablePublication) -> bool:
        """Whether `task` is not to be published (any more; `t` is the table's entry when its publication began): the
        table is halted (reported unpublished), forgotten or dropped (its entry replaced: a table re-created at that
        location must not get the old table's version), the version is published already, or the publisher was
        abandoned. Asked before the first attempt and before each retry."""
        with self._lock:
            halted = self.halts.why(task.table_id)
            if (self._abandoned or task.table_id in self._forgotten or halted is not None
                    or self.tables.get(task.table_id) is not t or task.version <= t.published):
                if halted is not None and not self._abandoned:
                    self._unpublished(task, halted)
                return True
            return False

    def _put_staged(self, task: PublishTask, path: StoredObject) -> Put:
        """`put_if_absent` of a version from its staged commit, copied a piece at a time into a temp file (its digest
        checked on the way). A staged commit already swept was published before: the version then holds it."""
        assert task.staged is not None
        proposal_id, ref = task.staged
        tmp = temp_file_for(path)
        if copy_decided(path.storage, proposal_id, task.version, ref, tmp):
            return put_if_absent(path, tmp, fsync=self.fsync)
        if is_published_as(path.storage, task.version, ref):
            return Put.IDENTICAL
        if path.storage.exists(path.key):
            return Put.DIFFERENT
        raise StagedCommitError(
            f"the staged commit of version {task.version} of {task.table_uri} ({decided_key(proposal_id, task.version, ref)}) "
            "is gone and the version was never published: its actions are lost from the store (deleted by hand?)")

    def _published(self, task: PublishTask, outcome: Put) -> None:
        if outcome is Put.IDENTICAL:
            log.info("version %d of %s was already published with the same content (a re-publication; nothing replaced)",
                     task.version, task.table_uri)
        with self._lock:
            t = self.tables.setdefault(task.table_id, TablePublication())
            if outcome is Put.WRITTEN and task.version > t.published:
                # Versions flushed together are tried from the first one's start (`_publish_many`).
                started = t.trying_since if t.trying_since is not None else (
                    t.next_free[1] if t.next_free is not None and t.next_free[0] == task.version else None)
                t.next_free = None if started is None else (task.version + 1, started)
            elif task.version >= t.published:
                t.next_free = None
            t.published = max(t.published, task.version)
            if t.trying_since is not None and t.last_error is None:
                took = time.monotonic() - t.trying_since
                t.put_s = took if t.put_s is None else t.put_s + _EWMA * (took - t.put_s)
            t.trying_since = t.last_error = None
        if task.staged is not None:
            try:  # the version holds the same bytes now: readers resolve the decision from it
                sweep_decided(self.locations.storage(task.table_uri), task.version)
            except (TableLocationError, StorageConfigError, StorageError, OSError) as e:
                log.warning("deleting the staged commit of %s v%d failed (%s); VACUUM removes it", task.table_uri,
                            task.version, e)
        if self.on_published is not None:
            try:
                count = task.staged[1].count if task.staged is not None else len(task.actions)
                self.on_published(task.table_id, task.table_uri, task.version, task.actions, count)
            except Exception:
                log.exception("post-publication hook failed for %s v%d", task.table_id, task.version)


__all__ = ["HaltedHook", "PublishFailure", "PublishTask", "PublishedHook", "Publisher", "TablePublication", "UnpublishedHook"]
