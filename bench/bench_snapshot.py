"""Benchmark: loading a 100,000-file table, `deltacoord.reader.snapshot.Snapshot` vs delta-rs (not a test).

    python bench/bench_snapshot.py [--files 100000] [--commits 10] [--tail-commits 5] [--runs 5] [--dir DIR]

1. Builds a synthetic table (no data files; only the log): version 0 creates it
   (partitioned by `date`, 100 partitions), versions 1..N add `--files` files
   with per-file stats in JSON commits, then a classic checkpoint is written
   at version N with `deltacoord.coordinator.delta_log.checkpointer.create_checkpoint`, and
   `--tail-commits` more commits (each adding 100 files and removing 50) follow
   it, so a load reads the checkpoint and replays JSON commits on top.
2. Times, in this process, `Snapshot.load(path)` + `files()` (live `AddFile`
   objects) against delta-rs `DeltaTable(path)` + `get_add_actions()` (an
   Arrow table), `--runs` times each after one warm-up, alternating. Our
   `add_files_struct()` (the live files as Arrow, like delta-rs returns them)
   is timed as well, for an Arrow-to-Arrow comparison.
3. Peak memory of one load each, in a fresh subprocess per reader: ru_maxrss
   after the imports and after the load (Linux reports KiB). Linux carries a
   parent's RSS high-water mark into ru_maxrss across fork+exec, so the table
   is built in a subprocess too and the memory runs happen before this process
   imports anything heavy (it is a few MiB then, below any reader's baseline).

Targets: `files()` within 1.5x of delta-rs (median wall time; CPU time, all
threads, is printed too: on a machine busy with other work, a multi-threaded
reader gets more of the cores) and our load's memory at most delta-rs's. Prints
both side by side; the last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_RATIO = 1.5
NOW = 1_700_000_000_000
SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "value", "type": "string", "nullable": True, "metadata": {}},
        {"name": "amount", "type": "double", "nullable": True, "metadata": {}},
        {"name": "date", "type": "string", "nullable": True, "metadata": {}},
    ],
}


def _add(i: int, rng: random.Random) -> Any:
    from deltacoord.schemas.actions import AddFile

    date = f"2024-{1 + i % 12:02d}-{1 + (i // 12) % 28:02d}" if i % 100 else "2024-01-01"
    n = rng.randint(1_000, 100_000)
    stats = json.dumps({
        "numRecords": n,
        "minValues": {"id": i * 100_000, "value": f"a{i}", "amount": 0.5},
        "maxValues": {"id": i * 100_000 + n, "value": f"z{i}", "amount": 999.5},
        "nullCount": {"id": 0, "value": rng.randint(0, 10), "amount": 0},
    }, separators=(",", ":"))
    return AddFile(
        path=f"date={date}/part-{i:07d}-{rng.getrandbits(64):016x}.c000.snappy.parquet",
        partition_values={"date": date}, size=rng.randint(100_000, 10_000_000), modification_time=NOW + i,
        data_change=True, stats=stats,
    )


def build_table(root: Path, files: int, commits: int, tail_commits: int) -> dict[str, Any]:
    """Write the synthetic log; returns what was built."""
    from deltacoord.coordinator.delta_log.checkpointer import create_checkpoint
    from deltacoord.schemas.actions import CommitInfo, Metadata, Protocol, commit_to_json_lines

    log = root / "_delta_log"
    log.mkdir(parents=True)
    rng = random.Random(42)

    def write(version: int, actions: list[Any], op: str) -> None:
        info = CommitInfo({"timestamp": NOW + version, "operation": op, "operationParameters": {}, "txnId": f"bench-{version}"})
        (log / f"{version:020d}.json").write_bytes(commit_to_json_lines([info, *actions]))

    md = Metadata(id="bench-table", schema_string=json.dumps(SCHEMA, separators=(",", ":")), partition_columns=("date",),
                  created_time=NOW)
    write(0, [Protocol(1, 2), md], "CREATE TABLE")
    per_commit = -(-files // commits)
    live: list[Any] = []
    i = 0
    version = 0
    for version in range(1, commits + 1):
        batch = [_add(j, rng) for j in range(i, min(files, i + per_commit))]
        i += len(batch)
        live.extend(batch)
        write(version, batch, "WRITE")
    t0 = time.perf_counter()
    result = create_checkpoint(root, version)
    checkpoint_s = time.perf_counter() - t0
    for _ in range(tail_commits):
        version += 1
        adds = [_add(j, rng) for j in range(i, i + 100)]
        i += 100
        gone = [live.pop(rng.randrange(len(live))) for _ in range(50)]
        write(version, [*adds, *(a.to_remove(NOW + version) for a in gone)], "WRITE")
        live.extend(adds)
    return {"version": version, "live_files": len(live), "checkpoint_version": result.version,
            "checkpoint_bytes": result.size_in_bytes, "checkpoint_s": round(checkpoint_s, 3)}


# --------------------------------------------------------------------------- loaders


def load_ours(path: str) -> int:
    from deltacoord.reader.snapshot import Snapshot

    return len(Snapshot.load(path).files())


def load_ours_arrow(path: str) -> int:
    from deltacoord.reader.snapshot import Snapshot

    return len(Snapshot.load(path).add_files_struct())


def load_delta_rs(path: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(path).get_add_actions().num_rows)


LOADERS: dict[str, Callable[[str], int]] = {
    "ours": load_ours,
    "ours-arrow": load_ours_arrow,
    "delta-rs": load_delta_rs,
}
LABELS = {
    "ours": "deltacoord Snapshot.load + files()",
    "ours-arrow": "deltacoord Snapshot.load + add_files_struct()",
    "delta-rs": "delta-rs DeltaTable + get_add_actions()",
}


def measure_memory(name: str, path: str) -> dict[str, Any]:
    """Run in a fresh interpreter: peak RSS after the imports and after one load."""
    if name.startswith("ours"):
        import deltacoord.reader.snapshot  # noqa: F401
    else:
        import deltalake  # noqa: F401
    import pyarrow  # noqa: F401

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n = LOADERS[name](path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"files": n, "baseline_kib": base, "peak_kib": peak}


def memory_in_subprocess(name: str, path: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--measure-memory", name, "--dir", path],
                         check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def time_loads(path: str, runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds (every thread of this process: delta-rs decodes on several) of each run."""
    times: dict[str, list[float]] = {name: [] for name in LOADERS}
    cpu: dict[str, list[float]] = {name: [] for name in LOADERS}
    counts: dict[str, int] = {}
    for name, fn in LOADERS.items():  # warm-up: imports, page cache
        counts[name] = fn(path)
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the readers disagree on the number of live files: {counts}")
    for _ in range(runs):
        for name, fn in LOADERS.items():
            gc.collect()
            c0 = time.process_time()
            t0 = time.perf_counter()
            fn(path)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return times, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=10, help="JSON commits holding the files before the checkpoint")
    ap.add_argument("--tail-commits", type=int, default=5, help="JSON commits after the checkpoint")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="Table directory (default: a temporary one, deleted afterwards)")
    ap.add_argument("--measure-memory", choices=sorted(LOADERS), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.measure_memory:
        print(json.dumps(measure_memory(args.measure_memory, args.dir)))
        return
    if args.build_only:
        print(json.dumps(build_table(Path(args.dir), args.files, args.commits, args.tail_commits)))
        return

    tmp = None
    if args.dir is None:
        tmp = tempfile.mkdtemp(prefix="bench-snapshot-")
        root = Path(tmp) / "table"
    else:
        root = Path(args.dir)
        if root.exists():
            shutil.rmtree(root)
    try:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--build-only", "--dir", str(root), "--files", str(args.files),
                              "--commits", str(args.commits), "--tail-commits", str(args.tail_commits)],
                             check=True, capture_output=True, text=True)
        built = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"built {built['live_files']:,} live files at version {built['version']} "
              f"(checkpoint at {built['checkpoint_version']}, {built['checkpoint_bytes'] / 1e6:.1f} MB, "
              f"written in {built['checkpoint_s']:.2f}s; build {time.perf_counter() - t0:.1f}s) in {root}")
        mem = {name: memory_in_subprocess(name, str(root)) for name in LOADERS}  # before any heavy import here
        times, cpu = time_loads(str(root), args.runs)

        med = {name: statistics.median(ts) for name, ts in times.items()}
        cpu_med = {name: statistics.median(ts) for name, ts in cpu.items()}
        print(f"\n{'reader':<48} {'median s':>9} {'min s':>8} {'CPU s':>7} {'peak RSS MiB':>13} {'load +MiB':>10}")
        for name in LOADERS:
            m = mem[name]
            print(f"{LABELS[name]:<48} {med[name]:>9.3f} {min(times[name]):>8.3f} {cpu_med[name]:>7.3f} "
                  f"{m['peak_kib'] / 1024:>13.0f} {(m['peak_kib'] - m['baseline_kib']) / 1024:>10.0f}")
        ratio = med["ours"] / med["delta-rs"]
        arrow_ratio = med["ours-arrow"] / med["delta-rs"]
        mem_ratio = (mem["ours"]["peak_kib"] - mem["ours"]["baseline_kib"]) / max(1, mem["delta-rs"]["peak_kib"] - mem["delta-rs"]["baseline_kib"])
        verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
        cpu_ratio = cpu_med["ours"] / cpu_med["delta-rs"]
        mem_verdict = "meets" if mem_ratio <= 1 else "MISSES"
        print(f"\ntime ours/delta-rs: {ratio:.2f}x with files() ({verdict} the {TARGET_RATIO}x target), "
              f"{arrow_ratio:.2f}x with add_files_struct(); CPU time ours/delta-rs {cpu_ratio:.2f}x with files() "
              f"(on a busy machine wall time favours delta-rs's threads); "
              f"load memory ours/delta-rs: {mem_ratio:.2f}x ({mem_verdict} the 1x target)")
        print(json.dumps({
            "files": built["live_files"], "runs": args.runs,
            "median_s": {k: round(v, 4) for k, v in med.items()},
            "min_s": {k: round(min(v), 4) for k, v in times.items()},
            "median_cpu_s": {k: round(v, 4) for k, v in cpu_med.items()}, "ratio_cpu_files": round(cpu_ratio, 3),
            "peak_rss_mib": {k: round(v["peak_kib"] / 1024, 1) for k, v in mem.items()},
            "load_rss_mib": {k: round((v["peak_kib"] - v["baseline_kib"]) / 1024, 1) for k, v in mem.items()},
            "ratio_files": round(ratio, 3), "ratio_arrow": round(arrow_ratio, 3), "target": TARGET_RATIO,
            "meets_target": ratio <= TARGET_RATIO, "memory_ratio": round(mem_ratio, 3), "meets_memory_target": mem_ratio <= 1,
        }))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
