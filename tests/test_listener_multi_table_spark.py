"""A multi-table pipeline attaches the progress listener (real Spark, real SQLite, real Delta):
after a ``Trigger.AvailableNow`` run of two tables, each table's batches in its own namespace
carry Spark's batch metrics as ``meta batches`` and the feed read them, and after ``stop()``
each table's query status is ``stopped`` and the listener is detached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from meta_store import open_meta_store
from tablestore_cdc.feed.polling import feed_records
from tablestore_cdc.pipeline import ApplySettings
from tablestore_cdc.pipeline.multi_table import start_pipeline, status_location
from tablestore_cdc.query_record import load_query_status

pytestmark = pytest.mark.slow
pytest.importorskip("deltalake")


def test_each_table_of_a_multi_table_run_gets_spark_metrics_and_its_stop(
        spark: Any, tmp_path: Path) -> None:
    store_path, out = tmp_path / "store.db", tmp_path / "out"
    endpoint = f"local://{store_path}"
    with LocalTablestore(store_path) as store:
        for name in ("t1", "t2"):
            store.create_table(name, [("id", "INTEGER")], [("v", "STRING")], channels=1)
            for i in range(5):
                store.put_row(name, {"id": i}, {"v": f"{name}-{i}"})
    pipeline = start_pipeline(
        spark, endpoint, "t*", "replicate", out, ApplySettings(f"delta://{out}/lake/{{table}}"),
        once=True)
    listener = pipeline.listener
    try:
        pipeline.state_query.awaitTermination()
        pipeline.check()
    finally:
        pipeline.stop()
    assert pipeline.listener is None and listener.errors == 0
    for table in ("t1", "t2"):
        meta, credentials, namespace = status_location(endpoint, "t*", "replicate", None, table)
        with open_meta_store(meta, credentials) as store:
            moved = [r for r in feed_records(store, namespace) if not r["initial"]]
            status = load_query_status(store, namespace)
        assert moved, table
        assert all(r["query"] is not None and r["query"]["name"] == pipeline.changelog.name
                   and r["query"]["query_id"] == str(pipeline.changelog.id)
                   and r["spark_batch_id"] == r["query"]["batch_id"] for r in moved), [
            (r["query"], r["spark_batch_id"]) for r in moved]
        assert (status or {}).get("status") == "stopped", (table, status)
