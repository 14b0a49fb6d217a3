"""`deltacoord table ...` and `deltacoord tail` against the real broker and an in-process coordinator.

The commands are registered on a throwaway click group, as the lead registers
them on the main `deltacoord` group.
"""

from __future__ import annotations

import decimal
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from deltalake import DeltaTable, QueryBuilder

from deltacoord.cli.tables import parse_schema, register
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from tests.conftest import StoreBucket
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli() -> click.Group:
    group = click.Group("deltacoord")
    register(group)
    return group


def prefix_of(topics: Topics) -> str:
    return topics.proposals.removesuffix(".proposals")


def run(cli: click.Group, *args: str, ok: bool = True, env: dict[str, str] | None = None) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env)
    if ok:
        assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result


def lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_parse_schema() -> None:
    s = parse_schema("id:long, date:string not null,amount:decimal(10,2),n:int,flag:bool,ts:timestamp")
    assert s.names == ["id", "date", "amount", "n", "flag", "ts"]
    assert s.field("amount").type == pa.decimal128(10, 2)
    assert s.field("n").type == pa.int32() and not s.field("date").nullable and s.field("id").nullable
    for bad in ("id", "id:nosuchtype", "id:long,id:long", ""):
        with pytest.raises(click.BadParameter):
            parse_schema(bad)


