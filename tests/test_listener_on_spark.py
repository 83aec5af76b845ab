"""``ProgressListener`` registered with a real Spark session: each batch's progress reaches it
as the report's JSON in one py4j call (``listener._ProgressAsJson``), not through PySpark's
field-by-field conversion, and the query's stop still reaches it through PySpark's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from meta_store import open_meta_store
from tablestore_cdc.feed.reading import user_namespaces
from tablestore_cdc.listener import ProgressListener
from tablestore_cdc.query_record import load_query_status, load_spark_metrics
from testkit.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.oldest_spark]  # PySpark internals: 4.0 too


def test_each_batch_reaches_the_listener_as_its_json(spark: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql.streaming.listener import QueryProgressEvent

    def refused(*args: Any) -> Any:
        raise AssertionError("the progress event converted field by field")

    # PySpark's conversion of a listener's progress event refused: only the JSON path records
    monkeypatch.setattr(QueryProgressEvent, "fromJObject", classmethod(refused))
    with LocalTablestore(tmp_path / "s.db") as store:
        store.create_table("t", [("id", "INTEGER")], [("v", "STRING")], channels=2)
        store.batch_write("t", [("put", {"id": i}, {"v": str(i)}) for i in range(50)])
    meta = f"sqlite://{tmp_path / 'meta.db'}"
    listener = ProgressListener(meta)
    spark.streams.addListener(listener)
    try:
        query = (spark.readStream.format("tablestore")
                 .option("endpoint", f"local://{tmp_path / 's.db'}").option("table.name", "t")
                 .option("tunnel.name", "json").option("meta.store", meta)
                 .option("maxOffsetsPerChannel", "10").load()
                 .writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(120)
        batches = {p["batchId"] for p in query.recentProgress if p["numInputRows"]}
        assert batches, query.recentProgress  # (PySpark 4.0's AvailableNow: one batch)
        with open_meta_store(meta) as store:
            namespace = user_namespaces(store)[0]
            wait_until("every batch's progress recorded",
                       lambda: {e["batch_id"] for e in load_spark_metrics(store,
                                                                         namespace).values()},
                       lambda recorded: recorded >= batches, timeout=30)
            assert listener.wait_terminated(timeout=30)
            assert (load_query_status(store, namespace) or {}).get("status") == "stopped"
        assert listener.errors == 0
    finally:
        spark.streams.removeListener(listener)
        listener.close()
