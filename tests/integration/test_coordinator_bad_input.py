"""Bad input never stops the daemon and is never silently dropped.

Each bad proposal gets a rejection with a reason code on the commits topic;
undecodable bytes go to the dead-letter topic (a bounded prefix of them; and, when the
writer named itself in headers, a rejection it can wait for). A valid proposal
after all of them still commits. Runs with the table in a local directory and on S3.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition

from deltacoord.coordinator.kafka.recovery import read_decisions
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol
from deltacoord.schemas.codec import encode_proposal
from deltacoord.schemas.messages import Decision, Proposal
from deltacoord.schemas.routing import H_ERROR, H_PROPOSAL_ID, H_TABLE_ID
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from tests.conftest import TablePlace
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string())])


def _proposal(table: Table, read_version: int, actions: tuple[object, ...], **kw: object) -> Proposal:
    pid = str(uuid.uuid4())
    return Proposal(
        table_id=table.table_id, table_uri=table.uri, proposal_id=pid, read_version=read_version, operation="WRITE",
        changes_data=True, actions=actions,  # type: ignore[arg-type]
        commit_info=CommitInfo({"operation": "WRITE", "txnId": pid}), **kw,  # type: ignore[arg-type]
    )


def _add(path: str, size: int = 10) -> AddFile:
    return AddFile(path, {"date": "2024-01-01"}, size, 0, True)


def test_each_bad_input_gets_a_reasoned_rejection_or_dead_letter(kafka_bootstrap: str, tmp_path: Path,
                                                                 table_place: TablePlace) -> None:
    topics = fresh_topics(kafka_bootstrap)
    root = table_place.uri("t")
    # A table this coordinator serves but nobody created.
    nowhere = "file:///nowhere" if table_place.is_local else table_place.uri("nowhere")
    with coordinator_thread(kafka_bootstrap, topics, max_proposal_bytes=64 * 1024, **table_place.coordinator_settings) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        t = Table(root, kafka_bootstrap, topics=topics, client=client, storage_options=table_place.storage_options)
        t.create(SCHEMA, partition_by=["date"])
        md = Metadata(id="x", schema_string='{"type":"struct","fields":[]}')
        cases: dict[str, Proposal] = {
            "UNKNOWN_TABLE": dataclasses.replace(_proposal(t, 0, (_add("date=2024-01-01/a.parquet"),)),
                                                 table_id=nowhere, table_uri=nowhere),
            "READ_VERSION_AHEAD": _proposal(t, 7, (_add("date=2024-01-01/b.parquet"),)),
            "BAD_READ_VERSION": _proposal(t, -5, (_add("date=2024-01-01/c.parquet"),)),
            "PATH_ESCAPES_TABLE": _proposal(t, 0, (_add("../../etc/passwd"),)),
            "PATH_ESCAPES_TABLE/absolute": _proposal(t, 0, (_add("/etc/passwd"),)),
            "PATH_ESCAPES_TABLE/scheme": _proposal(t, 0, (_add("s3://bucket/x.parquet"),)),
            # Control characters: urlsplit drops a newline, so the path or the location would name another one.
            "BAD_FILE_PATH": _proposal(t, 0, (_add("date=2024-01-01/ctl\nline.parquet"),)),
            "BAD_FILE_PATH/c1": _proposal(t, 0, (_add("date=2024-01-01/nel\x85line.parquet"),)),
            "BAD_FILE_PATH/encoded": _proposal(t, 0, (_add("date=2024-01-01/tab%09x.parquet"),)),
            "BAD_TABLE_URI/newline": dataclasses.replace(_proposal(t, 0, (_add("date=2024-01-01/g.parquet"),)),
                                                         table_uri=f"{root}/ctl\nline"),
            "BAD_TABLE_URI/c1": dataclasses.replace(_proposal(t, 0, (_add("date=2024-01-01/h.parquet"),)),
                                                    table_uri=f"{root}/nel\x85line"),
            "DUPLICATE_FILE_ACTION": _proposal(t, 0, (_add("date=2024-01-01/d.parquet"), _add("date=2024-01-01/d.parquet"))),
            "MULTIPLE_METADATA": _proposal(t, 0, (md, md)),
            "NEGATIVE_SIZE": _proposal(t, 0, (_add("date=2024-01-01/e.parquet", size=-1),)),
            "MULTIPLE_PROTOCOL": _proposal(t, 0, (Protocol(1, 2), Protocol(1, 2))),
            "OVERSIZE": _proposal(t, 0, tuple(_add(f"date=2024-01-01/f{i:05d}-{'x' * 40}.parquet") for i in range(2000))),
        }
        futures = {name: client.propose(p) for name, p in cases.items()}
        decisions: dict[str, Decision] = {name: f.result(60) for name, f in futures.items()}
        for name, d in decisions.items():
            assert not d.committed, f"{name} committed"
            assert d.reason_code == name.split("/")[0], f"{name}: got {d.reason_code}: {d.error_message}"
            assert d.error_message

        # Undecodable bytes: with headers the writer is told; without, only the dead letter records it.
        raw = Producer({"bootstrap.servers": kafka_bootstrap})
        pid = str(uuid.uuid4())
        garbage_fut = client.expect(pid)
        raw.produce(topics.proposals, value=b"\xc3\x01not avro at all", partition=0,
                    headers=[(H_PROPOSAL_ID, pid.encode()), (H_TABLE_ID, t.table_id.encode()), garbage_fut.header])
        raw.produce(topics.proposals, value=b"\x00\x01\x02 random", partition=0)
        good_bytes = encode_proposal(_proposal(t, 0, (_add("date=2024-01-01/g.parquet"),)))
        raw.produce(topics.proposals, value=good_bytes[: len(good_bytes) // 2], partition=0)  # truncated
        assert raw.flush(30) == 0
        garbage = garbage_fut.result(60)
        assert garbage.reason_code == "UNDECODABLE" and not garbage.committed

        # The daemon keeps serving: a valid append commits afterwards.
        assert t.append(pa.table({"id": [1], "date": ["2024-01-01"]})).version == 1
        assert coord.ready and not coord.fenced

    dl = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "dl-check", "enable.auto.commit": False,
                   "isolation.level": "read_committed"})
    dl.assign([TopicPartition(topics.dead_letters, 0, 0)])
    letters = []
    deadline = time.monotonic() + 120
    while len(letters) < 4:
        m = dl.poll(1)
        if m is None:
            assert time.monotonic() < deadline, f"expected 4 dead letters within 120 s, got {len(letters)}"
            continue
        letters.append(m)
    dl.close()
    values = {m.value() for m in letters}
    assert b"\xc3\x01not avro at all" in values and b"\x00\x01\x02 random" in values
    assert good_bytes[: len(good_bytes) // 2] in values
    assert all(dict(m.headers() or [])[H_ERROR] for m in letters)
    # The oversize proposal (from a writer that set headers) got both: a rejection and a dead letter.
    settings = CoordinatorSettings(bootstrap_servers=kafka_bootstrap, topics=topics, group_id="verify")
    reasons = [d.reason_code for d in read_decisions(settings, 0) if not d.committed]
    assert sorted(reasons) == sorted([n.split("/")[0] for n in cases] + ["UNDECODABLE"])
    client.close()