def test_create_append_delete_history_describe_and_tail(cli: click.Group, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        created = lines(run(cli, "table", "create", path, "--schema", "id:long,date:string,amount:decimal(10,2)",
                            "--partition-by", "date", "--property", "owner=me", *kafka))
        assert created == [{"version": 0, "operation": "CREATE TABLE", "proposalId": created[0]["proposalId"],
                            "alreadyCommitted": False, "metrics": created[0]["metrics"]}]

        inline = json.dumps([{"id": 1, "date": "2024-01-01", "amount": 1.5}, {"id": 2, "date": "2024-01-02", "amount": 2}])
        assert lines(run(cli, "table", "append", path, "--json-rows", inline, *kafka))[0]["version"] == 1
        jsonl = tmp_path / "rows.jsonl"
        jsonl.write_text('{"id": 3, "date": "2024-01-01"}\n{"id": 4, "date": "2024-01-03", "amount": 4.25}\n')
        assert lines(run(cli, "table", "append", path, "--json-rows", str(jsonl), *kafka))[0]["version"] == 2
        parquet = tmp_path / "rows.parquet"
        pq.write_table(pa.table({"id": [5], "date": ["2024-01-04"]}), parquet)
        assert lines(run(cli, "table", "append", path, "--parquet", str(parquet), *kafka))[0]["version"] == 3
        deleted = lines(run(cli, "table", "delete", path, "--where", "date = '2024-01-01'", *kafka))
        assert deleted[0]["version"] == 4 and deleted[0]["operation"] == "DELETE"

        # Errors: a clean message and a non-zero exit, never a traceback.
        again = run(cli, "table", "create", path, "--schema", "id:long", *kafka, ok=False)
        assert again.exit_code == 1 and "TableExistsError" in again.output
        unknown_col = run(cli, "table", "append", path, "--json-rows", '[{"nope": 1}]', *kafka, ok=False)
        assert unknown_col.exit_code == 1 and "nope" in unknown_col.output
        assert run(cli, "table", "append", path, *kafka, ok=False).exit_code == 2
        assert run(cli, "table", "create", str(tmp_path / "u"), "--schema", "id:huge", *kafka, ok=False).exit_code == 2
        assert run(cli, "table", "describe", str(tmp_path / "missing"), ok=False).exit_code == 2

        assert coord.wait_published(30)
        history = lines(run(cli, "table", "history", path))
        assert [h["version"] for h in history] == [4, 3, 2, 1, 0]
        assert [h["operation"] for h in history] == ["DELETE", "WRITE", "WRITE", "WRITE", "CREATE TABLE"]
        assert len(lines(run(cli, "table", "history", path, "--limit", "2"))) == 2

        described = lines(run(cli, "table", "describe", path))[0]
        snap = Snapshot.load(path)
        assert described["version"] == 4 == snap.version
        assert [f["name"] for f in described["schema"]] == ["id", "date", "amount"]
        assert described["partitionColumns"] == ["date"]
        assert described["properties"] == {"owner": "me"}
        assert described["numFiles"] == snap.num_files == 3
        assert described["sizeInBytes"] == sum(a.size for a in snap.files())
        assert lines(run(cli, "table", "describe", path, "--version", "1"))[0]["numFiles"] == 2
        rows = sorted(snap.to_pyarrow().column("id").to_pylist())
        assert rows == [2, 4, 5]

        # tail replays every version (data or not) from Kafka, one JSON line each.
        tailed = lines(run(cli, "tail", path, *kafka, "--from-version", "0", "--until-version", "4"))
        assert [e["version"] for e in tailed] == [0, 1, 2, 3, 4]
        assert [e["operation"] for e in tailed] == [h["operation"] for h in reversed(history)]
        assert tailed[0]["dataChange"] is False and tailed[1]["numAddedFiles"] == 2
        assert tailed[4]["numRemovedFiles"] == 2
        with_actions = lines(run(cli, "tail", path, *kafka, "--from-version", "4", "--until-version", "4", "--actions"))
        assert with_actions[0]["actions"][0]["commitInfo"]["operation"] == "DELETE"
        idle = run(cli, "tail", path, *kafka, "--from-version", "latest", "--idle-timeout", "0.5")
        assert lines(idle) == [] and "from version 5" in idle.stderr
        assert run(cli, "tail", path, *kafka, "--from-version", "-1", ok=False).exit_code == 2


def test_an_append_process_never_imports_pandas(kafka_bootstrap: str, tmp_path: Path) -> None:
    """`deltacoord table append` in a process of its own (as a user runs it) refuses pandas, which pyarrow would
    import only to ask whether the rows are a pandas object (about 200 ms of a one-second process); JSON rows,
    decimals included, and Parquet rows land as before, and delta-rs reads them."""
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": [3], "amount": [pa.scalar(decimal.Decimal("3.25"), pa.decimal128(10, 2))]}), parquet)
    with coordinator_thread(kafka_bootstrap, topics):
        with Table(path, kafka_bootstrap, topics=topics) as t:
            t.create(pa.schema([("id", pa.int64()), ("amount", pa.decimal128(10, 2))]))
        for rows in (["--json-rows", json.dumps([{"id": 1, "amount": 1.5}, {"id": 2, "amount": 2.75}])],
                     ["--parquet", str(parquet)]):
            done = subprocess.run([sys.executable, "-X", "importtime", "-m", "deltacoord.cli.main", "table", "append",
                                   path, *rows, *kafka], cwd=REPO, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            assert json.loads(done.stdout.strip().splitlines()[-1])["operation"] == "WRITE"
            imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
            assert "pyarrow" in imported and not [m for m in imported if m.startswith("pandas.")]
    got = DeltaTable(path).to_pyarrow_table().sort_by("id")
    assert got.column("id").to_pylist() == [1, 2, 3]
    assert got.column("amount").to_pylist() == [decimal.Decimal("1.50"), decimal.Decimal("2.75"), decimal.Decimal("3.25")]


def _data_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def test_append_streams_json_lines_in_chunks_and_leaves_nothing_on_a_bad_line(
        cli: click.Group, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltacoord.cli import tables as cli_tables
    from deltacoord.writer import staging

    monkeypatch.setattr(cli_tables, "JSON_CHUNK_ROWS", 3)
    monkeypatch.setattr(staging, "TARGET_FILE_SIZE", 1)  # a file per row: what is staged before a bad line shows
    topics = fresh_topics(kafka_bootstrap)
    root = tmp_path / "t"
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        run(cli, "table", "create", str(root), "--schema", "id:long,day:date", *kafka)
        rows = tmp_path / "rows.jsonl"
        rows.write_text("".join(json.dumps({"id": i, "day": f"2024-01-{i + 1:02d}"}) + "\n" for i in range(10)))
        done = lines(run(cli, "table", "append", str(root), "--json-rows", str(rows), *kafka))[0]
        # Ten rows read in chunks of three, a file per row: ten files staged, one commit.
        assert done["version"] == 1 and done["metrics"]["numOutputRows"] == 10
        assert len(_data_files(root)) == 10
        before = _data_files(root)

        bad = tmp_path / "bad.jsonl"
        bad.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(6)) + "{not json\n")
        failed = run(cli, "table", "append", str(root), "--json-rows", str(bad), *kafka, ok=False)
        assert failed.exit_code == 2 and "line 7 is not JSON" in failed.output, failed.output
        # Two chunks (six files) were staged before line 7; all were deleted.
        assert _data_files(root) == before

        wrong_type = tmp_path / "wrong.jsonl"
        wrong_type.write_text('{"id": "seven", "day": "2024-02-01"}\n')
        refused = run(cli, "table", "append", str(root), "--json-rows", str(wrong_type), *kafka, ok=False)
        assert refused.exit_code == 1 and "does not cast between string and numeric" in refused.output, refused.output
        assert _data_files(root) == before
        assert coord.wait_published(30)
    assert sorted(DeltaTable(str(root)).to_pyarrow_table().column("id").to_pylist()) == list(range(10))


def test_unknown_outcome_names_the_proposal_and_lookup_tells_it_later(cli: click.Group, kafka_bootstrap: str,
                                                                       tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics):
        run(cli, "table", "create", path, "--schema", "id:long", *kafka)
    # No coordinator now, and the writer's check for one off (as for static-partition coordinators, which it cannot
    # see): the append is sent, nobody decides it within the timeout.
    r = run(cli, "table", "append", path, "--json-rows", '[{"id": 1}]', "--timeout", "2", *kafka, ok=False,
            env={"DELTACOORD_COORDINATOR_CHECK": "0"})
    assert r.exit_code == 3, r.output
    m = re.search(r"deltacoord table lookup (.+) ([0-9a-f-]{36})", r.output)
    assert m is not None, r.output
    proposal_id = m.group(2)
    assert f"re-run the same command with --proposal-id {proposal_id}" in r.output, r.output
    undecided = run(cli, "table", "lookup", path, proposal_id, "--timeout", "5", *kafka, ok=False)
    assert undecided.exit_code == 3 and json.loads(undecided.stdout.splitlines()[0])["decided"] is False
    # A coordinator decides it once it runs; the hint's own arguments find the table.
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        hint_args = shlex.split(m.group(1))
        deadline = time.monotonic() + 180
        while True:
            found = run(cli, "table", "lookup", *hint_args, proposal_id, "--timeout", "5", ok=False)
            if found.exit_code == 0 or time.monotonic() > deadline:
                break
        assert found.exit_code == 0, found.output
        decided = json.loads(found.stdout)
        assert decided["decided"] is True and decided["committed"] is True and decided["version"] == 1
        assert coord.wait_published(120)
    assert DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [1]


def _reader(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)


def _next_line(q: queue.Queue[str], timeout_s: float, what: str) -> str:
    try:
        return q.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no {what} within {timeout_s}s") from None


def test_tail_follows_new_versions_until_ctrl_c(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    # The child makes Ctrl-C raise KeyboardInterrupt itself: it inherits the test process's SIGINT disposition at
    # exec, and a library thread of the test process may hold SIGINT ignored at that instant (as a C system() call
    # does); then Python would leave SIGINT ignored in the child, as it does for a background job of a shell.
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); import click; "
            "from deltacoord.cli.tables import register; g = click.Group(); register(g); g()")
    with coordinator_thread(kafka_bootstrap, topics), Table(path, kafka_bootstrap, topics=topics) as t:
        t.create(pa.schema([("id", pa.int64())]))
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "tail", str(path), "--topic-prefix", prefix_of(topics)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "DELTACOORD_BOOTSTRAP_SERVERS": kafka_bootstrap, "PYTHONPATH": str(REPO),
                 "PYTHONFAULTHANDLER": "1"},
        )
        out: queue.Queue[str] = queue.Queue()
        err: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, out), daemon=True).start()
        threading.Thread(target=_reader, args=(proc.stderr, err), daemon=True).start()
        try:
            notice = _next_line(err, 120, "start notice")  # a fresh process: imports at load 45 take long
            assert "from version 1" in notice, notice
            t.append(pa.table({"id": [1]}))
            t.append(pa.table({"id": [2]}))
            got = [json.loads(_next_line(out, 60, f"line {i}")) for i in range(2)]
            assert [g["version"] for g in got] == [1, 2]
            assert all(g["operation"] == "WRITE" and g["numAddedFiles"] == 1 for g in got)
            masks = [ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if ln.startswith("Sig")]
            proc.send_signal(signal.SIGINT)
            try:
                code_ = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
                proc.wait(10)
                time.sleep(0.5)
                stacks = "".join(err.get_nowait() for _ in range(err.qsize()))
                raise AssertionError(f"tail did not stop within 120 s of SIGINT; signal masks {masks}; "
                                     f"its threads:\n{stacks}") from None
            assert code_ == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_table_commands_and_verify_on_s3_with_storage_options(cli: click.Group, kafka_bootstrap: str,
                                                              s3_bucket: StoreBucket) -> None:
    from deltacoord.cli import verify as cli_verify
    cli_verify.register(cli)
    topics = fresh_topics(kafka_bootstrap)
    uri = s3_bucket.table_uri("sales")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    storage = [x for k, v in s3_bucket.storage_options.items() for x in ("--storage-option", f"{k}={v}")]
    with coordinator_thread(kafka_bootstrap, topics, table_roots=(s3_bucket.root,),
                            storage_options=s3_bucket.storage_options) as coord:
        assert lines(run(cli, "table", "create", uri, "--schema", "id:long,date:string", "--partition-by", "date",
                         *kafka, *storage))[0]["version"] == 0
        rows = json.dumps([{"id": 1, "date": "2024-01-01"}, {"id": 2, "date": "2024-01-02"}])
        assert lines(run(cli, "table", "append", uri, "--json-rows", rows, *kafka, *storage))[0]["version"] == 1
        assert lines(run(cli, "table", "delete", uri, "--where", "id = 1", *kafka, *storage))[0]["version"] == 2
        assert coord.wait_published(30)
        described = lines(run(cli, "table", "describe", uri, *storage))[0]
        assert described["location"] == uri and described["version"] == 2 and described["numFiles"] == 1
        assert [h["version"] for h in lines(run(cli, "table", "history", uri, *storage))] == [2, 1, 0]
        verified = run(cli, "verify", uri, *kafka, *storage)
        assert json.loads(verified.stdout)["ok"] is True
        # VACUUM: within the retention nothing goes; a shorter one needs the check turned off.
        assert lines(run(cli, "table", "vacuum", uri, "--dry-run", *storage))[0]["numDeletedFiles"] == 0
        refused = run(cli, "table", "vacuum", uri, "--retention-hours", "0", *storage, ok=False)
        assert refused.exit_code == 2 and "shorter than the table's" in refused.output
        done = lines(run(cli, "table", "vacuum", uri, "--retention-hours", "0", "--no-retention-check", *storage))[0]
        assert done["numDeletedFiles"] == 1 and done["deleted"][0].startswith("date=2024-01-01/")
        assert Snapshot.load(uri, storage_options=s3_bucket.storage_options).to_pyarrow().column("id").to_pylist() == [2]
        bad = run(cli, "table", "describe", "s3://bucket/../x", *storage, ok=False)
        assert bad.exit_code == 2 and "'..'" in bad.output


