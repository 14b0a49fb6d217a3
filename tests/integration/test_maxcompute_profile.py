"""MaxCompute's conflict table, cell by cell, as real concurrent jobs through the writer and the coordinator.

A table with `deltacoord.conflictProfile = maxcompute` holds, in the scope the
jobs work on (the whole non-partitioned table, or partition D1), one big file
(ids 1..200) and two small ones (ids 301, 302). Two jobs read the same
snapshot; the earlier one commits first, then the later one (its read version
precedes the earlier's commit). Each cell's expected outcome is the seed's
table, written out below independently of the coordinator's code; the final
rows are checked against a model that applies the jobs in commit order, and
delta-rs must read every version like our reader.

The jobs: INSERT OVERWRITE (`overwrite`), TRUNCATE (`truncate`), INSERT INTO
(`append`), UPDATE (row id 1, in the big file), MINOR compaction (the two
small files) and MAJOR compaction (every file of the scope).

On a table with deletion vectors every cell is the seed's, also when the
UPDATE/DELETE changes rows of the very files the compaction merges (the
UPDATE of id 301 or the DELETE of id 302, small files; the DELETE of id 2, in
the big file): the coordinator moves the changed rows through the
compaction's row map. There, incremental reads by time version return the
rows the UPDATE/DELETE, INSERT INTO or INSERT OVERWRITE added and nothing of
the compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deltacoord.reader.snapshot import Snapshot
from deltacoord.reader.stream import CommitStream
from deltacoord.reader.time_versions import incremental_read, time_versions
from deltacoord.schemas.errors import ConcurrentJobException, InvalidProposalError
from deltacoord.schemas.jobs import TIME_VERSION_KEY
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.test_deletion_vectors import delta_rs_agrees
from tests.integration.test_writer_operations import SCHEMA, Env, data, rows, running_env

MC = {"deltacoord.conflictProfile": "maxcompute"}
MC_DV = {**MC, "delta.enableDeletionVectors": "true"}
D1, D2 = "2024-01-01", "2024-01-02"
#: Ids in D2 are offset, so rows stay unique across partitions.
OFFSET = {D1: 0, D2: 1000}


@pytest.fixture(scope="module")
def env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with running_env(kafka_bootstrap, TablePlace("local", str(tmp_path_factory.mktemp("tables")))) as e:
        yield e


# --------------------------------------------------------------------------- the seed's table

IO, TR, II, UD, MI, MA = "INSERT OVERWRITE", "TRUNCATE", "INSERT INTO", "UPDATE/DELETE", "MINOR COMPACT", "MAJOR COMPACT"
FAILS, OVERWRITES, SUCCEEDS = "later fails", "later overwrites", "both succeed"
#: Rows: the earlier-finishing job; columns: the later-finishing job (IO, II, UD, MINOR, MAJOR).
SEED = {
    IO: (OVERWRITES, FAILS, FAILS, FAILS, FAILS),
    II: (OVERWRITES, FAILS, FAILS, SUCCEEDS, FAILS),
    UD: (OVERWRITES, FAILS, FAILS, SUCCEEDS, FAILS),
    MI: (OVERWRITES, SUCCEEDS, SUCCEEDS, FAILS, SUCCEEDS),
    MA: (OVERWRITES, SUCCEEDS, SUCCEEDS, FAILS, FAILS),
}
COLUMNS = (IO, II, UD, MI, MA)
#: The one cell where the seed's "both succeed" is not sound on copy-on-write Delta files (no deletion
#: vectors): the major compaction merged the file the UPDATE rewrites, so its old rows live on in the
#: compacted file and no metadata-level rebase can drop them. The coordinator fails the later job (see
#: docs/semantics.md); with deletion vectors it succeeds.
UNSOUND = {(MA, UD)}
#: UPDATE/DELETE jobs that change rows of files a compaction merges (the default UPDATE changes id 1).
UD_301, DEL_302, DEL_2 = "UPDATE id 301", "DELETE id 302", "DELETE id 2"
KIND = {TR: IO, UD_301: UD, DEL_302: UD, DEL_2: UD}


def expected(earlier: str, later: str, dvs: bool = False) -> str:
    row = SEED[KIND.get(earlier, earlier)]
    cell = row[COLUMNS.index(KIND.get(later, later))]
    if (earlier, later) in UNSOUND and not dvs:
        return FAILS
    return cell


JOBS = (IO, TR, II, UD, MI, MA)
CELLS = [(e, later) for e in JOBS for later in JOBS]


# --------------------------------------------------------------------------- tables and jobs

@dataclass
class Seeded:
    t: Table
    partitioned: bool
    #: minor compaction merges files smaller than this: the small files, not the big one.
    small_file_size: int

    def where(self, date: str) -> str | None:
        return f"date = '{date}'" if self.partitioned else None


def seeded(env: Env, path: Path, partitioned: bool, dvs: bool = False) -> Seeded:
    t = env.table(path)
    t.create(SCHEMA, partition_by=["date"] if partitioned else [], properties=MC_DV if dvs else MC)
    for date in (D1, D2) if partitioned else (D1,):
        o = OFFSET[date]
        t.append(data([o + i for i in range(1, 201)], date, [f"base-{i:04d}" for i in range(1, 201)]))
        t.append(data([o + 301], date, "s1"))
        t.append(data([o + 302], date, "s2"))
    sizes = sorted(a.size for a in t.snapshot().files() if a.partition_values.get("date", D1) in (D1, None))
    assert len(sizes) == 3 and sizes[1] < sizes[2], "the big file must be bigger than the small ones"
    return Seeded(t, partitioned, sizes[2])


Job = Callable[[Seeded, Snapshot, str, str], object]


def _io(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.overwrite(data([OFFSET[date] + 900], date, f"io-{role}"), replace_where=s.where(date), snapshot=snap)


def _truncate(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.truncate(s.where(date), snapshot=snap)


def _insert(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.append(data([OFFSET[date] + (500 if role == "earlier" else 501)], date, role), snapshot=snap)


def _row(s: Seeded, date: str, i: int) -> str:
    return f"id = {OFFSET[date] + i}" + (f" AND date = '{date}'" if s.partitioned else "")


def _update(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.update(_row(s, date, 1), {"value": f"'{role}'"}, snapshot=snap)


def _update_301(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.update(_row(s, date, 301), {"value": f"'{role}'"}, snapshot=snap)


def _delete_302(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.delete(_row(s, date, 302), snapshot=snap)


def _delete_2(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.delete(_row(s, date, 2), snapshot=snap)


def _minor(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.compact("minor", s.where(date), small_file_size=s.small_file_size, snapshot=snap)


def _major(s: Seeded, snap: Snapshot, role: str, date: str) -> object:
    return s.t.compact("major", s.where(date), snapshot=snap)


RUN: dict[str, Job] = {IO: _io, TR: _truncate, II: _insert, UD: _update, MI: _minor, MA: _major, UD_301: _update_301,
                       DEL_302: _delete_302, DEL_2: _delete_2}

Rows = dict[int, tuple[str, str]]


def model(rows_: Rows, job: str, role: str, date: str) -> Rows:
    """The table after `job` (what committing it alone does)."""
    o = OFFSET[date]
    out = dict(rows_)
    if job in (IO, TR):
        out = {k: v for k, v in out.items() if v[0] != date}
        if job == IO:
            out[o + 900] = (date, f"io-{role}")
    elif job == II:
        out[o + (500 if role == "earlier" else 501)] = (date, role)
    elif job == UD:
        out[o + 1] = (date, role)
    elif job == UD_301:
        out[o + 301] = (date, role)
    elif job in (DEL_302, DEL_2):
        del out[o + (302 if job == DEL_302 else 2)]
    return out


def added(job: str, role: str, date: str) -> list[tuple[object, ...]]:
    """The rows a time version of `job` adds (what an incremental read returns for it)."""
    return [] if job in (DEL_302, DEL_2) else as_rows(model({}, job, role, date))


def as_rows(m: Rows) -> list[tuple[object, ...]]:
    return sorted((k, d, v) for k, (d, v) in m.items())


def current(t: Table) -> Rows:
    return {r[0]: (r[1], r[2]) for r in rows(t)}  # type: ignore[misc]


def run_cell(env: Env, path: Path, partitioned: bool, earlier: str, later: str, earlier_date: str,
             dvs: bool = False) -> Seeded:
    s = seeded(env, path, partitioned, dvs)
    base = current(s.t)
    snap = s.t.snapshot()
    first = RUN[earlier](s, snap, "earlier", earlier_date)
    assert getattr(first, "version", None) == snap.version + 1, f"{earlier} did not commit"
    after_first = model(base, earlier, "earlier", earlier_date)
    # Jobs on different partitions never conflict.
    outcome = expected(earlier, later, dvs) if earlier_date == D1 else SUCCEEDS
    if outcome == FAILS:
        with pytest.raises(ConcurrentJobException) as ei:
            RUN[later](s, snap, "later", D1)
        assert ei.value.winning_version == snap.version + 1
        assert ei.value.retryable
        assert env.orphans(s.t) == set()
        assert rows(s.t) == as_rows(after_first)
    else:
        second = RUN[later](s, snap, "later", D1)
        assert getattr(second, "version", None) == snap.version + 2, f"{later} did not commit"
        info = s.t.history(1)[0]
        assert info["readVersion"] == snap.version  # it was concurrent: it read before the earlier commit
        assert rows(s.t) == as_rows(model(after_first, later, "later", D1))
        if outcome == OVERWRITES:
            assert info["deltacoord.rebase"]["over"] == [snap.version + 1]
        if dvs and {earlier, later} & {MI, MA}:
            # Incremental reads by time version return what the data job added, nothing of the compaction.
            env.settle()
            inc = incremental_read(s.t.uri, start_version=snap.version)
            data_jobs = [(v, j, r) for v, j, r in ((snap.version + 1, earlier, "earlier"), (snap.version + 2, later,
                                                                                          "later")) if j not in (MI, MA)]
            assert inc.versions == tuple(v for v, _, _ in data_jobs)
            assert rows(inc.data) == sorted(x for _, j, r in data_jobs for x in added(j, r, D1))
    for h in s.t.history():
        compaction = h["operation"] == "OPTIMIZE"
        assert h[TIME_VERSION_KEY] is (not compaction), h
    if dvs:
        delta_rs_agrees(env, s.t)  # its DataFusion scan applies deletion vectors
    else:
        env.assert_delta_rs_agrees(s.t)
    return s


@pytest.mark.kafka
@pytest.mark.parametrize(("earlier", "later"), CELLS, ids=[f"{e}->{lt}" for e, lt in CELLS])
def test_cell_on_unpartitioned_table(env: Env, tmp_path: Path, earlier: str, later: str) -> None:
    run_cell(env, tmp_path / "t", False, earlier, later, D1)


@pytest.mark.kafka
@pytest.mark.parametrize(("earlier", "later"), CELLS, ids=[f"{e}->{lt}" for e, lt in CELLS])
def test_cell_on_one_partition(env: Env, tmp_path: Path, earlier: str, later: str) -> None:
    run_cell(env, tmp_path / "t", True, earlier, later, D1)


@pytest.mark.kafka
@pytest.mark.parametrize(("earlier", "later"), CELLS, ids=[f"{e}->{lt}" for e, lt in CELLS])
def test_jobs_on_different_partitions_never_conflict(env: Env, tmp_path: Path, earlier: str, later: str) -> None:
    run_cell(env, tmp_path / "t", True, earlier, later, D2)


# --------------------------------------------------------------------------- with deletion vectors

#: The seed's 25 cells (TRUNCATE is INSERT OVERWRITE's other form, played above).
CELLS_25 = [(e, later) for e in COLUMNS for later in COLUMNS]
#: UPDATE/DELETE changing rows of files the compaction merges, in the cells where both succeed (and the
#: one where the later MAJOR compaction fails all the same).
SHARED = [(MI, UD_301), (MI, DEL_302), (UD_301, MI), (DEL_302, MI), (MA, UD_301), (MA, DEL_302), (MA, DEL_2),
          (UD_301, MA)]
DV_CELLS = CELLS_25 + SHARED


@pytest.mark.kafka
@pytest.mark.parametrize(("earlier", "later"), DV_CELLS, ids=[f"{e}->{lt}" for e, lt in DV_CELLS])
@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "one-partition"])
def test_cell_with_deletion_vectors(env: Env, tmp_path: Path, partitioned: bool, earlier: str, later: str) -> None:
    s = run_cell(env, tmp_path / "t", partitioned, earlier, later, D1, dvs=True)
    if (earlier, later) in SHARED and expected(earlier, later, True) == SUCCEEDS:
        # The compaction's output carries the rows the UPDATE/DELETE removed in a deletion vector.
        latest = s.t.snapshot()
        live = [a for a in latest.files() if a.partition_values.get("date", D1) in (D1, None)]
        assert any(a.deletion_vector is not None for a in live)
        assert s.t.history(1)[0]["deltacoord.rebase"]["rowsMovedOver"] == [latest.version - 1]


# --------------------------------------------------------------------------- soundness

@pytest.mark.kafka
def test_compaction_of_a_file_an_update_rewrote_fails(env: Env, tmp_path: Path) -> None:
    """UPDATE then MINOR, "both succeed" in the seed, but the minor compaction merged the updated file."""
    s = seeded(env, tmp_path / "t", False)
    snap = s.t.snapshot()
    s.t.update("id = 301", {"value": "'u'"}, snapshot=snap)
    with pytest.raises(ConcurrentJobException, match=r"would bring back rows.*delta\.enableDeletionVectors = true"):
        _minor(s, snap, "later", D1)
    assert (301, D1, "u") in rows(s.t)
    assert env.orphans(s.t) == set()


@pytest.mark.kafka
def test_update_of_a_file_a_compaction_merged_fails(env: Env, tmp_path: Path) -> None:
    """MINOR then UPDATE: the rows the update rewrote moved into the compacted file."""
    s = seeded(env, tmp_path / "t", False)
    snap = s.t.snapshot()
    _minor(s, snap, "earlier", D1)
    with pytest.raises(ConcurrentJobException, match=r"rows moved.*delta\.enableDeletionVectors = true"):
        s.t.update("id = 302", {"value": "'u'"}, snapshot=snap)
    assert (302, D1, "s2") in rows(s.t)


@pytest.mark.kafka
def test_major_after_minor_is_rebased_onto_the_minor_output(env: Env, tmp_path: Path) -> None:
    s = seeded(env, tmp_path / "t", True)
    snap = s.t.snapshot()
    minor = _minor(s, snap, "earlier", D1)
    minor_out = [a.path for a in s.t.snapshot().files() if a.partition_values["date"] == D1 and a.size < s.small_file_size
                 and a.path not in {f.path for f in snap.files()}]
    _major(s, snap, "later", D1)
    latest = s.t.snapshot()
    d1 = [a for a in latest.files() if a.partition_values["date"] == D1]
    assert len(d1) == 1 and d1[0].path not in minor_out  # the major output alone: no row twice
    assert latest.version == getattr(minor, "version", 0) + 1
    assert len(rows(s.t)) == 2 * 202
    env.assert_delta_rs_agrees(s.t)


@pytest.mark.kafka
def test_delta_profile_unchanged_for_the_same_jobs(env: Env, tmp_path: Path) -> None:
    """Without the property, two concurrent appends both commit (Delta's blind appends), as before."""
    t = env.table(tmp_path / "t")
    t.create(SCHEMA)
    snap = t.snapshot()
    t.append(data([1], D1, "a"), snapshot=snap)
    t.append(data([2], D1, "b"), snapshot=snap)
    assert rows(t) == [(1, D1, "a"), (2, D1, "b")]
    assert TIME_VERSION_KEY not in t.history(1)[0]


@pytest.mark.kafka
def test_bad_profile_is_refused(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "t")
    with pytest.raises(InvalidProposalError, match=r"deltacoord\.conflictProfile") as ei:
        t.create(SCHEMA, properties={"deltacoord.conflictProfile": "oracle"})
    assert ei.value.reason == "BAD_CONFLICT_PROFILE"


# --------------------------------------------------------------------------- time versions

@pytest.mark.kafka
def test_incremental_reads_by_time_version_skip_compaction(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "t")
    t.create(SCHEMA, properties={**MC, "delta.enableInCommitTimestamps": "true"})  # v0
    t.append(data([1], D1, "a"))  # v1
    t.append(data([2], D1, "b"))  # v2
    t.compact("minor")  # v3: no time version
    t.append(data([3], D1, "c"))  # v4
    env.settle()  # the reads below list _delta_log, which the coordinator publishes after deciding
    assert [tv.version for tv in time_versions(t.uri)] == [0, 1, 2, 4]
    assert [h[TIME_VERSION_KEY] for h in reversed(t.history())] == [True, True, True, False, True]

    inc = incremental_read(t.uri, start_version=1)
    assert inc.versions == (2, 4)
    assert sorted(inc.data.column("id").to_pylist()) == [2, 3]  # the compacted copy of 1 and 2 is not read
    assert inc.end_version == 4

    ts3 = Snapshot.load(t.uri, version=3).timestamp
    assert Snapshot.load(t.uri, timestamp=ts3).version == 3
    at = Snapshot.load(t.uri, timestamp=ts3, time_version=True)
    assert at.version == 2 and sorted(at.to_pyarrow().column("id").to_pylist()) == [1, 2]
    assert incremental_read(t.uri, start_timestamp=ts3).versions == (4,)
    with pytest.raises(ValueError, match="timestamp"):
        Snapshot.load(t.uri, time_version=True)

    # The change feed delivers time versions only: the compaction (and CREATE) are skipped.
    seen: list[int] = []
    with CommitStream(t.uri, env.bootstrap, topics=env.topics, starting_version=0) as stream:
        deadline = time.monotonic() + 120
        while 4 not in seen and time.monotonic() < deadline:
            seen.extend(e.version for e in stream.poll(1.0))
    assert seen == [1, 2, 4]
    env.assert_delta_rs_agrees(t)


@pytest.mark.kafka
def test_truncate_refuses_data_columns(env: Env, tmp_path: Path) -> None:
    t = env.table(tmp_path / "t")
    t.create(SCHEMA, partition_by=["date"], properties=MC)
    with pytest.raises(InvalidProposalError, match="partition columns only"):
        t.truncate("id = 1")
