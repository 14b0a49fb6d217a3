"""Row-level concurrency benchmark: writers deleting or updating their own rows of one table (not a test).

    python bench/bench_row_level.py [--rows 1000000] [--files 10] [--writers 8] [--ops-per-writer 40]
                                    [--rows-per-op 4] [--max-attempts 50] [--bootstrap-servers HOST:PORT]

One run measures three systems on the same data, one after the other: an
unpartitioned table of `--rows` rows (ids 0..rows-1, sorted, in `--files`
files), and `--writers` writer processes released together, each after an
untimed warm-up commit (deleting a row of its own in a file of warm-up rows). At its i-th
operation every writer works in the same region of ids, so in the same data
file as the others, on rows of its own: a contiguous block of `--rows-per-op`
ids (a DELETE or an UPDATE of `value`, alternately). An operation that
conflicts is retried from a fresh snapshot, up to `--max-attempts` times.

* `deltacoord_row_level`: deltacoord, deletion vectors on: DELETE and UPDATE
  mark rows in a deletion vector and the coordinator resolves concurrent
  changes of one file row by row. Target: 0 conflicts.
* `deltacoord_file_level`: deltacoord, deletion vectors off: each operation
  rewrites the file (Delta's file-level rules).
* `delta_rs`: delta-rs's own `DeltaTable.delete` / `DeltaTable.update` (copy-on-
  write, its commit retries on), reloading the table before each attempt.

For each: commits, attempts, conflicts, conflict rate (conflicts / attempts),
operations given up, commits/s over the timed phase, p50/p99 of an operation
(first attempt to commit, retries included), and whether the final rows are
exactly those the committed operations give. Printed side by side, then as one JSON line. A local
broker is started in a temporary directory unless `--bootstrap-servers` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: An operation: (kind, lowest id, id after the highest, the value an UPDATE writes).
Op = tuple[str, int, int, str]
SYSTEMS = ("deltacoord_row_level", "deltacoord_file_level", "delta_rs")


def _say(msg: str) -> None:
    print(f"[row-level {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def plan(rows: int, writers: int, k: int, per_op: int) -> list[list[Op]]:
    """Each writer's operations: at step i all writers work in region i (one file), each on its own block."""
    span = writers * per_op
    regions = rows // span
    if regions < k:
        raise SystemExit(f"--rows {rows} is too few for {writers} writers x {k} operations of {per_op} rows: "
                         f"give at least {k * span} rows")
    out: list[list[Op]] = [[] for _ in range(writers)]
    for i in range(k):
        base = (i * regions // k) * span
        for w in range(writers):
            lo = base + w * per_op
            out[w].append(("DELETE" if (i + w) % 2 == 0 else "UPDATE", lo, lo + per_op, f"w{w}-{i}"))
    return out


def expected(rows: int, plans: list[list[Op]]) -> tuple[int, dict[int, str | None]]:
    """The row count afterwards and the value of every touched id (None: deleted)."""
    touched: dict[int, str | None] = {}
    for ops in plans:
        for kind, lo, hi, value in ops:
            for i in range(lo, hi):
                touched[i] = None if kind == "DELETE" else value
    return rows - sum(v is None for v in touched.values()), touched


def rows_ok(table: Any, rows: int, plans: list[list[Op]]) -> bool:
    """The final rows are the expected ones: nothing lost, nothing resurrected, every update kept."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count, touched = expected(rows, plans)
    table = table.filter(pc.greater_equal(table.column("id"), 0))  # without the warm-up rows
    if table.num_rows != count:
        return False
    ids = table.column("id")
    hit = table.filter(pc.is_in(ids, value_set=pa.array(list(touched), type=ids.type)))
    got = dict(zip(hit.column("id").to_pylist(), hit.column("value").to_pylist(), strict=True))
    return got == {i: v for i, v in touched.items() if v is not None} and len(set(ids.to_pylist())) == count


def data(lo: int, hi: int) -> Any:
    import pyarrow as pa

    return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "value": pa.array(["v"] * (hi - lo), pa.string())})


def _files(args: argparse.Namespace) -> list[tuple[int, int]]:
    """The id ranges of the files the table is loaded in: the writers' warm-up rows (negative ids), then the rows."""
    step = -(-args.rows // args.files)
    return [(-args.writers, 0), *((lo, min(args.rows, lo + step)) for lo in range(0, args.rows, step))]


def _where(lo: int, hi: int) -> str:
    return f"id >= {lo} AND id < {hi}"


# -- writer processes -----------------------------------------------------------------------------------------------
def _dc_writer(bootstrap: str, prefix: str, location: str, w: int, ops: list[Op], max_attempts: int, barrier: Any,
               out: str) -> None:
    from deltacoord.schemas.errors import DeltaConcurrentModificationException
    from deltacoord.schemas.routing import Topics
    from deltacoord.writer.table import Table

    t = Table(location, bootstrap, topics=Topics.with_prefix(prefix), writer_name=f"bench-{w}")
    t.client.wait_leased(60)

    def attempt(kind: str, lo: int, hi: int, value: str) -> None:
        if kind == "DELETE":
            t.delete(_where(lo, hi))
        else:
            t.update(_where(lo, hi), {"value": f"'{value}'"})

    _warm_up(w, attempt, (DeltaConcurrentModificationException,))
    _loop(w, ops, max_attempts, attempt, (DeltaConcurrentModificationException,), barrier, out)
    t.close()


def _warm_up(w: int, attempt: Any, conflicts: tuple[type[Exception], ...]) -> None:
    """Untimed: delete the writer's own warm-up row (id -1-w), so the timed operations measure the steady
    state, not a process's first scan, proposal and publication."""
    for _ in range(100):
        with contextlib.suppress(*conflicts):
            attempt("DELETE", -1 - w, -w, "")
            return
    raise RuntimeError(f"writer {w}: the warm-up delete kept conflicting")


def _rs_conflict(e: Exception) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(e, CommitFailedError) or "concurrent" in str(e).lower() or "conflict" in str(e).lower()


def _rs_writer(location: str, w: int, ops: list[Op], max_attempts: int, barrier: Any, out: str) -> None:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    dt = DeltaTable(location)

    def attempt(kind: str, lo: int, hi: int, value: str) -> None:
        dt.update_incremental()
        try:
            if kind == "DELETE":
                dt.delete(_where(lo, hi))
            else:
                dt.update(updates={"value": f"'{value}'"}, predicate=_where(lo, hi))
        except DeltaError as e:
            if _rs_conflict(e):
                raise _Conflict(str(e)) from e
            raise

    _warm_up(w, attempt, (_Conflict,))
    _loop(w, ops, max_attempts, attempt, (_Conflict,), barrier, out)


class _Conflict(Exception):
    """delta-rs reported a conflict with a concurrent commit."""


def _loop(w: int, ops: list[Op], max_attempts: int, attempt: Any, conflicts: tuple[type[Exception], ...], barrier: Any,
          out: str) -> None:
    """Run `ops` in order, each retried on a conflict; the counts and latencies go to the file `out`."""
    lat: list[float] = []
    done: list[int] = []
    tries = conflicted = gave_up = 0
    barrier.wait()
    for n, op in enumerate(ops):
        s0 = time.perf_counter()
        for _ in range(max_attempts):
            tries += 1
            try:
                attempt(*op)
            except conflicts:
                conflicted += 1
                continue
            done.append(n)
            lat.append((time.perf_counter() - s0) * 1000)
            break
        else:
            gave_up += 1
    Path(out).write_text(json.dumps({"lat": lat, "attempts": tries, "conflicts": conflicted, "commits": len(done),
                                     "done": done, "gave_up": gave_up, "end": time.time()}))


def _run(target: Any, args_for: Any, n: int, workdir: Path) -> tuple[list[dict[str, Any]], float]:
    """`n` writer processes released together (the bench's `run_processes`): their results and the timed phase's length."""
    from deltacoord.tooling.bench import run_processes

    results, t0, end = run_processes(target, args_for, n, workdir)
    if len(results) < n:
        raise RuntimeError(f"{n - len(results)} of {n} writer processes ended without results")
    return results, end - t0


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def committed(plans: list[list[Op]], results: list[dict[str, Any]]) -> list[list[Op]]:
    """The operations that committed (an operation given up changed nothing), by writer."""
    return [[ops[n] for n in r["done"]] for ops, r in zip(plans, results, strict=True)]


def _summary(results: list[dict[str, Any]], elapsed: float, ok: bool) -> dict[str, Any]:
    lat = [x for r in results for x in r["lat"]]
    attempts = sum(r["attempts"] for r in results)
    conflicts = sum(r["conflicts"] for r in results)
    commits = sum(r["commits"] for r in results)
    return {"commits": commits, "attempts": attempts, "conflicts": conflicts,
            "conflict_rate": round(conflicts / attempts, 4) if attempts else 0.0,
            "gave_up": sum(r["gave_up"] for r in results), "elapsed_s": round(elapsed, 2),
            "commits_per_s": round(commits / elapsed, 2) if elapsed > 0 else 0.0,
            "p50_ms": round(_percentile(lat, 0.5), 1), "p99_ms": round(_percentile(lat, 0.99), 1), "rows_ok": ok}


# -- systems --------------------------------------------------------------------------------------------------------
def bench_deltacoord(bootstrap: str, workdir: Path, args: argparse.Namespace, plans: list[list[Op]], *,
                     deletion_vectors: bool) -> dict[str, Any]:
    """A coordinator process and the writer processes on a fresh table (deletion vectors on or off)."""
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import DEFAULT_REPLY_PARTITIONS, ensure_topics
    from deltacoord.reader.snapshot import Snapshot
    from deltacoord.schemas.kafka_logs import kafka_config
    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.bench import create_when_served
    from deltacoord.writer.table import Table

    workdir.mkdir(parents=True, exist_ok=True)
    prefix = f"bench-rl-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(prefix)
    admin = AdminClient(kafka_config({"bootstrap.servers": bootstrap}))
    ensure_topics(admin, topics, reply_partitions=max(DEFAULT_REPLY_PARTITIONS, 2 * args.writers))
    log = open(workdir / "coordinator.log", "wb")  # noqa: SIM115 - lives as long as the child
    coord = subprocess.Popen(
        [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT)
    location = str(workdir / "table")
    try:
        props = {"delta.enableDeletionVectors": "true"} if deletion_vectors else {}
        with Table(location, bootstrap, topics=topics) as t:
            create_when_served(t, pa.schema([("id", pa.int64()), ("value", pa.string())]), [coord], properties=props)
            for lo, hi in _files(args):
                t.append(data(lo, hi))
        _say(f"deltacoord, deletion vectors {'on' if deletion_vectors else 'off'}: {args.writers} writers x "
             f"{args.ops_per_writer} operations on {args.rows:,} rows ...")
        results, elapsed = _run(_dc_writer, lambda i: (bootstrap, prefix, location, i, plans[i], args.max_attempts),
                                args.writers, workdir)
        ok = rows_ok(Snapshot.load(location).to_pyarrow(), args.rows, committed(plans, results))
    finally:
        coord.terminate()
        coord.wait(60)
        log.close()
        for f in admin.delete_topics([topics.proposals, topics.commits, topics.dead_letters, topics.replies],
                                     operation_timeout=30).values():
            with contextlib.suppress(Exception):
                f.result(60)
    return _summary(results, elapsed, ok)


def bench_delta_rs(workdir: Path, args: argparse.Namespace, plans: list[list[Op]]) -> dict[str, Any]:
    from deltalake import DeltaTable, write_deltalake

    workdir.mkdir(parents=True, exist_ok=True)
    location = str(workdir / "table")
    for lo, hi in _files(args):
        write_deltalake(location, data(lo, hi), mode="append")
    _say(f"delta-rs: {args.writers} writers x {args.ops_per_writer} operations on {args.rows:,} rows ...")
    results, elapsed = _run(_rs_writer, lambda i: (location, i, plans[i], args.max_attempts), args.writers, workdir)
    return _summary(results, elapsed, rows_ok(DeltaTable(location).to_pyarrow_table(), args.rows, committed(plans, results)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (ids 0..rows-1)")
    ap.add_argument("--files", type=int, default=10, help="data files the rows are loaded in")
    ap.add_argument("--writers", type=int, default=8, help="writer processes")
    ap.add_argument("--ops-per-writer", type=int, default=40, help="operations each writer commits")
    ap.add_argument("--rows-per-op", type=int, default=4, help="ids each operation deletes or updates")
    ap.add_argument("--max-attempts", type=int, default=50, help="attempts per operation before it is given up")
    ap.add_argument("--bootstrap-servers", default=None, help="a running Kafka (default: start a local broker)")
    args = ap.parse_args(argv)
    plans = plan(args.rows, args.writers, args.ops_per_writer, args.rows_per_op)
    from deltacoord.tooling.broker import LocalBroker

    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-row-level-"))
    broker = None
    try:
        if args.bootstrap_servers is None:
            _say("starting a local broker ...")
            broker = LocalBroker(workdir / "broker")
        bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
        result: dict[str, Any] = {"rows": args.rows, "files": args.files, "writers": args.writers,
                                  "ops_per_writer": args.ops_per_writer, "rows_per_op": args.rows_per_op}
        result["deltacoord_row_level"] = bench_deltacoord(bootstrap, workdir / "dc-rl", args, plans, deletion_vectors=True)
        _say(json.dumps(result["deltacoord_row_level"]))
        result["deltacoord_file_level"] = bench_deltacoord(bootstrap, workdir / "dc-fl", args, plans, deletion_vectors=False)
        _say(json.dumps(result["deltacoord_file_level"]))
        result["delta_rs"] = bench_delta_rs(workdir / "rs", args, plans)
        _say(json.dumps(result["delta_rs"]))
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    keys = ("commits", "attempts", "conflicts", "conflict_rate", "gave_up", "commits_per_s", "p50_ms", "p99_ms", "rows_ok")
    print(f"{args.writers} writers x {args.ops_per_writer} operations of {args.rows_per_op} own rows, "
          f"{args.rows:,} rows in {args.files} files")
    print(f"{'':16}" + "".join(f"{s:>24}" for s in SYSTEMS))
    for k in keys:
        print(f"{k:16}" + "".join(f"{result[s][k]!s:>24}" for s in SYSTEMS))
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
