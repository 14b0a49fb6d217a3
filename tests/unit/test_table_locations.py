"""Where a coordinator may keep tables: the strict URI check, `table_roots`, storage options by root, settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltacoord.coordinator import settings
from deltacoord.coordinator.locations import TableLocationError, TableLocations
from deltacoord.reader.log import data_object, list_log, list_log_from_hint, newest_commit_version
from deltacoord.storage.table import StorageUriError, StoredObject, TableStorage
from deltacoord.storage.uri import check_table_uri

STRICT_REFUSED = [
    ("", "empty"),
    ("relative/t", "relative path"),
    ("file:t", "relative path"),
    ("/srv/tables/../etc", "'..' segment"),
    ("/srv/tables/./t", "'.' segment"),
    ("/srv//tables", "'//' segment"),
    ("/srv/%2e%2e/t", "percent-encoded"),
    ("/srv/a%2Fb", "percent-encoded"),
    ("file:///srv/tables/%2e%2e/x", "'..' segment"),
    ("file:///srv/tables/a%2Fb", "percent-encoded '/'"),
    ("/srv/t\x00x", "NUL"),
    ("/srv/t\nx", "control character"),
    ("s3://b/t/../x", "'..'"),
    ("s3://b/t/%2e%2e/x", "'..'"),
    ("hdfs://nn/t", "unsupported scheme"),
]


@pytest.mark.parametrize(("uri", "reason"), STRICT_REFUSED)
def test_the_strict_check_refuses_what_parse_would_resolve(uri: str, reason: str) -> None:
    with pytest.raises(StorageUriError, match=reason):
        check_table_uri(uri)


@pytest.mark.parametrize(("uri", "normal"), [
    ("/srv/tables/t", "file:///srv/tables/t"),
    ("/srv/tables/t/", "file:///srv/tables/t"),
    ("file:///srv/my%20t", "file:///srv/my%20t"),
    ("s3a://Bucket/t/", "s3://bucket/t"),
    ("abfss://c@acct.dfs.core.windows.net/t", "abfss://c@acct.dfs.core.windows.net/t"),
])
def test_the_strict_check_accepts_normal_locations(uri: str, normal: str) -> None:
    assert str(check_table_uri(uri)) == normal


def test_without_roots_local_tables_anywhere_and_no_object_store() -> None:
    loc = TableLocations()
    assert loc.problem("/srv/anything/t") is None
    err = loc.problem("s3://bucket/t")
    assert err is not None and err.reason == "TABLE_OUTSIDE_ROOTS" and "table_roots" in str(err)
    bad = loc.problem("relative")
    assert bad is not None and bad.reason == "BAD_TABLE_URI"


def test_roots_admit_only_their_own_locations(tmp_path: Path) -> None:
    loc = TableLocations.of(["s3://lake/tables", str(tmp_path / "tables")])
    assert loc.problem("s3://lake/tables/t") is None
    assert loc.problem("s3a://LAKE/tables/t") is None
    assert loc.problem(str(tmp_path / "tables" / "t")) is None
    for outside in ("s3://lake/tablesx/t", "s3://other/tables/t", "gs://lake/tables/t", str(tmp_path / "t")):
        err = loc.problem(outside)
        assert err is not None and err.reason == "TABLE_OUTSIDE_ROOTS", outside
    gcs = loc.problem("gs://lake/tables/t")
    assert gcs is not None and "no root is on GCS" in str(gcs)
    with pytest.raises(TableLocationError, match="BAD_TABLE_URI"):
        loc.storage("s3://lake/tables/../x")
    with pytest.raises(StorageUriError):
        TableLocations.of(["/srv/../etc"])


def test_storage_options_by_longest_root(tmp_path: Path) -> None:
    loc = TableLocations.of(
        ["s3://lake"], {"aws_region": "eu-west-1", "aws_allow_http": "false"},
        {"s3://lake": {"aws_region": "us-east-1"}, "s3://lake/special": {"aws_region": "ap-south-1"}},
    )
    assert loc.options_for(check_table_uri("s3://lake/t")) == {"aws_region": "us-east-1", "aws_allow_http": "false"}
    assert loc.options_for(check_table_uri("s3://lake/special/t"))["aws_region"] == "ap-south-1"
    local = TableLocations(fsync=False)
    assert local.storage(str(tmp_path / "t")) is local.storage(str(tmp_path / "t")), "one TableStorage per table"


def test_settings_read_table_roots_and_storage_from_file_environment_and_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[coordinator]\nbootstrap_servers = "k:9092"\ntable_roots = ["s3://lake/tables", "/data/tables"]\n'
        '[storage]\naws_region = "eu-west-1"\naws_allow_http = false\n'
        '[storage."s3://lake/tables"]\naws_endpoint_url = "http://minio:9000"\n'
    )
    run = settings.load(cfg, environ={})
    c = run.coordinator
    assert c.table_roots == ("s3://lake/tables", "/data/tables")
    assert c.storage_options == {"aws_region": "eu-west-1", "aws_allow_http": "false"}
    assert c.storage_options_by_root == {"s3://lake/tables": {"aws_endpoint_url": "http://minio:9000"}}
    assert [str(r) for r in c.locations().roots or ()] == ["s3://lake/tables", "file:///data/tables"]
    env = settings.load(cfg, environ={"DELTACOORD_TABLE_ROOTS": "s3://other/t, /x"}, storage_pairs=["aws_region=us-west-2"])
    assert env.coordinator.table_roots == ("s3://other/t", "/x")
    assert env.coordinator.storage_options["aws_region"] == "us-west-2"
    flags = settings.load(cfg, {"table_roots": "/only"}, environ={"DELTACOORD_TABLE_ROOTS": "/env"})
    assert flags.coordinator.table_roots == ("/only",)
    assert settings.load(None, environ={}).coordinator.table_roots is None
    with pytest.raises(settings.SettingsError, match="table_roots from the command line"):
        settings.load(None, {"table_roots": "s3://b/../x"}, environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text('[storage."not a uri/.."]\nk = "v"\n')
    with pytest.raises(settings.SettingsError, match="root URI"):
        settings.load(bad, environ={})


def test_hinted_listing_starts_at_the_checkpoint_and_falls_back_to_everything(tmp_path: Path) -> None:
    store = TableStorage(tmp_path / "t", fsync=False)
    for v in range(12):
        store.put(f"_delta_log/{v:020d}.json", b"{}")
    assert list_log_from_hint(store).listed_from is None  # no _last_checkpoint: the whole log
    store.put(f"_delta_log/{10:020d}.checkpoint.parquet", b"pq")
    store.put("_delta_log/_last_checkpoint", b'{"version":10,"size":1}')
    hinted = list_log_from_hint(store)
    assert hinted.listed_from == 10 and sorted(hinted.commits) == [10, 11] and sorted(hinted.checkpoints) == [10]
    assert newest_commit_version(store) == 11
    assert list_log_from_hint(store, at_most=9).listed_from is None, "time travel before the hint lists everything"
    store.put("_delta_log/_last_checkpoint", b'{"version":7,"size":1}')  # a stale hint: older, still a start
    stale = list_log_from_hint(store)
    assert stale.listed_from == 7 and sorted(stale.checkpoints) == [10]
    store.delete(f"_delta_log/{10:020d}.checkpoint.parquet")  # a hint whose checkpoint is gone
    assert list_log_from_hint(store).listed_from is None
    assert sorted(list_log(store).commits) == list(range(12))


def test_data_paths_resolve_to_keys_of_the_table_or_other_locations(tmp_path: Path) -> None:
    root = TableStorage(tmp_path / "t", fsync=False)
    assert data_object(root, "p=a%20b/part-0.parquet") == StoredObject(root, "p=a b/part-0.parquet")
    assert data_object(root, (tmp_path / "t" / "x.parquet").as_uri()) == StoredObject(root, "x.parquet")
    elsewhere = data_object(root, str(tmp_path / "other" / "y.parquet"))
    assert elsewhere.storage.location == (tmp_path / "other").as_uri() and elsewhere.key == "y.parquet"
    with pytest.raises(StorageUriError):
        data_object(root, "../escape.parquet")


def test_a_storage_option_no_store_of_the_roots_has_is_refused_at_start(tmp_path: Path) -> None:
    """A misspelt `[storage]` key, or another cloud's, used to be accepted and to fail each table's first commit."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[coordinator]\nbootstrap_servers = "k:9092"\ntable_roots = ["s3://lake/tables"]\n'
                   '[storage]\naws_regoin = "eu-west-1"\n')
    with pytest.raises(settings.SettingsError, match=r"'aws_regoin' is not valid for store 'S3'.*\[storage\] in"):
        settings.load(cfg, environ={})
    with pytest.raises(settings.SettingsError, match=r"'aws_region' configures S3, but gs://g/t is on GCS"):
        settings.load(None, {"table_roots": "gs://g/t"}, storage_pairs=["aws_region=us-west-2"], environ={})
    # Credentials left to the environment are not judged at start.
    assert settings.load(None, {"table_roots": "s3://lake/t"}, storage_pairs=["AWS_ACCESS_KEY_ID=a"], environ={})
