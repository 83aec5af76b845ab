"""The apply sink in a real local Spark stream: ``foreachBatch(DeltaApplySink(...))`` and
``foreachBatch(IcebergApplySink(...))`` on ``format("tablestore")`` while the table's channels
split and merge and a column no one declared appears; the tables, read back with deltalake /
pyiceberg, equal the store's table and (SCD 2) its change log's history."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg")

from connector.local import LocalTablestore  # noqa: E402
from tablestore_cdc.lakehouse import DeltaApplySink, IcebergApplySink  # noqa: E402
from tablestore_cdc.lakehouse.iceberg import sqlite_catalog_properties  # noqa: E402
from tablestore_cdc.verify import read_delta, rows_by_key, table_state  # noqa: E402
from testkit.target_reads import (  # noqa: E402
    history_mismatches,
    read_iceberg,
    source_history,
    table_history,
)

pytestmark = pytest.mark.slow


def write(store: LocalTablestore, start: int, n: int, colour: bool = False) -> None:
    for i in range(start, start + n):
        key = {"id": i % 30}
        if i % 7 == 3:
            store.delete_row("t", key)
        elif i % 3 == 1:
            store.update_row("t", key, {"qty": i})
        else:
            extra = {"colour": f"c{i % 4}"} if colour else {}
            store.put_row("t", key, {"name": f"n{i}", "qty": i, **extra})


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_stream_with_splits_a_merge_and_a_new_column_applies_exactly(spark, tmp_path: Path,
                                                                       kind: str) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=2)
    if kind == "delta":
        sink = DeltaApplySink(tmp_path / "orders", scd=2, schema_drift="add")

        def rows() -> list[dict]:
            return read_delta(str(tmp_path / "orders"))
    else:
        properties = sqlite_catalog_properties(str(tmp_path / "warehouse"))
        sink = IcebergApplySink(properties, "cdc.orders", scd=2, schema_drift="add")

        def rows() -> list[dict]:
            return read_iceberg(properties, "cdc.orders")

    write(store, 0, 120)
    query = (spark.readStream.format("tablestore")
             .option("endpoint", f"local://{store.path}").option("table.name", "t")
             .option("tunnel.name", kind).option("maxOffsetsPerChannel", "40").load()
             .writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        first = store.list_channels("t")[0].channel_id
        store.split_channel("t", first)
        write(store, 120, 100, colour=True)  # an attribute the table never declared
        children = [c.channel_id for c in store.list_channels("t") if c.parent_ids == (first,)]
        store.merge_channels("t", *children)
        write(store, 220, 100, colour=True)
        source = {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
        deadline = time.monotonic() + 240
        while True:  # children join once their parents' ends are pushed: a few batches
            query.processAllAvailable()
            if table_state(rows(), ["id"]) == source or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        query.stop()
    assert query.exception() is None
    applied = rows()
    assert table_state(applied, ["id"]) == source
    assert not history_mismatches(source_history(store.change_log("t")),
                                  table_history(applied, ["id"]))
    assert {r["colour"] for r in applied} >= {None, "c0", "c1"}
    assert sink.committed_batch(str(query.id)) == query.lastProgress["batchId"]
    assert any(c.parent_ids for c in store.list_channels("t") if len(c.parent_ids) == 2)


@pytest.mark.parametrize("kind", ["delta", "iceberg",
                                  pytest.param("delta+s3", marks=pytest.mark.extended)])
def test_batches_have_their_data_files_written_by_the_executors(
        spark, tmp_path: Path, kind: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``executor_write_rows=1``: every batch's data files — the first load's appends and
    the stream's rewrites — are written by Spark's Python workers (processes other than this
    driver), and the driver makes the one commit; the table equals the source. A Delta table
    in S3 (moto's server): its appends' files are written by the executors straight into the
    bucket, its rewrites by delta-rs' MERGE."""
    import os

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=2)
    for i in range(300):
        store.put_row("t", {"id": i}, {"name": f"n{i}", "qty": i})
    if kind == "delta+s3":
        from testkit.aws import AWS_TEST_ENV, new_s3_bucket

        bucket = new_s3_bucket(request.getfixturevalue("moto_endpoint"), monkeypatch)
        location = f"s3://{bucket}/orders"
        # the key pair as storage options: the suite's Spark workers started before this
        # test's AWS environment (a job's executors have it from their start)
        sink = DeltaApplySink(location, storage_options={
            "aws_allow_http": "true", "aws_access_key_id": AWS_TEST_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": AWS_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
            "aws_session_token": AWS_TEST_ENV["AWS_SESSION_TOKEN"]}, executor_write_rows=1)
    elif kind == "delta":
        sink = DeltaApplySink(tmp_path / "orders", executor_write_rows=1)
    else:
        sink = IcebergApplySink(sqlite_catalog_properties(str(tmp_path / "warehouse")),
                                "cdc.orders", executor_write_rows=1)
    results = []
    query = (spark.readStream.format("tablestore")
             .option("endpoint", f"local://{store.path}").option("table.name", "t")
             .option("tunnel.name", "executors").option("maxOffsetsPerChannel", "100").load()
             .writeStream.foreachBatch(lambda df, i: (sink(df, i), results.append(
                 sink.last_result)))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        write(store, 0, 60)  # updates and deletes of loaded keys: files rewritten
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    committed = [r for r in results if r is not None and r.committed and r.upserts]
    assert any(r.appended for r in committed) and any(not r.appended for r in committed)
    by_executors = [r for r in committed if r.appended or kind != "delta+s3"]
    assert all(r.written_by and os.getpid() not in r.written_by for r in by_executors)
    assert all(not r.written_by for r in committed if r not in by_executors)
    source = {k: dict(v) for k, v in rows_by_key(store.scan("t")).items()}
    if kind == "delta+s3":
        from deltalake import DeltaTable

        table = DeltaTable(location, storage_options={"aws_allow_http": "true"})
        rows = table.to_pyarrow_table().to_pylist()
        files = table.file_uris()
        assert files and all(f.startswith(f"s3://{bucket}/orders/part-") for f in files)
    else:
        rows = (read_delta(str(tmp_path / "orders")) if kind == "delta" else read_iceberg(
            sqlite_catalog_properties(str(tmp_path / "warehouse")), "cdc.orders"))
    assert table_state(rows, ["id"]) == source
