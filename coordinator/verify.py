"""Check a coordinated table against its source of truth.

`_delta_log` versions must be contiguous from 0 and equal, byte for byte, to
the committed decisions on the commits topic; every data file a live snapshot
references must exist; each proposal must have exactly one decision.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from coordinator.publisher import commit_path, table_root
from coordinator.service import CoordinatorSettings, read_decisions
from schemas.actions import commit_to_json_lines
from schemas.routing import partition_for


@dataclass
class VerifyReport:
    table_id: str
    topic_versions: int = 0
    published_versions: int = 0
    rejections: int = 0
    duplicate_answers: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_table(settings: CoordinatorSettings, table_uri: str, table_id: str, num_partitions: int = 1,
                 *, require_published: bool = True) -> VerifyReport:
    rep = VerifyReport(table_id)
    root = table_root(table_uri)
    partition = partition_for(table_id, num_partitions)
    decided: Counter[str] = Counter()
    expected = 0
    for d in read_decisions(settings, partition, table_id=table_id):
        decided[d.proposal_id] += 1
        if not d.committed:
            rep.rejections += 1
            continue
        if d.duplicate_of is not None:
            rep.duplicate_answers += 1
            continue
        if d.version != expected:
            rep.problems.append(f"commits topic: version {d.version} where {expected} was expected")
            expected = (d.version or 0) + 1
            continue
        expected += 1
        rep.topic_versions += 1
        path = commit_path(root, d.version)
        if not path.exists():
            if require_published:
                rep.problems.append(f"version {d.version} is ratified but {path.name} is missing")
            continue
        rep.published_versions += 1
        if path.read_bytes() != commit_to_json_lines(d.actions):
            rep.problems.append(f"{path.name} differs from the committed decision")
    for pid, n in decided.items():
        if n > 1:
            rep.problems.append(f"proposal {pid} has {n} decisions")
    log_dir = root / "_delta_log"
    extra = sorted(int(p.name[:20]) for p in log_dir.glob("*.json") if p.name[:20].isdigit() and int(p.name[:20]) >= expected)
    if extra:
        rep.problems.append(f"_delta_log has versions {extra[:5]} that the commits topic does not")
    if rep.published_versions:
        from reader.snapshot import Snapshot

        for a in Snapshot.load(table_uri).files():
            if not (root / unquote(a.path)).exists():
                rep.problems.append(f"live data file {a.path} is missing")
    return rep


def assert_verified(rep: VerifyReport) -> None:
    assert rep.ok, f"table {rep.table_id} failed verification: {rep.problems[:10]}"


def log_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "_delta_log").iterdir())
