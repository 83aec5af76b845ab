"""A total order of every key's changes across channel splits and merges, on a real local Spark
(docs/schema.md, "Order"): the batch id a ``foreachBatch`` sink records with the rows, then
``_sequence``. A child channel is read only in a batch after its parents were read to their end,
and within one batch a key's changes come from one channel, so ``struct(batch, _sequence)`` is a
strict order per key; ``max_by(struct(*), struct(batch, _sequence))`` per key is then the
source's current row, which ``_sequence`` alone does not give after a split or merge, and SCD 2
intervals built in that order equal the apply sink's history of the same stream."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from tablestore_cdc.lakehouse import DeltaApplySink
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import key_of, read_delta
from testkit.fixtures import write_changes
from testkit.target_reads import history_mismatches, table_history

pytestmark = [pytest.mark.slow,
              pytest.mark.store_table(channels=2, columns=[("name", "STRING"), ("qty", "INTEGER")])]


def test_batch_then_sequence_orders_each_key_across_splits_and_merges(spark, store, tmp_path):
    write_changes(store, 300)
    first = store.list_channels("t")[0].channel_id
    a, b = store.split_channel("t", first)
    write_changes(store, 300, start=300)
    store.merge_channels("t", a, b)
    write_changes(store, 300, start=600)
    sink = ExactlyOnceParquetSink(tmp_path / "log")
    applied = DeltaApplySink(tmp_path / "history", scd=2)

    def both(df: Any, batch_id: int) -> None:  # a batch read twice yields the same rows
        sink(df, batch_id)
        applied(df, batch_id)

    query = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
             .option("table.name", "t").option("tunnel.name", "q")
             .option("maxOffsetsPerChannel", "100").load()
             .writeStream.foreachBatch(both)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    log = spark.read.parquet(str(tmp_path / "log"))  # the sink's batch=<id> directories
    assert log.count() == len(store.change_log("t")) == 900
    order = F.struct("batch", "_sequence")
    # strict: no key has two changes at the same place in the order
    assert log.groupBy("id", "batch", "_sequence").count().where("count > 1").count() == 0

    def current(by: object) -> dict[int, tuple]:
        latest = (log.groupBy("id").agg(F.max_by(F.struct("_op", "name", "qty"), by)
                                        .alias("r")).where("r._op != 'DELETE'"))
        return {row.id: (row.r.name, row.r.qty) for row in latest.collect()}

    source = {pk["id"]: (attrs.get("name"), attrs.get("qty")) for pk, attrs in store.scan("t")}
    assert current(order) == source
    # the per-channel _sequence alone is not an order across channels: after the split and
    # the merge (the embedded store starts a child's sequences at 1 again) it picks old rows
    assert current(F.col("_sequence")) != source
    channels = store.list_channels("t")
    assert sum(c.closed for c in channels) == 3  # one split and one merge happened

    # SCD 2 from the same order: each PUT/UPDATE opens a version, the key's next change ends it
    delta = table_history(read_delta(str(tmp_path / "history")), ["id"])
    history = scd2_history(log, "batch", "_sequence")
    assert len(delta) == len(history) and not history_mismatches(history, delta)
    assert history_mismatches(scd2_history(log, "_sequence"), delta)  # the channel's alone


def scd2_history(log: Any, *order: str) -> dict[str, list]:
    """key -> SCD 2 versions of the change log ``log`` in ``order`` (``verify``'s shape)."""
    by_key = Window.partitionBy("id").orderBy(*order)
    versions = (log.withColumn("end_at", F.lead("_commit_ts").over(by_key))
                .where("_op != 'DELETE'").collect())
    history: dict[str, list] = {}
    for v in versions:
        image = {k: v[k] for k in ("name", "qty") if v[k] is not None}
        history.setdefault(key_of({"id": v["id"]}), []).append(
            (_micros(v["_commit_ts"]), None if v["end_at"] is None else _micros(v["end_at"]),
             image))
    return history


def _micros(value: Any) -> int:
    import datetime as dt

    if value.tzinfo is None:  # Spark hands local times: the session's time zone
        value = value.astimezone()
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
