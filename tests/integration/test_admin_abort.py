"""A writer process survives brokers that die and return: librdkafka's admin abort ends a child, not the writer.

librdkafka aborts its process (`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`, librdkafka
issue #4605) when DescribeConsumerGroups fails as its broker connection drops. The writer's coordinator check asks
that question in a child process (`deltacoord.writer.group_questions`); here a writer process keeps asking while its broker is
SIGKILLed and restarted, and must outlive every abort. Its quick look (ListGroups, `deltacoord.writer.group_states`) is asked
in the writer's own process: it does not take the group-coordinator path that aborts, and a second process asks it
from four threads at once through the same kills, so that questions are in flight when the connection drops.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltacoord.tooling.broker import LocalBroker
from deltacoord.tooling.ports import free_port

REPO = Path(__file__).resolve().parents[2]

ASKER = r"""
import json, pathlib, sys, time
from deltacoord.schemas.errors import NoCoordinatorError
from deltacoord.schemas.routing import Topics
import deltacoord.writer.serving as serving
serving.TRUSTED_S = 0.0  # ask Kafka every time
check = serving.CoordinatorCheck({"bootstrap.servers": sys.argv[1]}, Topics.with_prefix("abort"), "abort-coordinator")
asked, until = 0, None
while until is None or time.monotonic() < until:
    try:
        check.ensure(0)
    except NoCoordinatorError:
        pass
    asked += 1
    if until is None:  # answered once: asking for the given seconds from now, the broker's kills among them
        until = time.monotonic() + float(sys.argv[2])
        pathlib.Path(sys.argv[3]).touch()
print(json.dumps({"asked": asked, "children": check.kafka.started, "quick_looks": check.quick_looks}), flush=True)
check.close()
"""

LISTER = r"""
import json, os, sys, threading, time
from deltacoord.writer.group_states import ListingFailed, groups_in_states
conf, done, until = {"bootstrap.servers": sys.argv[1]}, sys.argv[2], time.monotonic() + float(sys.argv[3])
started = sys.argv[4]  # touched once a question was answered
counts, lock = {"answered": 0, "failed": 0, "answered_at_end": 0}, threading.Lock()
def ask():
    # Until the test says the broker is back for good (`done` exists) and a question was answered after that.
    while time.monotonic() < until and not counts["answered_at_end"]:
        end = os.path.exists(done)
        try:
            key = "answered" if groups_in_states(conf, ["STABLE"], 5.0).complete else "failed"
        except ListingFailed:
            key = "failed"
        with lock:
            counts[key] += 1
            counts["answered_at_end"] += key == "answered" and end
        if key == "answered" and not os.path.exists(started):
            open(started, "a").close()
threads = [threading.Thread(target=ask) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(counts), flush=True)
"""


@pytest.mark.kafka
def test_a_writer_outlives_the_admin_abort_while_its_broker_dies_and_returns(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker")
    bootstrap = broker.start(port=free_port()).bootstrap_servers
    asking, listing = tmp_path / "asker-answered", tmp_path / "lister-answered"
    asker = subprocess.Popen([sys.executable, "-c", ASKER, bootstrap, "75", str(asking)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = tmp_path / "broker-back-for-good"
    lister = subprocess.Popen([sys.executable, "-c", LISTER, bootstrap, str(done), "480", str(listing)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Both children are asking (each had an answer) before the broker first dies: fresh processes at load.
        deadline = time.monotonic() + 180
        while not (asking.exists() and listing.exists()):
            assert asker.poll() is None and lister.poll() is None, (asker.returncode, lister.returncode)
            assert time.monotonic() < deadline, (f"within 180 s: asker answered {asking.exists()}, "
                                                 f"lister answered {listing.exists()}")
            time.sleep(0.1)
        for _ in range(3):
            time.sleep(6)
            broker.kill()
            time.sleep(10)
            broker.start()
        done.touch()
        out, err = asker.communicate(timeout=180)
        listed, list_err = lister.communicate(timeout=510)
    finally:
        for proc in (asker, lister):
            if proc.poll() is None:
                proc.kill()
        broker.stop()
    assert asker.returncode == 0, f"the writer process ended with {asker.returncode}: {err[-2000:]}"
    assert lister.returncode == 0, f"the listing process ended with {lister.returncode}: {list_err[-2000:]}"
    import json

    result = json.loads(out.strip().splitlines()[-1])
    assert result["asked"] > 3
    assert result["children"] >= 1
    assert result["quick_looks"] >= result["asked"]  # each question began with a quick look in the writer's process
    counts = json.loads(listed.strip().splitlines()[-1])
    assert counts["failed"] >= 3, counts  # questions failed while the broker was down (each of the three kills)
    assert counts["answered_at_end"], counts  # and the process that asked through the kills is answered after them
