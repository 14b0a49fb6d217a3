"""MaxCompute's transaction rules: the `maxcompute` conflict profile (`deltacoord.conflictProfile`).

MaxCompute's MetaService decides two concurrent jobs on the same
non-partitioned table or the same partition by their job types
(`deltacoord.schemas.jobs.JobType`), earlier-finishing job (the winner, already
committed) against later-finishing job (the proposal being decided):

    earlier \\ later   INSERT OVERWRITE  INSERT INTO  UPDATE/DELETE  MINOR COMPACT  MAJOR COMPACT
    INSERT OVERWRITE   overwrites        fails        fails          fails          fails
    INSERT INTO        overwrites        fails        fails          compacts       fails
    UPDATE/DELETE      overwrites        fails        fails          compacts       fails
    MINOR COMPACT      overwrites        new data     new data       fails          compacts
    MAJOR COMPACT      overwrites        new data     new data       fails          fails

`check` walks the winners in version order like Delta's checker: first the
table-level checks every profile shares (protocol, metadata, domain metadata,
app ids: `checked.check_table_level`), then, for a winner that is a data
job touching the same partition (or the same non-partitioned table), the
cell's rule. A failed cell is `ConcurrentJobException`. A succeeding cell
may rebase the proposal at the metadata level, never by rewriting data:

* **overwrites** -- the later INSERT OVERWRITE/TRUNCATE also removes what the
  earlier job left in the overwritten scope: its remove set drops files the
  winner already removed and gains a `remove` for each file the winner added
  there.
* **new data** -- an INSERT INTO or UPDATE/DELETE after a compaction commits
  as written when no file it removes was compacted away (files it only read
  hold the same rows after a compaction). On a table with deletion vectors,
  the rows it changed in a compacted file are changed in the compaction's
  output instead, through the compaction's row map (`compaction`): MaxCompute's
  merge-on-read update, at the metadata level. Without deletion vectors (or
  without a row map to follow) the compacted file still holds the old rows and
  no metadata rebase is sound: the job fails.
* **compacts** -- a compaction commits as written when none of its input
  files was removed. After a minor compaction, a major compaction whose
  inputs include every file the minor one merged in a partition is rebased:
  it removes the minor compaction's output instead of its inputs (the same
  rows). After an UPDATE/DELETE of an input, on a table with deletion
  vectors, the compaction's output gets a vector marking the rows the
  UPDATE/DELETE removed, through its own row map (no data is read again);
  without deletion vectors it fails: its output would bring the old rows back.

Every accepted commit on such a table records `deltacoord.timeVersion`
(`deltacoord.schemas.jobs`), and a rebased one `deltacoord.rebase` (the winners it was
rebased over and the removes it gained and dropped; `rowsMovedOver`: the
winners whose row maps moved its changed rows or marked its output's rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from deltacoord.coordinator.rules.checked import CheckedTransaction, absorb_winner, check_table_level, follow_compaction
from deltacoord.coordinator.rules.conflicts import check_winners as delta_checks
from deltacoord.coordinator.rules.outcomes import Accepted, Conflict, Rejected
from deltacoord.coordinator.rules.pipeline import run_checks
from deltacoord.coordinator.rules.state import TableState, WinningCommit
from deltacoord.schemas.actions import Action, AddCDCFile, AddFile, RemoveFile
from deltacoord.schemas.errors import (
    ConcurrentJobException,
    InvalidProposalError,
    format_partition,
)
from deltacoord.schemas.expressions.partitions import (
    PartitionMatcher,
    PartitionSchema,
    Row,
    compile_read_predicates,
    row_of,
    row_to_mapping,
)
from deltacoord.schemas.jobs import TIME_VERSION_KEY, JobType, commit_job_type, creates_time_version, job_type
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.reasons import ReasonCode

#: commitInfo key of a rebased commit: the winners it was rebased over, removes gained and dropped.
REBASE_KEY = "deltacoord.rebase"


class Cell(StrEnum):
    """What one cell of the table says, in the seed's words."""

    LATER_FAILS = "the earlier job succeeds; the later job fails"
    OVERWRITES = "both succeed; the later job's result overwrites the earlier job's"
    NEW_DATA = "both succeed; the later job's new data is written"
    COMPACTS = "both succeed; the later job's compaction succeeds"


