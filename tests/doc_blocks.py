"""The shell blocks of the docs pages whose commands the tests run, and how each block is marked.

A ```` ```bash ```` block of these pages runs in a test as written, after a few substitutions (`SUBSTITUTIONS`).
An HTML comment right before a block says otherwise, visibly in the page's source:

* `<!-- not-run: why -->`: illustrative only (a synopsis, placeholders, minutes of work); the reason is the
  comment's text, and the unit test `test_doc_shell_blocks` keeps that list short;
* `<!-- run-by: tests/...py -->`: another test runs it as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The pages whose shell blocks are run (the README's and docs/spark.md's run in their own tests).
PAGES = ("commands.md", "operations.md", "testing.md")

_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.DOTALL | re.MULTILINE)
_MARK = re.compile(r"<!--\s*(not-run|run-by):\s*(.*?)\s*-->\s*$", re.DOTALL)


@dataclass(frozen=True)
class ShellBlock:
    page: str
    line: int  # of the opening fence
    text: str
    mark: str | None  # "not-run", "run-by", or None: run by tests/integration/test_doc_examples.py
    why: str  # the comment's text

    @property
    def first(self) -> str:
        """The block's first command line (how tests name it)."""
        return next(line for line in self.text.splitlines() if line.strip() and not line.startswith("#"))


def shell_blocks(page: str) -> list[ShellBlock]:
    text = (REPO / "docs" / page).read_text()
    out = []
    for m in _BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n")
        comment = before[before.rfind("<!--"):] if before.endswith("-->") else ""
        mark = _MARK.fullmatch(comment)
        out.append(ShellBlock(page, text.count("\n", 0, m.start()) + 1, m.group(1),
                              mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


def block(page: str, first: str) -> ShellBlock:
    """The block of `page` whose first command line starts with `first`."""
    (found,) = [b for b in shell_blocks(page) if b.first.startswith(first)]
    return found


#: The blocks tests/integration/test_doc_examples.py runs: page, the start of the block's first command.
RUN_HERE = (
    ("operations.md", "deltacoord verify /data/tables/sales"),
    ("operations.md", "deltacoord table drop /data/tables/sales"),
    ("operations.md", "deltacoord acls --writer-principal"),
    ("testing.md", ".venv/bin/deltacoord broker start"),
)


def substituted(text: str, *, bootstrap: str = "", prefix: str = "", data: Path | None = None, bin_dir: str = "") -> str:
    """A block as a test runs it: the example broker (`kafka-1:9092`) is the test's, `--topic-prefix deltacoord`
    the test's fresh topics, `/data/tables/` a directory of the test's and `.venv/bin/` this interpreter's."""
    if bootstrap:
        text = text.replace("kafka-1:9092", bootstrap)
    if prefix:
        text = text.replace("--topic-prefix deltacoord ", f"--topic-prefix {prefix} ")
        text = re.sub(r"--topic-prefix deltacoord$", f"--topic-prefix {prefix}", text, flags=re.MULTILINE)
    if data is not None:
        text = text.replace("/data/tables/", f"{data}/")
    if bin_dir:
        text = text.replace(".venv/bin/", f"{bin_dir}/")
    return text
