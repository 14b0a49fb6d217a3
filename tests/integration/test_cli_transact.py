"""`deltacoord table transact FILE`: a file of operations on several tables commits together, or none of it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltacoord.cli.main import main as cli
from tests.integration.coord_harness import coordinator_thread, fresh_topics
from tests.integration.test_multi_table import _apart, _create, _delta_rows

pytestmark = pytest.mark.kafka


def test_a_file_of_operations_commits_together_and_a_conflict_changes_nothing(kafka_bootstrap: str,
                                                                                 tmp_path: Path) -> None:
    # The real CLI: `table transact` joins the table group where the CLI is assembled (deltacoord/cli/main.py).
    topics = fresh_topics(kafka_bootstrap, partitions=4)
    kafka = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", topics.proposals.removesuffix(".proposals")]
    with coordinator_thread(kafka_bootstrap, topics):
        a = _create(tmp_path / "a", "bank::a", kafka_bootstrap, topics)
        b = _create(tmp_path / "b", "bank::b", kafka_bootstrap, topics)
        ops = {"operations": [
            {"table": str(tmp_path / "a"), "tableId": "bank::a", "op": "update", "set": {"amount": "amount - 30"},
             "where": "id = 1"},
            {"table": str(tmp_path / "b"), "tableId": "bank::b", "op": "append", "rows": [{"id": 3, "amount": 30}]},
        ]}
        f = tmp_path / "ops.json"
        f.write_text(json.dumps(ops))
        result = CliRunner().invoke(cli, ["table", "transact", str(f), *kafka])
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["versions"] == {"bank::a": 2, "bank::b": 2} and not out["alreadyCommitted"]
        assert _delta_rows(tmp_path / "a") == [(1, 70), (2, 100)]
        assert _delta_rows(tmp_path / "b") == [(1, 100), (2, 100), (3, 30)]
        again = CliRunner().invoke(cli, ["table", "transact", str(f), "--transaction-id", out["transactionId"], *kafka])
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["alreadyCommitted"], "the retry by id commits nothing again"
        assert DeltaTable(str(tmp_path / "a")).version() == 2
        # `table history` shows the transaction, its id and its tables, in each version it made.
        for n in ("a", "b"):
            shown = CliRunner().invoke(cli, ["table", "history", str(tmp_path / n)])
            assert shown.exit_code == 0, shown.output
            newest = json.loads(shown.stdout.splitlines()[0])
            assert newest["deltacoord.transaction"] == {"id": out["transactionId"], "tables": ["bank::a", "bank::b"]}
        # A part on a table that does not exist: the whole file changes nothing, exit 1 naming it.
        bad = {"operations": [ops["operations"][1], {"table": str(tmp_path / "a"), "tableId": "bank::zzz",
                                                     "op": "delete", "where": "id = 2"}]}
        f.write_text(json.dumps(bad))
        refused = CliRunner().invoke(cli, ["table", "transact", str(f), *kafka])
        assert refused.exit_code == 1, refused.output
        assert "bank::zzz" in refused.output, refused.output
        assert DeltaTable(str(tmp_path / "b")).version() == 2
        f.write_text(json.dumps({"operations": [{"table": "x", "op": "rename"}]}))
        usage = CliRunner().invoke(cli, ["table", "transact", str(f), *kafka])
        assert usage.exit_code == 2 and "one of append, delete, update" in usage.output
        twice = {"operations": [ops["operations"][1], ops["operations"][1]]}
        f.write_text(json.dumps(twice))
        usage = CliRunner().invoke(cli, ["table", "transact", str(f), *kafka])
        assert usage.exit_code == 2 and "operations 1 and 2 are both on" in usage.output, usage.output
        # Tables on different partitions: refused before anything is sent, naming the group setting.
        ida, idb = _apart("cli")
        c = _create(tmp_path / "c", ida, kafka_bootstrap, topics)
        d = _create(tmp_path / "d", idb, kafka_bootstrap, topics)
        apart = {"operations": [{"table": str(tmp_path / "c"), "tableId": ida, "op": "delete", "where": "id = 1"},
                                {"table": str(tmp_path / "d"), "tableId": idb, "op": "delete", "where": "id = 1"}]}
        f.write_text(json.dumps(apart))
        refused = CliRunner().invoke(cli, ["table", "transact", str(f), *kafka])
        assert refused.exit_code == 2, refused.output  # a usage error, not a traceback (exit 1)
        assert "table group" in refused.output and '"tableId"' in refused.output, refused.output
        assert "Traceback" not in refused.output
        assert [DeltaTable(str(tmp_path / n)).version() for n in ("c", "d")] == [1, 1]
        c.close()
        d.close()
        a.close()
        b.close()