_IO, _II, _UD, _MI, _MA = (JobType.INSERT_OVERWRITE, JobType.INSERT_INTO, JobType.UPDATE_DELETE,
                           JobType.MINOR_COMPACTION, JobType.MAJOR_COMPACTION)
_F, _O, _N, _C = Cell.LATER_FAILS, Cell.OVERWRITES, Cell.NEW_DATA, Cell.COMPACTS

#: (earlier-finishing job, later-finishing job) -> the cell.
TABLE: Mapping[tuple[JobType, JobType], Cell] = {
    (earlier, later): cell
    for earlier, row in (
        (_IO, (_O, _F, _F, _F, _F)),
        (_II, (_O, _F, _F, _C, _F)),
        (_UD, (_O, _F, _F, _C, _F)),
        (_MI, (_O, _N, _N, _F, _C)),
        (_MA, (_O, _N, _N, _F, _F)),
    )
    for later, cell in zip((_IO, _II, _UD, _MI, _MA), row, strict=True)
}


# ---------------------------------------------------------------------------
# The job being decided
# ---------------------------------------------------------------------------


@dataclass
class Job:
    """The later-finishing job: its type, the partitions it touches, and its (rebased) remove set."""

    type: JobType
    schema: PartitionSchema
    #: Read the whole table, or the table is not partitioned: every partition is in scope.
    everything: bool
    #: Partitions it wrote, removed from or read files in.
    rows: frozenset[Row]
    #: Its read predicates (partition conjuncts), or None.
    matcher: PartitionMatcher | None
    removes: dict[str, RemoveFile]
    table: str
    now_ms: int
    gained: int = 0
    dropped: int = 0
    rebased_over: list[int] = field(default_factory=list)
    #: On a table with deletion vectors, Delta's checker state, which moves changed rows through row maps
    #: (`checked.CheckedTransaction`); None without deletion vectors.
    mover: CheckedTransaction | None = None
    #: The winners whose row maps moved rows of this job (`mover`).
    moved_over: list[int] = field(default_factory=list)

    def covers(self, row: Row) -> bool:
        """Whether a file in partition `row` is in the job's scope (the same partition)."""
        if self.everything or row in self.rows:
            return True
        return self.matcher is not None and self.matcher(row)

    def hint(self, row: Row | None) -> str | None:
        if row is None or not self.schema:
            return None
        return format_partition(row_to_mapping(row, self.schema), [c.name for c in self.schema])


def job_of(proposal: Proposal, schema: PartitionSchema, table: str, now_ms: int) -> Job | None:
    """The proposal as a MaxCompute job; None for a commit that is no data job (metadata only)."""
    files = [a for a in proposal.actions if isinstance(a, (AddFile, RemoveFile, AddCDCFile))]
    jt = job_type(proposal.operation, proposal.operation_parameters or _params(proposal))
    if jt is None:
        if files:
            raise InvalidProposalError(
                ReasonCode.UNKNOWN_JOB_TYPE,
                f"operation {proposal.operation!r} changes files of a table with deltacoord.conflictProfile=maxcompute, "
                "whose rules need its MaxCompute job type: use WRITE (mode Append or Overwrite), TRUNCATE, UPDATE, "
                "DELETE, MERGE or OPTIMIZE (parameter compaction=minor|major)",
            )
        return None
    rows = frozenset(row_of(a.partition_values, schema) for a in files) | frozenset(
        row_of(f.partition_values, schema) for f in proposal.read_files
    )
    matcher = compile_read_predicates(proposal.read_predicates, schema) if proposal.read_predicates and schema else None
    removes = {a.path: a for a in proposal.actions if isinstance(a, RemoveFile)}
    return Job(jt, schema, not schema or proposal.read_whole_table, rows, matcher, removes, table, now_ms)


def _params(proposal: Proposal) -> Mapping[str, Any]:
    p = proposal.commit_info.values.get("operationParameters")
    return p if isinstance(p, Mapping) else {}


# ---------------------------------------------------------------------------
# One rule per cell kind
# ---------------------------------------------------------------------------


