"""Arrow's reading of plain file lines (`deltacoord.schemas.action_lines`) gives exactly the Python parse's actions,
or None (the Python parse then reads them): never other actions, never actions where the Python parse refuses."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deltacoord.reader.log as log_module
import deltacoord.schemas.action_lines as lines_module
import deltacoord.schemas.staged as staged_module
from deltacoord.reader.log import iter_commit_actions, parse_commit_lines, stream_commit_actions
from deltacoord.reader.staged_commits import load_proposal
from deltacoord.schemas.action_lines import LineParser, line_blocks, parse_file_lines, parse_line_blocks
from deltacoord.schemas.actions import (
    ARROW_LINES_MIN_BYTES,
    Action,
    AddFile,
    CommitInfo,
    RemoveFile,
    commit_to_json_lines,
    parse_commit,
)
from deltacoord.schemas.messages import StagedActions
from deltacoord.schemas.staged import StagedCommitError, parse_staged, parse_staged_pieces, staged_bytes, writer_key
from deltacoord.storage.table import StoredObject, TableStorage
from tests.unit.test_codec import FULL_PROPOSAL

_STATS = json.dumps({"numRecords": 3, "minValues": {"id": 1, "s": "a\"b"}, "maxValues": {"id": 9}})


def _add(i: int, values: dict[str, str | None] | None = None, stats: str | None = _STATS) -> AddFile:
    return AddFile(f"part-{i:05d}.parquet", values or {}, 100 + i, 1_700_000_000_000 + i, i % 2 == 0, stats)


def _remove(i: int, values: dict[str, str | None] | None = None) -> RemoveFile:
    return _add(i, values).to_remove(1_700_000_000_123)


def _fields(a: Action) -> list[tuple[type, Any]]:
    """Each field's type and value (== alone takes True for 1), partition values with their keys' order."""
    out: list[tuple[type, Any]] = []
    for f in dataclasses.fields(a):
        v = getattr(a, f.name)
        out.append((type(v), list(v.items()) if isinstance(v, dict) else v))
    return out


def _python(data: bytes) -> list[Action] | Exception:
    try:
        return parse_commit(data)
    except ValueError as e:
        return e


def assert_same_or_refused(data: bytes) -> list[Action] | None:
    """Arrow's actions, checked against the Python parse's: the same objects, field types, and key order."""
    fast = LineParser().parse(data)
    if fast is not None:
        slow = _python(data)
        assert not isinstance(slow, Exception), f"Arrow took what the Python parse refuses: {slow}"
        assert fast == slow
        assert [_fields(a) for a in fast] == [_fields(a) for a in slow]
    return fast


def _lines(*actions: Action) -> bytes:
    return commit_to_json_lines(actions)


_GOOD = _lines(_add(1), _add(2))
_ADD = b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":true,"stats":"s"}}'
_REMOVE = (b'{"remove":{"path":"r","deletionTimestamp":3,"dataChange":true,"extendedFileMetadata":true,'
           b'"partitionValues":{},"size":1,"stats":null}}')


def _edit(line: bytes, old: bytes, new: bytes) -> bytes:
    assert old in line
    return _GOOD + line.replace(old, new, 1) + b"\n"


TAKEN = {
    "adds": _GOOD,
    "removes": _lines(_remove(1), _remove(2)),
    "mixed, in line order": _lines(_add(1), _remove(2), _remove(3), _add(4), _remove(5)),
    "no last newline": _GOOD + _ADD,
    "non-ASCII and escaped paths": _lines(dataclasses.replace(_add(1), path="dé/ü\u2028\x85 \"q\"\\ \x00\t.parquet"),
                                          dataclasses.replace(_add(2), path="\U0001f986")),
    "escapes written otherwise": _GOOD + _edit(_ADD, b'"a"', b'"\\u00e9\\/\\ud83d\\ude00"')[len(_GOOD):],
    "stats null": _GOOD + _edit(_ADD, b'"s"', b"null")[len(_GOOD):],
    "stats absent": _GOOD + _edit(_ADD, b',"stats":"s"', b"")[len(_GOOD):],
    "an add's partitionValues null": _edit(_ADD, b'"partitionValues":{}', b'"partitionValues":null'),
    "an add's partitionValues absent": _edit(_ADD, b'"partitionValues":{},', b""),
    "a remove's partitionValues null and absent": _edit(_REMOVE, b"{}", b"null") + _edit(
        _REMOVE, b'"partitionValues":{},', b"")[len(_GOOD):],
    "a remove's optional fields null or absent": _GOOD + _edit(_REMOVE, b"3", b"null")[len(_GOOD):] + _edit(
        _REMOVE, b',"extendedFileMetadata":true,"partitionValues":{},"size":1,"stats":null', b"")[len(_GOOD):],
    "whitespace inside the object": _GOOD + _edit(_ADD, b'"size":1', b'"size" :\t1 ')[len(_GOOD):],
    "a key escaped": _GOOD + _edit(_ADD, b'"path"', b'"pa\\u0074h"')[len(_GOOD):],
    "-0": _edit(_ADD, b'"size":1', b'"size":-0'),
    "int64's extremes": _edit(_ADD, b'"size":1,"modificationTime":2', b'"size":-9223372036854775808,'
                                                                     b'"modificationTime":9223372036854775807'),
    "one partition column": _lines(_add(1, {"p": "x"}), _add(2, {"p": "y"}), _remove(3, {"p": "x"}), _add(4, {"p": ""})),
    "two partition columns": _lines(_add(1, {"p": "x", "q": "1"}), _add(2, {"p": "y", "q": "1"})),
    "a line longer than Arrow's block": _lines(_add(0), dataclasses.replace(_add(1), stats="x" * (5 << 20)), _add(2)),
    "a remove's partitionValues null in a partitioned table": _lines(_add(1, {"p": "x"})) + _edit(
        _REMOVE, b"{}", b"null")[len(_GOOD):],
}

REFUSED = {
    "two objects on one line": _GOOD + _ADD + _ADD + b"\n" + b"\n",
    "two objects on one line, a blank line beside": _GOOD + _ADD + _ADD + b"\n\n",
    "an object over two lines": _GOOD + _ADD.replace(b'"size"', b'\n"size"') + b"\n",
    "an object over two lines, two on the next": _ADD.replace(b",", b",\n", 1) + b"\n" + _ADD + _ADD + b"\n",
    "a blank line": _GOOD + b"\n" + _ADD + b"\n",
    "a line of spaces": _GOOD + b"  \n" + _ADD + b"\n",
    "a leading blank line": b"\n" + _GOOD,
    "\\r\\n": _GOOD.replace(b"\n", b"\r\n"),
    "space after the object": _GOOD + _ADD + b" \n",
    "space before the object": _GOOD + b" " + _ADD + b"\n",
    "{}": _GOOD + b"{}\n",
    "add null": _GOOD + b'{"add":null}\n',
    "add null beside a remove": _GOOD + _REMOVE[:-1] + b',"add":null}\n',
    "add and remove": _GOOD + _ADD[:-1] + b"," + _REMOVE[1:] + b"\n",
    "add twice": _GOOD + _ADD[:-1] + b"," + _ADD[1:] + b"\n",
    "a field twice": _edit(_ADD, b'"size":1', b'"size":1,"size":2'),
    "a missing path": _edit(_ADD, b'"path":"a",', b""),
    "a missing size": _edit(_ADD, b'"size":1,', b""),
    "a missing modificationTime": _edit(_ADD, b'"modificationTime":2,', b""),
    "a missing dataChange": _edit(_ADD, b',"dataChange":true', b""),
    "a remove's missing dataChange": _edit(_REMOVE, b'"dataChange":true,', b""),
    "a null path": _edit(_ADD, b'"a"', b"null"),
    "a null dataChange": _edit(_ADD, b"true", b"null"),
    "1.0": _edit(_ADD, b'"size":1', b'"size":1.0'),
    "1e2": _edit(_ADD, b'"size":1', b'"size":1e2'),
    "NaN": _edit(_ADD, b'"size":1', b'"size":NaN'),
    "beyond int64": _edit(_ADD, b'"size":1', b'"size":9223372036854775808'),
    "a string for a number": _edit(_ADD, b'"size":1', b'"size":"1"'),
    "true for a number": _edit(_ADD, b'"size":1', b'"size":true'),
    "1 for true": _edit(_ADD, b"true", b"1"),
    "a number for a path": _edit(_ADD, b'"a"', b"7"),
    "stats as an object": _edit(_ADD, b'"s"', b'{"numRecords":1}'),
    "a lone surrogate": _edit(_ADD, b'"a"', b'"\\ud800"'),
    "invalid UTF-8 in a path": _edit(_ADD, b'"a"', b'"a\xff"'),
    "invalid UTF-8 in stats": _edit(_ADD, b'"s"', b'"\xc0\xaf"'),
    "an encoded surrogate": _edit(_ADD, b'"a"', b'"\xed\xa0\x80"'),
    "a raw tab in a string": _edit(_ADD, b'"a"', b'"a\tb"'),
    "an unknown field": _edit(_ADD, b'"size":1', b'"size":1,"tags":{}'),
    "a commitInfo": _lines(CommitInfo({"operation": "WRITE"})) + _GOOD,
    "a metaData line later": _GOOD + b'{"metaData":{}}\n',
    "partitionValues not an object": _edit(_ADD, b'"partitionValues":{}', b'"partitionValues":[]'),
    "a partition value where the first line has none": _edit(_ADD, b"{}", b'{"p":"x"}'),
    "a partition value null": _lines(_add(1, {"p": "x"}), _add(2, {"p": None})),
    "a partition key missing": _lines(_add(1, {"p": "x", "q": "1"}), _add(2, {"p": "y"})),
    "a partition key twice": _lines(_add(1, {"p": "x"})) + _edit(_ADD, b"{}", b'{"p":"x","p":"y"}')[len(_GOOD):],
    "a partition key more": _lines(_add(1, {"p": "x"}), _add(2, {"p": "y", "q": "1"})),
    "an empty partitionValues in a partitioned table": _lines(_add(1, {"p": "x"})) + _ADD + b"\n",
    "a number for a partition value": _lines(_add(1, {"p": "x"})) + _edit(_ADD, b"{}", b'{"p":1}')[len(_GOOD):],
    "partition keys in another order": _lines(_add(1, {"p": "x", "q": "1"}), _add(2, {"q": "1", "p": "y"})),
    "three partition columns": _lines(_add(1, {"p": "x", "q": "1", "r": "2"})),
    "a partition value null in the first line": _lines(_add(1, {"p": None}), _add(2, {"p": "y"})),
    "a BOM": b"\xef\xbb\xbf" + _GOOD,
    "a comment": _edit(_ADD, b'"path"', b'/*x*/"path"'),
    "single quotes": _edit(_ADD, b'"a"', b"'a'"),
    "an unquoted key": _edit(_ADD, b'"path"', b"path"),
    "Infinity for a string": _edit(_ADD, b'"s"', b"Infinity"),
    "a raw NUL in a string": _edit(_ADD, b'"a"', b'"a\x00b"'),
    "empty": b"",
}


@pytest.mark.parametrize("name", TAKEN)
def test_lines_arrow_takes_give_the_python_parse_s_actions(name: str) -> None:
    data = TAKEN[name]
    assert assert_same_or_refused(data) is not None, f"{name}: expected to be taken"


@pytest.mark.parametrize("name", REFUSED)
def test_lines_arrow_cannot_vouch_for_are_left_to_the_python_parse(name: str) -> None:
    assert assert_same_or_refused(REFUSED[name]) is None


def test_files_of_one_partition_share_one_dict_across_blocks() -> None:
    data = _lines(*(_add(i, {"p": str(i % 2)}) for i in range(40)))
    pieces = [data[i:i + 50] for i in range(0, len(data), 50)]
    got = []
    parser = LineParser()
    for block in line_blocks(pieces, 300):
        actions = parser.parse(block)
        assert actions is not None
        got.extend(actions)
    assert got == parse_commit(data)
    assert len({id(a.partition_values) for a in got}) == 2


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_values = st.dictionaries(st.sampled_from(["p", "q", "r"]), st.one_of(st.none(), _text), max_size=3)
_ints = st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**70), 2**70)
_adds = st.builds(AddFile, _text, _values, _ints, _ints, st.booleans(), st.none() | _text)
_removes = st.builds(RemoveFile, _text, st.none() | _ints, st.booleans(), st.none() | st.booleans(),
                     st.none() | _values, st.none() | _ints, st.none() | _text)
_TOKENS = [b" ", b"\n", b"\r", b"null", b"{}", b"[]", b",", b'"', b"\\", b"1.0", b"-", b'"x":1', b"\xff", b"\xc3",
           b'{"add":{}}', b'{"remove":null}', b"}}", b'}}\n{"add":{', b'"stats":"s"', b'"size":1', b"true", b"0"]


@st.composite
def _files(draw: st.DrawFn) -> bytes:
    data = bytearray(commit_to_json_lines(draw(st.lists(_adds | _removes, min_size=1, max_size=6))))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        if draw(st.booleans()):
            data[at:at] = draw(st.sampled_from(_TOKENS))
        else:
            del data[at:at + draw(st.integers(1, 12))]
    return bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_files())
def test_arrow_gives_the_python_parse_s_actions_or_none(data: bytes) -> None:
    assert_same_or_refused(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_adds | _removes, min_size=1, max_size=8))
def test_plain_lines_as_written_are_taken_when_their_types_fit(actions: list[Action]) -> None:
    """The lines our writers write are taken unless a value is beyond Arrow's types (an int beyond int64, a None
    partition value, more than two partition columns, different partition keys)."""
    data = commit_to_json_lines(actions)
    fits = all(-(2**63) <= v < 2**63 for a in actions for v in (a.size, getattr(a, "modification_time", 0),
                                                               getattr(a, "deletion_timestamp", 0)) if v is not None)
    keys = {tuple(a.partition_values) for a in actions if a.partition_values}
    values_fit = (len(keys) <= 1 and all(len(k) <= 2 for k in keys)
                  and all(v is not None for a in actions if a.partition_values for v in a.partition_values.values()))
    if keys and not (actions[0].partition_values
                     and all(a.partition_values or (type(a) is RemoveFile and a.partition_values is None)
                             for a in actions)):
        values_fit = False  # the first line names the table's partition columns: each file has them (or null)
    if any(len(k) == 2 for k in keys) and any(a.partition_values is None for a in actions):
        values_fit = False  # two columns: their order is checked in each line's text, which a null one lacks
    fast = assert_same_or_refused(data)
    if fits and values_fit:
        assert fast is not None


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_blocks_are_whole_lines_that_add_up_to_the_file(piece: int) -> None:
    data = _lines(*(_add(i) for i in range(30))) + _ADD
    blocks = list(line_blocks((data[i:i + piece] for i in range(0, len(data), piece)), 500))
    assert b"".join(blocks) == data and len(blocks) > 3
    assert all(b.endswith(b"\n") for b in blocks[:-1])


# ----------------------------------------------------------------- the coordinator's load and the reader, with and without


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any], *modules: Any) -> tuple[Any, Any]:
    """`run()`'s result or error with Arrow's reading (any size) and without it."""
    def once() -> Any:
        try:
            return run()
        except ValueError as e:
            return (type(e), str(e))
    with monkeypatch.context() as m:
        for module in (*modules, staged_module):
            m.setattr(module, "ARROW_LINES_MIN_BYTES", 0)
        m.setattr(lines_module, "BLOCK_BYTES", 700)  # several blocks
        fast = once()
    with monkeypatch.context() as m:
        for module in (*modules, staged_module):
            m.setattr(module, "ARROW_LINES_MIN_BYTES", 1 << 60)
        slow = once()
    return fast, slow


def _ref(data: bytes, count: int) -> StagedActions:
    return StagedActions(sha256=hashlib.sha256(data).hexdigest(), count=count, size=len(data))


_BIG = _lines(*(_add(i, {"p": str(i % 3)}) for i in range(40)), *(_remove(i, {"p": "0"}) for i in range(5)))
STAGED_CASES: dict[str, tuple[bytes, StagedActions]] = {
    "taken": (_BIG, _ref(_BIG, 45)),
    "refused in a later block": (_BIG + b"\n" + _ADD + b"\n", _ref(_BIG + b"\n" + _ADD + b"\n", 46)),
    "not JSON in a later block": (_BIG + b"{oops}\n", _ref(_BIG + b"{oops}\n", 46)),
    "a missing field in a later block": (_BIG + _edit(_ADD, b'"path":"a",', b"")[len(_GOOD):],
                                         _ref(_BIG + _edit(_ADD, b'"path":"a",', b"")[len(_GOOD):], 46)),
    "changed after staging": (_BIG.replace(b"part-00039", b"part-00040"), _ref(_BIG, 45)),
    "changed after staging, JSON broken": (_BIG.replace(b"part-00039", b'part-"0039'), _ref(_BIG, 45)),
    "longer than named": (_BIG + _ADD + b"\n", _ref(_BIG, 45)),
    "shorter than named": (_BIG[:-len(_lines(_remove(4)))], _ref(_BIG, 45)),
    "another count": (_BIG, _ref(_BIG, 44)),
}


@pytest.mark.parametrize("name", STAGED_CASES)
@pytest.mark.parametrize("piece", [13, 1 << 20])
def test_the_coordinator_s_load_is_the_same_with_and_without_arrow(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                     piece: int) -> None:
    data, ref = STAGED_CASES[name]
    opened: list[int] = []

    def pieces() -> Iterable[bytes]:
        opened.append(1)
        return (data[i:i + piece] for i in range(0, len(data), piece))

    fast, slow = _both(monkeypatch, lambda: parse_staged_pieces(pieces, ref, "f"), staged_module)
    assert fast == slow
    if name == "taken":
        assert isinstance(fast, tuple) and len(fast) == 45 and opened == [1, 1], "read once each way"
    whole = _both(monkeypatch, lambda: parse_staged(data, ref, "f"), staged_module)
    assert whole[0] == whole[1] == (slow if name != "longer than named" else whole[1])
    if isinstance(slow, tuple) and slow and slow[0] is StagedCommitError:
        assert whole[0][0] is StagedCommitError


READER_CASES = {
    "a commit": _lines(CommitInfo({"operation": "WRITE"})) + _BIG,
    "an unknown action later": _lines(CommitInfo({"operation": "WRITE"})) + _BIG + b'{"future":{}}\n',
    "a malformed add later": _lines(CommitInfo({"operation": "WRITE"})) + _BIG + b'{"add":{"path":"x"}}\n',
    "not JSON later": _lines(CommitInfo({"operation": "WRITE"})) + _BIG + b"{oops\n",
    "a malformed first line": b'{"commitInfo":7}\n' + _BIG,
    "a blank first line": b"\n" + _BIG,
    "one line": _ADD,
}


@pytest.mark.parametrize("name", READER_CASES)
def test_the_reader_s_parse_is_the_same_with_and_without_arrow(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data = READER_CASES[name]
    fast, slow = _both(monkeypatch, lambda: parse_commit_lines(data, source="c"), log_module)
    assert fast == slow
    if name == "a commit":
        assert isinstance(fast, list) and len(fast) == 46
        assert parse_file_lines(data, data.find(b"\n") + 1) is not None, "taken by Arrow"


def test_a_staged_file_arrow_reads_whole_is_the_python_parse_s() -> None:
    assert parse_line_blocks([_BIG[:100], _BIG[100:]]) == parse_commit(_BIG)
    assert parse_line_blocks([_BIG, b"{oops}\n"]) is None


def test_a_large_staged_file_loads_through_arrow_from_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default size (a file of 4 MiB and more) the coordinator's load reads the file once, by Arrow, and gets
    the Python parse's actions; a file altered after staging is refused by digest either way."""
    storage = TableStorage(str(tmp_path))
    actions = tuple(_add(i, {"p": str(i % 5)}) for i in range(ARROW_LINES_MIN_BYTES // 150))
    data, ref = staged_bytes(actions)
    assert ref.size >= ARROW_LINES_MIN_BYTES
    storage.put(writer_key(FULL_PROPOSAL.proposal_id, ref), data)
    by_ref = dataclasses.replace(FULL_PROPOSAL, actions=(), staged=ref)
    reads: list[str] = []
    read_pieces = TableStorage.read_pieces

    def counted(self: TableStorage, key: str, *args: Any) -> Any:
        reads.append(key)
        return read_pieces(self, key, *args)

    monkeypatch.setattr(TableStorage, "read_pieces", counted)
    loaded = load_proposal(storage, by_ref)
    assert loaded.actions == actions and len(reads) == 1, "one read: Arrow vouched for every block"
    assert [_fields(a) for a in loaded.actions] == [_fields(a) for a in parse_commit(data)]
    storage.put(writer_key(FULL_PROPOSAL.proposal_id, ref), data.replace(b"part-00007", b"part-00008"))
    with pytest.raises(StagedCommitError, match="changed after it was staged"):
        load_proposal(storage, by_ref)


def test_the_deciding_process_loading_a_large_commit_imports_no_arrow_compute() -> None:
    """Arrow is imported by the first large load, but not `pyarrow.compute` (some 8 MB of the process)."""
    code = """
import sys
import deltacoord.coordinator.kafka.daemon
from deltacoord.schemas.action_lines import parse_file_lines
from deltacoord.schemas.actions import AddFile, commit_to_json_lines
files = [AddFile(f"f{i}", {"p": str(i % 2)}, 1, 2, True) for i in range(10)]
data = commit_to_json_lines([files[0], files[1].to_remove(3), *files[2:5], files[5].to_remove(3), files[6]])
assert parse_file_lines(data) is not None and "pyarrow" in sys.modules
assert "pyarrow.compute" not in sys.modules
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


STREAM_CASES = {**READER_CASES,
                "a metaData line between blocks": _lines(CommitInfo({"operation": "WRITE"})) + _BIG
                + b'{"metaData":{"id":"x"}}\n' + _BIG,
                "blank lines later": _lines(CommitInfo({"operation": "WRITE"})) + _BIG + b"\n\n" + _BIG,
                "no newline at its end": _lines(CommitInfo({"operation": "WRITE"})) + _BIG[:-1]}


@pytest.mark.parametrize("name", STREAM_CASES)
def test_a_stored_commit_streams_the_same_line_numbered_actions_with_and_without_arrow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    data = STREAM_CASES[name]
    storage = TableStorage(str(tmp_path))
    storage.put("_delta_log/00000000000000000001.json", data)
    obj = StoredObject(storage, "_delta_log/00000000000000000001.json")
    real = storage.read_pieces
    monkeypatch.setattr(storage, "read_pieces", lambda key, *a: (piece[i:i + 500] for piece in real(key, *a)
                                                                 for i in range(0, len(piece), 500)))
    taken: list[int] = []
    parse = LineParser.parse

    def counted(self: LineParser, block: bytes, start: int = 0, stop: int | None = None) -> list[Action] | None:
        out = parse(self, block, start, stop)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(LineParser, "parse", counted)
    fast, slow = _both(monkeypatch, lambda: list(stream_commit_actions(obj)), log_module)
    assert fast == slow
    if not isinstance(slow, tuple):
        assert slow == list(iter_commit_actions(data, source=str(obj))), "the line numbers of the whole file's parse"
    if name in ("a commit", "a metaData line between blocks", "blank lines later"):
        assert any(taken), "blocks taken by Arrow"
