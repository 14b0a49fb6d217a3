"""Benchmark of the pure conflict engine (not a test).

    python bench/bench_conflicts.py [--files 1000000] [--appends 50000] [--deletes 5000]

1. Blind appends against a table of 1,000,000 live files: the state is built
   by applying commits of many adds; then each proposal (one new file, read
   version 0..4 commits behind the head) is decided and applied.
   Target: 20,000 decisions/s on one core.
2. Conflict-checked DELETEs (partition predicate + read files + removes)
   against a window of 100 winning commits of 10 files each (non-blind
   UPDATEs in other partitions, so every winner file is matched against the
   predicate and every removed path against the read files). `decide` only.
   Target: 2,000 decisions/s on one core.

Prints the measured rates beside the targets, and the process RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltacoord.coordinator.rules.conflicts import decide
from deltacoord.coordinator.rules.outcomes import Accepted
from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, Metadata, Protocol, RemoveFile
from deltacoord.schemas.messages import FileRead, Proposal

TABLE_ID = "bench"
TABLE_URI = "s3://bench-bucket/tables/events"
NOW = 1_700_000_000_000
SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "payload", "type": "string", "nullable": True, "metadata": {}},
            {"name": "date", "type": "date", "nullable": True, "metadata": {}},
        ],
    }
)
METADATA = Metadata(id="b0000000-0000-4000-8000-000000000000", schema_string=SCHEMA, partition_columns=("date",))


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) in MB."""
    current = 0.0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return current, peak


def day(i: int) -> str:
    y, rem = divmod(i, 365)
    return time.strftime("%Y-%m-%d", time.gmtime((30 * 365 + y * 365 + rem) * 86_400))


def new_add(path: str, date: str, data_change: bool = True) -> AddFile:
    return AddFile(path=path, partition_values={"date": date}, size=4096, modification_time=NOW, data_change=data_change)


def commit_info(op: str, blind: bool, txn_id: str) -> CommitInfo:
    return CommitInfo({"timestamp": NOW, "operation": op, "isBlindAppend": blind, "txnId": txn_id})


def create_state(**bounds: int) -> TableState:
    st = TableState.empty(TABLE_ID, TABLE_URI, **bounds)
    st.apply(0, [commit_info("CREATE TABLE", False, "create"), Protocol(1, 2), METADATA])
    return st


def proposal(pid: str, rv: int, actions: tuple[Action, ...], **kw: object) -> Proposal:
    return Proposal(
        table_id=TABLE_ID,
        table_uri=TABLE_URI,
        proposal_id=pid,
        read_version=rv,
        operation=str(kw.pop("operation", "WRITE")),
        changes_data=True,
        actions=actions,
        commit_info=CommitInfo({"engineInfo": "bench", "txnId": pid}),
        **kw,  # type: ignore[arg-type]
    )


def bench_blind_appends(n_files: int, n_appends: int) -> tuple[float, float]:
    gc.collect()
    before, _ = rss_mb()
    st = create_state()
    per_commit = 2_000
    n_dates = 1_000
    t0 = time.perf_counter()
    made = 0
    v = 1
    while made < n_files:
        k = min(per_commit, n_files - made)
        adds = [new_add(f"date={day(j % n_dates)}/part-{j:08d}.snappy.parquet", day(j % n_dates)) for j in range(made, made + k)]
        st.apply(v, [commit_info("WRITE", True, f"load-{v}"), *adds])
        made += k
        v += 1
    build_s = time.perf_counter() - t0
    gc.collect()
    cur, _ = rss_mb()
    print(
        f"    built {st.live_file_count:,} live files in {v - 1} commits ({build_s:.1f}s); RSS {cur:.0f} MB "
        f"(state ~{cur - before:.0f} MB: live-key hashes + a window of {st.window_size} commits)"
    )

    rng = random.Random(7)
    base = st.version
    props = []
    for i in range(n_appends):
        rv = max(base, base + i - rng.randint(0, 4))
        d = day(rng.randrange(n_dates))
        a = new_add(f"date={d}/part-new-{i:08d}-c000.snappy.parquet", d)
        props.append(proposal(f"append-{i}", rv, (a,), operation_parameters={"mode": "Append"}))
    gc.collect()
    t0 = time.perf_counter()
    now = NOW
    for p in props:
        now += 1
        r = decide(st, p, now)
        if type(r) is not Accepted:
            raise SystemExit(f"unexpected decision for a blind append: {r}")
        st.apply(r.version, r.actions)
    dt = time.perf_counter() - t0
    assert st.live_file_count == n_files + n_appends
    del props, p, r  # the pre-built proposals are the benchmark's, not the state's
    gc.collect()
    alive, _ = rss_mb()  # measured while the 1M-file state (and its full window) is still alive
    print(f"    window now {st.window_size:,} commits (versions {st.oldest_retained_version:,}..{st.version:,})")
    return n_appends / dt, alive


