"""storage_options: delta-rs's keys, case-insensitive, routed to obstore's config, client and retry options."""

from __future__ import annotations

import datetime

import pytest

from deltacoord.storage.options import ObstoreOptions
from deltacoord.storage.options import obstore_options as translate
from deltacoord.storage.table import StorageConfigError, TableStorage, parse_table_uri


def obstore_options(uri: object, options: dict[str, str]) -> ObstoreOptions:
    """The translation with an empty environment, so the machine's variables cannot leak in."""
    return translate(uri, options, environ={})  # type: ignore[arg-type]

S3 = parse_table_uri("s3://bucket/t")
AZ = parse_table_uri("az://container/t")
ABFSS = parse_table_uri("abfss://container@acct.dfs.core.windows.net/t")
GS = parse_table_uri("gs://bucket/t")


def test_s3_keys_pass_through_and_client_keys_are_routed() -> None:
    opts = obstore_options(S3, {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t", "AWS_ALLOW_HTTP": "true", "aws_conditional_put": "etag",
        "timeout": "30s",
    })
    assert opts.config == {
        "aws_endpoint_url": "http://127.0.0.1:9000", "aws_region": "eu-west-1", "aws_access_key_id": "k",
        "aws_secret_access_key": "s", "aws_session_token": "t", "aws_conditional_put": "etag",
    }
    assert opts.client_options == {"allow_http": "true", "timeout": "30s"}


def test_s3_defaults_to_conditional_put_by_etag() -> None:
    assert obstore_options(S3, {}).config == {"conditional_put": "etag"}
    assert obstore_options(S3, {"aws_conditional_put": "disabled"}).config == {"aws_conditional_put": "disabled"}


def test_delta_rs_own_keys() -> None:
    opts = obstore_options(S3, {
        "AWS_S3_LOCKING_PROVIDER": "dynamodb", "DELTA_DYNAMO_TABLE_NAME": "x", "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        "AWS_IAM_ROLE_ARN": "arn:aws:iam::1:role/r", "AWS_IAM_ROLE_SESSION_NAME": "s", "AWS_S3_ADDRESSING_STYLE": "virtual",
        "AWS_S3_POOL_IDLE_TIMEOUT_SECONDS": "15", "max_retries": "4", "retry_timeout": "3min",
        "backoff_config.init_backoff": "100ms", "backoff_config.base": "2.5",
    })
    assert opts.config == {"role_arn": "arn:aws:iam::1:role/r", "role_session_name": "s",
                           "virtual_hosted_style_request": "true", "conditional_put": "etag"}
    assert opts.client_options == {"pool_idle_timeout": "15s"}
    assert opts.retry_config == {"max_retries": 4, "retry_timeout": datetime.timedelta(minutes=3),
                                 "backoff": {"init_backoff": datetime.timedelta(milliseconds=100), "base": 2.5}}


def test_keys_are_case_insensitive_but_not_contradictory() -> None:
    assert obstore_options(S3, {"aws_region": "x", "AWS_REGION": "x"}).config["aws_region"] == "x"
    with pytest.raises(StorageConfigError, match="given twice"):
        obstore_options(S3, {"aws_region": "x", "AWS_REGION": "y"})


@pytest.mark.parametrize(("uri", "options", "problem"), [
    (S3, {"azure_storage_account_name": "a"}, "configures Azure"),
    (AZ, {"AWS_REGION": "us-east-1"}, "configures S3"),
    (GS, {"aws_access_key_id": "k"}, "configures S3"),
    (S3, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "AWS_ALLOW_HTTP=true"),
    (AZ, {"azure_storage_endpoint": "http://127.0.0.1:10000/acct"}, "allow_http"),
    (S3, {"AWS_PROFILE": "dev"}, "AWS_PROFILE is not supported"),
    (S3, {"AWS_REGION": 5}, "strings to strings"),
    (S3, {"retry_timeout": "soon"}, "expected a duration"),
    (S3, {"max_retries": "-1"}, "whole number"),
    (S3, {"AWS_S3_ADDRESSING_STYLE": "sideways"}, "'path' or 'virtual'"),
    (S3, {"backoff_config.jitter": "1"}, "backoff_config takes"),
    (ABFSS, {"azure_storage_account_name": "other"}, "make them agree"),
])
def test_bad_options_name_the_problem(uri: object, options: dict[str, str], problem: str) -> None:
    with pytest.raises(StorageConfigError, match=problem):
        obstore_options(uri, options)  # type: ignore[arg-type]


