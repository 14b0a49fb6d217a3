"""The house's import rules, read from the source of every module (imports inside functions and TYPE_CHECKING too).

* no cycle between modules;
* `schemas` imports nothing of ours; the storage edge (`storage`) only `schemas`; `reader` only those two;
  `writer` only those and `reader`;
* the coordinator's rules (`deltacoord.coordinator.rules`) import only `schemas`;
* in `coordinator`, only the tooling (`deltacoord.coordinator.tooling`) imports `writer`;
* nothing imports the `deltacoord` facade;
* no module imports another module's private (`_`-prefixed) name: what two modules share is public;
* the batch client and the coordinator import without pyspark (an optional extra); the
  coordinator's deciding process without Arrow, and its checkpoint process without the SQL
  engine (both count against the coordinator's memory budget).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("schemas", "storage", "reader", "writer", "coordinator")
FRONT_DOOR = "deltacoord"


def _module_name(path: Path) -> str:
    """The installed name: the role folders are subpackages of the one import name."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in ROLES:
        parts.insert(0, FRONT_DOOR)
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module once: the role folders, then the front door's own files (its role entries are links to them)."""
    files = [p for role in ROLES for p in sorted((ROOT / role).rglob("*.py"))] + sorted((ROOT / FRONT_DOOR).glob("*.py"))
    return {_module_name(p): p for p in files}


MODULES = _modules()


def _ours(name: str) -> bool:
    return name.split(".")[0] == FRONT_DOOR


def _imports(module: str, path: Path) -> set[str]:
    """The modules of ours `module` imports; `from pkg import sub` counts as importing `pkg.sub` when it is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if _ours(a.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if not _ours(base):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    out.discard(module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _top(name: str) -> str:
    """The role a module belongs to (`schemas`, `reader`, `writer`, `coordinator`), or the front door."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROLES else FRONT_DOOR


def test_the_walk_sees_the_whole_house() -> None:
    assert {"deltacoord.schemas.expressions.partitions", "deltacoord.coordinator.rules.batch", "deltacoord.coordinator.kafka.partition",
            "deltacoord.coordinator.delta_log.files", "deltacoord.coordinator.tooling.cli", "deltacoord.writer.table", "deltacoord.reader.log", "deltacoord.storage.table", "deltacoord"} <= set(MODULES)
    assert "deltacoord.writer.table" in GRAPH["deltacoord.coordinator.tooling.bench"] | GRAPH["deltacoord.coordinator.tooling.cli_tables"]


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH.get(v, ())):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert cycles == []


@pytest.mark.parametrize(("package", "allowed"), [
    ("schemas", {"schemas"}),
    ("storage", {"schemas", "storage"}),
    ("reader", {"schemas", "storage", "reader"}),
    ("writer", {"schemas", "storage", "reader", "writer"}),
    ("coordinator", {"schemas", "storage", "reader", "coordinator", "writer"}),
])
def test_imports_point_one_way(package: str, allowed: set[str]) -> None:
    bad = {m: sorted(i for i in deps if _top(i) not in allowed) for m, deps in GRAPH.items() if _top(m) == package}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_rules_import_only_schemas() -> None:
    bad = {m: sorted(i for i in deps if not (i.startswith("deltacoord.schemas") or i.startswith("deltacoord.coordinator.rules")))
           for m, deps in GRAPH.items() if m.startswith("deltacoord.coordinator.rules")}
    assert {m: d for m, d in bad.items() if d} == {}
    assert len([m for m in GRAPH if m.startswith("deltacoord.coordinator.rules.")]) >= 6


def test_only_the_tooling_imports_the_writer() -> None:
    importers = {m for m, deps in GRAPH.items() if _top(m) == "coordinator" and any(_top(i) == "writer" for i in deps)}
    assert importers and all(m.startswith("deltacoord.coordinator.tooling") for m in importers), sorted(importers)


def test_nothing_imports_the_facade() -> None:
    front_door = {m for m in GRAPH if _top(m) == FRONT_DOOR}
    assert [m for m, deps in GRAPH.items() if deps & front_door and m not in front_door] == []


_NO_SPARK = """
import importlib.abc, sys
class NoSpark(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError("pyspark is not installed")
sys.meta_path.insert(0, NoSpark())
"""


def _python(code: str) -> None:
    res = subprocess.run([sys.executable, "-c", _NO_SPARK + code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_client_and_the_coordinator_import_without_pyspark() -> None:
    _python("""
from deltacoord.writer import Table, retry
from deltacoord.reader import Snapshot, CommitStream
import deltacoord, deltacoord.coordinator.tooling.cli, deltacoord.coordinator.kafka.daemon
assert deltacoord.Table is Table and deltacoord.retry is retry and deltacoord.Snapshot is Snapshot
assert deltacoord.CommitStream is CommitStream
print("ok")
""")


def test_the_deciding_process_imports_no_arrow_and_the_checkpoint_process_no_sql_engine() -> None:
    _python("""
import deltacoord.coordinator.kafka.daemon, deltacoord.coordinator.settings
assert "pyarrow" not in sys.modules, "the deciding process imports Arrow"
print("ok")
""")
    _python("""
import deltacoord.coordinator.delta_log.checkpoint_worker, deltacoord.coordinator.delta_log.checkpointer
assert "sqlglot" not in sys.modules and "pyarrow.dataset" not in sys.modules, "the checkpoint process imports the SQL engine"
print("ok")
""")


def _private_imports() -> set[tuple[str, str, str]]:
    out = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
                out.update((module, node.module, a.name) for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__"))
    return out


def test_no_module_imports_another_modules_private_name() -> None:
    assert _private_imports() == set()

