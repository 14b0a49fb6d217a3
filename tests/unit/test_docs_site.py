"""`make docs`: the site builds from docs/ and the docstrings with no warning (mkdocs --strict)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_with_no_warnings(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("Table", "Snapshot", "CommitStream", "CommitOutcomeUnknownError", "retry"):
        assert f'id="{name}' in api or f">{name}<" in api, name  # generated from the docstrings
    assert (tmp_path / "site" / "operations" / "index.html").exists()
