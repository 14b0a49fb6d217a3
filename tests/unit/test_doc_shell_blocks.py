"""Every shell block of docs/commands.md, operations.md and testing.md is run by a test, or marked as not run
with its reason (`tests.doc_blocks`); the two illustrative blocks of commands.md are checked here."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from click.testing import CliRunner

from deltacoord.cli.main import main
from tests.doc_blocks import PAGES, REPO, RUN_HERE, block, shell_blocks

#: At most this many blocks are illustrative only: a longer list means examples drifting from what runs. Three
#: of them are the long chaos forms (minutes to a quarter of an hour each).
MAX_NOT_RUN = 7


def test_every_shell_block_is_run_or_marked_with_a_reason() -> None:
    blocks = [b for page in PAGES for b in shell_blocks(page)]
    assert len(blocks) >= 10
    run_here = {(page, first) for page, first in RUN_HERE}
    unmarked = [b for b in blocks if b.mark is None]
    assert sorted((b.page, b.first) for b in unmarked) == sorted(
        (page, block(page, first).first) for page, first in run_here), \
        "a block with no mark must be run by tests/integration/test_doc_examples.py (RUN_HERE), and only those"
    not_run = [b for b in blocks if b.mark == "not-run"]
    assert all(len(b.why) > 20 for b in not_run), [b for b in not_run if len(b.why) <= 20]
    assert len(not_run) <= MAX_NOT_RUN, [f"{b.page}:{b.line}" for b in not_run]
    for b in blocks:
        if b.mark == "run-by":
            test = REPO / b.why
            assert test.is_file() and b.page in test.read_text(), f"{b.page}:{b.line} names {b.why}"
        if b.mark is None:
            assert (b.page, b.first) in {(p, block(p, f).first) for p, f in run_here}


def test_a_block_marked_not_run_is_recognised() -> None:
    chaos = block("testing.md", ".venv/bin/python -m tests.history.chaos --writers 8")
    assert chaos.mark == "not-run" and "minutes" in chaos.why
    assert block("operations.md", "deltacoord verify").mark is None


def _words(segment: str) -> list[list[str]]:
    """Command words up to the first option, placeholder or `[`; each word as its `|` alternatives."""
    path: list[list[str]] = []
    for w in segment.split():
        if w.startswith(("-", "[", "<")) or w == "..." or w.split("|")[0].isupper():
            break
        path.append(w.split("|"))
    return path


def _synopsis_commands(text: str) -> list[list[str]]:
    """The commands a synopsis line names: `deltacoord a b|c X` is [a, b] and [a, c]; after ` | `, a segment
    stands in for the first one's last word (`broker user NAME | credentials`: broker user, broker credentials)."""
    out: list[list[str]] = []
    for line in text.splitlines():
        first, *others = line.split("#", 1)[0].split(" | ")
        if not first.startswith("deltacoord "):
            continue
        path = _words(first.removeprefix("deltacoord "))
        out.extend(list(p) for p in itertools.product(*path))
        for other in others:
            out.extend(list(p) for p in itertools.product(*path[:-1], *_words(other)))
    return out


def test_every_command_of_the_synopsis_has_help() -> None:
    synopsis = block("commands.md", "deltacoord broker start|stop|status")
    assert synopsis.mark == "not-run"
    commands = _synopsis_commands(synopsis.text)
    assert ["table", "vacuum"] in commands and ["broker", "credentials"] in commands and ["jars", "fetch"] in commands
    assert len(commands) >= 30
    runner = CliRunner()
    failed = {" ".join(c): r.output[-300:] for c in commands
              if (r := runner.invoke(main, [*c, "--help"], prog_name="deltacoord")).exit_code != 0}
    assert not failed, failed


def test_every_make_target_of_the_commands_page_exists() -> None:
    make = block("commands.md", "make demo")
    targets = re.findall(r"^make (\S+)", make.text, re.MULTILINE)
    assert len(targets) >= 8
    makefile = Path(REPO / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    assert phony is not None
    missing = [t for t in targets if t not in phony.group(1).split() or not re.search(rf"^{t}:", makefile, re.MULTILINE)]
    assert not missing, missing
