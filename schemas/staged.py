"""Commits carried by reference: the staged file's name, bytes and check (pure; the I/O is `deltacoord.reader.staged_commits`).

A Kafka message is made for kilobytes; a Spark job that writes 100,000 files, or an overwrite that removes
every file of a big table, proposes hundreds of megabytes of actions. Such a commit travels as Delta's
catalog-managed tables stage theirs: the actions are written as one file of newline-delimited Delta JSON
under `_delta_log/_staged_commits/`, and the message carries its digest (`StagedActions`).

Two kinds of file, both named from the proposal id and the digest so that a name can only ever hold one
content, and so that no Delta reader takes one for a version (a version's name starts with digits; these
start with a letter):

* `w-<proposal>.<digest>.json`: a writer's actions (no commitInfo), staged before it proposes;
* `d-<version>-<proposal>.<digest>.json`: the coordinator's whole commit (commitInfo first, row ids
  assigned), staged before it ratifies, byte for byte what it then publishes as `<version>.json`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

from deltacoord.schemas.actions import (
    ARROW_LINES_MIN_BYTES,
    Action,
    CommitInfo,
    commit_to_json_lines,
    iter_json_lines,
    parse_commit,
    parse_commit_pieces,
)
from deltacoord.schemas.messages import StagedActions

#: The directory of staged commits, as Delta's catalog-managed tables name it.
STAGED_DIR = "_delta_log/_staged_commits/"
WRITER: Literal["w"] = "w"
DECIDED: Literal["d"] = "d"
#: A proposal whose Avro encoding exceeds this many bytes carries its actions by reference.
INLINE_MAX_BYTES = 256 * 1024
#: A committed decision with more actions than this is recorded by reference (its commit staged).
DECISION_INLINE_MAX_ACTIONS = 2_000
#: Bytes of a staged file read at a time: it is hashed and parsed as it is read, never held whole.
READ_PIECE_BYTES = 1 << 20


class StagedCommitError(ValueError):
    """A staged file that is missing, of another size or digest, or not Delta JSON actions."""


def _proposal_part(proposal_id: str) -> str:
    """The proposal id as a file name part: its own SHA-256 (ids may hold any character)."""
    return hashlib.sha256(proposal_id.encode("utf-8")).hexdigest()[:32]


def writer_key(proposal_id: str, ref: StagedActions) -> str:
    """The object key (relative to the table root) of a writer's staged actions."""
    return f"{STAGED_DIR}{WRITER}-{_proposal_part(proposal_id)}.{ref.sha256}.json"


def decided_key(proposal_id: str, version: int, ref: StagedActions) -> str:
    """The object key of the coordinator's staged commit of `version`: the version in the name lets a sweep delete
    every such file at or below the published version (none of them can be needed any more)."""
    return f"{STAGED_DIR}{DECIDED}-{version:020d}-{_proposal_part(proposal_id)}.{ref.sha256}.json"


def decided_version(key: str) -> int | None:
    """The version a coordinator's staged commit is for (None: not such a file)."""
    name = key[len(STAGED_DIR):] if key.startswith(STAGED_DIR) else ""
    if not (name.startswith(f"{DECIDED}-") and name.endswith(".json") and "/" not in name):
        return None
    digits = name[2:22]
    return int(digits) if len(digits) == 20 and digits.isdigit() and name[22:23] == "-" else None


def is_staged_key(key: str) -> bool:
    """Whether `key` names a staged file of this project (for vacuum and sweeps)."""
    name = key[len(STAGED_DIR):] if key.startswith(STAGED_DIR) else ""
    return name[:2] in ("w-", "d-") and name.endswith(".json") and "/" not in name


def staged_bytes(actions: Iterable[Action]) -> tuple[bytes, StagedActions]:
    """The file that carries `actions`, and its reference."""
    items = list(actions)
    data = commit_to_json_lines(items) if items else b""
    return data, StagedActions(sha256=hashlib.sha256(data).hexdigest(), count=len(items), size=len(data))


