"""Table URIs: one normalised form per location, and containment under allowed roots.

Accepted: plain paths, `file://`, `s3://` (`s3a://` is the same location), `az://`,
`abfs://`/`abfss://` (`container@account.dfs.core.windows.net` or `...blob...`) and `gs://`.

The normal form is what `table_roots` checks compare, so it must not admit two spellings of a
place nor hide a traversal: local paths are made absolute with symlinks resolved (`..` then has
its filesystem meaning); object-store paths are percent-decoded once and refused when they hold
`.`/`..` or empty segments, an encoded separator, a control character (C0, DEL, C1; raw or
percent-encoded, in any URI), a query or a fragment.
Scheme and bucket/container/account names (lowercase-only on every cloud) are lowercased.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from deltacoord.schemas.control_chars import control_character

StoreKind = Literal["file", "s3", "az", "gs"]

_SCHEMES: dict[str, StoreKind] = {
    "file": "file", "s3": "s3", "s3a": "s3", "az": "az", "azure": "az", "abfs": "az", "abfss": "az", "gs": "gs",
}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,254}$")
_ACCOUNT_RE = re.compile(r"^[a-z0-9]{1,64}$")
_AZURE_HOST_RE = re.compile(r"^(?P<account>[^.]+)\.(?:dfs|blob)\.(?P<suffix>core\.windows\.net|fabric\.microsoft\.com)$")
#: Characters kept as-is in the normal form's path (RFC 3986 pchar without '%', plus '/').
_SAFE = "/!$&'()*+,;=:@~"


class StorageError(Exception):
    """Base of every error the storage layer raises."""


class StorageUriError(StorageError, ValueError):
    """A table URI or object key that the storage layer refuses, with the reason."""


@dataclass(frozen=True)
class TableUri:
    """A parsed, normalised table location.

    `path` is the decoded key prefix inside the bucket (no leading/trailing '/', '' for the
    bucket root); for `file` it is the absolute local path. `account` is the Azure storage
    account when the URI names one.
    """

    kind: StoreKind
    bucket: str
    path: str
    account: str = ""

    def __str__(self) -> str:
        quoted = urllib.parse.quote(self.path, safe=_SAFE)
        if self.kind == "file":
            return f"file://{quoted}"
        if self.kind == "az" and self.account:
            base = f"abfss://{self.bucket}@{self.account}.dfs.core.windows.net"
        else:
            base = f"{self.kind}://{self.bucket}"
        return f"{base}/{quoted}" if self.path else base

    @property
    def local_path(self) -> str:
        if self.kind != "file":
            raise StorageUriError(f"{self} is not a local path")
        return self.path

    def is_under(self, root: TableUri) -> bool:
        """True when this location is `root` or lies below it (whole path segments)."""
        if (self.kind, self.bucket, self.account) != (root.kind, root.bucket, root.account):
            return False
        if self.kind == "file":
            return self.path == root.path or self.path.startswith(root.path.rstrip("/") + "/")
        return root.path == "" or self.path == root.path or self.path.startswith(root.path + "/")


def _fail(uri: object, problem: str) -> StorageUriError:
    return StorageUriError(f"bad table URI {uri!r}: {problem}")


def _check_chars(uri: object, text: str, what: str) -> None:
    if "\x00" in text:
        raise _fail(uri, f"the {what} contains a NUL byte")
    found = control_character(text)
    if found is not None:
        raise _fail(uri, f"the {what} contains a control character, {found} (C0, DEL and C1 controls are refused: "
                    "URL parsers drop some of them, so the URI would name another location)")


def _decode(uri: object, raw: str) -> str:
    if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
        raise _fail(uri, "a '%' that does not start a percent-escape (%XX); write a literal '%' as %25")
    lowered = raw.lower()
    if "%2f" in lowered or "%5c" in lowered:
        raise _fail(uri, "percent-encoded '/' or '\\' (%2F, %5C) is not allowed in a path")
    try:
        decoded = urllib.parse.unquote(raw, errors="strict")
    except UnicodeDecodeError as e:
        raise _fail(uri, "percent-escapes that are not UTF-8") from e
    _check_chars(uri, decoded, "path")
    return decoded


def _object_path(uri: object, raw_path: str) -> str:
    decoded = _decode(uri, raw_path)
    if "\\" in decoded:
        raise _fail(uri, "'\\' is not allowed in an object-store path")
    stripped = decoded.strip("/")
    if stripped == "":
        return ""
    for seg in stripped.split("/"):
        if seg in ("", ".", ".."):
            shown = "//" if seg == "" else seg
            raise _fail(uri, f"the path holds a {shown!r} segment; object stores have no directories to resolve it against")
    if decoded.startswith("//"):
        raise _fail(uri, "the path starts with '//'")
    return stripped


def _local(uri: object, path: str) -> TableUri:
    _check_chars(uri, path, "path")
    if path.strip() == "":
        raise _fail(uri, "the path is empty")
    return TableUri("file", "", os.path.realpath(os.path.abspath(path)))


def parse_table_uri(uri: str | os.PathLike[str]) -> TableUri:
    """Parse and normalise a table URI or local path; raises `StorageUriError` naming the problem."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str):
        raise StorageUriError(f"a table URI must be a string or a path, not {type(uri).__name__}")
    if uri.strip() == "":
        raise _fail(uri, "it is empty")
    # NUL and control characters before any parsing: urlsplit silently drops tabs and newlines, which would
    # name another location.
    _check_chars(uri, uri, "URI")
    m = _SCHEME_RE.match(uri)
    if m is None:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", uri) and not uri.startswith("/"):
            raise _fail(uri, "write the scheme with '//' (for example s3://bucket/path or file:///abs/path)")
        return _local(uri, uri)
    scheme = m.group(1).lower()
    kind = _SCHEMES.get(scheme)
    if kind is None:
        raise _fail(uri, f"unsupported scheme {scheme!r}; use a local path or one of file, s3, s3a, az, abfs, abfss, gs")
    if "?" in uri:
        raise _fail(uri, "a query string ('?') is not part of a table location; percent-encode '?' as %3F")
    if "#" in uri:
        raise _fail(uri, "a fragment ('#') is not part of a table location; percent-encode '#' as %23")
    parts = urllib.parse.urlsplit(scheme + uri[len(scheme):])
    netloc, raw_path = parts.netloc, parts.path
    if kind == "file":
        if netloc not in ("", "localhost"):
            raise _fail(uri, f"file URIs name this machine only (file:///abs/path), not host {netloc!r}")
        if not raw_path.startswith("/"):
            raise _fail(uri, "a file URI needs an absolute path (file:///abs/path)")
        return _local(uri, _decode(uri, raw_path))
    if netloc == "":
        raise _fail(uri, f"no bucket or container after {scheme}://")
    account = ""
    if kind == "az" and "@" in netloc:
        container, _, host = netloc.partition("@")
        hm = _AZURE_HOST_RE.match(host.lower())
        if hm is None:
            raise _fail(uri, f"expected container@ACCOUNT.dfs.core.windows.net, got host {host!r}")
        account, bucket = hm.group("account"), container.lower()
        if not _ACCOUNT_RE.match(account):
            raise _fail(uri, f"storage account name {account!r} must be 1-64 lowercase letters or digits")
    elif "@" in netloc or ":" in netloc:
        raise _fail(uri, f"{scheme}:// takes a bare bucket name, not {netloc!r} (no user, password or port)")
    else:
        bucket = netloc.lower()
    if "%" in bucket or not _BUCKET_RE.match(bucket):
        raise _fail(uri, f"bucket/container name {bucket!r} may hold only letters, digits, '.', '-' and '_'")
    return TableUri(kind, bucket, _object_path(uri, raw_path), account)