def test_azure_account_comes_from_the_uri() -> None:
    assert obstore_options(ABFSS, {}).config == {"account_name": "acct"}
    assert obstore_options(ABFSS, {"AZURE_STORAGE_ACCOUNT_NAME": "ACCT"}).config == {"azure_storage_account_name": "ACCT"}
    opts = obstore_options(AZ, {"azure_storage_account_name": "a", "azure_storage_account_key": "k", "use_emulator": "true",
                                "azure_allow_http": "true"})
    assert opts.config == {"azure_storage_account_name": "a", "azure_storage_account_key": "k", "use_emulator": "true"}
    assert opts.client_options == {"allow_http": "true"}


def test_gcs_keys() -> None:
    opts = obstore_options(GS, {"GOOGLE_SERVICE_ACCOUNT": "/k.json", "google_allow_http": "true"})
    assert opts.config == {"google_service_account": "/k.json"}
    assert opts.client_options == {"allow_http": "true"}


def test_local_tables_ignore_options() -> None:
    assert obstore_options(parse_table_uri("/srv/t"), {"AWS_REGION": "x"}).config == {}


def test_unknown_key_is_refused_when_the_store_is_built() -> None:
    with pytest.raises(StorageConfigError, match="bogus_key"):
        TableStorage("s3://bucket/t", {"bogus_key": "1"})
    with pytest.raises(StorageConfigError, match="account_nam"):
        TableStorage("az://container/t", {"azure_storage_account_nam": "x"})


def test_client_settings_come_from_the_environment_when_not_given() -> None:
    env = {"AWS_ALLOW_HTTP": "true", "AWS_TIMEOUT": "5s", "AZURE_ALLOW_HTTP": "false", "HOME": "/root"}
    assert translate(S3, {}, environ=env).client_options == {"allow_http": "true", "timeout": "5s"}
    assert translate(S3, {"AWS_ALLOW_HTTP": "false"}, environ=env).client_options["allow_http"] == "false"
    assert translate(AZ, {}, environ=env).client_options == {"allow_http": "false"}
    assert translate(GS, {}, environ=env).client_options == {}


@pytest.mark.parametrize(("uri", "key", "meant"), [
    ("s3://b/t", "AWS_REGOIN", "AWS_REGION"),
    ("s3://b/t", "aws_endpoint_ulr", "AWS_ENDPOINT_URL"),
    ("az://c/t", "AZURE_STORAGE_ACOUNT_NAME", "AZURE_STORAGE_ACCOUNT_NAME"),
    ("gs://b/t", "GOOGLE_SERVICE_ACOUNT", "GOOGLE_SERVICE_ACCOUNT"),
])
def test_a_misspelt_key_is_told_the_key_it_meant(uri: str, key: str, meant: str) -> None:
    with pytest.raises(StorageConfigError) as ei:
        TableStorage(uri, {key: "x"})
    assert str(ei.value).endswith(f"; did you mean {meant}?") and key.lower() in str(ei.value)


def test_a_key_like_no_other_gets_no_guess() -> None:
    with pytest.raises(StorageConfigError) as ei:
        TableStorage("s3://b/t", {"nonsense_key": "1"})
    assert "did you mean" not in str(ei.value) and "'nonsense_key'" in str(ei.value)
