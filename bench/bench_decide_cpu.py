"""The deciding thread's CPU per commit without Kafka (not a test): what `bench_capacity.py`'s coordinator does
for each batch on its deciding thread, fed pre-encoded proposals, timed with the thread's CPU clock (so other
work on the machine changes little of it).

    python bench/bench_decide_cpu.py [--commits 10000] [--batch 60] [--busy]

Per batch, as `PartitionCoordinator._decide` does: Avro-decode every proposal (`decode_proposal`), decide the
batch (`decide_batch`: validation, the conflict check, the rebase, and with `--busy` coalescing), encode every
decision for the commits topic (`encode_decision`) and apply the batch to the live state (`Overlay.apply_to`).
The proposals are the capacity bench's: one-file blind appends of long-lived writers, each with the read
version of its first snapshot (0), so the head runs away from the read version as the run goes on.

Prints one JSON line: CPU microseconds per commit over the run and per tenth of it (the head grows), and the
versions made.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltacoord.coordinator.rules.batch import Submitted, decide_batch
from deltacoord.coordinator.rules.state import TableState
from deltacoord.reader.staged_commits import on_the_wire
from deltacoord.schemas.actions import AddFile, CommitInfo, Metadata, Protocol
from deltacoord.schemas.codec import decode_proposal, encode_decision, encode_proposal
from deltacoord.schemas.messages import Proposal

TABLE_ID = "bench-decide"
TABLE_URI = "file:///tmp/bench-decide/t0"
NOW = 1_700_000_000_000
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "value", "type": "string", "nullable": True, "metadata": {}}]})


def _created() -> TableState:
    st = TableState.empty(TABLE_ID, TABLE_URI)
    st.apply(0, (CommitInfo({"operation": "CREATE TABLE", "txnId": "create", "timestamp": NOW}), Protocol(1, 2),
                 Metadata(id="d0000000-0000-4000-8000-000000000000", schema_string=SCHEMA, partition_columns=())))
    return st


def _proposal(i: int) -> bytes:
    """A writer's one-row blind append, as `Transaction.proposal` builds it, encoded."""
    pid = str(uuid.uuid4())
    stats = json.dumps({"numRecords": 1, "minValues": {"id": 1, "value": "x"}, "maxValues": {"id": 1, "value": "x"},
                        "nullCount": {"id": 0, "value": 0}})
    add = AddFile(path=f"part-{i:06d}-{pid}.parquet", partition_values={}, size=700, modification_time=NOW,
                  data_change=True, stats=stats)
    params = {"mode": "Append", "partitionBy": "[]"}
    info = {"timestamp": NOW, "operation": "WRITE", "operationParameters": params, "engineInfo": "deltacoord-bench",
            "txnId": pid, "operationMetrics": {"numAddedFiles": "1", "numRemovedFiles": "0", "numAddedBytes": "700",
                                               "numOutputRows": "1"}}
    p = Proposal(table_id=TABLE_ID, table_uri=TABLE_URI, proposal_id=pid, read_version=0, operation="WRITE",
                 changes_data=True, actions=(add,), commit_info=CommitInfo(info), operation_parameters=params,
                 writer="bench")
    return encode_proposal(p)


def run(commits: int, batch: int, busy: bool) -> dict[str, object]:
    raw = [_proposal(i) for i in range(commits)]
    live = {TABLE_ID: _created()}
    busy_set = frozenset({TABLE_ID}) if busy else frozenset()
    tenths: list[float] = []
    done_at = [commits * (k + 1) // 10 for k in range(10)]
    spent = 0.0
    versions = 0
    t_all = time.thread_time()
    t_part = t_all
    done = 0
    for start in range(0, commits, batch):
        t0 = time.thread_time()
        chunk = raw[start:start + batch]
        proposals = [Submitted(decode_proposal(b), NOW + start) for b in chunk]
        decided, overlay = decide_batch(live, proposals, NOW + start, busy=busy_set)
        encoded = [encode_decision(on_the_wire(d)) for d in decided]
        overlay.apply_to(live)
        spent += time.thread_time() - t0
        assert len(encoded) == len(chunk) and all(d.committed for d in decided), [d for d in decided if not d.committed][:1]
        versions += sum(1 for d in decided if d.holds_version)
        done += len(chunk)
        while len(tenths) < 10 and done >= done_at[len(tenths)]:
            now = time.thread_time()
            n = done_at[len(tenths)] - (done_at[len(tenths) - 1] if tenths else 0)
            tenths.append(round((now - t_part) * 1e6 / max(n, 1), 1))
            t_part = now
    return {"commits": commits, "batch": batch, "busy": busy, "versions": versions, "head": live[TABLE_ID].version,
            "cpu_us_per_commit": round(spent * 1e6 / commits, 1), "cpu_us_per_commit_by_tenth": tenths,
            "wall_cpu_s": round(time.thread_time() - t_all, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=60, help="proposals per batch (the capacity bench's are ~60)")
    ap.add_argument("--busy", action="store_true", help="the table's lane is busy: its appends coalesce")
    args = ap.parse_args()
    if args.commits < 1 or args.batch < 1:
        ap.error("--commits and --batch must be at least 1")
    print(json.dumps(run(args.commits, args.batch, args.busy)), flush=True)


if __name__ == "__main__":
    main()
