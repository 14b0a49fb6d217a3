"""Pure input validation of a proposal: reason codes for proposals that can never commit.

Every problem is reported as `InvalidProposalError(reason, message)`; the
reason codes are stable (see `REASONS`). `validate_proposal` raises,
`proposal_error` returns the error (or None).

Checked here, before any conflict check:

* every field has the type a decoded proposal has (`MALFORMED_PROPOSAL`:
  only objects built in process can fail this);
* the proposal names this table, and its read version is in -1..head
  (`UNKNOWN_TABLE` when the table does not exist and this is not a creation);
* `commitInfo.txnId`, when given, equals the proposal id, and it has no
  `coalescedCommits` (the coordinator's own record); no commitInfo inside `actions`;
* at most one metaData and one protocol action; a creation (read version -1)
  carries both; protocol versions this project supports (reader <= 3,
  writer <= 7);
* actions whose table feature the protocol in force after the commit lacks
  (`table_features.py`: domainMetadata without the `domainMetadata` feature);
  a protocol that drops the project's `deltacoord-coordinated` writer feature
  outside the DROP FEATURE commit of a release (MISSING_TABLE_FEATURE);
* at most one SetTransaction per appId (identical duplicates are allowed and
  de-duplicated at rebase, as Delta Spark does), at most one domainMetadata per
  domain;
* file actions: no duplicate add or remove of one logical key (path, DV id), no
  add and remove of the same key, non-negative sizes, paths inside the table
  root, partition values keyed exactly by the partition columns;
* `delta.isolationLevel` is Serializable or WriteSerializable; an append-only
  table gets no data-changing removes;
* read predicates compile against the read-time partition schema.

`check_txn_versions` (STALE_TXN_VERSION: a SetTransaction whose version is not
greater than the version recorded for its appId) is deliberately separate: the
conflict check runs it *after* the winner checks, so that two concurrent
instances of one streaming query get Delta's ConcurrentTransactionException
when the loser declared the appId as read, and the exactly-once rejection
otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any
from urllib.parse import unquote

from deltacoord.coordinator.rules.action_values import deletion_vector_problem, partition_value_problem
from deltacoord.coordinator.rules.identity import identity_error
from deltacoord.coordinator.rules.row_ids import missing_num_records
from deltacoord.coordinator.rules.state import TableState, Winners
from deltacoord.coordinator.rules.stats import BULK_MIN_FILES, stats_problem, stats_problems
from deltacoord.coordinator.rules.table_features import (
    append_only_error,
    check_constraints_error,
    coordinated_feature_error,
    domain_metadata_error,
)
from deltacoord.schemas.actions import (
    COALESCED_KEY,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from deltacoord.schemas.control_chars import control_character, path_control_character
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.expressions.partitions import compile_predicate, partition_schema
from deltacoord.schemas.expressions.syntax import read_predicates_problem
from deltacoord.schemas.messages import FileRead, Proposal
from deltacoord.schemas.properties import CONFLICT_PROFILES, TABLE_ISOLATION_LEVELS, Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.row_tracking import supported as row_tracking_supported
from deltacoord.schemas.table_features import MAX_READER_VERSION, MAX_WRITER_VERSION

#: Every reason code this module can report.
REASONS = frozenset(
    {
        ReasonCode.TABLE_MISMATCH,
        ReasonCode.UNKNOWN_TABLE,
        ReasonCode.BAD_READ_VERSION,
        ReasonCode.READ_VERSION_AHEAD,
        ReasonCode.TXN_ID_MISMATCH,
        ReasonCode.BAD_PROPOSAL_ID,
        ReasonCode.COMMIT_INFO_IN_ACTIONS,
        ReasonCode.UNKNOWN_ACTION,
        ReasonCode.MULTIPLE_METADATA,
        ReasonCode.MULTIPLE_PROTOCOL,
        ReasonCode.MISSING_METADATA,
        ReasonCode.MISSING_PROTOCOL,
        ReasonCode.UNSUPPORTED_PROTOCOL,
        ReasonCode.DUPLICATE_APP_ID,
        ReasonCode.DUPLICATE_DOMAIN,
        ReasonCode.DUPLICATE_FILE_ACTION,
        ReasonCode.ADD_AND_REMOVE_SAME_FILE,
        ReasonCode.NEGATIVE_SIZE,
        ReasonCode.BAD_STATS,
        ReasonCode.PATH_ESCAPES_TABLE,
        ReasonCode.BAD_FILE_PATH,
        ReasonCode.PARTITION_VALUES_MISMATCH,
        ReasonCode.BAD_DELETION_VECTOR,
        ReasonCode.BAD_ISOLATION_LEVEL,
        ReasonCode.BAD_CONFLICT_PROFILE,
        ReasonCode.BAD_TABLE_PROPERTY,
        ReasonCode.BAD_SCHEMA,
        ReasonCode.APPEND_ONLY,
        ReasonCode.BAD_PREDICATE,
        ReasonCode.STALE_TXN_VERSION,
        ReasonCode.MALFORMED_PROPOSAL,
        ReasonCode.COMMIT_INFO_TOO_DEEP,
        ReasonCode.COMMIT_INFO_TOO_LARGE,
        ReasonCode.MISSING_TABLE_FEATURE,
    }
)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
#: From this many actions on, the paths are first scanned at once (`plain_relative_paths`).
BULK_PATHS_MIN = 64


def _err(reason: ReasonCode, message: str) -> InvalidProposalError:
    return InvalidProposalError(reason, message)


def _normalize_location(uri: str) -> str:
    """Canonical text of a location for prefix tests (file: forms collapse to a plain path)."""
    u = uri
    m = _SCHEME.match(u)
    if m:
        scheme = m.group(0)[:-1].lower()
        rest = u[m.end() :]
        if scheme == "file":
            if rest.startswith("//"):
                rest = rest[2:]
                # file://host/path: only an empty host or localhost is local
                slash = rest.find("/")
                host = rest[:slash] if slash >= 0 else rest
                if host not in ("", "localhost"):
                    return f"file://{rest}"
                rest = rest[slash:] if slash >= 0 else "/"
            u = rest
        else:
            u = f"{scheme}:{rest}"
    return u.rstrip("/")


def _check_path_chars(path: str) -> None:
    """A data file's path with a control character is refused with its own code (BAD_FILE_PATH)."""
    chars = path_control_character(path)
    if chars is not None:
        raise _err(ReasonCode.BAD_FILE_PATH, (
            f"file path {path!r} {chars}: C0, DEL and C1 controls are refused in action paths (URL parsers drop "
            "some of them, so the path would name another file). Percent-encode the characters the file's name "
            "needs, as Delta does (a partition value's newline is %250A in the path), or rename the file"))


