"""Installed, the project is one import name.

A wheel built from the repository adds `deltacoord` (and its dist-info) to site-packages and nothing else: no
generic `writer`, `schemas`, `reader` or `coordinator` at the top, so a user's own `writer.py` or `schemas.py` in the
working directory cannot shadow the project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
def _without_checkout() -> dict[str, str]:
    """This process's environment without PYTHONPATH: a child then sees only what is installed where it runs. (The
    Spark tests put the repository on PYTHONPATH for their workers; pip then took the checkout's egg-info for an
    installed deltacoord and installed nothing into the fresh virtualenv.)"""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _copy_tracked_files(dest: Path) -> None:
    """The repository as a clean clone has it (links kept as links), so the build sees no local leftovers."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = ROOT / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        else:
            shutil.copy2(src, target)


def _build_wheel(tmp: Path) -> Path:
    src, out = tmp / "src", tmp / "wheels"
    _copy_tracked_files(src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], env=_without_checkout(), check=True,
                   capture_output=True, timeout=300)
    (wheel,) = out.glob("deltacoord-*.whl")
    return wheel


def test_a_wheel_adds_one_import_name_and_a_users_writer_py_cannot_shadow_it(tmp_path: Path) -> None:
    clean_env = _without_checkout()
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"deltacoord", f"deltacoord-{VERSION}.dist-info"}
    for role in ("coordinator", "writer", "reader", "storage", "schemas", "tooling", "cli"):
        assert f"deltacoord/{role}/__init__.py" in names
    assert any(n.startswith("deltacoord/schemas/avro/") and n.endswith(".avsc") for n in names), "the Avro schemas"
    assert "deltacoord/py.typed" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=clean_env, check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   env=clean_env, check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               env=clean_env, capture_output=True, text=True, check=True).stdout.strip())
    added = {p.name for p in site.iterdir()} - {"__pycache__", "_virtualenv.py", "_virtualenv.pth"}
    assert added == {"deltacoord", f"deltacoord-{VERSION}.dist-info"}
    # The dependencies come from this test's environment, after the fresh venv's own site-packages.
    (site / "zz_dependencies.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")

    work = tmp_path / "user"
    work.mkdir()
    for shadow in ("writer.py", "schemas.py", "reader.py", "coordinator.py"):
        (work / shadow).write_text(f"raise ImportError('the user\\'s own {shadow} was imported')\n")
    probe = ("import deltacoord, deltacoord.writer.client as c, deltacoord.schemas.codec as codec\n"
             "assert deltacoord.Table.__module__ == 'deltacoord.writer.table'\n"
             "assert codec.known_writer_schemas()\n"
             "print(deltacoord.__file__); print(c.__file__)")
    ran = subprocess.run([str(python), "-c", probe], cwd=work, env=clean_env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert all(line.startswith(str(site)) for line in ran.stdout.split()), ran.stdout
    cli = subprocess.run([str(venv / "bin" / "deltacoord"), "--help"], cwd=work, env=clean_env, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and "coordinator" in cli.stdout, cli.stderr
