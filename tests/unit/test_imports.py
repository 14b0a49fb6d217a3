"""The house's import rules, read from the source of every module (imports inside functions and TYPE_CHECKING too).

* no cycle between modules;
* `schemas` imports nothing of ours; the storage edge (`storage`) only `schemas`; `reader` only those two;
  `writer` only those and `reader`;
* the coordinator's rules (`deltacoord.coordinator.rules`) import only `schemas`;
* `coordinator` imports neither `writer` nor the development services (`tooling`: broker, storage servers,
  jars, bench, demo), which may import every role; the CLI (`deltacoord.cli`) sits beside the front door;
* nothing imports the `deltacoord` facade;
* no module imports another module's private (`_`-prefixed) name: what two modules share is public;
* the batch client and the coordinator import without pyspark (an optional extra); the
  coordinator's deciding process without Arrow, and its checkpoint process without the SQL
  engine (both count against the coordinator's memory budget).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("schemas", "storage", "reader", "writer", "coordinator", "tooling")
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
    door = ROOT / FRONT_DOOR
    own = [door, *(d for d in sorted(door.iterdir()) if d.is_dir() and not d.is_symlink() and d.name != "__pycache__")]
    files = [p for role in ROLES for p in sorted((ROOT / role).rglob("*.py"))]
    files += [p for d in own for p in sorted(d.glob("*.py"))]
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
            "deltacoord.coordinator.delta_log.files", "deltacoord.cli.main", "deltacoord.writer.table", "deltacoord.reader.log", "deltacoord.storage.table", "deltacoord"} <= set(MODULES)
    assert "deltacoord.writer.table" in GRAPH["deltacoord.tooling.bench"] | GRAPH["deltacoord.cli.tables"]


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
    ("coordinator", {"schemas", "storage", "reader", "coordinator"}),
    ("tooling", {"schemas", "storage", "reader", "writer", "coordinator", "tooling"}),
])
def test_imports_point_one_way(package: str, allowed: set[str]) -> None:
    bad = {m: sorted(i for i in deps if _top(i) not in allowed) for m, deps in GRAPH.items() if _top(m) == package}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_rules_import_only_schemas() -> None:
    bad = {m: sorted(i for i in deps if not (i.startswith("deltacoord.schemas") or i.startswith("deltacoord.coordinator.rules")))
           for m, deps in GRAPH.items() if m.startswith("deltacoord.coordinator.rules")}
    assert {m: d for m, d in bad.items() if d} == {}
    assert len([m for m in GRAPH if m.startswith("deltacoord.coordinator.rules.")]) >= 6


def test_the_cli_and_the_development_services_live_outside_the_coordinator() -> None:
    assert not (ROOT / "coordinator" / "tooling").exists()
    assert {"deltacoord.cli.main", "deltacoord.cli.tables", "deltacoord.tooling.broker", "deltacoord.tooling.processes",
            "deltacoord.tooling.storage_servers", "deltacoord.tooling.bench"} <= set(MODULES)


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
import deltacoord, deltacoord.cli.main, deltacoord.coordinator.kafka.daemon
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



_BARE_ROLE_IMPORT = re.compile(r"(?:^|[\s;\"'`(])(?:from|import) (?:" + "|".join(ROLES) + r")\.\w")


def test_no_code_in_a_string_imports_a_role_by_its_bare_name() -> None:
    """Code run in a child (`python -c`), quoted in a docstring or shown in the docs names the one import name:
    installed, `writer.x` does not exist (it only worked in a checkout, from the working directory)."""
    sources = [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _BARE_ROLE_IMPORT.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    docs = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            if _BARE_ROLE_IMPORT.search(p.read_text())]
    assert found == [] and docs == []
