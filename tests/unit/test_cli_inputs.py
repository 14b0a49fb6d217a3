"""The table commands' input files: a file that is not Parquet is one line naming the option, and exit 2
(a usage error), before anything talks to Kafka."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from deltacoord.cli.main import main

# Nothing listens there: reaching Kafka would fail differently (and take seconds).
UNREACHABLE = "127.0.0.1:9"


@pytest.mark.parametrize("content", [b"", b"id,name\n1,a\n", b"PAR1 but not really"])
@pytest.mark.parametrize(("command", "option", "extra"), [
    ("append", "--parquet", []),
    ("merge", "--source-parquet", ["--on", "id", "--when-not-matched-insert", "*"]),
])
def test_a_file_that_is_not_parquet_is_a_usage_error(tmp_path: Path, content: bytes, command: str, option: str,
                                                     extra: list[str]) -> None:
    bad = tmp_path / "rows.parquet"
    bad.write_bytes(content)
    table = tmp_path / "t"
    table.mkdir()
    r = CliRunner().invoke(main, ["table", command, str(table), option, str(bad), *extra,
                                  "--bootstrap-servers", UNREACHABLE])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for {option}" in r.output and str(bad) in r.output and "not a readable Parquet file" in r.output
    assert "Traceback" not in r.output


def test_a_parquet_file_is_read(tmp_path: Path) -> None:
    """The check refuses only what is not Parquet: a real file passes it and the command goes on to Kafka."""
    good = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": [1]}), good)
    table = tmp_path / "t"
    table.mkdir()
    r = CliRunner().invoke(main, ["table", "append", str(table), "--parquet", str(good), "--bootstrap-servers", UNREACHABLE])
    assert "not a readable Parquet file" not in r.output
    assert r.exit_code != 0  # no broker there
