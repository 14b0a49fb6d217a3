"""The Python examples of docs/python.md and docs/semantics.md, run against a broker and a coordinator.

Each example runs as written in a fresh interpreter, after a preamble that gives it the names the text
before it introduces (a table `t`, a `schema`); its paths move under the test's directory and its bootstrap
servers to the test broker. The README's examples run in `test_readme_path`, docs/spark.md's in
`test_spark_guide`. The object-storage example names a bucket on AWS and runs in no test: the S3 tests
make the same calls against the local S3 server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
