"""The Python examples of docs/python.md and docs/semantics.md, and the shell blocks of docs/operations.md and
docs/testing.md, run against a broker and a coordinator.

Each example runs as written in a fresh interpreter, after a preamble that gives it the names the text
before it introduces (a table `t`, a `schema`); its paths move under the test's directory and its bootstrap
servers to the test broker. The README's examples run in `test_readme_path`, docs/spark.md's in
`test_spark_guide`. The object-storage example names a bucket on AWS and runs in no test: the S3 tests
make the same calls against the local S3 server.

Shell blocks run as written after `tests.doc_blocks.substituted` (the test's broker, topics and directories);
the blocks a page marks `not-run` or `run-by` are accounted for in tests/unit/test_doc_shell_blocks.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.tooling.broker import LocalBroker
from tests.doc_blocks import block, substituted
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = [pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]


def _examples(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / page).read_text(), re.DOTALL | re.MULTILINE)


#: page, example index, the preamble giving it what the text before it defines.
CASES = [
    ("python.md", 0, ""),
    ("python.md", 1, 'import pyarrow as pa\nimport deltacoord\nt = deltacoord.Table("/data/events")\n'),
    ("semantics.md", 0, 'import pyarrow as pa\nimport deltacoord\nt = deltacoord.Table("/data/mc")\n'
                        'schema = pa.schema([("id", pa.int64()), ("date", pa.string())])\n'),
]


def test_the_object_storage_example_is_the_only_one_not_run() -> None:
    assert len(_examples("python.md")) == 3 and "s3://" in _examples("python.md")[2]
    assert len(_examples("semantics.md")) == 1


@pytest.mark.parametrize(("page", "index", "preamble"), CASES, ids=[f"{p}-{i}" for p, i, _ in CASES])
def test_a_docs_example_runs(kafka_bootstrap: str, tmp_path: Path, page: str, index: int, preamble: str) -> None:
    code = preamble + _examples(page)[index]
    code = code.replace('"/data/', f'"{tmp_path}/').replace("127.0.0.1:19092", kafka_bootstrap)
    topics = fresh_topics(kafka_bootstrap)
    env = {**os.environ, "DELTACOORD_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "DELTACOORD_TOPIC_PREFIX": topics.proposals.removesuffix(".proposals")}
    with coordinator_thread(kafka_bootstrap, topics):
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
    assert done.returncode == 0, f"{page} example {index}:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _bash(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` under `bash -euo pipefail`, with this interpreter's scripts (`deltacoord`) first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env={**os.environ, "PATH": path, **env},
                          capture_output=True, text=True, timeout=300)


def _sales(kafka_bootstrap: str, topics: object, path: Path) -> None:
    """The table the operations guide's blocks act on, with one row."""
    import pyarrow as pa

    from deltacoord.writer.table import Table

    with Table(str(path), kafka_bootstrap, topics=topics) as t:  # type: ignore[arg-type]
        t.create(pa.schema([("id", pa.int64()), ("amount", pa.float64())]))
        t.append(pa.table({"id": [1], "amount": [9.5]}))


def test_the_verify_block_of_the_operations_guide_runs(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = fresh_topics(kafka_bootstrap)
    prefix = topics.proposals.removesuffix(".proposals")
    code = substituted(block("operations.md", "deltacoord verify").text, bootstrap=kafka_bootstrap, prefix=prefix,
                       data=tmp_path)
    assert f"--topic-prefix {prefix}" in code and str(tmp_path) in code
    with coordinator_thread(kafka_bootstrap, topics):
        _sales(kafka_bootstrap, topics, tmp_path / "sales")
        done = _bash(code, tmp_path)
    assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "differs" not in done.stdout


def test_the_drop_and_re_create_block_of_the_operations_guide_runs(kafka_bootstrap: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    topics = fresh_topics(kafka_bootstrap)
    prefix = topics.proposals.removesuffix(".proposals")
    code = substituted(block("operations.md", "deltacoord table drop").text, bootstrap=kafka_bootstrap, prefix=prefix,
                       data=tmp_path)
    assert code.count(f"--topic-prefix {prefix}") == 2
    with coordinator_thread(kafka_bootstrap, topics):
        _sales(kafka_bootstrap, topics, tmp_path / "sales")
        old_id = DeltaTable(str(tmp_path / "sales")).metadata().id
        done = _bash(code, tmp_path)
    assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["operation"] for r in results] == ["DROP TABLE", "CREATE TABLE"], done.stdout
    assert results[1]["version"] == 0
    table = DeltaTable(str(tmp_path / "sales"))  # a new table: its own id, none of the old rows
    assert table.version() == 0 and table.metadata().id != old_id
    assert table.to_pyarrow_table().num_rows == 0
    assert [f.name for f in table.schema().fields] == ["id", "amount"]


def test_the_acls_block_of_the_operations_guide_prints_kafka_acls_commands(tmp_path: Path) -> None:
    done = _bash(block("operations.md", "deltacoord acls --writer-principal").text, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) > 5 and all(line.startswith("kafka-acls.sh --bootstrap-server kafka-1:9093 --command-config "
                                                  "admin.properties ") for line in lines), done.stdout
    assert any("User:writer" in line for line in lines) and any("User:coord" in line for line in lines)


def test_the_local_broker_block_of_the_testing_guide_runs(tmp_path: Path) -> None:
    """Start, status and stop as written, in a broker home of the test's (the suite's brokers keep theirs)."""
    code = substituted(block("testing.md", ".venv/bin/deltacoord broker start").text,
                       bin_dir=str(Path(sys.executable).parent))
    home = tmp_path / "broker-home"
    try:
        done = _bash(code, tmp_path, DELTACOORD_BROKER_HOME=str(home))
    finally:
        LocalBroker(home).stop()
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    status = json.loads(done.stdout[done.stdout.index("{"):done.stdout.rindex("}") + 1])
    assert status.get("pid") and str(home) in json.dumps(status), done.stdout
    assert LocalBroker(home).status() is None
