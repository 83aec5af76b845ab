"""format("tablestore") on a real local Spark: end to end, limits, AvailableNow, errors.

All tests share the session-scoped ``spark`` fixture (testkit/fixtures.py). Kill/restart tests
live in integration/test_restart.py (they need the driver in its own process).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from connector.local import LocalTablestore
from connector.spark_compat import FEATURES
from meta_store import open_meta_store
from tablestore_cdc.sinks import ExactlyOnceParquetSink, deliveries_from_rows
from tablestore_cdc.verify import rows_by_key, verify
from testkit.waiting import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.store_table(channels=3, columns=[("name", "STRING"), ("qty", "INTEGER")]),
              pytest.mark.usefixtures("stop_queries")]


def stream(spark, store: LocalTablestore, tunnel: str = "q", **options: str):
    reader = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
              .option("table.name", "t").option("tunnel.name", tunnel))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def write_changes(store: LocalTablestore, n: int, keys: int = 60, start: int = 0) -> None:
    """Deterministic inserts, updates and deletes over ``keys`` keys."""
    for i in range(start, start + n):
        key = {"id": i % keys}
        if i % 5 == 3:
            store.delete_row("t", key)
        elif i % 5 in (1, 4):
            store.update_row("t", key, {"qty": i})
        else:
            store.put_row("t", key, {"name": f"n{i}", "qty": i})


def delivered_count(sink: ExactlyOnceParquetSink) -> int:
    return sum(1 for _ in sink.deliveries(["id"]))


@pytest.mark.oldest_spark
def test_end_to_end_with_concurrent_writer_splits_and_merge(spark, store, tmp_path):
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    query = (stream(spark, store, maxOffsetsPerChannel="200").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())

    def writer() -> None:
        write_changes(store, 600)
        first = store.list_channels("t")[0].channel_id
        a, b = store.split_channel("t", first)
        write_changes(store, 600, start=600)
        store.merge_channels("t", a, b)
        write_changes(store, 600, start=1200)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    expected = len(store.change_log("t"))
    wait_until(f"{expected} changes in the sink", lambda: delivered_count(sink),
               lambda n: n >= expected, timeout=120, interval=0.25, query=query)
    query.stop()
    assert query.exception() is None
    result = verify(store.change_log("t"), sink.deliveries(["id"]),
                    rows_by_key(store.scan("t")))
    assert result.ok, result.summary() + str(result.examples)
    assert result.delivered == expected == 1800
    channels = store.list_channels("t")
    assert len(channels) == 6 and sum(c.closed for c in channels) == 3  # split + merge happened


def test_a_batch_read_twice_yields_identical_rows(spark, store, tmp_path):
    write_changes(store, 300)
    reads: list[tuple[list, list]] = []

    def read_twice(df, batch_id):
        first = sorted((r._channel_id, r._sequence) for r in df.collect())
        second = sorted((r._channel_id, r._sequence) for r in df.collect())
        reads.append((first, second))

    query = (stream(spark, store).writeStream.foreachBatch(read_twice)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    write_changes(store, 100, start=300)
    query.processAllAvailable()
    query.stop()
    assert query.exception() is None
    assert reads and all(first == second for first, second in reads)
    assert sum(len(first) for first, _ in reads) == 400


@pytest.mark.oldest_spark
def test_max_offsets_per_channel_and_per_trigger(spark, store, tmp_path):
    write_changes(store, 240)
    per_batch: list[dict[str, int]] = []

    def count(df, batch_id):
        per_batch.append({r["_channel_id"]: r["count"] for r in
                          df.groupBy("_channel_id").count().collect()})

    query = (stream(spark, store, maxOffsetsPerChannel="30", maxOffsetsPerTrigger="50")
             .writeStream.foreachBatch(count)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    query.stop()
    assert query.exception() is None
    assert sum(sum(b.values()) for b in per_batch) == 240
    assert all(n <= 30 for b in per_batch for n in b.values())
    assert all(sum(b.values()) <= 50 for b in per_batch)
    assert len(per_batch) >= 240 // 50


@pytest.mark.skipif(not FEATURES.available_now, reason="PySpark < 4.2 runs AvailableNow as one "
                    "batch: test_available_now_without_spark_support_runs_one_batch_per_run")
def test_available_now_stops_at_the_start_time_end(spark, store, tmp_path):
    write_changes(store, 150)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write_changes(store, 150, start=150)
    before_start = {(r.channel_id, r.sequence) for r in store.change_log("t")}
    delivered: list[tuple[str, str]] = []

    def sink(df, batch_id):
        delivered.extend((r._channel_id, r._sequence) for r in df.collect())
        if batch_id == 0:  # written after the run started: must not be read by this run
            write_changes(store, 50, start=300)

    query = (stream(spark, store, maxOffsetsPerChannel="40").writeStream.foreachBatch(sink)
             .trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    assert query.awaitTermination(180), "AvailableNow did not stop by itself"
    assert query.exception() is None
    assert sorted(delivered) == sorted(before_start)


@pytest.mark.oldest_spark
@pytest.mark.skipif(FEATURES.available_now, reason="PySpark 4.2+ runs AvailableNow itself: "
                    "test_available_now_stops_at_the_start_time_end")
def test_available_now_without_spark_support_runs_one_batch_per_run(spark, store, tmp_path):
    """PySpark 4.0/4.1: Spark runs an AvailableNow query as one batch, bounded by the source's
    limits, and stops; runs one after the other read everything, exactly once."""
    write_changes(store, 150)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    write_changes(store, 150, start=150)
    expected = len(store.change_log("t"))
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    batches_per_run: list[int] = []
    while delivered_count(sink) < expected and len(batches_per_run) < 12:
        batches: list[int] = []

        def record(df, batch_id, batches=batches):
            batches.append(batch_id)
            sink(df, batch_id)

        query = (stream(spark, store, maxOffsetsPerChannel="40").writeStream
                 .foreachBatch(record).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        assert query.awaitTermination(180), "AvailableNow did not stop by itself"
        assert query.exception() is None
        batches_per_run.append(len(batches))
    assert all(n == 1 for n in batches_per_run), batches_per_run
    assert len(batches_per_run) >= 300 // (3 * 40)  # 40 per channel per batch: several runs
    result = verify(store.change_log("t"), sink.deliveries(["id"]),
                    rows_by_key(store.scan("t")))
    assert result.ok and result.delivered == expected, result.summary()


@pytest.mark.oldest_spark
@pytest.mark.skipif(FEATURES.available_now, reason="PySpark 4.2+ runs AvailableNow itself; "
                    "the wrapper is only used for sources without it")
def test_spark_s_available_now_wrapper_is_refused_without_spark_support(spark, store, tmp_path):
    """Spark's internal wrapper asks for a batch before it says where its offset log ends."""
    write_changes(store, 50)
    spark.conf.set("spark.sql.streaming.triggerAvailableNowWrapper.enabled", "true")
    try:
        query = (stream(spark, store).writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        with pytest.raises(StreamingQueryException, match="SparkCallOrderError.*PySpark 4.2"):
            query.awaitTermination(180)
    finally:
        spark.conf.unset("spark.sql.streaming.triggerAvailableNowWrapper.enabled")


def idle_triggers(query, after_rows: int = 0) -> int:
    """Triggers that ran no batch since the last batch that ran, as Spark reports them (a
    progress entry without ``addBatch``, at most one per ``noDataProgressEventInterval``);
    0 until the last batch reported read ``after_rows`` rows (0 also when no batch ran)."""
    idle, last_rows = 0, 0
    for progress in query.recentProgress:
        if "addBatch" in progress["durationMs"]:
            idle, last_rows = 0, progress["numInputRows"]
        else:
            idle += 1
    return idle if last_rows == after_rows else 0


@pytest.fixture
def idle_triggers_reported(spark):
    """Queries started in the test report every idle trigger (Spark's default: one report per
    10 s), so a test can wait for "Spark asked and found nothing" instead of sleeping."""
    key = "spark.sql.streaming.noDataProgressEventInterval"
    spark.conf.set(key, "100ms")
    yield
    spark.conf.unset(key)


@pytest.mark.usefixtures("idle_triggers_reported")
def test_idle_tunnel_runs_no_batches(spark, store, tmp_path):
    batches: list[int] = []
    query = (stream(spark, store).writeStream
             .foreachBatch(lambda df, batch_id: batches.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    # wait until Spark has triggered a few times and run no batch (slow under load); a second
    # batch ends the wait too: the assertion below reports it
    wait_until("3 idle triggers", lambda: (idle_triggers(query), len(batches)),
               lambda seen: seen[0] >= 3 or seen[1] > 1, timeout=120, query=query)
    # Spark runs one empty batch 0 on a fresh start (its first offset is new to it); after
    # that an idle tunnel runs nothing and mints no UUIDs
    assert batches in ([], [0])
    idle = list(batches)
    meta = open_meta_store(f"sqlite://{Path(store.path).with_suffix('')}.meta.db")
    (namespace,) = meta.list_namespaces()
    assert len(meta.list_batches(namespace)) == 1  # only the initial offset
    store.put_row("t", {"id": 1}, {"name": "x"})
    wait_until(f"batches {[*idle, 1]}", lambda: list(batches),
               lambda seen: seen == [*idle, 1], timeout=60, query=query)
    wait_until("3 idle triggers after the batch of 1 row",
               lambda: (idle_triggers(query, after_rows=1), len(batches)),
               lambda seen: seen[0] >= 3 or seen[1] > len(idle) + 1, timeout=60, query=query)
    query.stop()
    assert batches == [*idle, 1]


def test_user_schema_keeps_undeclared_values(spark, store, tmp_path):
    store.put_row("t", {"id": 1}, {"name": "a", "colour": "red"})  # undeclared attribute
    rows: list = []
    df = (spark.readStream.format("tablestore").schema(
        "id long, name string, _op string, _channel_id string, _sequence string, _extra string")
        .option("endpoint", f"local://{store.path}").option("table.name", "t")
        .option("tunnel.name", "q").load())
    query = (df.writeStream.foreachBatch(lambda d, i: rows.extend(d.collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    query.stop()
    assert [(r.id, r.name, r._extra) for r in rows] == [(1, "a", '{"colour":"red"}')]
    got = list(deliveries_from_rows([r.asDict() for r in rows], ["id"]))
    assert got[0].after == {"name": "a", "colour": "red"}


def test_bad_option_fails_at_load_with_a_did_you_mean(spark, store):
    with pytest.raises(Exception, match="did you mean 'maxOffsetsPerChannel'"):
        stream(spark, store, maxOffsetPerChannel="5")


def test_checkpoint_of_another_table_is_refused(spark, store, tmp_path):
    store.create_table("other", primary_key=[("id", "INTEGER")], channels=1)
    store.put_row("t", {"id": 1}, {"name": "a"})
    ckpt = str(tmp_path / "ckpt")
    first = stream(spark, store).writeStream.foreachBatch(lambda d, i: d.count())
    query = first.option("checkpointLocation", ckpt).start()
    query.processAllAvailable()
    query.stop()
    store.put_row("other", {"id": 1}, {})
    other = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
             .option("table.name", "other").option("tunnel.name", "q").load())
    query = other.writeStream.foreachBatch(lambda d, i: d.count()).option(
        "checkpointLocation", ckpt).start()
    with pytest.raises(Exception, match="checkpoint location was written by source"):
        query.awaitTermination(60)
