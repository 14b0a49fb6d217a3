"""Deletion-vector bitmaps without I/O: Z85, Delta's RoaringBitmapArray format and inline descriptors.

Implements PROTOCOL.md "Deletion Vector Format" without a roaring library. An
inline DV (`storageType = 'i'`) is Z85 of `magic || portable-roaring64`; the
coordinator's pure rules decode and build inline vectors with this module, and
`deltacoord.reader.deletion_vectors` adds DV files. The magic number and the bitmap are
little endian; row indexes are sorted `numpy.uint64` arrays.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from deltacoord.schemas.actions import DeletionVector

DV_MAGIC = 1681511377
DV_MAGIC_NATIVE = 1681511376
_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4

Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(Z85_ALPHABET)}


class DeletionVectorError(ValueError):
    """A deletion vector cannot be read or decoded."""


# --------------------------------------------------------------------------- Z85


def z85_decode(text: str) -> bytes:
    """Decode Z85 text (length a multiple of 5) to bytes."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text length {len(text)} is not a multiple of 5")
    out = bytearray()
    try:
        for i in range(0, len(text), 5):
            v = 0
            for c in text[i : i + 5]:
                v = v * 85 + _Z85_INDEX[c]
            out += v.to_bytes(4, "big")
    except KeyError as e:
        raise DeletionVectorError(f"invalid Z85 character {e}") from None
    except OverflowError:
        raise DeletionVectorError("invalid Z85 group (value exceeds 32 bits)") from None
    return bytes(out)


def z85_encode(data: bytes) -> str:
    """Encode bytes as Z85, zero-padding to a multiple of 4 bytes (as Delta does)."""
    if len(data) % 4:
        data = data + b"\x00" * (4 - len(data) % 4)
    chars: list[str] = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i : i + 4], "big")
        group = []
        for _ in range(5):
            v, r = divmod(v, 85)
            group.append(Z85_ALPHABET[r])
        chars.extend(reversed(group))
    return "".join(chars)


def uuid_from_z85(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=z85_decode(text))


# --------------------------------------------------------------------------- roaring


def _u16(buf: bytes, pos: int, count: int) -> npt.NDArray[np.uint32]:
    end = pos + 2 * count
    if end > len(buf):
        raise DeletionVectorError("truncated roaring bitmap")
    return np.frombuffer(buf, dtype="<u2", count=count, offset=pos).astype(np.uint32)


def _decode_roaring32(buf: bytes, pos: int) -> tuple[npt.NDArray[np.uint32], int]:
    """Decode one standard 32-bit RoaringBitmap at `pos`; returns (values, end position)."""
    if pos + 4 > len(buf):
        raise DeletionVectorError("truncated roaring bitmap header")
    (cookie,) = struct.unpack_from("<I", buf, pos)
    pos += 4
    run_flags: bytes | None = None
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        n = (cookie >> 16) + 1
        nbytes = (n + 7) // 8
        run_flags = buf[pos : pos + nbytes]
        pos += nbytes
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
    else:
        raise DeletionVectorError(f"bad roaring cookie {cookie}")
    header = _u16(buf, pos, 2 * n)
    pos += 4 * n
    keys = header[0::2]
    cards = header[1::2] + 1
    if run_flags is None or n >= _NO_OFFSET_THRESHOLD:
        pos += 4 * n  # offset header; containers are read sequentially
    parts: list[npt.NDArray[np.uint32]] = []
    for i in range(n):
        high = np.uint32(keys[i]) << np.uint32(16)
        is_run = run_flags is not None and (run_flags[i // 8] >> (i % 8)) & 1
        if is_run:
            (nruns,) = struct.unpack_from("<H", buf, pos)
            pos += 2
            runs = _u16(buf, pos, 2 * nruns)
            pos += 4 * nruns
            starts = runs[0::2].astype(np.int64)
            lengths = runs[1::2].astype(np.int64) + 1
            total = int(lengths.sum())
            # expand runs: value j of the output = start_i + (j - prefix_i) for j in run i
            prefix = np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(lengths)[:-1]))
            low64 = np.repeat(starts - prefix, lengths) + np.arange(total, dtype=np.int64)
            parts.append(high | low64.astype(np.uint32))
        elif cards[i] <= 4096:
            low = _u16(buf, pos, int(cards[i]))
            pos += 2 * int(cards[i])
            parts.append(high | low)
        else:
            if pos + 8192 > len(buf):
                raise DeletionVectorError("truncated roaring bitmap container")
            bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=8192, offset=pos), bitorder="little")
            pos += 8192
            parts.append(high | np.flatnonzero(bits).astype(np.uint32))
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
    return values, pos


