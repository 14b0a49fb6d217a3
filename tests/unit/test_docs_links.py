"""The README and docs/ hold together: every relative link and image points to a file that exists, every
`#anchor` to a heading of its target (GitHub's slugs), and every page of docs/ is in mkdocs.yml's nav."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links and code marks dropped), lowercased, punctuation other
    than '-' and '_' removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of `page`; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(page.read_text()):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> Iterator[tuple[int, str]]:
    """Every link and image target in `page`'s prose (not in code blocks or code spans)."""
    for n, line in _prose_lines(page.read_text()):
        m = _REFERENCE.match(line)
        if m:
            yield n, m.group(1)
            continue
        prose = _CODE_SPAN.sub(lambda s: "x" * len(s.group(0)), line)
        for m in _INLINE.finditer(prose):
            yield n, m.group(1)
        for m in _HTML.finditer(prose):
            yield n, m.group(1)


def test_slugs_follow_github() -> None:
    assert slug("How it fits together (what operations depend on)") == "how-it-fits-together-what-operations-depend-on"
    assert slug("The `deltacoord-coordinated` writer feature") == "the-deltacoord-coordinated-writer-feature"
    assert slug("Where one commit's time goes") == "where-one-commits-time-goes"
    assert slug("Row tracking, identity columns, purge and V2 checkpoints") == (
        "row-tracking-identity-columns-purge-and-v2-checkpoints")
    assert slug("snake_case and a [link](x.md)") == "snake_case-and-a-link"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    problems: list[str] = []
    found = 0
    for n, target in links(page):
        if _EXTERNAL.match(target):
            continue
        found += 1
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        where = f"{page.relative_to(REPO)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert not problems, "\n".join(problems)
    if page.name in ("README.md", "index.md"):
        assert found, f"{page.name} links to no page"


def _nav_pages(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        if not _EXTERNAL.match(node):
            yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config.get("site_name")
    docs_dir = REPO / config.get("docs_dir", "docs")
    assert docs_dir == DOCS
    nav = list(_nav_pages(config.get("nav")))
    missing_files = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing_files, f"mkdocs.yml lists pages that do not exist: {missing_files}"
    unlisted = sorted(p.name for p in DOCS.glob("*.md") if p.name not in nav)
    assert not unlisted, f"pages of docs/ missing from mkdocs.yml's nav: {unlisted}"
    assert nav[0] == "index.md", "the site's home, docs/index.md, comes first"
