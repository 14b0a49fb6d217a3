"""Authentication: is the proposal signed by a writer key the table registers?

A table with `deltacoord.writerKeys` accepts only proposals whose exact bytes
are signed by one of those keys (`deltacoord.schemas.signing`), and the proposal's
declared writer must be the signing key's name, so the allow-list
(`deltacoord.allowedWriters`, checked by admission afterwards) sees a name the
producer proved, not one it typed. Refusals are `WRITER_NOT_AUTHENTICATED`.

Key management follows from the same rule: a proposal that changes the keys
or the allow-list of a table with keys is itself signed by a key registered
before the change. A proposal that registers the first keys (at creation, or
on a table that had none) must be signed by one of the keys it registers, so a
table cannot be created locked against its own creator. A proposal setting a
value that does not parse is `BAD_WRITER_KEYS`. A table without keys is open:
the writer name there is only declared (see docs/operations.md, Security).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from deltacoord.coordinator.rules.state import TableState
from deltacoord.schemas.actions import Metadata
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.signing import WriterKeyError, parse_writer_keys, verify


@dataclass(frozen=True, slots=True)
class Signature:
    """What the Kafka edge read next to a proposal: the key name, the signature and the signed bytes."""

    signer: str
    signature: bytes
    data: bytes


@functools.lru_cache(maxsize=1024)
def _keys(text: str) -> dict[str, bytes] | WriterKeyError:
    try:
        return parse_writer_keys(text)
    except WriterKeyError as e:
        return e


def _new_metadata(p: Proposal) -> Metadata | None:
    return next((a for a in p.actions if isinstance(a, Metadata)), None)


def _not_authenticated(message: str) -> InvalidProposalError:
    return InvalidProposalError(ReasonCode.WRITER_NOT_AUTHENTICATED, message)


def _check(table_id: str, keys: dict[str, bytes], p: Proposal, sig: Signature | None, which: str) -> InvalidProposalError | None:
    if sig is None:
        return _not_authenticated(
            f"table {table_id} registers writer keys ({Property.WRITER_KEYS}); this proposal is not signed. "
            "Give the writer its key (writer_key=..., --writer-key or DELTACOORD_WRITER_KEY)"
        )
    public = keys.get(sig.signer)
    if public is None:
        return _not_authenticated(f"the proposal is signed by key {sig.signer!r}, which is not among the {which} keys of table "
                                  f"{table_id} ({', '.join(sorted(keys)) or 'none'})")
    if not verify(public, sig.signature, sig.data):
        return _not_authenticated(f"the signature by key {sig.signer!r} does not verify for table {table_id}")
    if p.writer != sig.signer:
        return _not_authenticated(f"the proposal declares writer {p.writer!r} but is signed by key {sig.signer!r}")
    return None


def registers_writer_keys(state: TableState | None) -> bool:
    """Whether the table registers writer keys: every proposal it decides was then signed by one of them."""
    return state is not None and TableProperties.of(state.metadata).writer_keys is not None


def authentication_error(state: TableState | None, p: Proposal, sig: Signature | None) -> InvalidProposalError | None:
    """Why `p` is not authenticated for `state` (None: a table this proposal creates), or None."""
    md = _new_metadata(p)
    new_text = TableProperties.of(md).writer_keys if md is not None else None
    if new_text is not None:
        parsed = _keys(new_text)
        if isinstance(parsed, WriterKeyError):
            return InvalidProposalError(ReasonCode.BAD_WRITER_KEYS, f"{Property.WRITER_KEYS}: {parsed}")
    current_text = TableProperties.of(state.metadata).writer_keys if state is not None else None
    if current_text is not None:
        current = _keys(current_text)
        if isinstance(current, WriterKeyError):
            # Fail closed: a value that does not parse cannot have been set through this coordinator.
            return _not_authenticated(f"table {p.table_id} has an unreadable {Property.WRITER_KEYS} ({current}); "
                                      "no proposal can be authenticated")
        return _check(p.table_id, current, p, sig, "registered")
    if new_text is not None:
        new = _keys(new_text)
        assert not isinstance(new, WriterKeyError)
        return _check(p.table_id, new, p, sig, "newly registered")
    return None


__all__ = ["Signature", "authentication_error", "registers_writer_keys"]
