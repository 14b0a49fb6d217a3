"""A commit file is read and written in pieces (never held as lines, one string and bytes at once): the pieces'
edges change nothing, whatever falls on them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deltacoord.schemas.actions as actions_module
from deltacoord.reader.log import CorruptLogError, iter_commit_actions, parse_commit_lines
from deltacoord.schemas.actions import (
    ActionParseError,
    AddFile,
    CommitInfo,
    DeletionVector,
    RemoveFile,
    commit_to_json_lines,
    parse_commit,
)


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
    # Readers of the log read the same way, and number lines the same way.
    assert parse_commit_lines(spaced) == acts
    assert [n for n, _a in iter_commit_actions(spaced)] == [2 * i + 1 for i in range(len(acts))]


@pytest.mark.parametrize("chunk_bytes", [1, 5, 1 << 20])
def test_a_bad_line_is_named_by_its_number_in_the_whole_file(monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    monkeypatch.setattr(actions_module, "_PARSE_CHUNK_BYTES", chunk_bytes)
    lines = _one_string(_actions(3)).split(b"\n")
    lines.insert(4, b"{not json")
    with pytest.raises(ActionParseError, match=r"^line 5 is not JSON"):
        parse_commit(b"\n".join(lines))
    with pytest.raises(CorruptLogError, match=r"^c: line 5 is not JSON"):
        parse_commit_lines(b"\n".join(lines), source="c")
    with pytest.raises(UnicodeDecodeError):
        parse_commit(b'{"commitInfo":{"a":"\xff"}}\n')


_maybe_text = st.none() | st.text(max_size=5)
_maybe_int = st.none() | st.integers(-5, 2**40)


@settings(max_examples=200, deadline=None)
@given(path=_maybe_text, size=_maybe_int, mtime=_maybe_int, change=st.none() | st.booleans(), stats=_maybe_text,
       tags=st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
       dv=st.none() | st.just(DeletionVector("u", "ab", 1, 2)), row=_maybe_int, crv=_maybe_int,
       clustering=_maybe_text, values=st.dictionaries(st.text(max_size=3), _maybe_text, max_size=2))
def test_an_add_is_written_as_all_its_fields_less_the_absent_ones(
        path: Any, size: Any, mtime: Any, change: Any, stats: str | None, tags: dict[str, str] | None,
        dv: DeletionVector | None, row: int | None, crv: int | None, clustering: str | None,
        values: dict[str, str | None]) -> None:
    a = AddFile(path, values, size, mtime, change, stats, tags, dv, row, crv, clustering)
    every = {"path": path, "partitionValues": values, "size": size, "modificationTime": mtime, "dataChange": change,
             "stats": stats, "tags": tags, "deletionVector": None if dv is None else dv.to_json(), "baseRowId": row,
             "defaultRowCommitVersion": crv, "clusteringProvider": clustering}
    written = a.to_json()
    assert written == {"add": {k: v for k, v in every.items() if v is not None}}
    assert list(written["add"]) == [k for k, v in every.items() if v is not None], "in the protocol's key order"
    if path is not None and size is not None and mtime is not None and change is not None:
        assert parse_commit(commit_to_json_lines([a])) == [a]
        # A plain add's line is written field by field: the same bytes as the encoder's of its JSON object.
        assert commit_to_json_lines([a]) == _encoded(written)


@settings(max_examples=200, deadline=None)
@given(path=_maybe_text, ts=_maybe_int, change=st.none() | st.booleans(), extended=st.none() | st.booleans(),
       values=st.none() | st.dictionaries(st.text(max_size=3), _maybe_text, max_size=2), size=_maybe_int,
       stats=_maybe_text, tags=st.none() | st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
       dv=st.none() | st.just(DeletionVector("u", "ab", 1, 2)), row=_maybe_int, crv=_maybe_int)
def test_a_remove_is_written_as_all_its_fields_less_the_absent_ones(
        path: Any, ts: int | None, change: Any, extended: bool | None, values: dict[str, str | None] | None,
        size: int | None, stats: str | None, tags: dict[str, str] | None, dv: DeletionVector | None, row: int | None,
        crv: int | None) -> None:
    r = RemoveFile(path, ts, change, extended, values, size, stats, tags, dv, row, crv)
    every = {"path": path, "deletionTimestamp": ts, "dataChange": change, "extendedFileMetadata": extended,
             "partitionValues": values, "size": size, "stats": stats, "tags": tags,
             "deletionVector": None if dv is None else dv.to_json(), "baseRowId": row, "defaultRowCommitVersion": crv}
    written = r.to_json()
    assert written == {"remove": {k: v for k, v in every.items() if v is not None}}
    assert list(written["remove"]) == [k for k, v in every.items() if v is not None], "in the protocol's key order"
    if path is not None and change is not None:
        assert parse_commit(commit_to_json_lines([r])) == [r]
        assert commit_to_json_lines([r]) == _encoded(written)


def _encoded(action: dict[str, Any]) -> bytes:
    return (json.dumps(action, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


_ADD = '{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":true}}'


@pytest.mark.parametrize("line", [
    _ADD, f"  {_ADD}", f"{_ADD} \r", f"{_ADD}{_ADD}", f"{_ADD},", '{"add":{"path":"a"}}', '{"add":{"path":}}',
    '{"add":[]}', '{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":true},"x":1}',
    '[1]', '"add"', '{"add":{"path":"a\\u0000","partitionValues":{"p":null},"size":1,"modificationTime":2,'
    '"dataChange":false,"stats":"{\\"numRecords\\":1}"}}', '{"add":{"path":"a\tb"}}', "nul", '{"x":1}',
    '{"remove":{"path":"a","deletionTimestamp":1,"dataChange":true}}', '{"add":NaN}',
])
def test_a_line_parses_as_the_json_decoder_and_the_action_parser_say(line: str) -> None:
    """Lines are read by the JSON scanner itself, an add without the action parser's dispatch: the same actions and
    the same refusals, with their line numbers, as decoding each line and parsing its action."""
    def reference() -> list[Any]:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ActionParseError(f"line 2 is not JSON: {e}") from e
        return [a for a in [actions_module.action_from_json(obj)] if a is not None]

    data = f'{{"commitInfo":{{}}}}\n{line}\n'.encode()
    try:
        want: list[Any] | str = reference()
    except Exception as e:  # whatever the reference raises, ours must too
        want = f"{type(e).__name__}: {e}"
    try:
        got: list[Any] | str = parse_commit(data)[1:]
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    assert got == want


def _plain_fields(kind: str) -> dict[str, Any]:
    if kind == "add":
        return {"path": "a.parquet", "partitionValues": {"p": "1"}, "size": 3, "modificationTime": 7,
                "dataChange": True, "stats": '{"numRecords":1}'}
    return {"path": "a.parquet", "deletionTimestamp": 9, "dataChange": False, "extendedFileMetadata": True,
            "partitionValues": {}, "size": 3, "stats": '{"numRecords":1}'}


@pytest.mark.parametrize("kind", ["add", "remove"])
@pytest.mark.parametrize("variant", ["plain", "one-field-fewer", "one-field-more", "odd-types"])
def test_the_plain_fast_read_makes_the_action_the_general_one_makes(kind: str, variant: str) -> None:
    """A plain add or remove (the fields `_file_line` writes) is made positionally, slot by slot; every other body goes
    the general way. Both give the same object, field for field, and the same JSON line back."""
    body = _plain_fields(kind)
    if variant == "one-field-fewer":
        del body["stats"]
    elif variant == "one-field-more":
        body["tags"] = {"k": "v"}
    elif variant == "odd-types":  # not the rules' business here: validation refuses them, reading keeps them
        body["size"], body["path"] = "3", 5
    cls = AddFile if kind == "add" else RemoveFile
    general = cls(**{f: _general_value(f, body) for f in cls.__dataclass_fields__})
    got = parse_commit(json.dumps({kind: body}) + "\n")
    assert got == [general]
    assert all(getattr(got[0], f) == getattr(general, f) for f in cls.__dataclass_fields__)
    assert type(got[0]) is cls
    if variant != "odd-types":
        assert json.loads(commit_to_json_lines(got)) == {kind: body}


_JSON_NAMES = {"partition_values": "partitionValues", "modification_time": "modificationTime",
               "data_change": "dataChange", "deletion_timestamp": "deletionTimestamp",
               "extended_file_metadata": "extendedFileMetadata", "deletion_vector": "deletionVector",
               "base_row_id": "baseRowId", "default_row_commit_version": "defaultRowCommitVersion",
               "clustering_provider": "clusteringProvider"}


def _general_value(field: str, body: dict[str, Any]) -> Any:
    return body.get(_JSON_NAMES.get(field, field))


def test_a_plain_line_with_a_field_missing_is_still_refused_by_name() -> None:
    body = _plain_fields("add")
    del body["size"]
    body["tags"] = None  # as many fields as a plain add, not its fields
    with pytest.raises(ActionParseError, match="size"):
        parse_commit(json.dumps({"add": body}) + "\n")


def test_the_slot_maker_refuses_a_class_its_objects_would_not_be_whole_for() -> None:
    from dataclasses import dataclass, field

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int
        b: int = 0

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: int
        b: list[int] = field(default_factory=list)

    for cls in (Checked, Factory):
        with pytest.raises(TypeError, match="needs its own __init__"):
            actions_module._slot_maker(cls, 1)


def test_files_of_one_partition_share_one_partition_values_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse shares equal partition values (in the same key order) between its files: about 300 bytes a file
    less, and every line written back the same."""
    monkeypatch.setattr(actions_module, "SHARED_PARTITION_VALUES", 3)
    lines = [json.dumps({"add": {"path": f"d={d}/{i}.parquet", "partitionValues": pv, "size": 1,
                                 "modificationTime": 1, "dataChange": True}}, separators=(",", ":"))
             for i, (d, pv) in enumerate([("a", {"d": "a", "r": "x"}), ("a", {"d": "a", "r": "x"}),
                                          ("a", {"r": "x", "d": "a"}), ("b", {"d": "b", "r": None}),
                                          ("b", {"d": "b", "r": None}), ("c", {"d": "c", "r": "x"}),
                                          ("c", {"d": "c", "r": "x"}), ("l", {"d": ["not", "hashable"]})])]
    lines.append('{"remove":{"path":"d=a/9.parquet","deletionTimestamp":1,"dataChange":true,'
                 '"partitionValues":{"d":"a","r":"x"}}}')
    data = ("\n".join(lines) + "\n").encode()
    acts = parse_commit(data)
    pvs = [a.partition_values for a in acts]
    assert pvs[0] is pvs[1] is pvs[8] and pvs[3] is pvs[4]
    assert pvs[2] is not pvs[0] and list(pvs[2]) == ["r", "d"]  # another key order: its own dict
    assert pvs[5] is not pvs[6]  # beyond SHARED_PARTITION_VALUES distinct ones, each keeps its own
    assert pvs[7] == {"d": ["not", "hashable"]}
    assert commit_to_json_lines(acts) == data