def test_compact_and_truncate_on_a_maxcompute_table(cli: click.Group, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        run(cli, "table", "create", path, "--schema", "id:long,date:string", "--partition-by", "date",
            "--property", "deltacoord.conflictProfile=maxcompute", *kafka)
        for i in (1, 2, 3):
            run(cli, "table", "append", path, "--json-rows", json.dumps([{"id": i, "date": "2024-01-01"}]), *kafka)
        run(cli, "table", "append", path, "--json-rows", json.dumps([{"id": 9, "date": "2024-01-02"}]), *kafka)
        major = lines(run(cli, "table", "compact", path, "--kind", "major", *kafka))[0]
        assert major["version"] == 5 and major["operation"] == "OPTIMIZE"
        truncated = lines(run(cli, "table", "truncate", path, "--where", "date = '2024-01-02'", *kafka))[0]
        assert truncated["version"] == 6 and truncated["operation"] == "TRUNCATE"
        bad = run(cli, "table", "compact", path, "--kind", "huge", *kafka, ok=False)
        assert bad.exit_code == 2 and "huge" in bad.output
        assert coord.wait_published(30)
        history = lines(run(cli, "table", "history", path))
        assert [h["operationParameters"].get("compaction") for h in history if h["operation"] == "OPTIMIZE"] == ["major"]
        assert [h["deltacoord.timeVersion"] for h in history][:2] == [True, False]
        snap = Snapshot.load(path)
        assert sorted(snap.to_pyarrow().column("id").to_pylist()) == [1, 2, 3]
        assert len(snap.files()) == 1


def test_update_merge_and_optimize_commands(cli: click.Group, kafka_bootstrap: str, tmp_path: Path) -> None:
    """The CLI's UPDATE, MERGE (upsert and change-feed forms) and OPTIMIZE: rows checked, delta-rs reads the result."""
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics):
        run(cli, "table", "create", path, "--schema", "id:long,date:string,amount:long", "--partition-by", "date", *kafka)
        for i in range(3):  # three small files in one partition, for OPTIMIZE
            run(cli, "table", "append", path, "--json-rows", json.dumps([{"id": i, "date": "d1", "amount": 10 * i}]), *kafka)

        updated = lines(run(cli, "table", "update", path, "--set", "amount=amount + 1", "--where", "id >= 1", *kafka))[0]
        assert updated["operation"] == "UPDATE" and updated["metrics"]["numUpdatedRows"] == 2

        src = tmp_path / "changes.jsonl"
        src.write_text('{"id": 2, "date": "d1", "amount": 200}\n{"id": 7, "date": "d1", "amount": 70}\n')
        merged = lines(run(cli, "table", "merge", path, "--source-json-rows", str(src), "--on", "id",
                           "--when-matched-update", "*", "--when-not-matched-insert", "*", *kafka))[0]
        assert merged["operation"] == "MERGE"
        feed = json.dumps([{"id": 0, "op": "D"}, {"id": 1, "op": "U"}, {"id": 9, "op": "D"}])
        lines(run(cli, "table", "merge", path, "--source-json-rows", feed, "--on", "s.id = t.id",
                  "--when-matched-delete", "s.op = 'D'", "--when-matched-update", "amount=t.amount * 100",
                  "--when-not-matched-insert", "id=s.id", "--when-not-matched-insert", "date='d1'",
                  "--when-not-matched-insert", "amount=0", "--when-not-matched-insert-if", "s.op <> 'D'", *kafka))
        expected = {1: 1100, 2: 200, 7: 70}

        def rows() -> dict[int, int]:
            t = Snapshot.load(path).to_pyarrow()
            return dict(zip(t.column("id").to_pylist(), t.column("amount").to_pylist(), strict=True))

        assert rows() == expected
        files_before = len(Snapshot.load(path).files())
        optimized = lines(run(cli, "table", "optimize", path, "--where", "date = 'd1'", *kafka))[0]
        assert optimized["operation"] == "OPTIMIZE"
        assert len(Snapshot.load(path).files()) == 1 < files_before and rows() == expected
        zordered = lines(run(cli, "table", "optimize", path, "--zorder-by", "amount", *kafka))[0]
        assert zordered["operation"] == "OPTIMIZE" and rows() == expected
        assert Snapshot.load(path).history(1)[0]["operationParameters"]["zOrderBy"] == '["amount"]'
        wrong = run(cli, "table", "optimize", path, "--zorder-by", "date", *kafka, ok=False)
        assert wrong.exit_code == 2 and "partition columns" in wrong.output
        theirs = DeltaTable(path).to_pyarrow_table()
        assert dict(zip(theirs.column("id").to_pylist(), theirs.column("amount").to_pylist(), strict=True)) == expected

        bad = run(cli, "table", "update", path, "--set", "amount", *kafka, ok=False)
        assert bad.exit_code == 2 and "COLUMN=SQL" in bad.output
        none = run(cli, "table", "merge", path, "--source-json-rows", "[]", "--on", "id", *kafka, ok=False)
        assert none.exit_code == 2 and "--when-matched-update" in none.output


def test_purge_command(cli: click.Group, kafka_bootstrap: str, tmp_path: Path) -> None:
    """`table purge` rewrites the files with deletion vectors; delta-rs reads the same rows."""
    topics = fresh_topics(kafka_bootstrap)
    path = str(tmp_path / "t")
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix_of(topics)]
    with coordinator_thread(kafka_bootstrap, topics) as coord:
        run(cli, "table", "create", path, "--schema", "id:long", "--property", "delta.enableDeletionVectors=true", *kafka)
        run(cli, "table", "append", path, "--json-rows", json.dumps([{"id": i} for i in range(10)]), *kafka)
        run(cli, "table", "delete", path, "--where", "id < 4", *kafka)
        assert coord.wait_published(30)
        assert [a.deletion_vector is not None for a in Snapshot.load(path).files()] == [True]
        purged = lines(run(cli, "table", "purge", path, *kafka))[0]
        assert purged["operation"] == "REORG" and purged["version"] == 3
        assert coord.wait_published(30)
        assert [a.deletion_vector for a in Snapshot.load(path).files()] == [None]
        theirs = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT id FROM t").read_all()
        assert sorted(theirs.column("id").to_pylist()) == list(range(4, 10))
