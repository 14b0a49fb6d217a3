"""Writer keys: Ed25519 signatures that bind a proposal to a writer identity a producer cannot forge.

A table registers its writers' public keys in the table property
`deltacoord.writerKeys` (`name:base64key, ...`). A writer holding the private
key of `name` signs the exact bytes of its encoded proposal; the signature and
the key name travel in Kafka headers (`deltacoord.signature`,
`deltacoord.signer`). The coordinator verifies the signature against the
table's registered keys before deciding, so the writer name the allow-list
checks is the name of a key, not a claim.

A key file holds one private key and its name, so one file (or one
`DELTACOORD_WRITER_KEY` variable naming it) is all a writer needs::

    deltacoord-writer-key: alice
    -----BEGIN PRIVATE KEY-----
    ...
    -----END PRIVATE KEY-----

The signed message is `SIGNING_CONTEXT + proposal bytes`: a key used for
deltacoord proposals signs nothing that could mean something elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: Prepended to the proposal bytes before signing (domain separation).
SIGNING_CONTEXT = b"deltacoord-proposal-v1\x00"
#: The environment variable a writer reads its key file (or the key text itself) from.
WRITER_KEY_ENV = "DELTACOORD_WRITER_KEY"
SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")
_FILE_HEADER = "deltacoord-writer-key:"


class WriterKeyError(ValueError):
    """A key file, a key name or a `deltacoord.writerKeys` value that cannot be used; the message says why."""


def check_key_name(name: str) -> str:
    """`name` if it can name a writer key (letters, digits, `_.@+-`, at most 128 characters)."""
    if not _NAME.match(name):
        raise WriterKeyError(
            f"writer key name {name!r} is not allowed: use 1 to 128 letters, digits or _.@+- (starting with a letter or digit)"
        )
    return name


def signed_message(data: bytes) -> bytes:
    return SIGNING_CONTEXT + data


@dataclass(frozen=True)
class WriterKey:
    """A writer's private key and the name the table registers its public half under."""

    name: str
    private_key: Ed25519PrivateKey

    @staticmethod
    def generate(name: str) -> WriterKey:
        return WriterKey(check_key_name(name), Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        """The signature of proposal bytes `data` (64 bytes)."""
        return self.private_key.sign(signed_message(data))

    @property
    def public_key_b64(self) -> str:
        raw = self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode("ascii")

    @property
    def registration(self) -> str:
        """This key's entry in `deltacoord.writerKeys`: `name:base64key`."""
        return f"{self.name}:{self.public_key_b64}"

    def to_text(self) -> str:
        """The key file's content (keep it secret: it holds the private key)."""
        pem = self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")
        return f"{_FILE_HEADER} {self.name}\n{pem}"

    @staticmethod
    def from_text(text: str, where: str = "the key text") -> WriterKey:
        first, _, rest = text.strip().partition("\n")
        if not first.startswith(_FILE_HEADER):
            raise WriterKeyError(
                f"{where} is not a deltacoord writer key: its first line must be '{_FILE_HEADER} <name>' "
                "(create one with `deltacoord writer-key generate NAME`)"
            )
        name = check_key_name(first[len(_FILE_HEADER):].strip())
        try:
            key = serialization.load_pem_private_key(rest.encode("ascii"), password=None)
        except (ValueError, TypeError, UnicodeEncodeError) as e:
            raise WriterKeyError(f"{where}: the private key of {name!r} cannot be read ({e})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise WriterKeyError(f"{where}: the key of {name!r} is a {type(key).__name__}, not an Ed25519 private key")
        return WriterKey(name, key)

    @staticmethod
    def load(source: str | os.PathLike[str]) -> WriterKey:
        """A key from a file path, or from the key file's text itself (as `DELTACOORD_WRITER_KEY` may hold)."""
        text = os.fspath(source)
        if text.lstrip().startswith(_FILE_HEADER):
            return WriterKey.from_text(text)
        path = Path(text).expanduser()
        try:
            content = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as e:
            raise WriterKeyError(f"cannot read the writer key file {path}: {e}") from None
        return WriterKey.from_text(content, f"the writer key file {path}")

    def __repr__(self) -> str:  # never print the private key
        return f"WriterKey(name={self.name!r}, public={self.public_key_b64})"


def resolve_writer_key(key: WriterKey | str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> WriterKey | None:
    """The key a writer signs with: the one given, else `DELTACOORD_WRITER_KEY`, else None (unsigned)."""
    if isinstance(key, WriterKey):
        return key
    if key is not None:
        return WriterKey.load(key)
    env = os.environ if environ is None else environ
    value = env.get(WRITER_KEY_ENV)
    return WriterKey.load(value) if value else None


def parse_writer_keys(text: str) -> dict[str, bytes]:
    """`deltacoord.writerKeys` (`name:base64, ...`) as name -> raw 32-byte public key; WriterKeyError naming the bad entry."""
    out: dict[str, bytes] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, b64 = entry.partition(":")
        name = name.strip()
        if not sep:
            raise WriterKeyError(f"writer key entry {entry!r} is not name:base64key")
        check_key_name(name)
        try:
            raw = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise WriterKeyError(f"writer key {name!r}: {b64.strip()!r} is not base64") from None
        if len(raw) != PUBLIC_KEY_BYTES:
            raise WriterKeyError(f"writer key {name!r} has {len(raw)} bytes; an Ed25519 public key has {PUBLIC_KEY_BYTES}")
        if name in out:
            raise WriterKeyError(f"writer key {name!r} is registered twice")
        out[name] = raw
    return out


@functools.lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def verify(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """Whether `signature` is the signature of proposal bytes `data` by `public_key` (raw 32 bytes)."""
    if len(signature) != SIGNATURE_BYTES or len(public_key) != PUBLIC_KEY_BYTES:
        return False
    try:
        _public_key(public_key).verify(signature, signed_message(data))
        return True
    except InvalidSignature:
        return False


__all__ = [
    "SIGNING_CONTEXT",
    "WRITER_KEY_ENV",
    "WriterKey",
    "WriterKeyError",
    "check_key_name",
    "parse_writer_keys",
    "resolve_writer_key",
    "verify",
]