def path_problem(path: str, table_uri: str) -> str | None:
    """Why a data-file path is not acceptable for this table, or None.

    Relative paths (the normal form) must not climb out with `..` segments or
    point into `_delta_log`. An absolute path or URI is accepted only inside
    the table root.
    """
    if not path:
        return "empty path"
    if "\x00" in path:
        return "path contains a NUL character"
    chars = path_control_character(path)
    if chars is not None:
        return f"path {path!r} {chars}"
    rel = path
    if path[0] in "/\\" or _SCHEME.match(path):
        root = _normalize_location(table_uri)
        full = _normalize_location(path)
        if not root or not full.startswith(root + "/"):
            return f"absolute path {path!r} is outside the table root {table_uri!r}"
        rel = full[len(root) + 1 :]
    if ".." in rel or "%" in rel or "\\" in rel or rel.startswith("_delta_log"):
        decoded = unquote(rel).replace("\\", "/")
        segments = decoded.split("/")
        if ".." in segments:
            return f"path {path!r} escapes the table root with a '..' segment"
        if segments[0] == "_delta_log":
            return f"path {path!r} points into _delta_log"
        if decoded.startswith("/"):
            return f"path {path!r} decodes to an absolute path"
    return None


#: Marks in the join of a commit's paths (`plain_relative_paths`) that some path may need `path_problem`'s full look.
_NOT_PLAIN = ("%", ":", "\\", "..", "//", "/_delta_log")


#: Paths joined and scanned at a time by `plain_relative_paths`: a million paths are never held as one string.
PATHS_SLICE = 65_536


