"""The Spark guide's example (docs/spark.md) runs as written, the way a newcomer runs it.

The code block after `<!-- doc-test: spark -->` in docs/spark.md is saved to a
file and run by the virtual environment's interpreter in a fresh process,
against a real broker and a coordinator, with only what the guide tells the
user to set (`DELTACOORD_BOOTSTRAP_SERVERS`; `DELTACOORD_TOPIC_PREFIX` for this
test's topics). No `PYSPARK_PYTHON`, no `PYTHONPATH`, the working directory
outside the repository, and a `python3` first on `PATH` that fails if run: every
Python worker must find the project's environment on its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deltacoord.reader.snapshot import Snapshot
from deltacoord.writer.spark_options import BOOTSTRAP_ENV, TOPIC_PREFIX_ENV
from tests.integration.coord_harness import coordinator_thread, fresh_topics

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "spark.md"
MARKER = "<!-- doc-test: spark -->"


def guide_block(marker: str = MARKER) -> str:
    """The fenced Python block right after `marker` in docs/spark.md."""
    text = GUIDE.read_text()
    assert text.count(marker) == 1, f"docs/spark.md must hold {marker!r} once"
    m = re.match(r"\s*```python\n(.*?)\n```", text.split(marker, 1)[1], re.S)
    assert m is not None, f"no ```python block right after {marker!r} in docs/spark.md"
    return m.group(1) + "\n"


@pytest.mark.slow
def test_the_spark_guide_example_runs_as_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    script = tmp_path / "spark_example.py"
    script.write_text(guide_block())
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):
        (fake / name).write_text("#!/bin/sh\necho \"python3 from PATH ran: $*\" >&2\nexit 97\n")
        (fake / name).chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    topics = fresh_topics(kafka_bootstrap)
    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    environ.update({
        "PATH": f"{fake}{os.pathsep}{environ.get('PATH', '')}",
        "TMPDIR": str(tmp),  # where the example's tempfile.mkdtemp() puts its table
        BOOTSTRAP_ENV: kafka_bootstrap,
        TOPIC_PREFIX_ENV: topics.proposals.removesuffix(".proposals"),
    })
    with coordinator_thread(kafka_bootstrap, topics):
        res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environ, capture_output=True, text=True,
                             timeout=540)
    out = res.stdout
    assert res.returncode == 0, f"stdout:\n{out[-4000:]}\nstderr:\n{res.stderr[-8000:]}"
    assert "python3 from PATH ran" not in res.stderr
    # The session and its Python workers run with a pandas PySpark supports (pandas 3 made each of them warn).
    assert "does not yet fully support pandas" not in res.stderr, res.stderr[-4000:]
    # What the guide says it shows: 2 clicks, 2 views, 9 streamed rows; CREATE TABLE, two WRITEs, three STREAMING UPDATEs.
    counts = dict(re.findall(r"^\|\s*(click|view|stream)\|\s*(\d+)\|$", out, re.M))
    assert counts == {"click": "2", "stream": "9", "view": "2"}, out
    ops = re.findall(r"^\|\s*(\d+)\|\s*([A-Z ]+?)\|$", out, re.M)
    assert [op for _, op in ops] == ["CREATE TABLE", "WRITE", "WRITE", *["STREAMING UPDATE"] * 3], out
    table = out.strip().splitlines()[-1]
    assert table.startswith(str(tmp)), out
    snap = Snapshot.load(table)
    assert snap.partition_columns == ["date"]
    rows = snap.to_pyarrow().to_pylist()
    assert sorted(r["id"] for r in rows if r["kind"] == "stream") == sorted([10, 11, 12] * 3)
    assert sorted({r["date"] for r in rows}) == ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05"]
