"""Questions about consumer groups, asked of Kafka's admin API in a child process.

librdkafka aborts the whole process (the assertion `eonce->refcnt > 0` in
`rd_kafka_enq_once_del_source_return`, librdkafka issue #4605; the fix, pull request #5397, is not
released) when a coordinator-targeted admin request such as DescribeConsumerGroups fails because its
broker connection drops: exactly when a broker dies or restarts under running writers. Reproduced
here in two broker restarts out of two. So a writer asks through `GroupQuestions`: a small child
process (this module's `main`) holds the admin client and answers one question per line on its
pipes. If librdkafka aborts, only the child ends; the question is answered "cannot tell" and the
next one starts a new child. Listing groups (ListGroups, sent to each broker, not through the group
coordinator) is not affected and is asked in the writer's own process (`deltacoord.writer.group_states`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

#: Seconds a question may take beyond its own Kafka timeout before the child is given up (and killed).
MARGIN_S = 10.0


class QuestionFailed(Exception):
    """The child could not answer (it died, hung, or Kafka gave no answer to the whole question)."""


class GroupQuestions:
    """The writer's side: one child process, started on the first question, asked one question at a time."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self._conf = {k: v for k, v in conf.items() if isinstance(v, (str, int, float, bool))}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        #: Children started so far (a restart after an abort shows here), for tests and diagnostics.
        self.started = 0

    def describe(self, group_ids: list[str], timeout_s: float) -> dict[str, dict[str, Any]]:
        """Per group: {"error": text} or {"state": name, "members": [[[topic, partition], ...], ...]}."""
        answer = self._ask({"op": "describe", "groups": group_ids, "timeout": timeout_s}, timeout_s)
        return dict(answer["groups"])

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- the pipe ----------------------------------------------------------------------------
    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "from deltacoord.writer.group_questions import main; main()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(self._conf).encode() + b"\n")  # secrets (SASL) through the pipe, not argv
        proc.stdin.flush()
        self.started += 1
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def _ask(self, question: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start()
                proc = self._proc
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(question).encode() + b"\n")
                proc.stdin.flush()
                line = self._read_line(proc, timeout_s + MARGIN_S)
            except (OSError, ValueError) as e:
                self._stop()
                raise QuestionFailed(f"the admin child process failed ({e})") from None
            if line is None:
                code = proc.poll()
                self._stop()
                raise QuestionFailed("the admin child process ended (librdkafka aborted it)" if code is not None
                                     else "the admin child process did not answer in time")
            answer: dict[str, Any] = json.loads(line)
            if "error" in answer:
                raise QuestionFailed(str(answer["error"]))
            return answer

    @staticmethod
    def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the child ended
            buf += chunk
        return buf


def _describe(admin: Any, q: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import KafkaException

    out: dict[str, Any] = {}
    futures = admin.describe_consumer_groups(q["groups"], request_timeout=q["timeout"])
    for gid, fut in futures.items():
        try:
            desc = fut.result()
        except KafkaException as e:
            out[gid] = {"error": str(e.args[0] if e.args else e)}
            continue
        members = [[[tp.topic, tp.partition] for tp in (m.assignment.topic_partitions if m.assignment else [])]
                   for m in desc.members or ()]
        out[gid] = {"state": desc.state.name, "members": members}
    return {"groups": out}


def main() -> None:
    """The child: read the client configuration, then answer one JSON question per line until stdin closes."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    conf = json.loads(sys.stdin.readline())
    for line in sys.stdin:
        q = json.loads(line)
        admin = AdminClient(conf)  # one per question: an idle admin client would reconnect for ever
        try:
            answer = _describe(admin, q)
        except (KafkaException, KeyError, ValueError) as e:
            answer = {"error": str(e.args[0] if e.args else e)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


__all__ = ["GroupQuestions", "QuestionFailed", "main"]