def _fail(job: Job, w: WinningCommit, earlier: JobType | None, row: Row | None, why: str) -> Conflict:
    where = job.hint(row)
    msg = (
        f"ConcurrentJobException: this {job.type} job finished after a concurrent "
        f"{earlier or 'unclassified'} job ({w.operation or 'TRANSACTION'} committed at version {w.version})"
        f"{' in the partition ' + where if where else ''} of table {job.table}: {why}. Please try the operation again."
    )
    return Conflict(
        ConcurrentJobException(msg, winning_version=w.version, winning_operation=w.operation, partition=where,
                               table=job.table),
        w.version,
    )


def later_fails(job: Job, w: WinningCommit, earlier: JobType, row: Row) -> None:
    """The earlier job succeeds; the later job fails."""
    raise _fail(job, w, earlier, row, f"MaxCompute's rules fail the later-finishing job of this pair ({earlier}, then {job.type})")


def later_overwrites(job: Job, w: WinningCommit, earlier: JobType, row: Row) -> None:
    """Both succeed: the overwrite also removes what the earlier job left in its scope."""
    for r in w.removed_files:
        if job.removes.pop(r.path, None) is not None:
            job.dropped += 1
    for a in w.added_files:
        if a.path not in job.removes and job.covers(row_of(a.partition_values, job.schema)):
            job.removes[a.path] = _remove_of(a, job.now_ms, data_change=True)
            job.gained += 1
    job.rebased_over.append(w.version)


#: What a refusal that deletion vectors lift says.
ENABLE_DVS = ("enable deletion vectors on the table (delta.enableDeletionVectors = true) and the coordinator "
              "moves the changed rows through the compaction's row map, so both jobs succeed")


def new_data(job: Job, w: WinningCommit, earlier: JobType, row: Row) -> None:
    """Both succeed: the job commits as written when the compaction moved no row it changed; on a table with
    deletion vectors, its changes of a compacted file apply to the compaction's output (the row map)."""
    moved = sorted(p for p in job.removes if p in w.removed_paths)
    if not moved:
        return
    cur = job.mover
    if cur is None:
        raise _fail(job, w, earlier, row, f"the compaction rewrote {moved[0]}, which this job rewrites; its rows moved, "
                                          f"so no metadata-level rebase is sound: {ENABLE_DVS}")
    wc = None if w.zorder else w.compaction
    for p in moved:
        place = wc.placements.get(p) if wc is not None else None
        change = cur.changes.get(p)
        if place is None or change is None or not follow_compaction(cur, w, p, place, change):
            raise _fail(job, w, earlier, row, f"the compaction rewrote {p}, which this job rewrites, and its rows "
                                              "cannot be followed into the compaction's output (no row map recorded, "
                                              "or a deletion vector stored in a file)")
    # The job now changes the compaction's outputs: later winners are checked against those.
    for p in moved:
        del job.removes[p]
    for c in cur.changes.values():
        job.removes[c.remove.path] = c.remove
    job.moved_over.append(w.version)


def compaction_succeeds(job: Job, w: WinningCommit, earlier: JobType, row: Row) -> None:
    """Both succeed when the compaction's inputs are live, or were merged by an earlier compaction it contains."""
    lost = {p for p in job.removes if p in w.removed_paths}
    if not lost:
        return
    if not earlier.compaction:
        _absorb(job, w, earlier, row, lost)
        return
    for part in {row_of(r.partition_values, job.schema) for r in w.removed_files if r.path in lost}:
        merged = {r.path for r in w.removed_files if row_of(r.partition_values, job.schema) == part}
        if not merged <= job.removes.keys():
            raise _fail(job, w, earlier, part, "the earlier compaction merged files this compaction did not read; "
                                               "their rows cannot be accounted for without rewriting data")
        for p in merged:
            del job.removes[p]
            job.dropped += 1
        for a in w.added_files:
            if row_of(a.partition_values, job.schema) == part:
                job.removes[a.path] = _remove_of(a, job.now_ms, data_change=False)
                job.gained += 1
    job.rebased_over.append(w.version)


