"""The first commits of a fresh process: deltacoord's Python API and CLI beside delta-rs, in one run.

    python bench/bench_cold_start.py [--runs 5] [--commits 6] [--bootstrap-servers HOST:PORT]

Every short-lived process pays its first commits: a CLI write, a cron job, a Spark commit that runs in a
fresh Python worker. For each of `--runs` fresh processes:

* `python`: `Table(...)` then `--commits` one-row appends, each timed from the call to its return (the
  version is in `_delta_log`); the first two are the cold ones, the rest show a warm commit (the rows are
  built beforehand: `pa.table` of a dict imports pandas, a cost of the caller's, not of the commit); and
  again with the rows built before `Table(...)`, so the first append starts the moment the handle exists,
  while the client's start-up questions to Kafka are still out (also printed: `Table()` plus that first
  append, and the process's CPU time during the first commit and a warm one, start-up threads included);
* `delta-rs`: `write_deltalake(..., mode="append")` the same number of times on a table of its own;
* `cli`: one `deltacoord table append` process, timed from its start to its exit (interpreter and imports
  included), beside a process that only imports what the CLI imports, so the commit's own share shows, and
  beside a fresh process that appends one row with delta-rs.

A local broker is started in a temporary directory unless `--bootstrap-servers` is given; the coordinator
runs as its own process, as deployed. Prints JSON lines, then a table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

_PY_WRITER = r"""
import json, sys, time
t0 = time.perf_counter()
import pyarrow as pa
from deltacoord.schemas.routing import Topics
from deltacoord.writer import staging
from deltacoord.writer.table import Table
imported = time.perf_counter()
bootstrap, prefix, path, n, at_once = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
if at_once:  # the rows first: the first append is issued the moment Table() returns
    batches = [pa.table({"id": [i], "value": [f"row-{i}"]}) for i in range(n)]
opened = time.perf_counter()
t = Table(path, bootstrap, topics=Topics.with_prefix(prefix))
out = {"import_ms": (imported - t0) * 1000, "table_ms": (time.perf_counter() - opened) * 1000, "commits_ms": [],
       "cpu_ms": []}
if not at_once:  # untimed, as in delta-rs's run (pa.table of a dict imports pandas: about 200 ms)
    batches = [pa.table({"id": [i], "value": [f"row-{i}"]}) for i in range(n)]
for i in range(n):
    s, c = time.perf_counter(), time.process_time()  # the process's CPU, its start-up threads' included
    t.append(batches[i])
    out["commits_ms"].append((time.perf_counter() - s) * 1000)
    out["cpu_ms"].append((time.process_time() - c) * 1000)
# The exact coordinator question runs in a child process only when the quick look did not find the group Stable.
out["check_children"] = t.client.coordinator_check.kafka.started
t.close()
print(json.dumps(out))
"""

_RS_WRITER = r"""
import json, sys, time
t0 = time.perf_counter()
import pyarrow as pa
from deltalake import write_deltalake
imported = time.perf_counter()
path, n = sys.argv[1], int(sys.argv[2])
out = {"import_ms": (imported - t0) * 1000, "commits_ms": []}
batches = [pa.table({"id": [i], "value": [f"row-{i}"]}) for i in range(n)]  # untimed: pyarrow imports pandas here
for i in range(n):
    s = time.perf_counter()
    write_deltalake(path, batches[i], mode="append")
    out["commits_ms"].append((time.perf_counter() - s) * 1000)