def plain_relative_paths(paths: Iterable[str]) -> bool:
    """Whether every path is a plain relative one that `path_problem` and the control-character check accept: no
    control character, `%`, `:`, backslash, `..`, leading `/`, empty path or `_delta_log` start. One C-speed scan
    of the paths joined by `/`, a slice of `PATHS_SLICE` at a time (the same answer as one join: no mark but `//`
    and `/_delta_log` holds a `/`, and those across two slices show as one's end or the next one's start); False
    only means: look at each."""
    it = iter(paths)
    scanned = False
    while piece := list(islice(it, PATHS_SLICE)):
        joined = "/".join(piece)
        if (not joined or control_character(joined) is not None or any(m in joined for m in _NOT_PLAIN)
                or joined.startswith(("/", "_delta_log")) or joined.endswith("/")):
            return False
        scanned = True
    return scanned


def table_isolation_level(metadata: Metadata | None) -> str:
    """The table's configured level; WriteSerializable when unset (the seed documents' default)."""
    return TableProperties.of(metadata).isolation_level


def read_time_metadata(state: TableState, proposal: Proposal, new_metadata: Metadata | None) -> Metadata | None:
    """Metadata the proposal's reads refer to (its own metaData when it creates the table)."""
    if proposal.read_version < 0:
        return new_metadata
    if proposal.read_version == state.version:
        return state.metadata
    try:
        winners = state.winners_since(proposal.read_version)
    except (LookupError, ValueError):
        return state.metadata
    return winners[0].prior_metadata if winners else state.metadata


def _protocol_changed_since_read(state: TableState, proposal: Proposal) -> bool:
    """Whether a version after the proposal's read version changed the protocol (True when too old to tell)."""
    if proposal.read_version < 0 or proposal.read_version >= state.version:
        return False
    try:
        winners = state.winners_since(proposal.read_version)
    except (LookupError, ValueError):
        return True
    # A protocol change is never quiet: the window's index of marked winners holds it.
    return any(w.protocol is not None for w in (winners.marked() if isinstance(winners, Winners) else winners))


#: commitInfo is copied into the published commit, which every Delta reader parses:
#: deep nesting breaks readers (delta-rs fails past ~127 levels), so it is bounded.
MAX_COMMIT_INFO_DEPTH = 16
MAX_COMMIT_INFO_CHARS = 64 * 1024


#: Characters of JSON a string of n characters takes at most: quotes, and 12 per character (a character outside
#: the BMP is a surrogate pair of `\\uXXXX` escapes).
_STR_CHARS = 12
#: An int of more bits may exceed Python's int-to-string digit limit: its size is asked of `json.dumps`.
_INT_BITS_BOUNDED = 10_000


def _key_bound(k: object) -> int | None:
    """Characters a dict key takes as JSON at most (None: not bounded here)."""
    t = type(k)
    if t is str:
        assert isinstance(k, str)
        return 2 + _STR_CHARS * len(k)
    if t is bool or k is None:
        return 7
    if t is int:
        assert isinstance(k, int)
        bits = k.bit_length()
        return 4 + bits // 3 if bits <= _INT_BITS_BOUNDED else None
    if t is float:
        return 28
    return None


def _plain_bound(d: dict[Any, Any], depth: int) -> int:
    """`_check_commit_info`'s bound for the common commitInfo, a dict (at `depth`) of string keys and strings,
    numbers, booleans, nulls and such dicts, in one recursive pass; -1 when anything else is met or a value would
    sit deeper than `MAX_COMMIT_INFO_DEPTH` (the general walk then answers)."""
    if d and depth >= MAX_COMMIT_INFO_DEPTH:
        return -1
    bound = 2 + 2 * len(d)
    for k, v in d.items():
        if type(k) is not str:
            return -1
        bound += 2 + _STR_CHARS * len(k)
        t = type(v)
        if t is str:
            bound += 2 + _STR_CHARS * len(v)
        elif t is dict:
            b = _plain_bound(v, depth + 1)
            if b < 0:
                return -1
            bound += b
        elif t is int:
            bits = v.bit_length()
            if bits > _INT_BITS_BOUNDED:
                return -1
            bound += 4 + bits // 3
        elif t is bool or v is None:
            bound += 7
        elif t is float:
            bound += 28
        else:
            return -1
    return bound