_ENCODED_DOT_OR_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def check_table_uri(uri: str | os.PathLike[str]) -> TableUri:
    """The strict parse a coordinator applies to a proposal's table URI before deciding anything.

    Beyond `parse_table_uri` it refuses what that one would resolve: a relative
    path, `.` / `..` / empty segments in local paths and `file://` URIs (even when
    they would resolve inside), and percent-encoded dots or separators in a plain
    path. The location is one the writer named exactly, not one a rule made of it.
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if isinstance(uri, str) and uri.strip() and "\x00" not in uri:
        m = _SCHEME_RE.match(uri)
        if m is None or m.group(1).lower() == "file":
            if m is None:
                if not uri.startswith("/"):
                    raise _fail(uri, "a relative path; name the table by an absolute path or URI")
                if _ENCODED_DOT_OR_SEPARATOR.search(uri):
                    raise _fail(uri, "percent-encoded '.', '/' or '\\' (%2E, %2F, %5C) in a path")
                local = uri
            else:
                local = _decode(uri, urllib.parse.urlsplit(uri).path)
            for seg in local.rstrip("/").split("/")[1:]:
                if seg in ("", ".", ".."):
                    shown = "//" if seg == "" else seg
                    raise _fail(uri, f"the path holds a {shown!r} segment; name the table by its normal path")
    return parse_table_uri(uri)


def normalize_table_uri(uri: str | os.PathLike[str]) -> str:
    """The one normal string form of a table location (see the module docstring)."""
    return str(parse_table_uri(uri))


def uri_within_roots(uri: str | os.PathLike[str] | TableUri, roots: Iterable[str | os.PathLike[str] | TableUri]) -> bool:
    """True when `uri` is one of `roots` or lies below one (after normalising both sides).

    This is the check behind a `table_roots` setting: a location in another bucket, another
    scheme or reached through `..` is outside. A bad URI raises `StorageUriError`.
    """
    target = uri if isinstance(uri, TableUri) else parse_table_uri(uri)
    return any(target.is_under(r if isinstance(r, TableUri) else parse_table_uri(r)) for r in roots)


#: A NUL or another C0 control character, or DEL: never in an object key.
_CONTROL_CHAR = re.compile("[\x00-\x1f\x7f]")


def check_key(key: str) -> str:
    """Validate an object key relative to a table root ('/'-separated, decoded) and return it."""
    if not isinstance(key, str) or key == "":
        raise StorageUriError(f"an object key must be a non-empty string, got {key!r}")
    if _CONTROL_CHAR.search(key) is not None:
        raise StorageUriError(f"object key {key!r} contains a NUL or control character")
    if key.startswith("/") or "\\" in key:
        raise StorageUriError(f"object key {key!r} must be relative and '/'-separated")
    for seg in key.split("/"):
        if seg in ("", ".", ".."):
            raise StorageUriError(f"object key {key!r} holds an empty, '.' or '..' segment")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix names a directory below the root: '' or a valid key; a trailing '/' is dropped."""
    stripped = prefix.rstrip("/")
    return "" if stripped == "" else check_key(stripped)
