"""`deltacoord bench` runs both systems and ends with the issue's JSON line (figures are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from deltacoord.tooling.cpu_usage import broker_pid

KEYS = {"writers", "commits", "failed", "commits_per_s", "p50_ms", "p99_ms", "first_commit_p50_ms"}


@pytest.mark.slow
def test_bench_reports_both_systems_from_one_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    chart = tmp_path / "bench.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "deltacoord.cli.main", "bench", "--writers", "2", "--commits-per-writer", "3",
         "--memory-files", "0", "--warmup-commits-per-writer", "2", "--bootstrap-servers", kafka_bootstrap,
         "--chart", str(chart)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deltacoord: 2 writers x 3 blind appends" in proc.stderr, "the bench prints progress"
    assert "warming the broker (untimed): 2 writers x 2 appends" in proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) >= {"deltacoord", "delta_rs", "commits_per_s_ratio"}
    dc, rs = out["deltacoord"], out["delta_rs"]
    assert set(dc) >= KEYS and set(rs) >= KEYS
    # Blind appends through the coordinator never fail; each timed commit is counted once.
    assert dc["writers"] == 2 and dc["commits"] == 6 and dc["failed"] == 0
    assert rs["commits"] + rs["failed"] == 6
    assert dc["commits_per_s"] > 0 and 0 < dc["p50_ms"] <= dc["p99_ms"]
    # Propose -> decided <= propose -> visible (a commit returns once published), and the reply consumers' bytes.
    assert 0 < dc["decided_p50_ms"] <= dc["visible_p50_ms"]
    assert dc["fetch_bytes_per_commit"] > 0 and "foreign_records" in dc
    # Where the time went: each step's p50 since proposing, in the order the steps happen.
    steps = dc["steps_p50_ms"]
    assert steps["produced_ms"] > 0 and steps["ratified_ms"] <= steps["put_ms"] <= steps["reply_ms"], steps
    # CPU per commit of every process (writers; the coordinator with its checkpoint process; the local broker)
    # beside delta-rs's writers, and the throughput that CPU allows on this machine's cores.
    cpu = dc["cpu_ms_per_commit"]
    assert cpu["writers"] > 0 and cpu["coordinator"] > 0, cpu
    if broker_pid(kafka_bootstrap) is not None:
        assert cpu["broker"] is not None and cpu["broker"] > 0, cpu
    assert cpu["total"] == round(sum(v for k, v in cpu.items() if k != "total" and v is not None), 2)
    assert rs["cpu_ms_per_commit"]["writers"] > 0
    assert out["cpu_per_commit_fraction_of_delta_rs"] > 0
    assert out["cpu_ceiling_commits_per_s"] == round((os.cpu_count() or 1) * 1000 / cpu["total"], 1)
    # The chart beside the JSON line: both systems' throughput and latency curves of this run; samples stay out of the JSON.
    assert out["chart"] == str(chart)
    text = ElementTree.tostring(ElementTree.parse(chart).getroot(), encoding="unicode", method="text")
    assert "2 writers: commits/s" in text and "deltacoord" in text and "delta-rs" in text and "latency distribution" in text
    assert not any(k.startswith("_") for k in dc) and not any(k.startswith("_") for k in rs)


def test_bench_through_a_relay_counts_its_cpu_and_fetch_bytes(kafka_bootstrap: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deltacoord.cli.main", "bench", "--writers", "3", "--commits-per-writer", "3",
         "--memory-files", "0", "--warmup-commits-per-writer", "0", "--bootstrap-servers", kafka_bootstrap,
         "--no-chart", "--relay"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dc = json.loads(proc.stdout.strip().splitlines()[-1])["deltacoord"]
    assert dc["relay"] is True and dc["commits"] == 9 and dc["failed"] == 0
    # The relay's process is measured beside the others, and the replies it fetched are the fetch bytes.
    assert dc["cpu_ms_per_commit"]["relay"] > 0, dc["cpu_ms_per_commit"]
    assert dc["fetch_bytes_per_commit"] > 0 and dc["foreign_records"] == 0


@pytest.mark.slow
def test_bench_on_s3_measures_both_systems_to_visibility(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = {**os.environ, "DELTACOORD_S3_SERVER_HOME": str(tmp_path / "s3")}
    proc = subprocess.run(
        [sys.executable, "-m", "deltacoord.cli.main", "bench", "--storage", "s3", "--writers", "2",
         "--commits-per-writer", "3", "--warmup-commits-per-writer", "2", "--bootstrap-servers", kafka_bootstrap,
         "--no-chart"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "aws_conditional_put=etag" in proc.stderr, "delta-rs runs in its S3 conditional-put mode"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["storage"] == "s3" and "until the version is in _delta_log" in out["latency"] and out["ratio"] > 0
    dc, rs = out["deltacoord"], out["delta_rs"]
    assert set(dc) >= KEYS and set(rs) >= KEYS
    assert dc["commits"] == 6 and dc["failed"] == 0 and rs["commits"] + rs["failed"] == 6
    assert 0 < dc["p50_ms"] <= dc["p99_ms"]