def _check_commit_info(values: Mapping[str, Any]) -> None:
    # The JSON's size is bounded from above (types `json.dumps` writes plainly); when the bound is within the
    # limit the exact size is not needed. Anything else is measured by `json.dumps` itself.
    if type(values) is dict and 0 <= _plain_bound(values, 1) <= MAX_COMMIT_INFO_CHARS:
        return  # the common case: `_walked_bound` would find the same bound
    bound = _walked_bound(values)
    if bound is not None and bound <= MAX_COMMIT_INFO_CHARS:
        return
    try:
        size = len(json.dumps(values, separators=(",", ":"), default=str))
    except (TypeError, ValueError) as e:  # an object key JSON cannot have, a circular reference
        raise _err(ReasonCode.MALFORMED_PROPOSAL, f"commitInfo is not a JSON object: {e}") from None
    if size > MAX_COMMIT_INFO_CHARS:
        raise _err(ReasonCode.COMMIT_INFO_TOO_LARGE, f"commitInfo is {size} characters; the limit is {MAX_COMMIT_INFO_CHARS}")


def _walked_bound(values: Mapping[str, Any]) -> int | None:
    """The bound on the JSON's size of any commitInfo (None: not bounded here), walking every mapping and list;
    raises COMMIT_INFO_TOO_DEEP for a value nested deeper than `MAX_COMMIT_INFO_DEPTH`."""
    stack: list[tuple[Any, int]] = [(values, 1)]
    bound = 0
    bounded = True
    while stack:
        v, depth = stack.pop()
        if depth > MAX_COMMIT_INFO_DEPTH:
            raise _err(ReasonCode.COMMIT_INFO_TOO_DEEP, f"commitInfo nests deeper than {MAX_COMMIT_INFO_DEPTH} levels")
        t = type(v)
        if t is str:
            bound += 2 + _STR_CHARS * len(v)
        elif isinstance(v, Mapping):
            stack.extend((x, depth + 1) for x in v.values())
            if bounded and t is dict:
                bound += 2 + 2 * len(v)
                for k in v:
                    kb = _key_bound(k)
                    if kb is None:
                        bounded = False
                        break
                    bound += kb
            else:
                bounded = False
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
            bound += 2 + len(v)
            bounded = bounded and t is list
        elif bounded:
            kb = _key_bound(v)
            if kb is None:
                bounded = False
            else:
                bound += kb
    return bound if bounded else None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _values_problem(pv: object, what: str, *, optional: bool = False) -> str | None:
    if pv is None and optional:
        return None
    if not isinstance(pv, Mapping):
        return f"{what}: partitionValues is {type(pv).__name__}, not a map"
    for k, v in pv.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, str)):
            return f"{what}: partitionValues must map strings to strings or null, got {k!r}: {v!r}"
    return None


def _action_problem(a: object) -> str | None:
    """Why an action object is not structurally what its type declares (fields the rules read), or None."""
    if isinstance(a, (AddFile, RemoveFile, AddCDCFile)):
        what = f"{type(a).__name__} {a.path!r}"
        if not isinstance(a.path, str):
            return f"{type(a).__name__}: path is {type(a.path).__name__}, not a string"
        problem = _values_problem(a.partition_values, what, optional=isinstance(a, RemoveFile))
        if problem:
            return problem
        if not (_is_int(a.size) or (a.size is None and isinstance(a, RemoveFile))):
            return f"{what}: size is {type(a.size).__name__}, not an integer"
        if not isinstance(a.data_change, bool):
            return f"{what}: dataChange is {type(a.data_change).__name__}, not a boolean"
        dv = None if isinstance(a, AddCDCFile) else a.deletion_vector
        if dv is not None and not (isinstance(dv, DeletionVector) and isinstance(dv.storage_type, str)
                                   and isinstance(dv.path_or_inline_dv, str) and (dv.offset is None or _is_int(dv.offset))):
            return f"{what}: deletionVector is not a deletion vector descriptor"
    elif isinstance(a, Metadata):
        if not isinstance(a.schema_string, str):
            return "metaData: schemaString is not a string"
        if not isinstance(a.partition_columns, (tuple, list)) or not all(isinstance(c, str) for c in a.partition_columns):
            return "metaData: partitionColumns must be a list of strings"
        if not isinstance(a.configuration, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in a.configuration.items()):
            return "metaData: configuration must map strings to strings"
    elif isinstance(a, Protocol):
        if not (_is_int(a.min_reader_version) and _is_int(a.min_writer_version)):
            return "protocol: minReaderVersion and minWriterVersion must be integers"
    elif isinstance(a, SetTransaction):
        if not (isinstance(a.app_id, str) and _is_int(a.version)):
            return "txn: appId must be a string and version an integer"
    elif isinstance(a, DomainMetadata) and not isinstance(a.domain, str):
        return "domainMetadata: domain is not a string"
    return None


