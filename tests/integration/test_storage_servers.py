"""The storage edge against real local servers: versitygw (S3), Azurite (Azure) and fake-gcs-server (GCS)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from obstore.exceptions import AlreadyExistsError
from obstore.store import S3Store

from deltacoord.storage.table import ObjectNotFoundError, RangeReader, StorageError, TableStorage
from tests.conftest import StoreBucket, StoreServer

pytestmark = pytest.mark.storage

T = TypeVar("T")


def race(n: int, attempt: Callable[[int], T]) -> list[T]:
    """Run attempt(0..n-1) in n threads released together; their results by index."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        results[i] = attempt(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_s3_server_refuses_the_second_conditional_put_with_412(s3_bucket: StoreBucket) -> None:
    """The evidence behind choosing the S3 server: If-None-Match: * is enforced, not ignored."""
    opts = s3_bucket.storage_options
    raw = S3Store(s3_bucket.name, config={
        "endpoint": opts["AWS_ENDPOINT_URL"], "access_key_id": opts["AWS_ACCESS_KEY_ID"],
        "secret_access_key": opts["AWS_SECRET_ACCESS_KEY"], "region": opts["AWS_REGION"], "conditional_put": "etag",
    }, client_options={"allow_http": True})
    obstore.put(raw, "k", b"first", mode="create")
    with pytest.raises(AlreadyExistsError) as refused:
        obstore.put(raw, "k", b"second", mode="create")
    assert "412 Precondition Failed" in str(refused.value)
    assert bytes(obstore.get(raw, "k").bytes()) == b"first"
    # Racing conditional puts of one key: exactly one 200, every other one 412 (or 409).
    for round_ in range(10):
        statuses = race(8, lambda i, key=f"race/{round_}": _conditional_put_status(raw, key, f"w{i}".encode()))  # type: ignore[misc]
        assert statuses.count("200") == 1, statuses
        assert set(statuses) <= {"200", "412", "409"}, statuses


def _conditional_put_status(store: S3Store, key: str, data: bytes) -> str:
    try:
        obstore.put(store, key, data, mode="create")
        return "200"
    except AlreadyExistsError as e:
        return "412" if "412" in str(e) else "409" if "409" in str(e) else str(e)


def test_put_get_head_list_delete(object_store_bucket: StoreBucket) -> None:
    store = TableStorage(object_store_bucket.table_uri("tables/t1"), object_store_bucket.storage_options)
    assert store.location == object_store_bucket.table_uri("tables/t1")
    store.put("_delta_log/_last_checkpoint", b'{"version":1}')
    store.put("_delta_log/_last_checkpoint", b'{"version":22}')
    assert store.get("_delta_log/_last_checkpoint") == b'{"version":22}'
    info = store.head("_delta_log/_last_checkpoint")
    assert (info.key, info.size) == ("_delta_log/_last_checkpoint", 14)
    assert store.get_range("_delta_log/_last_checkpoint", 2, 7) == b"version"
    for key in ("part-0.parquet", "a=1/part-1.parquet", "odd name/ü %.json"):
        store.put(key, key.encode())
    # Another table in the same bucket is not listed.
    TableStorage(object_store_bucket.table_uri("tables/t10"), object_store_bucket.storage_options).put("x", b"x")
    assert [o.key for o in store.list()] == sorted(
        ["_delta_log/_last_checkpoint", "part-0.parquet", "a=1/part-1.parquet", "odd name/ü %.json"]
    )
    assert store.get("odd name/ü %.json") == "odd name/ü %.json".encode()
    store.delete("part-0.parquet")
    store.delete("part-0.parquet")  # deleting a missing key is not an error
    assert not store.exists("part-0.parquet")
    with pytest.raises(ObjectNotFoundError):
        store.get("part-0.parquet")
    with pytest.raises(ObjectNotFoundError):
        store.head("part-0.parquet")
    assert store.list("nothing-here") == []