def check_staged(data: bytes, ref: StagedActions, where: str) -> None:
    """Raise StagedCommitError unless `data` is the file `ref` names."""
    if len(data) != ref.size:
        raise StagedCommitError(f"{where} holds {len(data)} bytes, not the {ref.size} the message names")
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref.sha256:
        raise StagedCommitError(f"{where} has SHA-256 {digest}, not {ref.sha256}: it was changed after it was staged")


def lines_after_first_by_arrow(data: bytes) -> tuple[int, list[Action]] | None:
    """For a commit file of `ARROW_LINES_MIN_BYTES` or more after its first line (a published or decided commit's
    commitInfo, which the caller parses): where that line ends, and the actions of the lines after it when Arrow
    vouches for every one (`deltacoord.schemas.action_lines`). None: the caller parses the whole file itself."""
    head = data.find(b"\n") + 1
    if not head or len(data) - head < ARROW_LINES_MIN_BYTES:
        return None
    from deltacoord.schemas.action_lines import parse_file_lines

    rest = parse_file_lines(data, head)
    return None if rest is None else (head, rest)


def _parse_file(data: bytes) -> list[Action]:
    """`parse_commit(data)`, its lines after the first (a decided commit's commitInfo) read by Arrow when it
    vouches for them."""
    split = lines_after_first_by_arrow(data)
    if split is None:
        return parse_commit(data)
    head, rest = split
    return parse_commit(data[:head]) + rest


def parse_staged(data: bytes, ref: StagedActions, where: str) -> tuple[Action, ...]:
    """The actions of a staged file, after its size and digest are checked."""
    check_staged(data, ref, where)
    try:
        actions = tuple(_parse_file(data))
    except (ValueError, json.JSONDecodeError) as e:
        raise StagedCommitError(f"{where} is not Delta JSON actions: {e}") from e
    if len(actions) != ref.count:
        raise StagedCommitError(f"{where} holds {len(actions)} actions, not the {ref.count} the message names")
    return actions


class DigestingPieces:
    """The pieces of a staged file as they are read, hashed and counted on the way: reading stops at the first
    byte beyond the size the message names (such a file cannot be the one named)."""

    def __init__(self, pieces: Iterable[bytes], ref: StagedActions, where: str) -> None:
        self._pieces = iter(pieces)
        self._ref, self._where = ref, where
        self._hash = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._pieces:
            self.size += len(piece)
            if self.size > self._ref.size:
                raise StagedCommitError(f"{self._where} holds more than the {self._ref.size} bytes the message names")
            self._hash.update(piece)
            yield piece

    def check(self) -> None:
        """Read what is left (hashing it), then raise StagedCommitError unless it was the file named."""
        for _ in self:
            pass
        if self.size != self._ref.size:
            raise StagedCommitError(f"{self._where} holds {self.size} bytes, not the {self._ref.size} the message names")
        digest = self._hash.hexdigest()
        if digest != self._ref.sha256:
            raise StagedCommitError(f"{self._where} has SHA-256 {digest}, not {self._ref.sha256}: it was changed after "
                                    "it was staged")


def parse_staged_pieces(open_pieces: Callable[[], Iterable[bytes]], ref: StagedActions, where: str) -> tuple[Action, ...]:
    """`parse_staged` of a file read a piece at a time (`READ_PIECE_BYTES`, each read from `open_pieces()`), hashed
    while it is parsed: its bytes are never held whole beside its actions. A large file is read by Arrow a block
    of lines at a time (`parse_line_blocks`); when it cannot vouch for a block, the file is read again by the
    Python parser. The digest is the first verdict: a file changed after it was staged is refused as such, even
    when the change also broke its JSON."""
    if ref.size >= ARROW_LINES_MIN_BYTES:
        from deltacoord.schemas.action_lines import parse_line_blocks

        pieces = open_pieces()
        try:
            seen = DigestingPieces(pieces, ref, where)
            fast = parse_line_blocks(seen)
            if fast is not None:
                seen.check()
                if len(fast) != ref.count:
                    raise StagedCommitError(f"{where} holds {len(fast)} actions, not the {ref.count} the message names")
                return VerbatimActions(fast)
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()
    return _parse_pieces(open_pieces(), ref, where)


