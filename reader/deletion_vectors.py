"""Deletion vectors in storage: reading any DV, writing DV files (the bitmap codec is `deltacoord.schemas.deletion_vectors`).

* inline DVs (`storageType = 'i'`): Z85 of `magic || portable-roaring64`;
* on-disk DVs (`'u'`: `<random prefix><z85 uuid>` relative to the table root,
  `'p'`: an absolute path): a file of `version(1 byte)` then, per DV at
  `offset`, `dataSize (int32 BE) || magic || portable-roaring64 || crc32 (BE)`.

The magic number and the bitmap are little endian. Row indexes are returned as
a sorted `numpy.uint64` array.

Writing (`write_deletion_vector`): a small bitmap goes inline in the log, so the
coordinator can read it without I/O (row-level conflict resolution needs the
rows); a larger one goes to a `deletion_vector_<uuid>.bin` file.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from deltacoord.reader.log import data_object, resolve_data_path
from deltacoord.schemas.actions import DeletionVector
from deltacoord.schemas.deletion_vectors import (
    DEFAULT_INLINE_MAX_BYTES,
    DV_MAGIC,
    DV_MAGIC_NATIVE,
    Z85_ALPHABET,
    DeletionVectorError,
    decode_roaring64,
    dv_file_bytes,
    encode_roaring64,
    inline_descriptor,
    inline_rows,
    row_array,
    uuid_from_z85,
    z85_decode,
    z85_encode,
)
from deltacoord.storage.table import StoredObject, TableStorage

__all__ = [
    "DEFAULT_INLINE_MAX_BYTES",
    "DV_MAGIC",
    "DV_MAGIC_NATIVE",
    "Z85_ALPHABET",
    "DeletionVectorError",
    "decode_roaring64",
    "dv_file_bytes",
    "dv_file_path",
    "dv_object",
    "encode_roaring64",
    "inline_descriptor",
    "inline_rows",
    "keep_mask",
    "read_deletion_vector",
    "uuid_from_z85",
    "write_deletion_vector",
    "z85_decode",
    "z85_encode",
]


def _dv_relative_key(dv: DeletionVector) -> str:
    encoded = dv.path_or_inline_dv
    if len(encoded) < 20:
        raise DeletionVectorError(f"invalid 'u' deletion vector path {encoded!r}")
    prefix, uuid_part = encoded[:-20], encoded[-20:]
    name = f"deletion_vector_{uuid_from_z85(uuid_part)}.bin"
    return f"{prefix}/{name}" if prefix else name


def dv_file_path(table_root: Path, dv: DeletionVector) -> Path:
    """The local file holding an on-disk DV (`u` relative to the table, `p` absolute)."""
    if dv.storage_type == "u":
        return table_root / _dv_relative_key(dv)
    if dv.storage_type == "p":
        return resolve_data_path(table_root, dv.path_or_inline_dv)
    raise DeletionVectorError(f"deletion vector storage type {dv.storage_type!r} has no file")


def dv_object(storage: TableStorage, dv: DeletionVector) -> StoredObject:
    """The object holding an on-disk DV of a table on any store."""
    if dv.storage_type == "u":
        return StoredObject(storage, _dv_relative_key(dv))
    if dv.storage_type == "p":
        return data_object(storage, dv.path_or_inline_dv)
    raise DeletionVectorError(f"deletion vector storage type {dv.storage_type!r} has no file")


def write_deletion_vector(storage: TableStorage, rows: Iterable[int] | npt.NDArray[np.uint64], *,
                          inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES) -> DeletionVector:
    """The descriptor of a DV holding `rows`: inline when its bitmap is at most `inline_max_bytes`,
    else a new `deletion_vector_<uuid>.bin` at the table root (version byte, then size, bitmap, CRC-32)."""
    values = row_array(rows)
    data = encode_roaring64(values)
    max_row = int(values[-1]) if len(values) else None
    if len(data) <= inline_max_bytes:
        return DeletionVector("i", z85_encode(data), len(data), len(values), max_row_index=max_row)
    ident = uuid.uuid4()
    blob, offsets = dv_file_bytes([data])
    storage.put(f"deletion_vector_{ident}.bin", blob)
    return DeletionVector("u", z85_encode(ident.bytes), len(data), len(values), offset=offsets[0], max_row_index=max_row)


# --------------------------------------------------------------------------- reading


def read_deletion_vector(table: Path | TableStorage, dv: DeletionVector) -> npt.NDArray[np.uint64]:
    """The deleted row indexes of a DV (any storage type), validated against its descriptor.

    `table` is the table's root: a local path or its `TableStorage`.
    """
    if dv.storage_type == "i":
        raw = z85_decode(dv.path_or_inline_dv)[: dv.size_in_bytes]
        rows = decode_roaring64(raw)
    elif dv.storage_type in ("u", "p"):
        obj = dv_object(table if isinstance(table, TableStorage) else TableStorage(table, fsync=False), dv)
        offset = 1 if dv.offset is None else dv.offset
        try:
            # size (4 bytes), the bitmap, its CRC (4 bytes): one ranged read
            blob = obj.storage.get_range(obj.key, offset, 8 + max(0, dv.size_in_bytes))
        except FileNotFoundError:
            raise DeletionVectorError(f"deletion vector file {obj} does not exist") from None
        if len(blob) < 4:
            raise DeletionVectorError(f"deletion vector file {obj} is truncated at offset {offset}")
        (size,) = struct.unpack(">i", blob[:4])
        if size != dv.size_in_bytes:
            raise DeletionVectorError(
                f"deletion vector in {obj} at offset {offset} has size {size}, expected {dv.size_in_bytes}"
            )
        data, crc_raw = blob[4 : 4 + size], blob[4 + size : 8 + size]
        if len(data) != size or len(crc_raw) != 4:
            raise DeletionVectorError(f"deletion vector file {obj} is truncated")
        (crc,) = struct.unpack(">I", crc_raw)
        if zlib.crc32(data) & 0xFFFFFFFF != crc:
            raise DeletionVectorError(f"deletion vector in {obj} at offset {offset} fails its CRC-32 check")
        rows = decode_roaring64(data)
    else:
        raise DeletionVectorError(f"unknown deletion vector storage type {dv.storage_type!r}")
    if len(rows) != dv.cardinality:
        raise DeletionVectorError(f"deletion vector {dv.unique_id()} decodes to {len(rows)} rows, descriptor says {dv.cardinality}")
    return rows


def keep_mask(num_rows: int, deleted: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """Boolean mask of the rows a DV keeps in a file of `num_rows` rows."""
    mask = np.ones(num_rows, dtype=bool)
    idx = deleted[deleted < np.uint64(num_rows)].astype(np.int64)
    mask[idx] = False
    return mask
