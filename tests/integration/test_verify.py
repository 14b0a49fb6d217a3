"""`deltacoord verify`: a healthy table verifies; each kind of damage is reported.

One table is written once through a real coordinator (checkpoints every 3
versions); every test verifies its own copy of the directory under the
original table id, so the damage of one test never leaks into another.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner

from deltacoord.cli.verify import register
from deltacoord.coordinator.delta_log.checkpointer import checkpoint_actions, create_checkpoint, write_checkpoint
from deltacoord.coordinator.delta_log.verify import VerifyReport, verify_table
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.reader.log import list_log, read_last_checkpoint, resolve_data_path
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.routing import Topics
from deltacoord.writer.table import Table
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])
APPENDS = 7  # versions 1..7; checkpoints at 3 and 6


@dataclass(frozen=True)
class Built:
    bootstrap: str
    topics: Topics
    root: Path
    table_id: str

    def settings(self) -> CoordinatorSettings:
        return CoordinatorSettings(bootstrap_servers=self.bootstrap, topics=self.topics, group_id="verify-test")

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.root, dest)
        return dest

    def verify(self, root: Path) -> VerifyReport:
        return verify_table(self.settings(), root.as_uri(), self.table_id)


def _wait(cond: object, timeout_s: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def built(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path_factory.mktemp("verify") / "t").resolve()
    with coordinator_thread(kafka_bootstrap, topics, checkpoint_fn=create_checkpoint) as coord:
        with Table(root, kafka_bootstrap, topics=topics) as t:
            t.create(SCHEMA, partition_by=["date"], properties={"delta.checkpointInterval": "3"})
            for i in range(APPENDS):
                t.append(pa.table({"id": [i], "date": [f"2024-01-0{i % 2 + 1}"]}))
            table_id = t.table_id
        assert coord.wait_published(60)
        ckpt = root / "_delta_log" / f"{6:020d}.checkpoint.parquet"
        _wait(lambda: ckpt.exists() and (lc := read_last_checkpoint(root)) is not None and lc.version == 6, 60,
              "the checkpoint of version 6")
    yield Built(kafka_bootstrap, topics, root, table_id)


def _has(rep: VerifyReport, *fragments: str) -> bool:
    return any(all(f in p for f in fragments) for p in rep.problems)


def test_healthy_table_verifies(built: Built, tmp_path: Path) -> None:
    rep = built.verify(built.root)
    assert rep.ok, rep.problems
    assert rep.topic_versions == APPENDS + 1 and rep.published_versions == APPENDS + 1
    assert rep.log_versions == (0, APPENDS)
    assert rep.checkpoints_checked == [3, 6] and rep.last_checkpoint == 6
    assert rep.live_files == APPENDS and rep.orphan_files == []


def test_cli_prints_a_json_report_and_exit_codes(built: Built, tmp_path: Path) -> None:
    group = click.Group("deltacoord")
    register(group)
    prefix = built.topics.proposals.removesuffix(".proposals")
    runner = CliRunner()
    # The table id defaults to the table's file:// URI, and the partition count comes from the topic.
    ok = runner.invoke(group, ["verify", str(built.root), "--bootstrap-servers", built.bootstrap, "--topic-prefix", prefix])
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output)
    assert report["ok"] is True and report["topic_versions"] == APPENDS + 1 and report["problems"] == []

    damaged = built.copy(tmp_path / "t")
    (damaged / "_delta_log" / f"{2:020d}.json").write_text('{"commitInfo":{}}\n')
    bad = runner.invoke(group, ["verify", damaged.as_uri(), "--table-id", built.table_id, "--bootstrap-servers",
                                built.bootstrap, "--topic-prefix", prefix, "--num-partitions", "1"])
    assert bad.exit_code == 1, bad.output
    assert any("00000000000000000002.json differs" in p for p in json.loads(bad.output)["problems"])

    missing_topic = runner.invoke(group, ["verify", str(built.root), "--bootstrap-servers", built.bootstrap,
                                          "--topic-prefix", "no-such-prefix-x"])
    assert missing_topic.exit_code == 2 and "not found" in missing_topic.output

    no_table = runner.invoke(group, ["verify", str(tmp_path / "no" / "such" / "table"), "--bootstrap-servers",
                                     built.bootstrap, "--topic-prefix", prefix])
    assert no_table.exit_code == 1, no_table.output
    no_table_report = json.loads(no_table.output)
    assert no_table_report["ok"] is False
    assert any(p.startswith("no Delta table at ") for p in no_table_report["problems"]), no_table_report


def test_tampered_commit_file_is_reported(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    path = root / "_delta_log" / f"{4:020d}.json"
    text = path.read_text()
    path.write_text(text.replace('"dataChange":true', '"dataChange":false', 1))
    rep = built.verify(root)
    assert _has(rep, f"{4:020d}.json differs from the committed decision"), rep.problems
    # A version the topic does not have, and a hole in the log.
    shutil.copy(path, root / "_delta_log" / f"{APPENDS + 1:020d}.json")
    (root / "_delta_log" / f"{5:020d}.json").unlink()
    rep = built.verify(root)
    assert _has(rep, "that the commits topic does not", str(APPENDS + 1)), rep.problems
    assert _has(rep, "not contiguous", "[5]"), rep.problems
    assert _has(rep, "version 5 is ratified", "missing"), rep.problems


def test_values_delta_readers_cannot_parse_are_reported(built: Built, tmp_path: Path) -> None:
    """A commit holding what the coordinator's validation refuses (here stats no reader parses) is reported:
    verify applies the same checks to what `_delta_log` holds."""
    root = built.copy(tmp_path / "t")
    path = root / "_delta_log" / f"{3:020d}.json"
    lines = path.read_text().splitlines()
    bad = [json.dumps({"add": {**json.loads(ln)["add"], "stats": "{{{{not json"}}) if '"add"' in ln else ln
           for ln in lines]
    path.write_text("\n".join(bad) + "\n")
    rep = built.verify(root)
    assert _has(rep, "version 3: add", "Delta readers cannot read it"), rep.problems


def test_missing_data_file_is_reported(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    victim = Snapshot.load(root.as_uri()).files()[0]
    resolve_data_path(root, victim.path).unlink()
    other = Snapshot.load(root.as_uri()).files()[1]
    with open(resolve_data_path(root, other.path), "ab") as fh:
        fh.write(b"junk")
    rep = built.verify(root)
    assert _has(rep, "live data file", victim.path, "missing"), rep.problems
    assert _has(rep, "another size", other.path), rep.problems


def test_corrupted_checkpoint_is_reported(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    ckpt = root / "_delta_log" / f"{3:020d}.checkpoint.parquet"
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # garbage in the middle of the column chunks
    ckpt.write_bytes(bytes(data[: len(data) - 16]))  # and a broken footer
    rep = built.verify(root)
    assert _has(rep, "checkpoint", f"{3:020d}.checkpoint.parquet", "unreadable"), rep.problems
    # A reader would not notice: it falls back to the JSON commits.
    assert Snapshot.load(root.as_uri(), version=3).num_files == 3


def test_checkpoint_that_differs_from_the_json_replay_is_reported(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    ckpt = root / "_delta_log" / f"{6:020d}.checkpoint.parquet"
    ckpt.unlink()
    items = list(checkpoint_actions(root, 6, from_checkpoint=False))
    dropped = next(a for a in items if isinstance(a, AddFile))
    write_checkpoint(root, 6, [a for a in items if a is not dropped], update_last_checkpoint=False)
    rep = built.verify(root)
    assert _has(rep, f"{6:020d}.checkpoint.parquet", "lacks 1 live files", dropped.path), rep.problems


def test_last_checkpoint_must_name_an_existing_checkpoint(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    lc = root / "_delta_log" / "_last_checkpoint"
    doc = json.loads(lc.read_text())
    lc.write_text(json.dumps({**doc, "version": 5}))
    rep = built.verify(root)
    assert _has(rep, "_last_checkpoint points at version 5"), rep.problems
    lc.write_text("{not json")
    assert _has(built.verify(root), "_last_checkpoint is unreadable")


def test_log_cleanup_below_a_checkpoint_verifies(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    for v in range(3):  # what Delta's log cleanup does once version 3 is checkpointed
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    rep = built.verify(root)
    assert rep.ok, rep.problems
    assert rep.log_versions == (3, APPENDS) and rep.cleaned_versions == 3 and rep.published_versions == APPENDS - 2
    # Without the checkpoint that covers them, the cleaned versions are a hole nobody can read past.
    for v in (3, 6):
        (root / "_delta_log" / f"{v:020d}.checkpoint.parquet").unlink()
    (root / "_delta_log" / "_last_checkpoint").unlink()
    rep = built.verify(root)
    assert _has(rep, "starts at version 3", "no checkpoint"), rep.problems
    assert list_log(root).latest_version == APPENDS


def test_orphan_data_files_are_listed_not_problems(built: Built, tmp_path: Path) -> None:
    root = built.copy(tmp_path / "t")
    orphan = root / "date=2024-01-01" / "part-00000-orphan-c000.snappy.parquet"
    orphan.write_bytes(b"PAR1")
    rep = built.verify(root)
    assert rep.ok, rep.problems
    assert rep.orphan_files == ["date=2024-01-01/part-00000-orphan-c000.snappy.parquet"]


def test_a_rejected_proposal_sent_again_is_one_decision_repeated(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A writer re-sending a rejected proposal (with its id) gets the same rejection again: verify reads that as
    one decision answered twice, not as a proposal decided twice."""
    from deltacoord import DeltaConcurrentModificationException

    topics = fresh_topics(kafka_bootstrap)
    root = (tmp_path / "t").resolve()
    with coordinator_thread(kafka_bootstrap, topics) as coord, Table(root, kafka_bootstrap, topics=topics) as t:
        t.create(SCHEMA, partition_by=["date"])
        t.append(pa.table({"id": [1, 2], "date": ["2024-01-01", "2024-01-01"]}))
        snap = t.snapshot()
        t.delete("id = 1", snapshot=snap)
        for _ in range(2):  # the same proposal id twice: the second answer repeats the first
            with pytest.raises(DeltaConcurrentModificationException):
                t.delete("id = 2", snapshot=snap, proposal_id="resent-delete")
        assert coord.wait_published(30)
        table_id = t.table_id
    rep = verify_table(CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify-test"),
                       root.as_uri(), table_id)
    assert rep.ok, rep.problems
    assert rep.rejections == 2 and rep.topic_versions == 3
