"""Authenticated writers against a real coordinator, and the optional check that added files exist.

The probe: on a table whose allow-list named `alice`, a producer that merely
declared `writer="alice"` committed, then replaced the allow-list and locked
the real alice out. With the table's writer keys registered it is refused
(WRITER_NOT_AUTHENTICATED) and alice keeps writing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from deltacoord.cli.main import main as cli
from deltacoord.schemas.actions import AddFile
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.properties import Property
from deltacoord.schemas.signing import WRITER_KEY_ENV, WriterKey
from deltacoord.writer import staging
from deltacoord.writer.client import CoordinatorClient
from deltacoord.writer.table import Table
from deltacoord.writer.transaction import Transaction
from tests.integration.coord_harness import coordinator_thread, fresh_topics

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(autouse=True)
def _static_coordinators(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinators here own partition 0 statically and join no consumer group, so the writers' check that a
    coordinator serves the partition cannot see them: the writers (the CLI's too) skip the check."""
    monkeypatch.setenv("DELTACOORD_COORDINATOR_CHECK", "0")


def _rows(t: Table) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(str(t.root)).to_pyarrow_table().column("id").to_pylist())


def _reason(fn: object) -> str:
    with pytest.raises(InvalidProposalError) as ei:
        fn()  # type: ignore[operator]
    return str(ei.value.reason)


def test_a_forged_writer_cannot_commit_nor_take_the_table_over(kafka_bootstrap: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    topics = fresh_topics(kafka_bootstrap)
    path = tmp_path / "t"
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    runner = CliRunner()
    for name in ("alice", "bob", "mallory"):
        res = runner.invoke(cli, ["writer-key", "generate", name, "--out", str(keys_dir / f"{name}.key")])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["registration"] == WriterKey.load(keys_dir / f"{name}.key").registration
    alice_key, bob_key = WriterKey.load(keys_dir / "alice.key"), WriterKey.load(keys_dir / "bob.key")

    with coordinator_thread(kafka_bootstrap, topics, partitions=[0]) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        alice = Table(path, kafka_bootstrap, topics=topics, client=client, writer_key=keys_dir / "alice.key")
        assert alice.writer_name == "alice"
        alice.create(SCHEMA, properties={Property.ALLOWED_WRITERS: "alice, bob",
                                         Property.WRITER_KEYS: f"{alice_key.registration}, {bob_key.registration}"})
        assert alice.append(pa.table({"id": [1]}, schema=SCHEMA)).version == 1

        forger = Table(path, kafka_bootstrap, topics=topics, client=client, writer_name="alice")
        assert _reason(lambda: forger.append(pa.table({"id": [666]}, schema=SCHEMA))) == "WRITER_NOT_AUTHENTICATED"
        takeover = {Property.ALLOWED_WRITERS: "mallory",
                    Property.WRITER_KEYS: WriterKey.load(keys_dir / "mallory.key").registration}
        assert _reason(lambda: forger.set_properties(takeover)) == "WRITER_NOT_AUTHENTICATED"
        mallory = Table(path, kafka_bootstrap, topics=topics, client=client, writer_key=keys_dir / "mallory.key")
        assert _reason(lambda: mallory.set_properties(takeover)) == "WRITER_NOT_AUTHENTICATED"
        assert _reason(lambda: mallory.append(pa.table({"id": [667]}, schema=SCHEMA))) == "WRITER_NOT_AUTHENTICATED"

        # The real writers are not locked out; bob signs through DELTACOORD_WRITER_KEY.
        assert alice.append(pa.table({"id": [2]}, schema=SCHEMA)).version == 2
        monkeypatch.setenv(WRITER_KEY_ENV, str(keys_dir / "bob.key"))
        bob = Table(path, kafka_bootstrap, topics=topics, client=client)
        assert bob.writer_name == "bob" and bob.append(pa.table({"id": [3]}, schema=SCHEMA)).version == 3
        monkeypatch.delenv(WRITER_KEY_ENV)

        # The CLI signs with --writer-key; without a key the coordinator refuses.
        prefix = topics.proposals.removesuffix(".proposals")
        base = ["table", "append", str(path), "--json-rows", '[{"id": 4}]', "--bootstrap-servers", kafka_bootstrap,
                "--topic-prefix", prefix]
        signed = runner.invoke(cli, [*base, "--writer-key", str(keys_dir / "alice.key")])
        assert signed.exit_code == 0, signed.output
        assert json.loads(signed.output)["version"] == 4
        unsigned = runner.invoke(cli, base, env={WRITER_KEY_ENV: ""})
        assert unsigned.exit_code == 1 and "WRITER_NOT_AUTHENTICATED" in unsigned.output, unsigned.output

        assert coord.wait_published(60)
        client.close()
    assert _rows(alice) == [1, 2, 3, 4]


def test_a_table_can_verify_that_added_files_exist_with_their_size(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    with coordinator_thread(kafka_bootstrap, topics, partitions=[0]) as coord:
        client = CoordinatorClient(kafka_bootstrap, topics=topics)
        checked = Table(tmp_path / "checked", kafka_bootstrap, topics=topics, client=client)
        checked.create(SCHEMA, properties={Property.VERIFY_ADDED_FILES: "true"})
        plain = Table(tmp_path / "plain", kafka_bootstrap, topics=topics, client=client)
        plain.create(SCHEMA)
        assert checked.append(pa.table({"id": [1]}, schema=SCHEMA)).version == 1

        def propose(t: Table, version: int, path: str, size: int | None = None) -> int:
            (real,) = staging.write_data_files(t.root, pa.table({"id": [9]}, schema=SCHEMA), ())
            tx = Transaction(t, version)
            tx.add(AddFile(path or real.path, {}, real.size if size is None else size, real.modification_time, True))
            return tx.commit("WRITE").version

        ghost = f"part-{uuid.uuid4()}.parquet"
        with pytest.raises(InvalidProposalError) as ei:
            propose(checked, 1, ghost)
        assert ei.value.reason == "ADDED_FILE_MISSING" and ghost in str(ei.value)
        with pytest.raises(InvalidProposalError) as ei:
            propose(checked, 1, "", size=5)
        assert ei.value.reason == "ADDED_FILE_MISSING" and "not the 5" in str(ei.value)
        # Off by default: the same missing file is ratified on a table that does not ask.
        assert propose(plain, 0, ghost) == 1
        assert coord.wait_published(60)
        client.close()