def _parse_pieces(pieces: Iterable[bytes], ref: StagedActions, where: str) -> tuple[Action, ...]:
    """`parse_staged_pieces` by the Python parser."""
    seen = DigestingPieces(pieces, ref, where)
    actions: list[Action] = []
    broken: ValueError | None = None
    try:
        actions.extend(parse_commit_pieces(seen))
    except ValueError as e:  # ActionParseError, json.JSONDecodeError, UnicodeDecodeError
        if isinstance(e, StagedCommitError):
            raise
        broken, actions = e, []
    seen.check()
    if broken is not None:
        raise StagedCommitError(f"{where} is not Delta JSON actions: {broken}") from broken
    if len(actions) != ref.count:
        raise StagedCommitError(f"{where} holds {len(actions)} actions, not the {ref.count} the message names")
    return tuple(actions)


def staged_pieces(actions: Iterable[Action]) -> Iterator[bytes]:
    """The staged file of `actions`, a piece at a time (`staged_bytes` joins them; `StagedDigest` names them)."""
    return iter_json_lines(actions)


class StagedDigest:
    """The reference of a staged file written a piece at a time: feed it each piece as it is written."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0
        self.size = 0

    def update(self, piece: bytes) -> None:
        self._hash.update(piece)
        self.size += len(piece)
        self.count += piece.count(b"\n")

    def ref(self) -> StagedActions:
        return StagedActions(sha256=self._hash.hexdigest(), count=self.count, size=self.size)


class VerbatimActions(tuple[Action, ...]):
    """Actions read from a writer's staged file whose every line the strict reading vouched for
    (`deltacoord.schemas.action_lines`): each line is one plain add or remove object of only the fields it reads,
    each of its JSON type, so that any JSON reader takes from the line exactly the action it stands for. A decided
    commit that holds exactly these actions, in order, after its commitInfo, is then that commitInfo's line followed
    by the writer's file byte for byte (`deltacoord.reader.staged_commits.stage_decision`): the largest commits are
    copied, not encoded field by field again."""

    __slots__ = ()


def holds_verbatim(actions: Sequence[Action], source: Sequence[Action]) -> bool:
    """Whether `actions` are a commitInfo and then exactly the objects of `source`, in order, and `source` is
    `VerbatimActions` (so the decided commit can be the writer's file after one line of its own)."""
    return (isinstance(source, VerbatimActions) and len(actions) == len(source) + 1
            and isinstance(actions[0], CommitInfo) and all(map(operator.is_, itertools.islice(actions, 1, None), source)))


def decided_commit_info(actions: Sequence[Action]) -> tuple[Action, ...]:
    """What a decision by reference keeps inline: its commitInfo (the first action), for history and answers."""
    return tuple(a for a in actions[:1] if isinstance(a, CommitInfo))


__all__ = [
    "DECIDED",
    "DECISION_INLINE_MAX_ACTIONS",
    "INLINE_MAX_BYTES",
    "READ_PIECE_BYTES",
    "STAGED_DIR",
    "WRITER",
    "DigestingPieces",
    "StagedCommitError",
    "StagedDigest",
    "VerbatimActions",
    "check_staged",
    "decided_commit_info",
    "decided_key",
    "decided_version",
    "holds_verbatim",
    "is_staged_key",
    "lines_after_first_by_arrow",
    "parse_staged",
    "parse_staged_pieces",
    "staged_bytes",
    "staged_pieces",
    "writer_key",
]
