"""The bench's memory part: a coordinator (deciding process + checkpoint process) holding a table."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from deltacoord.tooling.bench import memory_coordinator, memory_table


def test_memory_part_measures_both_processes_of_a_coordinator(tmp_path: Path) -> None:
    made = memory_table(2_000, tmp_path)
    assert made["version"] == 100 and made["live_files"] == 2_000
    out = memory_coordinator(made["table"], made["version"])
    assert out["live_files"] == 2_000
    assert 0 < out["checkpoint_process_idle_mb"] <= out["checkpoint_process_peak_mb"]
    assert abs(out["coordinator_peak_mb"] - out["deciding_rss_mb"] - out["checkpoint_process_peak_mb"]) <= 0.11
    log = Path(made["table"]) / "_delta_log"
    assert (log / f"{100:020d}.checkpoint.parquet").exists(), "the worker wrote the checkpoint it was timed on"
    dt = DeltaTable(made["table"])
    assert dt.version() == 100 and len(dt.file_uris()) == 2_000