def test_list_from_a_version(object_store_bucket: StoreBucket) -> None:
    store = TableStorage(object_store_bucket.table_uri("t"), object_store_bucket.storage_options)
    for v in range(12):
        store.put(f"_delta_log/{v:020d}.json", b"{}")
    store.put(f"_delta_log/{10:020d}.checkpoint.parquet", b"pq")
    store.put("_delta_log/_last_checkpoint", b"{}")
    store.put("part-0.parquet", b"data")
    after = [o.key for o in store.list("_delta_log", start_after=f"_delta_log/{9:020d}.json")]
    assert after == [f"_delta_log/{10:020d}.checkpoint.parquet", f"_delta_log/{10:020d}.json",
                     f"_delta_log/{11:020d}.json", "_delta_log/_last_checkpoint"]
    everything = [o.key for o in store.list("_delta_log")]
    assert everything == sorted(everything) and len(everything) == 14


def test_put_if_absent_race_between_threads(object_store_bucket: StoreBucket) -> None:
    store = TableStorage(object_store_bucket.table_uri("t"), object_store_bucket.storage_options)
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"v0") is True
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"v0") is False
    for round_ in range(1, 11):
        key = f"_delta_log/{round_:020d}.json"
        results = race(8, lambda i, key=key: store.put_if_absent(key, f"writer {i}".encode()))  # type: ignore[misc]
        assert results.count(True) == 1, results
        assert store.get(key) == f"writer {results.index(True)}".encode()


def _contend_in_process(uri: str, options: dict[str, str], key: str, i: int, start: Any) -> bool:
    start.wait()
    return TableStorage(uri, options).put_if_absent(key, f"process {i}".encode())


def test_put_if_absent_race_between_processes(object_store_bucket: StoreBucket) -> None:
    uri, options = object_store_bucket.table_uri("t"), object_store_bucket.storage_options
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for round_ in range(3):
            key = f"_delta_log/{round_:020d}.json"
            start = manager.Event()
            pending = [pool.apply_async(_contend_in_process, (uri, options, key, i, start)) for i in range(4)]
            start.set()
            results = [p.get(timeout=120) for p in pending]
            assert results.count(True) == 1, results
            assert TableStorage(uri, options).get(key) == f"process {results.index(True)}".encode()


