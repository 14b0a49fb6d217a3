"""`storage_options` (delta-rs's keys) translated into obstore's store config, client options and retries.

The dict is the one a user hands delta-rs: string values, keys case-insensitive, any of
object_store's aliases (`AWS_ENDPOINT_URL`, `aws_endpoint`, `endpoint`, ...) plus the few keys
delta-rs adds itself. Keys object_store knows pass through (obstore rejects unknown ones, and we
turn that into a `StorageConfigError` naming the key); HTTP-client and retry keys are routed to
obstore's `client_options`/`retry_config`; delta-rs's own commit-protocol keys (DynamoDB locking,
unsafe rename) mean nothing here and are dropped. Whatever is not given comes from each cloud's
environment chain (`AWS_*`, `AZURE_*`, `GOOGLE_*` variables, web identity, instance metadata), which
obstore reads when the store is built.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deltacoord.storage.uri import StorageError, TableUri


class StorageConfigError(StorageError, ValueError):
    """`storage_options` that cannot configure the store, with the offending key."""


class UnknownStorageOptionError(StorageConfigError):
    """A storage option the table's store does not have (a misspelt key, or another cloud's)."""


_PREFIX = {"s3": "aws_", "az": "azure_", "gs": "google_"}
_CLOUD_NAME = {"s3": "S3", "az": "Azure", "gs": "GCS"}

#: object_store's HTTP client keys (any store; a store's own prefix may precede them).
_CLIENT_KEYS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_only", "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle",
    "http2_max_frame_size", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate",
    "proxy_excludes", "randomize_addresses", "timeout", "user_agent",
})

#: delta-rs keys about its own commit protocol or its SDK clients: no meaning for this layer.
_IGNORED = frozenset({
    "aws_s3_locking_provider", "aws_s3_allow_unsafe_rename", "aws_force_credential_load",
    "aws_ec2_metadata_disabled", "aws_ec2_metadata_timeout", "aws_sts_pool_idle_timeout_seconds",
    "aws_s3_get_internal_server_error_retries", "aws_endpoint_url_dynamodb", "aws_region_dynamodb",
    "aws_access_key_id_dynamodb", "aws_secret_access_key_dynamodb", "aws_session_token_dynamodb",
    "delta_dynamo_table_name", "delta_dynamo_billing_mode", "delta_dynamo_max_elapsed_request_time",
    "allow_unsafe_rename", "mount_allow_unsafe_rename",
})

#: delta-rs spellings that object_store names differently.
_RENAMED = {
    "aws_iam_role_arn": "role_arn", "aws_s3_assume_role_arn": "role_arn",
    "aws_iam_role_session_name": "role_session_name", "aws_s3_role_session_name": "role_session_name",
}

#: The store settings users spell (object_store's names, which delta-rs takes too): only to suggest the key a
#: misspelt one meant; object_store itself decides what it accepts.
_KNOWN_KEYS = {
    "s3": ("access_key_id", "secret_access_key", "session_token", "region", "default_region", "endpoint", "endpoint_url",
           "bucket", "checksum_algorithm", "conditional_put", "copy_if_not_exists", "disable_tagging",
           "metadata_endpoint", "request_payer", "role_arn", "role_session_name", "server_side_encryption",
           "skip_signature", "sse_bucket_key_enabled", "sse_kms_key_id", "sts_endpoint", "unsigned_payload",
           "virtual_hosted_style_request", "web_identity_token_file", "s3_addressing_style", "token"),
    "az": ("storage_account_name", "storage_account_key", "account_name", "account_key", "access_key", "authority_host",
           "client_id", "client_secret", "tenant_id", "container_name", "disable_tagging", "endpoint", "federated_token_file",
           "msi_endpoint", "msi_resource_id", "object_id", "sas_key", "sas_token", "skip_signature", "token",
           "use_azure_cli", "use_emulator", "use_fabric_endpoint", "storage_use_emulator"),
    "gs": ("service_account", "service_account_key", "application_credentials", "base_url", "bearer_token", "bucket",
           "skip_signature", "service_account_path"),
}


def suggestion(kind: str, key: str) -> str | None:
    """The known storage option a misspelt `key` most likely meant, in the store's own spelling (AWS_REGION)."""
    own = _PREFIX.get(kind)
    if own is None:
        return None
    names = [own + k for k in _KNOWN_KEYS[kind]] + [own + k for k in _CLIENT_KEYS] + sorted(_CLIENT_KEYS) + [
        "max_retries", "retry_timeout"]
    close = difflib.get_close_matches(key.strip().lower(), names, n=1, cutoff=0.75)
    return close[0].upper() if close else None


_TRUE = frozenset({"true", "1", "yes", "on"})
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins|h|hr|hrs)?\s*$")
_UNIT_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "mins": 60.0,
                 "h": 3600.0, "hr": 3600.0, "hrs": 3600.0}


@dataclass
class ObstoreOptions:
    """Keyword arguments for an obstore store constructor."""

    config: dict[str, str] = field(default_factory=dict)
    client_options: dict[str, str] = field(default_factory=dict)
    retry_config: dict[str, Any] = field(default_factory=dict)

    def cache_key(self) -> tuple[object, ...]:
        backoff = self.retry_config.get("backoff", {})
        rest = {k: v for k, v in self.retry_config.items() if k != "backoff"}
        return (tuple(sorted(self.config.items())), tuple(sorted(self.client_options.items())),
                tuple(sorted((k, str(v)) for k, v in rest.items())), tuple(sorted((k, str(v)) for k, v in backoff.items())))