def _plainly_typed(p: Proposal) -> bool:
    """The common case, checked fast: what the decoder builds (exact built-in types everywhere the rules look)."""
    if not (type(p.table_id) is str and type(p.table_uri) is str and type(p.proposal_id) is str
            and type(p.operation) is str and type(p.read_version) is int and type(p.actions) is tuple
            and type(p.read_predicates) is tuple and type(p.read_files) is tuple and type(p.read_app_ids) is tuple
            and (p.writer is None or type(p.writer) is str) and type(p.commit_info) is CommitInfo
            and type(p.commit_info.values) is dict and type(p.operation_parameters) is dict
            and not p.read_files and all(type(x) is str for x in p.read_app_ids)):
        return False
    for a in p.actions:
        if type(a) is AddFile:
            pv = a.partition_values
            if not (type(a.path) is str and type(pv) is dict and type(a.size) is int and type(a.data_change) is bool
                    and a.deletion_vector is None
                    and (not pv or all(type(k) is str and (v is None or type(v) is str) for k, v in pv.items()))):
                return False
        elif type(a) is RemoveFile:  # an overwrite's: as `_action_problem` reads one without a deletion vector
            rpv, size = a.partition_values, a.size
            if not (type(a.path) is str and type(a.data_change) is bool and a.deletion_vector is None
                    and (size is None or type(size) is int)
                    and (rpv is None or (type(rpv) is dict and (
                        not rpv or all(type(k) is str and (v is None or type(v) is str) for k, v in rpv.items()))))):
                return False
        elif type(a) not in (SetTransaction, CommitInfo) or _action_problem(a) is not None:
            return False
    return True


def structure_problem(proposal: Proposal) -> str | None:
    """Why a proposal object is not structurally a proposal, or None.

    Decoded proposals always pass (the Avro schema types every field); this
    catches objects built in process with fields of the wrong type, so that
    they are refused as MALFORMED_PROPOSAL rather than break a rule.
    """
    p = proposal
    if _plainly_typed(p):
        return None
    for name in ("table_id", "table_uri", "proposal_id", "operation"):
        if not isinstance(getattr(p, name), str):
            return f"{name} is {type(getattr(p, name)).__name__}, not a string"
    if not _is_int(p.read_version):
        return f"read_version is {type(p.read_version).__name__}, not an integer"
    for name in ("actions", "read_predicates", "read_files", "read_app_ids"):
        if not isinstance(getattr(p, name), (tuple, list)):
            return f"{name} is {type(getattr(p, name)).__name__}, not a list"
    if p.writer is not None and not isinstance(p.writer, str):
        return f"writer is {type(p.writer).__name__}, not a string"
    if not isinstance(p.commit_info, CommitInfo) or not isinstance(p.commit_info.values, Mapping):
        return "commit_info is not a commitInfo object"
    if not isinstance(p.operation_parameters, Mapping):
        return "operation_parameters is not a map"
    if not all(isinstance(x, str) for x in p.read_app_ids):
        return "read_app_ids must be strings"
    for f in p.read_files:
        if not isinstance(f, FileRead) or not isinstance(f.path, str):
            return f"read file {f!r} is not a FileRead with a string path"
        problem = _values_problem(f.partition_values, f"read file {f.path!r}")
        if problem:
            return problem
    for a in p.actions:
        problem = _action_problem(a)
        if problem:
            return problem
    return None


