"""A table's files as a whole: deleting them all (a drop with `--delete-files`), and telling a table whose files
were deleted around the coordinator from one whose first versions are not published yet.

Deletion order makes a crash halfway safe to repeat (the drop is recorded only after the files are gone, so a
crash leaves the table under coordination and the operator drops it again): the location's claim first, then
`_delta_log` newest key first, then the data files. Whatever is left is either a log whose lower versions are
intact over intact data files (recovery republishes the rest from Kafka), or a location with neither a claim nor a
log, which recovery halts as deleted (`deleted_problem`), naming `deltacoord table drop`.
"""

from __future__ import annotations

import shutil

from deltacoord.reader.claim import CLAIM_KEY
from deltacoord.storage.backend import ObjectNotFoundError
from deltacoord.storage.table import StorageError, TableStorage

#: Where a table's log lives, relative to its root.
LOG_PREFIX = "_delta_log/"


def delete_table_files(storage: TableStorage) -> int:
    """Delete every object under the table's root (as Delta's DROP TABLE of a path table deletes its directory);
    returns how many. Raises StorageError when the store refuses one: deleting again finishes the work."""
    objects = storage.list("")
    keys = [o.key for o in objects]
    log_keys = sorted((k for k in keys if k.startswith(LOG_PREFIX)), reverse=True)
    data_keys = [k for k in keys if not k.startswith(LOG_PREFIX) and k != CLAIM_KEY]
    ordered = [CLAIM_KEY, *log_keys, *data_keys]
    for key in ordered:
        try:
            storage.delete(key)
        except ObjectNotFoundError:
            continue
    if storage.is_local:  # the directories left empty
        shutil.rmtree(storage.local_path(), ignore_errors=True)
    return len(keys)


def deleted_problem(table_id: str, table_uri: str, head: int, claimed: bool | None) -> str | None:
    """Why a table Kafka ratified up to `head` must not be republished, or None: its location has neither a log
    (the caller found no commit nor checkpoint) nor a claim (`claimed` False; None when the store could not say).

    A creation claims its location before its version 0 is ratified, so a table whose first versions are
    ratified but not published yet (a crash between ratify and publish) keeps its claim and is republished; a
    location without both was deleted, and the data files its history names are gone with it."""
    if head < 0 or claimed is None or claimed:
        return None
    table_opt = "" if table_id == table_uri else f" --table-id {table_id}"
    return (f"the table's files are gone: {table_uri} has no _delta_log and no {CLAIM_KEY}, but Kafka ratified versions "
            f"0..{head}; it was deleted around the coordinator, and republishing its history would name data files "
            f"that no longer exist. The table is halted and nothing is republished. If it was deleted on purpose, drop "
            f"it: `deltacoord table drop {table_uri}{table_opt}` (Python: Table(uri).drop()), then create it again; if "
            "its files were lost by accident, restore them and resume it (`deltacoord table resume`)")


def location_claimed(storage: TableStorage) -> bool | None:
    """Whether the location holds a claim object (any table id); None when the store does not answer."""
    try:
        return storage.exists(CLAIM_KEY)
    except (StorageError, OSError):
        return None


__all__ = ["LOG_PREFIX", "delete_table_files", "deleted_problem", "location_claimed"]
