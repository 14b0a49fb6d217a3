"""The deciding thread's work on one large commit by reference, per step, without Kafka (not a test).

    python bench/bench_big_decide.py [--files 100000]

What `PartitionCoordinator` does on its deciding thread for a commit whose actions travel by reference
(`docs/operations.md`, *Large commits*): read the writer's staged file (`load_proposal`: hashed while parsed),
decide it (`decide_batch`: validation, the conflict check, the rebase), stage the decided commit
(`stage_decision`) and apply the batch to the live state (`Overlay.apply_to`). First an append of N files
(adds with stats of two columns, as `bench_big_commits.py`'s), then an overwrite removing them all and
adding one, on a local table in a temporary directory.

Prints one JSON line per commit: each step's wall and thread-CPU seconds, the process's resident memory at
the step's peak and after it (sampled every 5 ms; the bench holds no actions of its own: it writes the staged
files as a stream), and the load average (the CPU figures move little with other work on the machine, the
wall ones move with it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltacoord.coordinator.rules.batch import Submitted, decide_batch
from deltacoord.coordinator.rules.state import TableState
from deltacoord.reader.staged_commits import load_proposal, stage_decision
from deltacoord.schemas.actions import Action, AddFile, CommitInfo, Metadata, Protocol, iter_json_lines
from deltacoord.schemas.messages import Proposal, StagedActions
from deltacoord.schemas.staged import STAGED_DIR, StagedDigest, writer_key
from deltacoord.storage.table import TableStorage

TABLE_ID = "bench-big-decide"
NOW = 1_700_000_000_000
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "value", "type": "string", "nullable": True, "metadata": {}}]})


def _stats(i: int) -> str:
    return json.dumps({"numRecords": 1, "minValues": {"id": i, "value": f"value-{i:09d}"},
                       "maxValues": {"id": i, "value": f"value-{i:09d}"}, "nullCount": {"id": 0, "value": 0}},
                      separators=(",", ":"))


def _path(i: int) -> str:
    return f"part-dc-{i:09d}-c000.snappy.parquet"


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 1e6


class _PeakRss:
    """The process's resident size at its highest since `reset`, sampled by a daemon thread."""

    def __init__(self) -> None:
        self.peak = _rss_mb()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, _rss_mb())
            time.sleep(0.005)

    def reset(self) -> None:
        self.peak = _rss_mb()


_RSS = _PeakRss()


def _stage(storage: TableStorage, pid: str, actions: Iterable[Action]) -> StagedActions:
    """Write `actions` as a writer's staged file, a piece at a time (the bench never holds them all)."""
    digest = StagedDigest()
    tmp = storage.temp_for(f"{STAGED_DIR}bench.json")
    with open(tmp, "wb") as out:
        for piece in iter_json_lines(actions):
            digest.update(piece)
            out.write(piece)
    ref = digest.ref()
    storage.put_file_if_absent(writer_key(pid, ref), tmp)
    if os.path.exists(tmp):
        os.unlink(tmp)
    return ref


def _commit(storage: TableStorage, live: dict[str, TableState], actions: Iterable[Action], mode: str,
            read_version: int) -> dict[str, Any]:
    """Stage `actions` as a writer would, then load, decide, stage and apply them as the deciding thread does."""
    pid = str(uuid.uuid4())
    ref = _stage(storage, pid, actions)
    params = {"mode": mode, "partitionBy": "[]"}
    p = Proposal(table_id=TABLE_ID, table_uri=storage.location, proposal_id=pid, read_version=read_version,
                 operation="WRITE", changes_data=True, actions=(), staged=ref, operation_parameters=params,
                 commit_info=CommitInfo({"timestamp": NOW, "operation": "WRITE", "operationParameters": params,
                                         "txnId": pid}), read_whole_table=mode == "Overwrite", writer="bench")
    steps: dict[str, list[float]] = {}
    rss: dict[str, list[int]] = {"start": [round(_rss_mb())]}

    def step(name: str, f: Callable[[], Any]) -> Any:
        _RSS.reset()
        w, c = time.perf_counter(), time.thread_time()
        out = f()
        steps[name] = [round(time.perf_counter() - w, 2), round(time.thread_time() - c, 2)]
        time.sleep(0.01)  # one more sample
        rss[name] = [round(_RSS.peak), round(_rss_mb())]
        return out

    # Each step's inputs are dropped once used, as the partition loop drops them (no closure keeps them).
    loaded = step("load", partial(load_proposal, storage, p, 1 << 31))
    decided, overlay = step("decide", partial(decide_batch, live, [Submitted(loaded, NOW)], NOW))
    assert decided[0].committed, decided[0]
    # Given the loaded proposal, as the partition gives it: a commit of exactly its vouched lines is copied.
    step("stage", partial(stage_decision, storage, decided[0], loaded))
    del decided, loaded
    step("apply", partial(overlay.apply_to, live))
    return {"steps_wall_cpu_s": steps, "total_wall_s": round(sum(v[0] for v in steps.values()), 2),
            "total_cpu_s": round(sum(v[1] for v in steps.values()), 2), "rss_mb_peak_after": rss,
            "load_average": round(os.getloadavg()[0], 1)}


def _adds(n: int) -> Iterator[AddFile]:
    return (AddFile(_path(i), {}, 1000 + i % 100, NOW, True, stats=_stats(i)) for i in range(n))


def _overwrite(n: int) -> Iterator[Action]:
    for a in _adds(n):
        yield a.to_remove(NOW)
    yield AddFile("part-new.parquet", {}, 1000, NOW, True, stats=_stats(0))


def run(n: int, root: Path) -> list[dict[str, Any]]:
    storage = TableStorage(root.as_uri())
    st = TableState.empty(TABLE_ID, storage.location)
    st.apply(0, (CommitInfo({"operation": "CREATE TABLE", "txnId": "create", "timestamp": NOW}), Protocol(1, 2),
                 Metadata(id="d0000000-0000-4000-8000-000000000000", schema_string=SCHEMA, partition_columns=())))
    live = {TABLE_ID: st}
    rows = [{"commit": "append", "files": n, **_commit(storage, live, _adds(n), "Append", 0)}]
    rows.append({"commit": "overwrite", "files": n, **_commit(storage, live, _overwrite(n), "Overwrite", 1)})
    assert live[TABLE_ID].live_file_count == 1
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    args = ap.parse_args()
    if args.files < 1:
        ap.error("--files must be at least 1")
    root = Path(tempfile.mkdtemp(prefix="deltacoord-big-decide-"))
    try:
        for row in run(args.files, root):
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