def _duration(key: str, value: str) -> datetime.timedelta:
    m = _DURATION_RE.match(value)
    if m is None:
        raise StorageConfigError(f"storage option {key}={value!r}: expected a duration such as '30s', '3min' or '500ms'")
    return datetime.timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2)])


def _lowercased(options: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise StorageConfigError(
                f"storage_options must map strings to strings (as delta-rs takes them); got {key!r}: {value!r}"
            )
        k = key.strip().lower()
        if k in out and out[k] != value:
            raise StorageConfigError(f"storage option {key!r} is given twice (keys are case-insensitive) with different values")
        out[k] = value
    return out


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def obstore_options(uri: TableUri, storage_options: Mapping[str, str] | None,
                    environ: Mapping[str, str] | None = None) -> ObstoreOptions:
    """Translate `storage_options` for the store `uri` lives in; raises `StorageConfigError`.

    obstore reads credentials and store settings from the environment itself, but its HTTP-client
    settings (`AWS_ALLOW_HTTP`, `AZURE_ALLOW_HTTP`, `GOOGLE_ALLOW_HTTP`, timeouts, ...) only from what
    it is given, so those are taken from `environ` (default `os.environ`) where the options lack them.
    """
    if uri.kind == "file":
        return ObstoreOptions()
    opts = ObstoreOptions()
    own = _PREFIX[uri.kind]
    for key, value in _lowercased(storage_options or {}).items():
        for other_kind, other in _PREFIX.items():
            if other_kind != uri.kind and key.startswith(other):
                raise UnknownStorageOptionError(
                    f"storage option {key!r} configures {_CLOUD_NAME[other_kind]}, but {uri} is on {_CLOUD_NAME[uri.kind]}"
                )
        bare = key[len(own):] if key.startswith(own) else key
        if key in _IGNORED or bare.startswith("dynamo"):
            continue
        if key == "aws_profile":
            raise StorageConfigError(
                "storage option AWS_PROFILE is not supported here: pass AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                "(and AWS_SESSION_TOKEN) or rely on the environment, web identity or instance metadata"
            )
        if bare in _CLIENT_KEYS:
            opts.client_options[bare] = value
        elif key == "aws_s3_pool_idle_timeout_seconds":
            opts.client_options["pool_idle_timeout"] = f"{int(_duration(key, value).total_seconds())}s"
        elif key == "aws_s3_addressing_style":
            if value.lower() not in ("path", "virtual"):
                raise StorageConfigError(f"storage option AWS_S3_ADDRESSING_STYLE={value!r}: expected 'path' or 'virtual'")
            opts.config["virtual_hosted_style_request"] = "true" if value.lower() == "virtual" else "false"
        elif key == "max_retries":
            if not value.strip().isdigit():
                raise StorageConfigError(f"storage option max_retries={value!r}: expected a whole number")
            opts.retry_config["max_retries"] = int(value)
        elif key == "retry_timeout":
            opts.retry_config["retry_timeout"] = _duration(key, value)
        elif key.startswith("backoff_config."):
            name = key.removeprefix("backoff_config.")
            backoff = opts.retry_config.setdefault("backoff", {})
            if name in ("init_backoff", "max_backoff"):
                backoff[name] = _duration(key, value)
            elif name == "base":
                try:
                    backoff["base"] = float(value)
                except ValueError as e:
                    raise StorageConfigError(f"storage option {key}={value!r}: expected a number") from e
            else:
                raise StorageConfigError(f"unknown storage option {key!r}; backoff_config takes init_backoff, max_backoff, base")
        else:
            opts.config[_RENAMED.get(key, key)] = value
    _client_keys_from_env(uri, opts, environ if environ is not None else os.environ)
    if uri.kind == "s3":
        _s3_defaults(uri, opts)
    elif uri.kind == "az":
        _azure_defaults(uri, opts)
    return opts


def _client_keys_from_env(uri: TableUri, opts: ObstoreOptions, environ: Mapping[str, str]) -> None:
    own = _PREFIX[uri.kind].upper()
    for name, value in environ.items():
        if name.startswith(own):
            key = name[len(own):].lower()
            if key in _CLIENT_KEYS and key not in opts.client_options:
                opts.client_options[key] = value


def _s3_defaults(uri: TableUri, opts: ObstoreOptions) -> None:
    # Put-if-absent needs If-None-Match; every S3 and compatible server we target supports it.
    if not any(k in opts.config for k in ("aws_conditional_put", "conditional_put")):
        opts.config["conditional_put"] = "etag"
    endpoint = next((v for k, v in opts.config.items()
                     if k in ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint", "aws_endpoint_url_s3")), "")
    if endpoint.lower().startswith("http://") and not is_true(opts.client_options.get("allow_http")):
        raise StorageConfigError(
            f"the S3 endpoint {endpoint} is plain http; set AWS_ALLOW_HTTP=true in storage_options to allow it"
        )


def _azure_defaults(uri: TableUri, opts: ObstoreOptions) -> None:
    given = next((v for k, v in opts.config.items() if k in ("azure_storage_account_name", "account_name")), None)
    if uri.account:
        if given is None:
            opts.config["account_name"] = uri.account
        elif given.lower() != uri.account:
            raise StorageConfigError(
                f"{uri} names storage account {uri.account!r} but storage_options name {given!r}; make them agree"
            )
    endpoint = next((v for k, v in opts.config.items()
                     if k in ("azure_storage_endpoint", "azure_endpoint", "endpoint")), "")
    if endpoint.lower().startswith("http://") and not is_true(opts.client_options.get("allow_http")):
        raise StorageConfigError(
            f"the Azure endpoint {endpoint} is plain http; set azure_allow_http=true (or allow_http) in storage_options"
        )
