"""Table URIs: one normal form per location, clear refusals, and containment under table roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltacoord.storage.table import StorageUriError, TableUri, normalize_table_uri, parse_table_uri, uri_within_roots
from deltacoord.storage.uri import check_key, check_prefix

NORMAL_FORMS = [
    # object stores
    ("s3://bucket/tables/t1", "s3://bucket/tables/t1"),
    ("s3a://bucket/tables/t1", "s3://bucket/tables/t1"),
    ("S3A://Bucket/tables/t1/", "s3://bucket/tables/t1"),
    ("s3://bucket", "s3://bucket"),
    ("s3://bucket/", "s3://bucket"),
    ("s3://bucket/my%20table", "s3://bucket/my%20table"),
    ("s3://bucket/my table", "s3://bucket/my%20table"),
    ("s3://bucket/%41bc", "s3://bucket/Abc"),
    ("s3://bucket/caf%C3%A9", "s3://bucket/caf%C3%A9"),
    ("s3://bucket/a=1/b:c", "s3://bucket/a=1/b:c"),
    ("az://container/dir/t", "az://container/dir/t"),
    ("AZ://Container/dir/t", "az://container/dir/t"),
    ("azure://container/t", "az://container/t"),
    ("abfs://container/t", "az://container/t"),
    ("abfss://container@account.dfs.core.windows.net/t", "abfss://container@account.dfs.core.windows.net/t"),
    ("abfs://Container@Account.dfs.core.windows.net/t", "abfss://container@account.dfs.core.windows.net/t"),
    ("abfss://container@account.blob.core.windows.net/t/", "abfss://container@account.dfs.core.windows.net/t"),
    ("gs://bucket/t", "gs://bucket/t"),
    ("GS://bucket.with.dots/t", "gs://bucket.with.dots/t"),
    # local
    ("file:///srv/tables/t", "file:///srv/tables/t"),
    ("file://localhost/srv/tables/t", "file:///srv/tables/t"),
    ("FILE:///srv/tables/t/", "file:///srv/tables/t"),
    ("file:///srv/my%20t", "file:///srv/my%20t"),
    ("/srv/tables/t", "file:///srv/tables/t"),
    ("/srv/tables/../tables/t", "file:///srv/tables/t"),
    ("/srv//tables/./t/", "file:///srv/tables/t"),
    ("file:///srv/tables/%2e%2e/x", "file:///srv/x"),
    ("/srv/%2e%2e/t", "file:///srv/%252e%252e/t"),
]


@pytest.mark.parametrize(("given", "normal"), NORMAL_FORMS)
def test_normal_form(given: str, normal: str) -> None:
    assert normalize_table_uri(given) == normal
    # The normal form is a fixed point.
    assert normalize_table_uri(normal) == normal


def test_relative_paths_become_absolute_under_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    real = os.path.realpath(tmp_path)
    assert normalize_table_uri("tables/t1") == f"file://{real}/tables/t1"
    assert normalize_table_uri("./tables/../t2") == f"file://{real}/t2"
    assert normalize_table_uri(Path("t3")) == f"file://{real}/t3"


def test_symlinks_resolve_to_one_location(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert normalize_table_uri(tmp_path / "link" / "t") == normalize_table_uri(tmp_path / "real" / "t")


def test_parsed_parts() -> None:
    assert parse_table_uri("s3a://b/x/y") == TableUri("s3", "b", "x/y")
    assert parse_table_uri("abfss://c@acct.dfs.core.windows.net/p") == TableUri("az", "c", "p", "acct")
    assert parse_table_uri("gs://b") == TableUri("gs", "b", "")
    assert parse_table_uri("s3://b/my%20t").path == "my t"


REFUSED = [
    ("", "empty"),
    ("   ", "empty"),
    ("/srv/t\x00x", "NUL"),
    ("s3://bucket/t\x00", "NUL"),
    ("s3://bucket/a%00b", "NUL"),
    ("s3://bucket/a%0Ab", "control character"),
    # Raw tabs and newlines: urlsplit drops them, so "ctl\nline" would have named the table "ctlline".
    ("file:///srv/ctl\nline", "control character"),
    ("file:///srv/ctl\tline", "control character"),
    ("s3://bucket/ctl\nline", "control character"),
    ("s3://buck\ret/t", "control character"),
    ("/srv/ctl\nline", "control character"),
    # DEL and the C1 controls too (U+0085 NEL is a newline to some parsers), raw or percent-encoded.
    ("file:///srv/del\x7fete", "U+007F (DEL)"),
    ("/srv/nel\x85line", "U+0085 (NEL)"),
    ("file:///srv/c1\x9fend", "U+009F"),
    ("s3://bucket/nel\x85line", "U+0085"),
    ("s3://bucket/nel%C2%85line", "U+0085"),
    ("file:///srv/nel%C2%85line", "U+0085"),
    ("file:///srv/ctl\nline2", "U+000A (LF, a newline) at index 15"),
    ("s3://bucket/../other", "'..' segment"),
    ("s3://bucket/a/../../other", "'..' segment"),
    ("s3://bucket/a/%2e%2e/b", "'..' segment"),
    ("s3://bucket/a/%2E%2E", "'..' segment"),
    ("s3://bucket/./a", "'.' segment"),
    ("gs://bucket/a/..", "'..' segment"),
    ("az://c/a/%2e%2e/b", "'..' segment"),
    ("s3://bucket/a%2Fb", "percent-encoded '/'"),
    ("s3://bucket/a%2fb", "percent-encoded '/'"),
    ("s3://bucket/a%5Cb", "percent-encoded"),
    ("file:///srv/a%2Fb", "percent-encoded '/'"),
    ("s3://bucket/a//b", "'//' segment"),
    ("s3://bucket//a", "'//'"),
    ("s3://bucket/a\\b", "is not allowed in an object-store path"),
    ("s3://bucket/a%ZZ", "does not start a percent-escape"),
    ("s3://bucket/100%", "does not start a percent-escape"),
    ("s3://bucket/caf%E9", "not UTF-8"),
    ("s3://bucket/t?versionId=1", "query string"),
    ("s3://bucket/t#frag", "fragment"),
    ("s3:///t", "no bucket"),
    ("s3://", "no bucket"),
    ("s3://user@bucket/t", "bare bucket name"),
    ("s3://bucket:9000/t", "bare bucket name"),
    ("s3://bu*cket/t", "bucket/container name"),
    ("s3://%62ucket/t", "bucket/container name"),
    ("abfss://c@account.example.com/t", "container@ACCOUNT"),
    ("abfss://c@acc-ount.dfs.core.windows.net/t", "storage account name"),
    ("http://host/t", "unsupported scheme"),
    ("hdfs://nn/t", "unsupported scheme"),
    ("s3:/bucket/t", "with '//'"),
    ("file://otherhost/srv/t", "this machine only"),
    ("file://relative", "this machine only"),
]


@pytest.mark.parametrize(("given", "reason"), REFUSED)
def test_refused_with_a_reason(given: str, reason: str) -> None:
    with pytest.raises(StorageUriError) as err:
        parse_table_uri(given)
    assert "bad table URI" in str(err.value)
    assert reason in str(err.value), str(err.value)


def test_not_a_string() -> None:
    with pytest.raises(StorageUriError, match="string or a path"):
        parse_table_uri(42)  # type: ignore[arg-type]


CONTAINMENT = [
    ("s3://b/tables/t1", ["s3://b/tables"], True),
    ("s3://b/tables", ["s3://b/tables"], True),
    ("s3a://B/tables/t1", ["s3://b/tables/"], True),
    ("s3://b/tables-other/t1", ["s3://b/tables"], False),
    ("s3://b/tablesx", ["s3://b/tables"], False),
    ("s3://b/x", ["s3://b"], True),
    ("s3://other/tables/t1", ["s3://b/tables"], False),
    ("gs://b/tables/t1", ["s3://b/tables"], False),
    ("az://b/tables/t1", ["s3://b/tables"], False),
    ("s3://b/t%20x/1", ["s3://b/t x"], True),
    ("abfss://c@acct.dfs.core.windows.net/t", ["abfss://c@acct.dfs.core.windows.net/"], True),
    ("abfss://c@other.dfs.core.windows.net/t", ["abfss://c@acct.dfs.core.windows.net/"], False),
    ("az://c/t", ["abfss://c@acct.dfs.core.windows.net/"], False),
    ("/srv/tables/t1", ["/srv/tables"], True),
    ("/srv/tables/../etc/t", ["/srv/tables"], False),
    ("/srv/tables2/t", ["/srv/tables"], False),
    ("file:///srv/tables/t", ["/srv/tables"], True),
    ("/srv/tables/t", ["s3://b", "/srv"], True),
    ("/srv/tables/t", [], False),
    ("/", ["/"], True),
    ("/srv", ["/"], True),
]


@pytest.mark.parametrize(("uri", "roots", "inside"), CONTAINMENT)
def test_within_roots(uri: str, roots: list[str], inside: bool) -> None:
    assert uri_within_roots(uri, roots) is inside


def test_within_roots_refuses_traversal_instead_of_answering() -> None:
    with pytest.raises(StorageUriError, match=r"'\.\.'"):
        uri_within_roots("s3://b/tables/../secrets", ["s3://b/tables"])
    with pytest.raises(StorageUriError, match=r"'\.\.'"):
        uri_within_roots("s3://b/tables/%2e%2e/secrets", ["s3://b/tables"])


def test_symlink_out_of_a_root_is_outside(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "escape").symlink_to(tmp_path / "elsewhere")
    assert not uri_within_roots(tmp_path / "root" / "escape" / "t", [tmp_path / "root"])


@pytest.mark.parametrize("key", ["_delta_log/00000000000000000000.json", "a=1/part-0.parquet", "x", "a b/ü%.json"])
def test_good_keys(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/.", "a\\b", "a\x00b", "a\nb", "a/"])
def test_bad_keys(key: str) -> None:
    with pytest.raises(StorageUriError):
        check_key(key)


def test_prefixes() -> None:
    assert check_prefix("") == ""
    assert check_prefix("/") == ""
    assert check_prefix("_delta_log/") == "_delta_log"
    with pytest.raises(StorageUriError):
        check_prefix("../x")