def test_reading_one_row_group_of_a_100mb_parquet_file_fetches_only_that_row_group(
    object_store_bucket: StoreBucket,
) -> None:
    store = TableStorage(object_store_bucket.table_uri("t"), object_store_bucket.storage_options)
    rows = 12_500_000  # 100 MB of incompressible int64s, ten row groups
    values = np.random.default_rng(1).integers(0, 2**62, size=rows, dtype=np.int64)
    size = store.write_parquet("part-0.parquet", pa.table({"v": values}), row_group_size=rows // 10, compression="none")
    assert size == store.head("part-0.parquet").size and size > 100_000_000
    reader = store.open_input("part-0.parquet")
    assert isinstance(reader, RangeReader)
    pf = pq.ParquetFile(reader)
    assert pf.metadata.num_row_groups == 10
    group = pf.read_row_group(3)
    assert group.column("v").to_numpy()[0] == values[3 * rows // 10]
    one_group = pf.metadata.row_group(3).total_byte_size
    # Footer + one row group: far less than the object (the whole would be > 100 MB).
    assert reader.bytes_fetched < one_group + 1_000_000 < size // 5, (reader.bytes_fetched, one_group, size)


def test_writer_is_all_or_nothing(object_store_bucket: StoreBucket) -> None:
    store = TableStorage(object_store_bucket.table_uri("t"), object_store_bucket.storage_options)
    with pytest.raises(RuntimeError), store.open_output("part-1.parquet") as out:
        out.write(b"partial")
        raise RuntimeError("writer failed")
    assert not store.exists("part-1.parquet")
    table = pa.table({"id": [1, 2, 3]})
    store.write_parquet("part-2.parquet", table)
    assert pq.read_table(store.open_input("part-2.parquet")).equals(table)


def test_credentials_from_the_environment(object_store_bucket: StoreBucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no storage_options the cloud's environment variables configure the client."""
    for key, value in object_store_bucket.storage_options.items():
        monkeypatch.setenv(key.upper(), value)
    TableStorage(object_store_bucket.table_uri("t"), object_store_bucket.storage_options).put("k", b"via options")
    assert TableStorage(object_store_bucket.table_uri("t")).get("k") == b"via options"


def test_wrong_credentials_fail_clearly(s3_bucket: StoreBucket) -> None:
    options = dict(s3_bucket.storage_options, AWS_SECRET_ACCESS_KEY="wrong")
    with pytest.raises(StorageError, match="failed"):
        TableStorage(s3_bucket.table_uri("t"), options).put("k", b"x")


def test_delta_rs_table_is_listed_through_the_edge(object_store_bucket: StoreBucket) -> None:
    """delta-rs writes with the server's storage_options (see `StoreServer.storage_options`); the edge reads its log.

    What delta-rs 1.6 needs on each local server:
    - S3 (versitygw): AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
      AWS_ALLOW_HTTP=true and aws_conditional_put=etag (its commits then use If-None-Match).
    - Azurite: azure_storage_account_name, azure_storage_account_key, azure_storage_endpoint
      (http://127.0.0.1:PORT/devstoreaccount1) and azure_allow_http=true; az:// and abfss:// both work.
    - fake-gcs-server: google_service_account_key, a JSON document with gcs_base_url and
      disable_oauth=true, plus google_allow_http=true.
    """
    from deltalake import DeltaTable, write_deltalake

    uri, options = object_store_bucket.table_uri("dl/t1"), object_store_bucket.storage_options
    write_deltalake(uri, pa.table({"id": [1, 2, 3]}), storage_options=options)
    write_deltalake(uri, pa.table({"id": [4]}), storage_options=options, mode="append")
    store = TableStorage(uri, options)
    log = [o.key for o in store.list("_delta_log")]
    assert log[:2] == ["_delta_log/00000000000000000000.json", "_delta_log/00000000000000000001.json"], log
    actions = [json.loads(line) for line in store.get(log[0]).decode().splitlines()]
    assert {"protocol", "metaData", "add", "commitInfo"} <= {k for a in actions for k in a}
    adds = [a["add"]["path"] for a in actions if "add" in a]
    assert all(store.exists(p) for p in adds)
    assert store.list("_delta_log", start_after=log[0])[0].key == log[1]
    # And delta-rs reads what is there, through the same options.
    assert sorted(DeltaTable(uri, storage_options=options).to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3, 4]


def test_delta_rs_on_abfss_uris(azurite_server: StoreServer) -> None:
    bucket = azurite_server.new_bucket()
    from deltalake import DeltaTable, write_deltalake

    uri = f"abfss://{bucket.name}@devstoreaccount1.dfs.core.windows.net/t"
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=bucket.storage_options)
    store = TableStorage(uri, bucket.storage_options)
    assert store.location == uri
    assert [o.key for o in store.list("_delta_log")] == ["_delta_log/00000000000000000000.json"]
    assert TableStorage(f"az://{bucket.name}/t", bucket.storage_options).exists("_delta_log/00000000000000000000.json")
    assert DeltaTable(uri, storage_options=bucket.storage_options).version() == 0


def test_a_forked_child_gets_an_error_instead_of_a_hang(s3_bucket: StoreBucket) -> None:
    uri, options = s3_bucket.table_uri("t"), s3_bucket.storage_options
    TableStorage(uri, options).put("k", b"parent")
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        code = 3
        try:
            TableStorage(uri, options).get("k")
            code = 1
        except StorageError as e:
            code = 0 if "forked" in str(e) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in the object store")
        time.sleep(0.1)
    assert os.waitstatus_to_exitcode(status) == 0
    assert TableStorage(uri, options).get("k") == b"parent", "the parent is unaffected"
