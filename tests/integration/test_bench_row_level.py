"""`bench/bench_row_level.py` at a tiny size: the three systems side by side and one JSON line.

Timings are not asserted (the machine is shared); the outcomes are: with
row-level concurrency the writers' disjoint rows never conflict, and every
system ends with exactly the expected rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_row_level.py"
KEYS = {"commits", "attempts", "conflicts", "conflict_rate", "gave_up", "elapsed_s", "commits_per_s", "p50_ms", "p99_ms",
        "rows_ok"}


def test_row_level_bench_runs_three_systems_and_row_level_has_no_conflicts(kafka_bootstrap: str) -> None:
    writers, ops = 4, 3
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--rows", "2000", "--writers", str(writers), "--ops-per-writer", str(ops),
         "--bootstrap-servers", kafka_bootstrap],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "deltacoord_row_level" in lines[1] and "delta_rs" in lines[1], "the figures side by side"
    out = json.loads(lines[-1])
    assert {out[k] for k in ("rows", "writers", "ops_per_writer")} == {2000, writers, ops}
    for system in ("deltacoord_row_level", "deltacoord_file_level", "delta_rs"):
        r = out[system]
        assert set(r) == KEYS, system
        # An operation commits or, after --max-attempts conflicts, is given up (file-level rules can starve one).
        assert r["commits"] + r["gave_up"] == writers * ops and r["commits"] > 0, system
        assert r["attempts"] == r["commits"] + r["conflicts"], system
        assert r["rows_ok"] is True, f"{system} lost or resurrected a row"
    rl = out["deltacoord_row_level"]
    assert rl["conflicts"] == 0 and rl["conflict_rate"] == 0.0, "disjoint rows never conflict with row-level concurrency"
    assert rl["commits"] == rl["attempts"] == writers * ops and rl["gave_up"] == 0
