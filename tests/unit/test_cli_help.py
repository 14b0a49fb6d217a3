"""The CLI explains itself: help and an example for every command and option, `-h`, `--version`,
and the commands the README and the operations guide show exist with the flags they use."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import click
import pytest

from deltacoord.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _commands(group: click.Group = main, path: tuple[str, ...] = ("deltacoord",)) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


LEAVES = [(p, c) for p, c in _commands() if not isinstance(c, click.Group)]


def _examples(cmd: click.Command) -> list[str]:
    text = cmd.help or ""
    if "Example" not in text:
        return []
    block = text.split("Example", 1)[1].split(":", 1)[1]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("deltacoord ")]


@pytest.mark.parametrize(("path", "cmd"), LEAVES, ids=[" ".join(p[1:]) for p, _ in LEAVES])
def test_every_command_has_help_an_example_and_option_help(path: tuple[str, ...], cmd: click.Command) -> None:
    assert (cmd.help or "").strip(), f"{' '.join(path)} has no help text"
    examples = _examples(cmd)
    assert examples, f"{' '.join(path)} has no 'Example:' in its help"
    for ex in examples:
        words = shlex.split(ex)
        assert tuple(words[: len(path)]) == path, f"example {ex!r} does not run {' '.join(path)}"
        # The example's options and arguments parse (no file checks: the parser alone, no type conversion).
        # (A parent context like the real command line's: click caches each command's help option.)
        root = click.Context(main, info_name="deltacoord", **main.context_settings)
        ctx = click.Context(cmd, info_name=path[-1], parent=root)
        cmd.make_parser(ctx).parse_args(words[len(path):])
    undocumented = [p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not undocumented, f"{' '.join(path)}: options without help: {undocumented}"


def test_short_help_flag_and_version() -> None:
    # A fresh process: click caches each command's help option, so in-process runs of other tests must not matter.
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "deltacoord.cli.main", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    root = cli("-h")
    assert root.returncode == 0 and "Usage: " in root.stdout and "Example" in root.stdout, root.stderr
    sub = cli("table", "append", "-h")
    assert sub.returncode == 0 and "--json-rows" in sub.stdout and "Example:" in sub.stdout, sub.stderr
    v = cli("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"deltacoord, version {version('deltacoord')}", v.stdout


def test_a_command_imports_only_its_own_family() -> None:
    """`table append` (a short-lived CLI write pays every import of its process) loads the table commands' modules,
    not those of the topics, keys, relay, ACL and verify commands; `commands` (help, did-you-mean) has them all."""
    code = ("import sys, json; from click.testing import CliRunner; from deltacoord.cli.main import main; "
            "r = CliRunner().invoke(main, ['table', 'append', '-h']); assert r.exit_code == 0, r.output; "
            "before = sorted(m for m in sys.modules if m.startswith('deltacoord.cli.')); names = sorted(main.commands); "
            "print(json.dumps([before, names, sorted(m for m in sys.modules if m.startswith('deltacoord.cli.'))]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, names, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"deltacoord.cli.tables", "deltacoord.cli.transaction"} <= set(before)
    others = {f"deltacoord.cli.{m}" for m in ("topics", "keys", "relay", "acls", "verify")}
    assert not others & set(before), sorted(others & set(before))
    assert others <= set(after)
    assert {"table", "tail", "topics", "writer-key", "relay", "acls", "verify", "broker", "coordinator"} <= set(names)


_DOC_LINE = re.compile(r"^\s*(?:\$\s*)?(deltacoord\s[^#|>&]*)")


def _documented_invocations() -> Iterator[tuple[str, str]]:
    """Every `deltacoord ...` line inside a fenced code block of the README and docs/."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        fenced = False
        for line in doc.read_text().splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            m = _DOC_LINE.match(line) if fenced else None
            if m:
                yield doc.name, m.group(1).strip()


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = main
    i = 1
    while isinstance(cmd, click.Group) and i < len(words) and words[i] in cmd.commands:
        cmd = cmd.commands[words[i]]
        i += 1
    return cmd, words[i:]


def test_documented_commands_and_flags_exist() -> None:
    seen = 0
    problems: list[str] = []
    for doc, line in _documented_invocations():
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        cmd, rest = _resolve(words)
        if cmd is main and len(words) > 1:
            problems.append(f"{doc}: `{line}`: no command {words[1]!r}")
            continue
        seen += 1
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
        for w in rest:
            flag = w.split("=", 1)[0]
            # `a|b` alternatives and placeholders in prose-like synopses are not flags.
            if flag.startswith("--") and re.fullmatch(r"--[a-z0-9-]+", flag) and flag not in known:
                problems.append(f"{doc}: `{line}`: {' '.join(words[:1])} {cmd.name} has no option {flag}")
    assert seen > 10
    assert not problems, "\n".join(problems)