print(json.dumps(out))
"""


#: A fresh process that appends one row with delta-rs: beside `deltacoord table append`'s process.
_RS_PROCESS = r"""
import sys
import pyarrow as pa
from deltalake import write_deltalake
write_deltalake(sys.argv[1], pa.table({"id": [0], "value": ["process"]}), mode="append")
"""


def _run_json(argv: list[str]) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    s = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    ms = (time.perf_counter() - s) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return ms


def _start_coordinator(bootstrap: str, prefix: str, workdir: Path) -> subprocess.Popen[bytes]:
    log = open(workdir / "coordinator.log", "wb")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(
        [sys.executable, "-m", "deltacoord.cli.main", "coordinator", "run", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT)


def _create(bootstrap: str, prefix: str, path: str, coordinator: subprocess.Popen[bytes]) -> None:
    import pyarrow as pa

    from deltacoord.schemas.routing import Topics
    from deltacoord.tooling.bench import create_when_served
    from deltacoord.writer.table import Table

    with Table(path, bootstrap, topics=Topics.with_prefix(prefix)) as t:
        create_when_served(t, pa.schema([("id", pa.int64()), ("value", pa.string())]), [coordinator])


def run(bootstrap: str, runs: int, commits: int, workdir: Path) -> list[dict[str, Any]]:
    from confluent_kafka.admin import AdminClient

    from deltacoord.coordinator.kafka.topics import ensure_topics
    from deltacoord.schemas.routing import Topics

    prefix = f"cold-{uuid.uuid4().hex[:6]}"
    ensure_topics(AdminClient({"bootstrap.servers": bootstrap}), Topics.with_prefix(prefix))
    coordinator = _start_coordinator(bootstrap, prefix, workdir)
    rows: list[dict[str, Any]] = []
    try:
        dc_table = str(workdir / "deltacoord")
        cli_table = str(workdir / "deltacoord-cli")
        _create(bootstrap, prefix, dc_table, coordinator)
        _create(bootstrap, prefix, cli_table, coordinator)
        for r in range(runs):
            print(f"[cold start] run {r + 1} of {runs} ...", file=sys.stderr, flush=True)
            py = _run_json([sys.executable, "-c", _PY_WRITER, bootstrap, prefix, dc_table, str(commits), "0"])
            now = _run_json([sys.executable, "-c", _PY_WRITER, bootstrap, prefix, dc_table, str(commits), "1"])
            rs = _run_json([sys.executable, "-c", _RS_WRITER, str(workdir / f"delta-rs-{r}"), str(commits)])
            cli = _timed([sys.executable, "-m", "deltacoord.cli.main", "table", "append", cli_table,
                          "--bootstrap-servers", bootstrap, "--topic-prefix", prefix,
                          "--json-rows", json.dumps([{"id": r, "value": "cli"}])])
            # What `table append` imports (its command family loads when the command runs).
            imports = _timed([sys.executable, "-c", "import deltacoord.cli.main, deltacoord.cli.tables, pyarrow"])
            rs_process = _timed([sys.executable, "-c", _RS_PROCESS, str(workdir / f"delta-rs-{r}")])
            row = {"run": r, "python_commits_ms": [round(x, 1) for x in py["commits_ms"]],
                   "python_at_once_commits_ms": [round(x, 1) for x in now["commits_ms"]],
                   "python_at_once_table_ms": round(now["table_ms"], 1),
                   "python_at_once_cpu_ms": [round(x, 1) for x in now["cpu_ms"]],
                   "delta_rs_commits_ms": [round(x, 1) for x in rs["commits_ms"]],
                   "python_import_ms": round(py["import_ms"], 1), "delta_rs_import_ms": round(rs["import_ms"], 1),
                   "check_children": py["check_children"] + now["check_children"],
                   "cli_process_ms": round(cli, 1), "cli_imports_only_ms": round(imports, 1),
                   "delta_rs_process_ms": round(rs_process, 1)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        coordinator.terminate()
        coordinator.wait(60)
    return rows


def _table(rows: list[dict[str, Any]]) -> None:
    def med(key: str, i: int | None = None) -> float:
        return round(statistics.median(r[key] if i is None else r[key][i] for r in rows), 1)

    def warm(key: str) -> float:
        return round(statistics.median(x for r in rows for x in r[key][2:]), 1)

    print(f"{'median of ' + str(len(rows)) + ' fresh processes':34} {'deltacoord':>11} {'delta-rs':>9}")
    print(f"{'1st commit ms':34} {med('python_commits_ms', 0):>11} {med('delta_rs_commits_ms', 0):>9}")
    print(f"{'2nd commit ms':34} {med('python_commits_ms', 1):>11} {med('delta_rs_commits_ms', 1):>9}")
    print(f"{'warm commit ms (3rd on)':34} {warm('python_commits_ms'):>11} {warm('delta_rs_commits_ms'):>9}")
    print(f"{'1st commit ms, rows built first':34} {med('python_at_once_commits_ms', 0):>11}")
    print(f"{'2nd commit ms, rows built first':34} {med('python_at_once_commits_ms', 1):>11}")
    print(f"{'warm commit ms, rows built first':34} {warm('python_at_once_commits_ms'):>11}")
    # Work moved from the first append into Table() shows here: the handle is opened and used at once.
    opened = round(statistics.median(r["python_at_once_table_ms"] + r["python_at_once_commits_ms"][0] for r in rows), 1)
    print(f"{'Table() + 1st commit ms, rows first':34} {opened:>11}")
    print(f"{'CPU ms 1st / warm, rows built first':34} {med('python_at_once_cpu_ms', 0):>11} "
          f"/ {warm('python_at_once_cpu_ms')}")
    print(f"{'one-append process ms (CLI)':34} {med('cli_process_ms'):>11} {med('delta_rs_process_ms'):>9}")
    print(f"{'  of which imports only':34} {med('cli_imports_only_ms'):>11}")
    for label, key, i in (("1st / warm", "python_commits_ms", 0), ("2nd / warm", "python_commits_ms", 1),
                          ("1st / warm, rows built first", "python_at_once_commits_ms", 0),
                          ("2nd / warm, rows built first", "python_at_once_commits_ms", 1)):
        ratio = med(key, i) / warm("python_commits_ms")  # the warm commits of the same build and run
        rs = "" if "at_once" in key else f"{med('delta_rs_commits_ms', i) / warm('delta_rs_commits_ms'):>8.1f}x"
        print(f"{label:34} {ratio:>10.1f}x {rs}")
    # The at-once processes against their own warm commits: the other processes' may differ by more than the
    # first commit's own cost when the machine is shared.
    own = med("python_at_once_commits_ms", 0) / warm("python_at_once_commits_ms")
    print(f"{'1st / own warm, rows built first':34} {own:>10.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commits", type=int, default=6, help="appends per fresh process (at least 3)")
    ap.add_argument("--bootstrap-servers", default=None)
    args = ap.parse_args()
    if args.commits < 3:
        ap.error("--commits must be at least 3: two cold commits and a warm one")
    from deltacoord.tooling.broker import LocalBroker

    workdir = Path(tempfile.mkdtemp(prefix="deltacoord-cold-"))
    broker = None if args.bootstrap_servers else LocalBroker(workdir / "broker")
    try:
        bootstrap = args.bootstrap_servers or broker.start().bootstrap_servers  # type: ignore[union-attr]
        rows = run(bootstrap, args.runs, args.commits, workdir)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    _table(rows)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
