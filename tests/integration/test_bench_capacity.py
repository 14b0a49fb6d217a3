"""`bench/bench_capacity.py` run small: every emulated proposal is decided once, published, and read back by
delta-rs; each floor loop counts every message it was fed (figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from deltalake import DeltaTable

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_capacity.py"


@pytest.mark.slow
def test_capacity_bench_decides_publishes_and_counts_every_proposal(kafka_bootstrap: str, tmp_path: Path) -> None:
    details = tmp_path / "details.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--writers", "8", "--tables", "2", "--commits", "300", "--warmup", "16",
         "--floors", "coordinator,every-batch", "--bootstrap-servers", kafka_bootstrap,
         "--workdir", str(tmp_path / "work"), "--details", str(details)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.strip().splitlines()]
    by_system = {x["system"]: x for x in lines if "system" in x}
    assert set(by_system) == {"coordinator", "floor", "floor_offsets_every_batch"}
    for line in by_system.values():
        assert line["sent"] == 300 and line["decided"] == 300 and line["undecided"] == 0, line
        assert line["cpu_ms_per_commit"]["generator"] > 0, line
    coord = by_system["coordinator"]
    assert coord["committed"] == 300 and coord["visible"] == 300, coord
    assert coord["cpu_ms_per_commit"]["coordinator"] > 0 and coord["decided_p50_ms"] <= coord["decided_p99_ms"]
    summary = lines[-1]
    assert summary["capacity_commits_per_s"] == coord["decided_per_s"]
    assert summary["capacity_to_floor"] == round(coord["decided_per_s"] / by_system["floor"]["decided_per_s"], 2)

    got = json.loads(details.read_text())
    # The coordinator: warm-up and timed proposals, each decided exactly once, committed (blind appends to
    # tables nobody else changes) and published.
    proposals = got["coordinator"]["proposals"]
    assert len(proposals) == 316 and got["coordinator"]["unsent"] == 0
    assert sum(not p["warmup"] for p in proposals.values()) == 300
    doubled = {pid: p["decisions"] for pid, p in proposals.items() if p["decisions"] != 1}
    assert not doubled, f"proposals not decided exactly once: {doubled}"
    assert all(p["outcome"] == "COMMITTED" and p["visible"] for p in proposals.values())
    paths: dict[int, set[str]] = defaultdict(set)
    versions: dict[int, set[int]] = defaultdict(set)
    for p in proposals.values():
        paths[p["table"]].add(p["path"])
        versions[p["table"]].add(p["version"])
    assert sum(len(x) for x in paths.values()) == 316, "each proposal adds a file of its own"
    # delta-rs reads each table with exactly the files committed, their rows, and the newest version decided
    # (versions 1.. after the create; coalesced proposals share one).
    rows_per_file = got["coordinator"]["rows_per_file"]
    for i, root in enumerate(got["coordinator"]["tables"]):
        dt = DeltaTable(root)
        assert {Path(u).name for u in dt.file_uris()} == paths[i]
        assert dt.to_pyarrow_table().num_rows == len(paths[i]) * rows_per_file
        assert dt.version() == max(versions[i]) and versions[i] == set(range(1, max(versions[i]) + 1))

    # Each floor loop consumed and answered every message it was fed, once, and the generator saw each answer once.
    for name, every_batch in (("floor", False), ("floor_offsets_every_batch", True)):
        floor = got[name]
        assert floor["sent"] == 316
        counts = floor["counts"]
        assert counts["consumed"] == counts["produced"] == 316, (name, counts)
        assert len(floor["decisions"]) == 316 and set(floor["decisions"].values()) == {1}, name
        if every_batch:
            assert counts["offset_commits"] == counts["transactions"], counts
        else:
            assert counts["offset_commits"] < counts["transactions"], counts
