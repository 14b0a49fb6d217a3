"""A commit file is read and written in pieces (never held as lines, one string and bytes at once): the pieces'
edges change nothing, whatever falls on them."""

from __future__ import annotations

import json

import pytest

import schemas.actions as actions_module
from schemas.actions import ActionParseError, AddFile, CommitInfo, RemoveFile, commit_to_json_lines, parse_commit


def _actions(n: int) -> list[AddFile | RemoveFile | CommitInfo]:
    out: list[AddFile | RemoveFile | CommitInfo] = [CommitInfo({"operation": "WRITE", "note": "héllo \u2028 wörld"})]
    for i in range(n):
        # Non-ASCII paths: a piece's edge must never cut a character in two.
        out.append(AddFile(f"dé/part-{i:05d}-\u00e9\u4e2d.parquet", {"p": str(i % 3)}, i, 7, True,
                           stats=json.dumps({"numRecords": i})))
        if i % 5 == 0:
            out.append(RemoveFile(f"old-{i}.parquet", 9, True))
    return out


def _one_string(acts: list[AddFile | RemoveFile | CommitInfo]) -> bytes:
    """The file as one join of lines (what the pieces must add up to)."""
    lines = [json.dumps(a.to_json(), separators=(",", ":"), ensure_ascii=False) for a in acts]
    return ("\n".join(lines) + "\n").encode("utf-8")


@pytest.mark.parametrize("chunk_lines", [1, 3, 4096])
def test_the_pieces_of_a_written_commit_join_into_the_one_string_form(monkeypatch: pytest.MonkeyPatch,
                                                                      chunk_lines: int) -> None:
    monkeypatch.setattr(actions_module, "_CHUNK_LINES", chunk_lines)
    acts = _actions(50)
    assert commit_to_json_lines(acts) == _one_string(acts)
    assert commit_to_json_lines([]) == b""


@pytest.mark.parametrize("chunk_bytes", [1, 2, 7, 64, 1 << 20])
def test_a_commit_read_in_pieces_of_any_size_gives_the_same_actions(monkeypatch: pytest.MonkeyPatch,
                                                                     chunk_bytes: int) -> None:
    monkeypatch.setattr(actions_module, "_PARSE_CHUNK_BYTES", chunk_bytes)
    acts = _actions(40)
    data = _one_string(acts)
    assert parse_commit(data) == acts
    assert parse_commit(data.rstrip(b"\n")) == acts  # no final newline
    # Blank and whitespace lines are skipped; "\r\n" line ends are JSON whitespace.
    spaced = b"\n\n".join(data.split(b"\n")).replace(b"\n", b"\r\n", 3) + b"  \n\n"
    assert parse_commit(spaced) == acts
    assert parse_commit(data.decode("utf-8")) == acts


@pytest.mark.parametrize("chunk_bytes", [1, 5, 1 << 20])
def test_a_bad_line_is_named_by_its_number_in_the_whole_file(monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    monkeypatch.setattr(actions_module, "_PARSE_CHUNK_BYTES", chunk_bytes)
    lines = _one_string(_actions(3)).split(b"\n")
    lines.insert(4, b"{not json")
    with pytest.raises(ActionParseError, match=r"^line 5 is not JSON"):
        parse_commit(b"\n".join(lines))
    with pytest.raises(UnicodeDecodeError):
        parse_commit(b'{"commitInfo":{"a":"\xff"}}\n')