def bench_deletes(n_deletes: int) -> float:
    st = create_state()
    n_target_dates = 50
    target = [day(i) for i in range(n_target_dates)]  # partitions the DELETEs read
    other = [day(1_000 + i) for i in range(200)]  # partitions the winners write
    # version 1: 10 files in each target partition, 20 in each "other" partition
    seed: list[Action] = [commit_info("WRITE", True, "seed")]
    files_by_date: dict[str, list[AddFile]] = {}
    for d in target:
        files_by_date[d] = [new_add(f"date={d}/seed-{k}.parquet", d) for k in range(10)]
        seed += files_by_date[d]
    for d in other:
        files_by_date[d] = [new_add(f"date={d}/seed-{k}.parquet", d) for k in range(20)]
        seed += files_by_date[d]
    st.apply(1, seed)
    read_version = st.version
    # 100 winners: non-blind UPDATEs, 10 files each (5 removes + 5 adds) in the other partitions
    for w in range(100):
        acts: list[Action] = [commit_info("UPDATE", False, f"winner-{w}")]
        for k in range(5):
            d = other[(w * 5 + k) % len(other)]
            victim = files_by_date[d].pop()
            acts.append(RemoveFile(path=victim.path, deletion_timestamp=NOW, data_change=True, partition_values={"date": d}))
            acts.append(new_add(f"date={d}/upd-{w}-{k}.parquet", d))
        st.apply(st.version + 1, acts)
    assert len(st.winners_since(read_version)) == 100

    rng = random.Random(11)
    props = []
    for i in range(n_deletes):
        d = target[rng.randrange(n_target_dates)]
        files = files_by_date[d]
        actions: tuple[Action, ...] = (
            *(RemoveFile(path=f.path, deletion_timestamp=NOW, data_change=True, partition_values={"date": d}) for f in files),
            new_add(f"date={d}/rewritten-{i}.parquet", d),
        )
        props.append(
            proposal(
                f"delete-{i}",
                read_version,
                actions,
                operation="DELETE",
                read_predicates=(f"date = '{d}' AND id % 7 = 3",),
                read_files=tuple(FileRead(f.path, {"date": d}) for f in files),
            )
        )
    gc.collect()
    t0 = time.perf_counter()
    for p in props:
        r = decide(st, p, NOW)
        if type(r) is not Accepted:
            raise SystemExit(f"unexpected decision for a disjoint DELETE: {r}")
    dt = time.perf_counter() - t0
    return n_deletes / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--appends", type=int, default=50_000)
    ap.add_argument("--deletes", type=int, default=5_000)
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}, one core")
    print(f"(1) blind appends against a table of {args.files:,} live files (decide + apply)")
    appends, alive = bench_blind_appends(args.files, args.appends)
    _, peak = rss_mb()
    print(f"    {appends:>10,.0f} decisions/s   target 20,000/s   {'OK' if appends >= 20_000 else 'BELOW TARGET'}")
    print(f"    RSS with the state alive {alive:.0f} MB (process peak {peak:.0f} MB)   target < 300 MB")
    print("(2) conflict-checked DELETEs vs a window of 100 winners x 10 files (decide)")
    deletes = bench_deletes(args.deletes)
    _, peak = rss_mb()
    print(f"    {deletes:>10,.0f} decisions/s   target  2,000/s   {'OK' if deletes >= 2_000 else 'BELOW TARGET'}")
    print(f"    process peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
