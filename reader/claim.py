"""One table location is one table: the claim object that says which table id holds a location.

A table is named two ways: its location (the URI of its root) and its table id (what the
coordinator keys its state by, and what routes its proposals: murmur2(table id) picks the proposals
partition). Ids and locations are chosen by writers (`Table(uri, table_id=...)`; the id defaults to the
URI), so two ids can name one location, and their proposals may be decided by different partitions,
even different coordinator processes. Two coordinated tables over one `_delta_log` would both
ratify version v, and only one `<v>.json` can be published: the other writer would be told COMMITTED
for a version nobody can read.

The arbiter is the location's own store, which every coordinator reaches: the object
`_deltacoord/table.json` under the table root, created put-if-absent (a conditional PUT on an object
store, a hard link on a local filesystem) naming the table id, when a coordinator decides a creation
(read version -1) or an adoption of that location. Whoever creates it holds the location; a creation or
adoption under another id finds it and is refused (TABLE_LOCATION_TAKEN). A release removes its own
claim, so the location can be adopted again, under any id. The directory starts with `_`, so Delta
readers, VACUUM (Delta's, delta-rs's and ours) and partition discovery ignore it.

Why not Delta's `metaData.id`: the table id is not the metadata id (a local table's id is its URI, and
`table_id=` takes any text), and a creation has no metadata at the location to compare with yet, so two
creations racing on an empty directory through two partitions could not be told apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from deltacoord.storage.backend import ObjectNotFoundError
from deltacoord.storage.table import StorageError, TableStorage

#: Where a location's claim lives, relative to the table root.
CLAIM_KEY = "_deltacoord/table.json"


class ClaimError(StorageError):
    """The claim object exists but does not say which table id holds the location (not JSON, no `tableId`)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Which table id holds a location, since when, and the request (a proposal id) that claimed it."""

    table_id: str
    claimed_at_ms: int = 0
    claimed_by: str = ""

    def encode(self) -> bytes:
        return json.dumps({"tableId": self.table_id, "claimedAtMs": self.claimed_at_ms, "claimedBy": self.claimed_by},
                          sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes, where: str) -> Claim:
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ClaimError(f"{where} is not JSON ({e}); it should name the table id holding the location") from e
        tid = doc.get("tableId") if isinstance(doc, dict) else None
        if not isinstance(tid, str) or not tid:
            raise ClaimError(f"{where} names no table id (no string 'tableId'); remove it if no table holds the location")
        at = doc.get("claimedAtMs", 0)
        by = doc.get("claimedBy", "")
        return Claim(tid, at if isinstance(at, int) else 0, by if isinstance(by, str) else "")


def read_claim(storage: TableStorage) -> Claim | None:
    """The location's claim, or None when no table id holds it. Raises StorageError (ClaimError when unreadable)."""
    try:
        raw = storage.get(CLAIM_KEY)
    except ObjectNotFoundError:
        return None
    return Claim.decode(raw, f"{storage.location}/{CLAIM_KEY}")


def claim(storage: TableStorage, wanted: Claim) -> Claim:
    """Claim the location for `wanted.table_id` unless a table id holds it already; returns the holder (`wanted`
    itself, or the claim found). Put-if-absent: of two claims racing through two coordinators, one wins."""
    existing = read_claim(storage)
    if existing is not None:
        return existing
    if storage.put_if_absent(CLAIM_KEY, wanted.encode()):
        return wanted
    found = read_claim(storage)
    if found is None:  # released between the two calls: try once more
        return wanted if storage.put_if_absent(CLAIM_KEY, wanted.encode()) else (read_claim(storage) or wanted)
    return found


def drop_claim(storage: TableStorage, table_id: str) -> bool:
    """Remove the location's claim if `table_id` holds it (at a release); True when removed."""
    existing = read_claim(storage)
    if existing is None or existing.table_id != table_id:
        return False
    storage.delete(CLAIM_KEY)
    return True


__all__ = ["CLAIM_KEY", "Claim", "ClaimError", "claim", "drop_claim", "read_claim"]