def validate_proposal(state: TableState, proposal: Proposal) -> None:
    """Raise InvalidProposalError for a proposal that can never commit (see module doc)."""
    p = proposal
    problem = structure_problem(p)
    if problem is not None:
        raise _err(ReasonCode.MALFORMED_PROPOSAL, problem)
    if p.table_id != state.table_id:
        raise _err(ReasonCode.TABLE_MISMATCH, f"proposal for table {p.table_id!r} delivered to table {state.table_id!r}")
    if not p.proposal_id:
        raise _err(ReasonCode.BAD_PROPOSAL_ID, "proposal_id is empty")
    if p.staged is not None and len(p.actions) != p.staged.count:
        # Loaded at the Kafka edge (`deltacoord.reader.staged_commits`); one that was not must never commit as it stands.
        raise _err(ReasonCode.STAGED_COMMIT_INVALID, f"the proposal's {p.staged.count} staged actions were not loaded")
    rv = p.read_version
    if rv < -1:
        raise _err(ReasonCode.BAD_READ_VERSION, f"read version {rv} is below -1")
    if rv > state.version:
        if state.version < 0:
            raise _err(
                ReasonCode.UNKNOWN_TABLE,
                f"table {state.table_id!r} does not exist and the proposal (read version {rv}) does not create it",
            )
        raise _err(ReasonCode.READ_VERSION_AHEAD, f"read version {rv} is beyond the table head {state.version}")
    _check_commit_info(p.commit_info.values)
    txn_id = p.commit_info.txn_id
    if txn_id is not None and txn_id != p.proposal_id:
        raise _err(ReasonCode.TXN_ID_MISMATCH, f"commitInfo.txnId {txn_id!r} differs from proposal id {p.proposal_id!r}")
    if COALESCED_KEY in p.commit_info.values:
        # The coordinator's record of the proposals a shared version holds: set by a writer, it would make the
        # proposal ids it names count as committed (answered as duplicates, their files never committed).
        raise _err(ReasonCode.TXN_ID_MISMATCH, f"commitInfo.{COALESCED_KEY} is the coordinator's record of the proposals "
                   "a shared version holds; a proposal may not set it: leave it out of commit_info")

    root = state.table_uri or p.table_uri  # the coordinator's record of the table root is authoritative
    new_metadata: Metadata | None = None
    new_protocol: Protocol | None = None
    # A file's key is its path when it has no deletion vector (no tuple per file: a commit of a million files).
    add_keys: set[str | tuple[str, str]] = set()
    remove_keys: set[str | tuple[str, str]] = set()
    app_versions: dict[str, int] = {}
    domains: set[str] = set()
    data_removes = False
    adds: list[AddFile] = []
    # A commit of thousands of files has its stats read in one pass (`stats_problems`); the same answers.
    n_adds = sum(1 for a in p.actions if isinstance(a, AddFile))
    bad_stats = stats_problems([a.stats for a in p.actions if isinstance(a, AddFile)]) \
        if n_adds >= BULK_MIN_FILES else None
    # Likewise their paths: when all are plain relative ones (the common case), no path needs a look of its own.
    plain = len(p.actions) >= BULK_PATHS_MIN and plain_relative_paths(
        a.path for a in p.actions if isinstance(a, (AddFile, RemoveFile, AddCDCFile)))
    for a in p.actions:
        if isinstance(a, AddFile):
            dv = a.deletion_vector
            key = a.path if dv is None else (a.path, dv.unique_id())
            if key in add_keys:
                raise _err(ReasonCode.DUPLICATE_FILE_ACTION, f"file {a.path!r} is added twice in one commit")
            add_keys.add(key)
            if a.size < 0:
                raise _err(ReasonCode.NEGATIVE_SIZE, f"add {a.path!r} has negative size {a.size}")
            if not plain:
                _check_path_chars(a.path)
                problem = path_problem(a.path, root)
                if problem:
                    raise _err(ReasonCode.PATH_ESCAPES_TABLE, problem)
            problem = stats_problem(a.stats) if bad_stats is None else bad_stats.get(len(adds))
            if problem:
                raise _err(ReasonCode.BAD_STATS, f"add {a.path!r}: {problem}")
            if dv is not None:
                problem = deletion_vector_problem(dv)
                if problem is None and dv.storage_type == "p":
                    problem = path_problem(dv.path_or_inline_dv, root)
                if problem:
                    raise _err(ReasonCode.BAD_DELETION_VECTOR, f"add {a.path!r}: deletion vector: {problem}")
            adds.append(a)
        elif isinstance(a, RemoveFile):
            dv = a.deletion_vector
            key = a.path if dv is None else (a.path, dv.unique_id())
            if key in remove_keys:
                raise _err(ReasonCode.DUPLICATE_FILE_ACTION, f"file {a.path!r} is removed twice in one commit")
            remove_keys.add(key)
            if a.size is not None and a.size < 0:
                raise _err(ReasonCode.NEGATIVE_SIZE, f"remove {a.path!r} has negative size {a.size}")
            if not plain:
                _check_path_chars(a.path)
                problem = path_problem(a.path, root)
                if problem:
                    raise _err(ReasonCode.PATH_ESCAPES_TABLE, problem)
            data_removes = data_removes or a.data_change
        elif isinstance(a, AddCDCFile):
            if a.size < 0:
                raise _err(ReasonCode.NEGATIVE_SIZE, f"cdc {a.path!r} has negative size {a.size}")
            if not plain:
                _check_path_chars(a.path)
                problem = path_problem(a.path, root)
                if problem:
                    raise _err(ReasonCode.PATH_ESCAPES_TABLE, problem)
        elif isinstance(a, SetTransaction):
            seen = app_versions.get(a.app_id)
            if seen is not None and seen != a.version:
                raise _err(
                    ReasonCode.DUPLICATE_APP_ID,
                    f"two SetTransaction actions for appId {a.app_id!r} with different versions {seen} and {a.version}",
                )
            app_versions[a.app_id] = a.version
        elif isinstance(a, Metadata):
            if new_metadata is not None:
                raise _err(ReasonCode.MULTIPLE_METADATA, "cannot change the metadata more than once in a transaction")
            new_metadata = a
        elif isinstance(a, Protocol):
            if new_protocol is not None:
                raise _err(ReasonCode.MULTIPLE_PROTOCOL, "cannot change the protocol more than once in a transaction")
            new_protocol = a
        elif isinstance(a, DomainMetadata):
            if a.domain in domains:
                raise _err(ReasonCode.DUPLICATE_DOMAIN, f"domain {a.domain!r} appears twice in one commit")
            domains.add(a.domain)
        elif isinstance(a, CommitInfo):
            raise _err(ReasonCode.COMMIT_INFO_IN_ACTIONS, "commitInfo belongs in Proposal.commit_info, not in actions")
        else:
            raise _err(ReasonCode.UNKNOWN_ACTION, f"unsupported action type {type(a).__name__}")

    both = add_keys & remove_keys
    if both:
        path, dv_id = min(((k, None) if isinstance(k, str) else k for k in both), key=lambda k: (k[0], k[1] or ""))
        raise _err(ReasonCode.ADD_AND_REMOVE_SAME_FILE, f"file {path!r} (dv {dv_id}) is both added and removed")

    if rv == -1:
        if new_metadata is None:
            raise _err(ReasonCode.MISSING_METADATA, "the first version of a table must contain a metaData action")
        if new_protocol is None:
            raise _err(ReasonCode.MISSING_PROTOCOL, "the first version of a table must contain a protocol action")
    if new_protocol is not None and (
        new_protocol.min_reader_version > MAX_READER_VERSION
        or new_protocol.min_writer_version > MAX_WRITER_VERSION
        or new_protocol.min_reader_version < 1
        or new_protocol.min_writer_version < 1
    ):
        raise _err(
            ReasonCode.UNSUPPORTED_PROTOCOL,
            f"protocol ({new_protocol.min_reader_version}, {new_protocol.min_writer_version}) is not supported "
            f"(reader <= {MAX_READER_VERSION}, writer <= {MAX_WRITER_VERSION})",
        )

    effective_protocol = new_protocol if new_protocol is not None else state.protocol
    feature_error = domain_metadata_error(effective_protocol, p)
    if feature_error is not None:
        raise feature_error
    if new_protocol is not None and not _protocol_changed_since_read(state, p):
        # (A protocol changed since the read is the conflict check's ProtocolChangedException, which a retry resolves.)
        dropped = coordinated_feature_error(state.protocol, new_protocol, p)
        if dropped is not None:
            raise dropped
    if p.read_version >= 0:
        # Against what it read: a stale proposal is a MetadataChangedException of the conflict check, not invalid.
        reuse = identity_error(read_time_metadata(state, p, new_metadata), new_metadata, p.actions)
        if reuse is not None:
            raise reuse
    if row_tracking_supported(effective_protocol):
        uncounted = missing_num_records(p.actions)
        if uncounted:
            raise _err(ReasonCode.MISSING_ROW_COUNT, (
                f"the table tracks row ids (writer feature rowTracking) but {len(uncounted)} added file(s) have no "
                f"numRecords in their stats (first: {uncounted[0]!r}); write per-file stats with numRecords"))
    constraints_error = check_constraints_error(new_protocol if new_protocol is not None else state.protocol, p)
    if constraints_error is not None:
        raise constraints_error

    effective = new_metadata if new_metadata is not None else state.metadata
    level = table_isolation_level(effective)
    if level not in TABLE_ISOLATION_LEVELS:
        raise _err(
            ReasonCode.BAD_ISOLATION_LEVEL,
            f"{Property.ISOLATION_LEVEL}={level!r}; must be one of {sorted(TABLE_ISOLATION_LEVELS)}",
        )
    profile = TableProperties.of(effective).conflict_profile
    if profile not in CONFLICT_PROFILES:
        raise _err(
            ReasonCode.BAD_CONFLICT_PROFILE,
            f"{Property.CONFLICT_PROFILE}={profile!r}; must be one of {sorted(CONFLICT_PROFILES)}",
        )
    coalesce = new_metadata.configuration.get(Property.COALESCE) if new_metadata is not None else None
    if coalesce is not None and coalesce.strip().lower() not in ("true", "false"):
        raise _err(ReasonCode.BAD_TABLE_PROPERTY,
                   f"{Property.COALESCE}={coalesce[:100]!r}; must be true or false (false: one version per commit)")
    if effective is not None:
        schema = partition_schema(effective)  # raises BAD_SCHEMA
        if adds:
            names = {c.physical_name for c in schema}
            n = len(names)
            for a in adds:
                pv = a.partition_values
                if len(pv) != n or (n and any(k not in names for k in pv)):
                    raise _err(
                        ReasonCode.PARTITION_VALUES_MISMATCH,
                        f"add {a.path!r} has partition values for {sorted(pv)} but the table is partitioned by "
                        f"{sorted(names)}",
                    )
                for c in schema:  # a value no reader can parse would make every scan of the table fail
                    problem = partition_value_problem(pv.get(c.physical_name), c.type_name)
                    if problem:
                        raise _err(
                            ReasonCode.PARTITION_VALUES_MISMATCH,
                            f"add {a.path!r}: partition value {pv.get(c.physical_name)!r} of column {c.name!r} "
                            f"({c.type_name}) is {problem}",
                        )
        append_only = append_only_error(effective, data_removes)
        if append_only is not None:
            raise append_only

    problem = read_predicates_problem(p.read_predicates)
    if problem is not None:
        raise _err(ReasonCode.BAD_PREDICATE, problem)
    if p.read_predicates:
        read_md = read_time_metadata(state, p, new_metadata)
        read_schema = partition_schema(read_md)
        for text in p.read_predicates:
            compile_predicate(text, read_schema)


def proposal_error(state: TableState, proposal: Proposal) -> InvalidProposalError | None:
    """The validation error of a proposal, or None if it is valid."""
    try:
        validate_proposal(state, proposal)
    except InvalidProposalError as e:
        return e
    return None


def check_txn_versions(state: TableState, proposal: Proposal) -> InvalidProposalError | None:
    """STALE_TXN_VERSION: a SetTransaction must advance its appId's recorded version."""
    recorded = state.app_versions
    if not recorded:
        return None
    for a in proposal.actions:
        if isinstance(a, SetTransaction):
            last = recorded.get(a.app_id)
            if last is not None and a.version <= last:
                return _err(
                    ReasonCode.STALE_TXN_VERSION,
                    f"SetTransaction for appId {a.app_id!r} has version {a.version}, but version {last} is already "
                    "committed (exactly-once: this batch was committed before)",
                )
    return None
