"""The history recorder: writer processes running randomized transactions and logging each one.

The table is partitioned by an integer key column `p` (`NUM_PARTITIONS` values)
with a unique row id `k` and a value `v`. Every writer process picks, per
transaction, a table and an operation:

* ``append``   -- a blind append of fresh keys into one or two partitions;
* ``update``   -- reads every file of one or two partitions at snapshot *s*
  (predicate ``p = X`` / ``p IN (X, Y)``), rewrites some of them with ``v + 1``;
* ``delete``   -- reads a partition (predicate ``p = X AND k IN (...)``), removes
  one or two rows by rewriting the files holding them;
* ``optimize`` -- compacts every file of a partition into one (dataChange=false);
* ``metadata`` -- read-modify-write of the table property `COUNTER_KEY`.

Snapshots are sometimes a few versions stale and there is a short random pause
between reading and proposing, so concurrent writers conflict.

Each transaction appends JSON lines to its writer's file: an ``invoke`` record
before proposing (proposal id, read version, predicates, the files read with
their rows, the files added and removed with their rows), then a ``complete``
record with the outcome the writer saw: ``committed`` (version), ``rejected``
(conflict class, winning version), ``not_sent`` (ProposalNotSentError: it never
reached Kafka) or ``unknown``. An unknown outcome (CommitOutcomeUnknownError, or
any other error after sending) is retried with the same proposal id, as writers
are told to, for up to ``retry_unknown_s``; the record keeps the attempts and
the errors seen, and ``unknown`` is left only when no retry got an answer. Tables
live in a local directory or, with storage options, on an object store. A writer configured to crash writes a ``proposed`` record once
its proposal is delivered and SIGKILLs itself before hearing the decision; that
transaction has no ``complete`` record and is resolved from the commits topic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import unquote

import pyarrow as pa

from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.errors import (
    CommitNotPublishedError,
    CommitOutcomeUnknownError,
    DeltaConcurrentModificationException,
    InvalidProposalError,
    ProposalNotSentError,
)
from deltacoord.schemas.routing import Topics
from deltacoord.storage.table import TableStorage
from deltacoord.storage.uri import normalize_table_uri
from deltacoord.writer import staging
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction

SCHEMA = pa.schema([("p", pa.int32()), ("k", pa.int64()), ("v", pa.int64())])
PARTITION_COLUMN = "p"
NUM_PARTITIONS = 4
#: Table property every ``metadata`` transaction increments (a read-modify-write of the metadata).
COUNTER_KEY = "history.counter"
ISOLATION_KEY = "delta.isolationLevel"

OPS = ("append", "update", "delete", "optimize", "metadata")
DEFAULT_WEIGHTS: dict[str, float] = {"append": 0.42, "update": 0.24, "delete": 0.12, "optimize": 0.18, "metadata": 0.04}

Rows = list[list[int]]  # [[k, v], ...]


@dataclass(frozen=True)
class TableSpec:
    """One table of the run: where it lives (a local directory, or an object-store URI with its storage
    options) and its isolation level."""

    uri: str
    isolation: str
    storage: tuple[tuple[str, str], ...] = ()

    @property
    def storage_options(self) -> dict[str, str]:
        return dict(self.storage)

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    @property
    def table_id(self) -> str:
        return Path(self.uri).resolve().as_uri() if self.is_local else normalize_table_uri(self.uri)


@dataclass(frozen=True)
class WriterConfig:
    """Everything a writer process needs (picklable, for multiprocessing spawn)."""

    writer_id: int
    bootstrap: str
    topic_prefix: str
    tables: tuple[TableSpec, ...]
    transactions: int
    seed: int
    out_path: str
    decision_timeout_s: float = 30.0
    publish_timeout_s: float = 60.0
    #: SIGKILL this process after proposing its n-th transaction (0-based), before hearing the decision.
    crash_after_propose_at: int | None = None
    stale_probability: float = 0.3
    max_pause_s: float = 0.03
    #: Mean pause after each transaction (uniform in 0..2x): a short run then spans slow faults
    #: (a partition-leader kill, an isolation) at a low CPU cost.
    think_s: float = 0.0
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    #: Other Kafka settings of the writers (on a secured cluster: SASL_SSL as the writers' principal).
    kafka: dict[str, str] = field(default_factory=dict)
    #: The Unix socket of a relay (`deltacoord relay run`) this writer commits through, or None for Kafka direct.
    relay: str | None = None
    #: How long a writer keeps retrying a commit whose outcome is unknown, with the same proposal id.
    retry_unknown_s: float = 90.0


class Recorder:
    """Append-only JSON lines, flushed per record so a SIGKILL loses nothing already written."""

    def __init__(self, path: str | Path) -> None:
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


# -- helpers ------------------------------------------------------------------------------


def partition_of(add: AddFile) -> int:
    raw = add.partition_values.get(PARTITION_COLUMN)
    assert raw is not None, f"file {add.path} has no partition value"
    return int(raw)


def read_rows(storage: TableStorage, add: AddFile) -> Rows:
    """The (k, v) rows of one data file, as stored."""
    t = storage.read_parquet_file(unquote(add.path)).read(columns=["k", "v"])
    return [[int(k), int(v)] for k, v in zip(t.column("k").to_pylist(), t.column("v").to_pylist(), strict=True)]


def _file_record(add: AddFile, rows: Rows, data_change: bool | None = None) -> dict[str, Any]:
    """A file added (its add's dataChange) or removed (the remove's dataChange, given)."""
    dc = add.data_change if data_change is None else data_change
    return {"path": add.path, "p": partition_of(add), "rows": rows, "data_change": dc}


def _write(root: TableStorage, p: int, rows: Rows, data_change: bool = True) -> list[AddFile]:
    data = pa.table({"p": pa.array([p] * len(rows), pa.int32()),
                     "k": pa.array([r[0] for r in rows], pa.int64()),
                     "v": pa.array([r[1] for r in rows], pa.int64())})
    return staging.write_data_files(root, data, [PARTITION_COLUMN], data_change=data_change)


def _predicate(parts: Sequence[int]) -> str:
    return f"p = {parts[0]}" if len(parts) == 1 else f"p IN ({', '.join(str(p) for p in parts)})"


@dataclass
class Planned:
    """A transaction built and ready to propose, plus what the history records about it."""

    tx: Transaction
    operation: str
    changes_data: bool
    parameters: dict[str, Any]
    record: dict[str, Any]


def create_table(spec: TableSpec, bootstrap: str, topic_prefix: str, out_path: str | Path,
                 decision_timeout_s: float = 60.0, kafka: dict[str, str] | None = None) -> int:
    """Create one table (version 0) and record the creation in the history."""
    rec = Recorder(out_path)
    # coordinator_check=False: the chaos coordinators own partition 0 statically and join no group, so the
    # writers' check for a coordinator cannot see them.
    with Table(spec.uri, bootstrap, topics=Topics.with_prefix(topic_prefix), writer_name="setup",
               decision_timeout_s=decision_timeout_s, coordinator_check=False,
               storage_options=spec.storage_options or None, **(kafka or {})) as t:
        # One transaction per version, as the checker replays them (coalesced versions are checked in
        # tests/integration/test_coalescing.py).
        props = {ISOLATION_KEY: spec.isolation, COUNTER_KEY: "0", "delta.checkpointInterval": "10",
                 "deltacoord.coalesce": "false"}
        tx = t.begin_create(SCHEMA, partition_by=[PARTITION_COLUMN], properties=props)
        rec.write({"type": "invoke", "writer": -1, "seq": 0, "table": spec.table_id, "proposal_id": tx.proposal_id,
                   "op": "create", "read_version": -1, "read_partitions": [], "read_predicates": [],
                   "read_whole": False, "read_files": {}, "added": [], "removed": [], "counter_read": None,
                   "counter_new": 0, "changes_data": False, "t": time.time()})
        res = tx.commit("CREATE TABLE", changes_data=False, parameters={"partitionBy": [PARTITION_COLUMN],
                                                                        "properties": props})
        rec.write({"type": "complete", "proposal_id": tx.proposal_id, "outcome": "committed", "version": res.version,
                   "t": time.time()})
    rec.close()
    return res.version


class _Workload:
    def __init__(self, cfg: WriterConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        topics = Topics.with_prefix(cfg.topic_prefix)
        self.tables = [
            Table(s.uri, cfg.bootstrap, topics=topics, writer_name=f"w{cfg.writer_id}",
                  decision_timeout_s=cfg.decision_timeout_s, publish_timeout_s=cfg.publish_timeout_s,
                  coordinator_check=False, storage_options=s.storage_options or None, relay=cfg.relay, **cfg.kafka)  # static coordinators (see create_table)
            for s in cfg.tables
        ]
        self.specs = list(cfg.tables)
        self.rec = Recorder(cfg.out_path)
        self.key_seq = 0

    def new_key(self) -> int:
        self.key_seq += 1
        return self.cfg.writer_id * 10_000_000 + self.key_seq

    def snapshot(self, table: Table) -> Snapshot:
        snap = table.snapshot()
        if snap.version > 0 and self.rng.random() < self.cfg.stale_probability:
            back = self.rng.randint(1, 3)
            snap = Snapshot.load(table.uri, version=max(0, snap.version - back), storage_options=table.storage_options)
        return snap

    # -- operations -------------------------------------------------------------------
    def _base(self, table: Table, snap: Snapshot, tx: Transaction, op: str, seq: int) -> dict[str, Any]:
        return {"type": "invoke", "writer": self.cfg.writer_id, "seq": seq, "table": table.table_id,
                "proposal_id": tx.proposal_id, "op": op, "read_version": snap.version, "read_partitions": [],
                "read_predicates": [], "read_whole": False, "read_files": {}, "added": [], "removed": [],
                "counter_read": None, "counter_new": None, "changes_data": True}

    def plan_append(self, table: Table, snap: Snapshot, seq: int) -> Planned:
        tx = table.begin(snap)
        rec = self._base(table, snap, tx, "append", seq)
        for p in self.rng.sample(range(NUM_PARTITIONS), self.rng.choice((1, 1, 2))):
            rows = [[self.new_key(), self.rng.randint(0, 999)] for _ in range(self.rng.randint(1, 3))]
            adds = _write(table.storage, p, rows)
            tx.stage(adds)
            rec["added"] += [_file_record(a, rows) for a in adds]
        params = {"mode": "Append", "partitionBy": [PARTITION_COLUMN]}
        return Planned(tx, "WRITE", True, params, rec)

    def _read_partitions(self, table: Table, snap: Snapshot, tx: Transaction, rec: dict[str, Any],
                         parts: Sequence[int]) -> list[tuple[AddFile, Rows]]:
        files = [a for a in snap.files() if partition_of(a) in parts]
        tx.read_files_from(files)
        out = [(a, read_rows(table.storage, a)) for a in files]
        rec["read_partitions"] = sorted(parts)
        rec["read_files"] = {a.path: rows for a, rows in out}
        return out

    def plan_update(self, table: Table, snap: Snapshot, seq: int) -> Planned | None:
        parts = self.rng.sample(range(NUM_PARTITIONS), self.rng.choice((1, 1, 1, 2)))
        tx = table.begin(snap)
        rec = self._base(table, snap, tx, "update", seq)
        pred = _predicate(parts)
        tx.read_predicate(pred)
        rec["read_predicates"] = [pred]
        read = self._read_partitions(table, snap, tx, rec, parts)
        if not read:
            return None
        for add, rows in self.rng.sample(read, min(len(read), self.rng.randint(1, 2))):
            new_rows = [[k, v + 1] for k, v in rows]
            tx.remove(add)
            rec["removed"].append(_file_record(add, rows, data_change=True))
            adds = _write(table.storage, partition_of(add), new_rows)
            tx.stage(adds)
            rec["added"] += [_file_record(a, new_rows) for a in adds]
        return Planned(tx, "UPDATE", True, {"predicate": json.dumps([pred])}, rec)

    def plan_delete(self, table: Table, snap: Snapshot, seq: int) -> Planned | None:
        part = self.rng.randrange(NUM_PARTITIONS)
        tx = table.begin(snap)
        rec = self._base(table, snap, tx, "delete", seq)
        read = self._read_partitions(table, snap, tx, rec, [part])
        all_keys = [k for _a, rows in read for k, _v in rows]
        if not all_keys:
            return None
        victims = set(self.rng.sample(all_keys, min(len(all_keys), self.rng.randint(1, 2))))
        # A data-column conjunct: the coordinator widens it to the partition conjunct (Delta's rule).
        pred = f"p = {part} AND k IN ({', '.join(str(k) for k in sorted(victims))})"
        tx.read_predicate(pred)
        rec["read_predicates"] = [pred]
        for add, rows in read:
            if not any(k in victims for k, _v in rows):
                continue
            tx.remove(add)
            rec["removed"].append(_file_record(add, rows, data_change=True))
            kept = [[k, v] for k, v in rows if k not in victims]
            if kept:
                adds = _write(table.storage, part, kept)
                tx.stage(adds)
                rec["added"] += [_file_record(a, kept) for a in adds]
        return Planned(tx, "DELETE", True, {"predicate": json.dumps([pred])}, rec)

    def plan_optimize(self, table: Table, snap: Snapshot, seq: int) -> Planned | None:
        part = self.rng.randrange(NUM_PARTITIONS)
        tx = table.begin(snap)
        rec = self._base(table, snap, tx, "optimize", seq)
        pred = _predicate([part])
        files = [a for a in snap.files() if partition_of(a) == part]
        if len(files) < 2:
            return None
        tx.read_predicate(pred)
        rec["read_predicates"] = [pred]
        read = self._read_partitions(table, snap, tx, rec, [part])
        merged: Rows = []
        for add, rows in read:
            tx.remove(add, data_change=False)
            rec["removed"].append(_file_record(add, rows, data_change=False))
            merged += rows
        adds = _write(table.storage, part, merged, data_change=False)
        tx.stage(adds)
        rec["added"] += [_file_record(a, merged) for a in adds]
        rec["changes_data"] = False
        return Planned(tx, "OPTIMIZE", False, {"predicate": json.dumps([pred]), "filesCompacted": str(len(read))}, rec)

    def plan_metadata(self, table: Table, snap: Snapshot, seq: int) -> Planned:
        tx = table.begin(snap)
        rec = self._base(table, snap, tx, "metadata", seq)
        conf = dict(snap.metadata.configuration)
        counter = int(conf.get(COUNTER_KEY, "0"))
        conf[COUNTER_KEY] = str(counter + 1)
        tx.add(dataclasses.replace(snap.metadata, configuration=conf))
        rec.update(counter_read=counter, counter_new=counter + 1, changes_data=False)
        return Planned(tx, "SET TBLPROPERTIES", False, {"properties": {COUNTER_KEY: str(counter + 1)}}, rec)

    def plan(self, table: Table, seq: int) -> Planned:
        snap = self.snapshot(table)
        ops, weights = zip(*self.cfg.weights.items(), strict=True)
        op = self.rng.choices(ops, weights)[0]
        planned: Planned | None = None
        if op == "update":
            planned = self.plan_update(table, snap, seq)
        elif op == "delete":
            planned = self.plan_delete(table, snap, seq)
        elif op == "optimize":
            planned = self.plan_optimize(table, snap, seq)
        elif op == "metadata":
            planned = self.plan_metadata(table, snap, seq)
        if planned is None:  # nothing to rewrite there: append instead
            planned = self.plan_append(table, snap, seq)
        return planned

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        proposed = 0
        attempts = 0
        while proposed < self.cfg.transactions and attempts < self.cfg.transactions * 5:
            attempts += 1
            i = self.rng.randrange(len(self.tables))
            table = self.tables[i]
            try:
                planned = self.plan(table, proposed)
            except Exception as e:  # e.g. publication lag while the coordinator is down: nothing proposed
                self.rec.write({"type": "error", "writer": self.cfg.writer_id, "phase": "plan", "error": repr(e),
                                "t": time.time()})
                table.invalidate()
                time.sleep(0.2)
                continue
            planned.record["t"] = time.time()
            self.rec.write(planned.record)
            seq = proposed
            proposed += 1
            time.sleep(self.rng.uniform(0, self.cfg.max_pause_s))
            if self.cfg.crash_after_propose_at == seq:
                self.crash(table, planned)
            self.rec.write(self.commit(table, planned))
            if self.cfg.think_s > 0:
                time.sleep(self.rng.uniform(0, 2 * self.cfg.think_s))

    def commit(self, table: Table, planned: Planned) -> dict[str, Any]:
        """Commit, and while the outcome is unknown retry the same transaction (the same proposal id, which
        commits at most once) for up to `retry_unknown_s`, as a writer is told to; record what it was told."""
        pid = planned.tx.proposal_id
        out: dict[str, Any] = {"type": "complete", "proposal_id": pid}
        errors: list[str] = []
        delivered = False
        deadline = time.monotonic() + self.cfg.retry_unknown_s
        attempts = 0
        while True:
            attempts += 1
            try:
                res = planned.tx.commit(planned.operation, changes_data=planned.changes_data,
                                        parameters=planned.parameters)
                out.update(outcome="committed", version=res.version, already_committed=res.already_committed)
                break
            except DeltaConcurrentModificationException as e:
                out.update(outcome="rejected", error_type=type(e).__name__, winning_version=e.winning_version)
                break
            except InvalidProposalError as e:
                out.update(outcome="rejected", error_type="InvalidProposalError", reason_code=e.reason, error=str(e))
                break
            except CommitNotPublishedError as e:  # ratified, not visible yet: committed, never retried
                out.update(outcome="committed", version=e.version, published=False, error=str(e))
                break
            except ProposalNotSentError as e:
                errors.append(f"not_sent:{type(e).__name__}")
                if attempts == 1:  # never reached Kafka: its staged files are gone, it cannot commit
                    out.update(outcome="not_sent", error=str(e))
                    time.sleep(self.rng.uniform(0.5, 1.5))  # e.g. the relay restarting: back off a little
                    break
            except CommitOutcomeUnknownError as e:
                errors.append(f"unknown:{type(e).__name__}")
                # Without a word on delivery, Kafka had acknowledged it: it must get a decision.
                delivered = delivered or "deliver" not in e.summary
                if e.proposal_id != pid:
                    errors.append(f"other:CommitOutcomeUnknownError naming {e.proposal_id}, not {pid}")
            except Exception as e:  # neither an outcome nor one of the documented errors: kept for the report
                errors.append(f"other:{type(e).__name__}: {str(e)[:200]}")
            table.invalidate()
            if time.monotonic() >= deadline:
                out.update(outcome="unknown", delivered=delivered, error=errors[-1])
                break
            time.sleep(self.rng.uniform(0.5, 1.5))
        out.update(attempts=attempts, errors=errors, t=time.time())
        return out

    def crash(self, table: Table, planned: Planned) -> None:
        """Propose, wait for the delivery report only, record that, and die before the decision."""
        p = planned.tx.proposal(planned.operation, planned.changes_data, planned.parameters)
        table.client.propose(p)  # returns once the broker acknowledged the proposal
        self.rec.write({"type": "proposed", "proposal_id": p.proposal_id, "writer": self.cfg.writer_id,
                        "t": time.time()})
        os.kill(os.getpid(), signal.SIGKILL)

    def close(self) -> None:
        for t in self.tables:
            t.close()
        self.rec.close()


def writer_main(cfg: WriterConfig) -> None:
    """Body of one writer process."""
    w = _Workload(cfg)
    try:
        w.run()
    except BaseException:
        w.rec.write({"type": "error", "writer": cfg.writer_id, "phase": "fatal", "error": traceback.format_exc(),
                     "t": time.time()})
        raise
    finally:
        w.close()


def read_jsonl(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """All records of the given history files (a torn last line of a killed writer is skipped)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    return out