def _absorb(job: Job, w: WinningCommit, earlier: JobType, row: Row, lost: set[str]) -> None:
    """The compaction merged files the earlier job changed: on a table with deletion vectors its outputs get
    vectors marking the rows the earlier job deleted (its own row map), and its removes name the files as the
    earlier job left them; otherwise it fails."""
    cur = job.mover
    if cur is None:
        raise _fail(job, w, earlier, row, f"the earlier job removed {min(lost)}, an input of this compaction; its output "
                                          f"would bring back rows the earlier job changed: {ENABLE_DVS}")
    for p in sorted(lost):
        if cur.own is None or p not in cur.own.placements or w.zorder or not absorb_winner(cur, w, p):
            raise _fail(job, w, earlier, row, f"the earlier job removed {p}, an input of this compaction, and the rows "
                                              "it changed cannot be marked in the compaction's output (no row map "
                                              "recorded, or a deletion vector stored in a file)")
        kept = cur.inputs.get(p)
        if kept is None:
            del job.removes[p]
        else:
            job.removes[p] = kept
    job.moved_over.append(w.version)


RULES: Mapping[Cell, Callable[[Job, WinningCommit, JobType, Row], None]] = {
    Cell.LATER_FAILS: later_fails,
    Cell.OVERWRITES: later_overwrites,
    Cell.NEW_DATA: new_data,
    Cell.COMPACTS: compaction_succeeds,
}


def _remove_of(a: AddFile, now_ms: int, *, data_change: bool) -> RemoveFile:
    return RemoveFile(
        path=a.path, deletion_timestamp=now_ms, data_change=data_change, extended_file_metadata=True,
        partition_values=a.partition_values, size=a.size, stats=a.stats, tags=a.tags, deletion_vector=a.deletion_vector,
        base_row_id=a.base_row_id, default_row_commit_version=a.default_row_commit_version,
    )


def shared_partition(job: Job, w: WinningCommit) -> Row | None:
    """A partition both jobs touch (the winner's files against the job's scope), or None."""
    files: list[AddFile | RemoveFile] = [*w.added_files, *w.removed_files]
    for f in files:
        row = row_of(f.partition_values, job.schema)
        if job.covers(row):
            return row
    return None


def check_winner(job: Job, w: WinningCommit) -> None:
    """The cell for (the winner's job type, the job's), if they share a partition."""
    if not w.added_files and not w.removed_files:
        return
    row = shared_partition(job, w)
    if row is None:
        return  # different partitions never conflict
    earlier = commit_job_type(w.commit_info)
    if earlier is None:
        raise _fail(job, w, None, row, "the earlier commit changed files without a MaxCompute job type")
    RULES[TABLE[(earlier, job.type)]](job, w, earlier, row)


# ---------------------------------------------------------------------------
# Entry point (a `pipeline.Checker`)
# ---------------------------------------------------------------------------


def check(state: TableState, winners: Sequence[WinningCommit], proposal: Proposal, now_ms: int) -> Accepted | Rejected:
    """Decide `proposal` against `winners` by MaxCompute's table, rebasing it at the metadata level. Pure."""
    extra: dict[str, Any] = {}

    def checks(cur: CheckedTransaction, winners: Sequence[WinningCommit], proposal: Proposal, table: str) -> Proposal:
        job = job_of(proposal, cur.read_schema, table, now_ms)
        if job is None:
            # No data job (metadata, properties, ...): Delta's checks decide it.
            return delta_checks(cur, winners, proposal, table)
        if cur.dv_table:
            job.mover = cur
        for w in winners:
            check_table_level(cur, w, table)
            check_winner(job, w)
        if job.rebased_over or job.moved_over:
            extra[REBASE_KEY] = {"over": sorted({*job.rebased_over, *job.moved_over}), "removesAdded": job.gained,
                                 "removesDropped": job.dropped, "rowsMovedOver": job.moved_over}
        if not job.rebased_over:
            return proposal
        kept: list[Action] = [a for a in proposal.actions if not isinstance(a, RemoveFile)]
        return replace(proposal, actions=(*kept, *job.removes.values()))

    return _with_time_version(run_checks(state, winners, proposal, now_ms, checks), extra)


def _with_time_version(result: Accepted | Rejected, extra: Mapping[str, Any]) -> Accepted | Rejected:
    """An acceptance whose commitInfo records its time version (and `extra`)."""
    if not isinstance(result, Accepted):
        return result
    values = {TIME_VERSION_KEY: creates_time_version(result.actions), **extra}
    return Accepted(result.version, (result.commit_info.with_values(**values), *result.actions[1:]))


__all__ = ["ENABLE_DVS", "REBASE_KEY", "RULES", "TABLE", "Cell", "Job", "check", "check_winner", "compaction_succeeds", "job_of",
           "later_fails", "later_overwrites", "new_data", "shared_partition"]