def decode_roaring64(buf: bytes) -> npt.NDArray[np.uint64]:
    """Decode a serialised DV bitmap into sorted row indexes.

    Accepts Delta's portable format (`magic 1681511377` LE, then the portable
    64-bit roaring layout) and the older "native" RoaringBitmapArray format
    (`magic 1681511376` BE, bitmap count BE, then per 32-bit bitmap its size BE
    and its bytes) that the PROTOCOL.md inline example uses.
    """
    if len(buf) < 8:
        raise DeletionVectorError("deletion vector too short")
    parts: list[npt.NDArray[np.uint64]] = []
    (magic,) = struct.unpack_from("<i", buf, 0)
    if magic == DV_MAGIC:
        (nbuckets,) = struct.unpack_from("<q", buf, 4)
        pos = 12
        for _ in range(nbuckets):
            (key,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            low, pos = _decode_roaring32(buf, pos)
            parts.append((np.uint64(key) << np.uint64(32)) | low.astype(np.uint64))
    elif struct.unpack_from(">i", buf, 0)[0] == DV_MAGIC_NATIVE:
        (nbitmaps,) = struct.unpack_from(">i", buf, 4)
        pos = 8
        for key in range(nbitmaps):
            (size,) = struct.unpack_from(">i", buf, pos)
            pos += 4
            low, _ = _decode_roaring32(buf, pos)
            pos += size
            parts.append((np.uint64(key) << np.uint64(32)) | low.astype(np.uint64))
    else:
        raise DeletionVectorError(f"bad deletion vector magic number {magic}")
    if not parts:
        return np.zeros(0, dtype=np.uint64)
    return np.sort(np.concatenate(parts))


def row_array(rows: Iterable[int] | npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    if isinstance(rows, np.ndarray):
        return np.unique(rows.astype(np.uint64))
    return np.unique(np.fromiter(rows, dtype=np.uint64))


def encode_roaring64(rows: Iterable[int] | npt.NDArray[np.uint64]) -> bytes:
    """Delta's serialisation of a row-index set (array and bitmap containers, no runs)."""
    values = row_array(rows)
    out = bytearray(struct.pack("<i", DV_MAGIC))
    highs = values >> np.uint64(32)
    buckets = np.unique(highs)
    out += struct.pack("<q", len(buckets))
    for b in buckets:
        low = (values[highs == b] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        keys16 = np.unique(low >> np.uint32(16))
        containers = [(int(k), (low[(low >> np.uint32(16)) == k] & np.uint32(0xFFFF)).astype(np.uint16)) for k in keys16]
        bodies: list[bytes] = []
        for _, c in containers:
            if len(c) <= 4096:
                bodies.append(c.astype("<u2").tobytes())
            else:
                bits = np.zeros(65536, dtype=np.uint8)
                bits[c] = 1
                bodies.append(np.packbits(bits, bitorder="little").tobytes())
        n = len(containers)
        bm = bytearray(struct.pack("<II", _SERIAL_COOKIE_NO_RUNCONTAINER, n))
        for k, c in containers:
            bm += struct.pack("<HH", k, len(c) - 1)
        cur = 8 + 8 * n  # offsets are relative to the start of this 32-bit bitmap
        for body in bodies:
            bm += struct.pack("<I", cur)
            cur += len(body)
        for body in bodies:
            bm += body
        out += struct.pack("<I", int(b)) + bm
    return bytes(out)


def dv_file_bytes(bitmaps: Iterable[bytes]) -> tuple[bytes, list[int]]:
    """A DV file holding the given serialised bitmaps; returns (file bytes, offsets)."""
    out = bytearray(b"\x01")
    offsets: list[int] = []
    for data in bitmaps:
        offsets.append(len(out))
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data) & 0xFFFFFFFF)
    return bytes(out), offsets


#: Serialised bitmaps up to this size are stored inline (`i`); larger ones in a DV file (`u`).
DEFAULT_INLINE_MAX_BYTES = 4096


def inline_descriptor(rows: Iterable[int] | npt.NDArray[np.uint64]) -> DeletionVector:
    """An inline (`i`) descriptor of a row set: Z85 of the serialised bitmap, no I/O."""
    values = row_array(rows)
    data = encode_roaring64(values)
    return DeletionVector("i", z85_encode(data), len(data), len(values),
                          max_row_index=int(values[-1]) if len(values) else None)


def inline_rows(dv: DeletionVector) -> npt.NDArray[np.uint64]:
    """The rows of an inline DV (pure: the coordinator decodes proposals with it)."""
    if dv.storage_type != "i":
        raise DeletionVectorError(f"deletion vector {dv.unique_id()[:40]} is stored in a file, not inline")
    rows = decode_roaring64(z85_decode(dv.path_or_inline_dv)[: dv.size_in_bytes])
    if len(rows) != dv.cardinality:
        raise DeletionVectorError(f"inline deletion vector decodes to {len(rows)} rows, descriptor says {dv.cardinality}")
    return rows
