"""The progress listener on a multi-table query: its composite offset (``connector.multiplex``,
a real reader over a real store file, no Spark) gives one entry per table whose offset moved,
each in its own namespace, and the query's stop is recorded in every table's namespace it
reported (``tablestore_cdc.listener``, the filter ``start_pipeline`` attaches)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from connector.local import LocalTablestore
from connector.multiplex import MultiTableStreamReader
from connector.table_selection import MultiTableOptions
from meta_store import open_meta_store
from tablestore_cdc.listener import ProgressListener, reported_namespaces, spark_metrics
from tablestore_cdc.pipeline.queries import _selected_namespaces
from tablestore_cdc.query_record import load_query_status, load_spark_metrics


def _progress(start: dict, end: dict, batch_id: int) -> dict:
    """A progress report as Spark sends it for the multi-table source's batch (start, end]."""
    return {"id": "q-1", "runId": "r-1", "name": "changelog", "batchId": batch_id,
            "timestamp": "2026-12-06T10:00:00.000Z", "numInputRows": 3,
            "inputRowsPerSecond": 6.0, "processedRowsPerSecond": 4.0,
            "durationMs": {"triggerExecution": 750},
            "sources": [{"description": "PythonMicroBatchStream", "numInputRows": 3,
                         "startOffset": json.dumps(start), "endOffset": json.dumps(end)}]}


def test_each_table_whose_offset_moved_gets_the_batch_in_its_namespace_and_all_stop(
        tmp_path: Path) -> None:
    with LocalTablestore(tmp_path / "s.db") as store:
        for name in ("a", "b", "skip"):
            store.create_table(name, [("id", "INTEGER")], [("v", "STRING")], channels=1)
        options = MultiTableOptions.from_spark({
            "endpoint": f"local://{tmp_path}/s.db", "tables": "a,b,skip", "tunnel.name": "t",
            "tables.refreshIntervalMs": "0"})
        reader = MultiTableStreamReader(options)
        start = reader.initialOffset()
        store.put_row("a", {"id": 1}, {"v": "x"})
        end = reader.latestOffset(start, None)
        reader.stop()
    namespaces = {t: options.for_table(t).source_identity for t in ("a", "b", "skip")}
    assert end["tables"]["b"]["uuid"] == start["tables"]["b"]["uuid"]  # b did not move

    [(namespace, entry)] = spark_metrics(_progress(start, end, 4))
    assert namespace == namespaces["a"]
    assert entry["uuid"] == end["tables"]["a"]["uuid"] and entry["table"] == "a"
    assert (entry["batch_id"], entry["num_input_rows"], entry["batch_duration_ms"]) == (4, 3, 750)
    assert entry["input_rows_per_second"] == 6.0  # the query's figures: Spark has no others
    assert reported_namespaces(_progress(start, end, 4)) == {
        (namespaces[t], t) for t in ("a", "b", "skip")}
    # the first batch (no start offset): every table joined, so every table moved
    assert {ns for ns, _ in spark_metrics(_progress({}, start, 0))} == set(namespaces.values())

    # the pipeline's filter: a table the selection no longer keeps is not recorded, nor a
    # namespace that is not the table's own
    narrowed = MultiTableOptions.from_spark({
        "endpoint": f"local://{tmp_path}/s.db", "tables": "a,b,skip", "exclude": "skip",
        "tunnel.name": "t"})
    accepts = _selected_namespaces(narrowed)
    assert accepts(namespaces["a"], "a") and not accepts(namespaces["skip"], "skip")
    assert not accepts(namespaces["b"], "a") and not accepts(namespaces["a"], None)

    meta = narrowed.for_table("a").meta_store
    listener = ProgressListener(meta, namespaces=accepts)
    assert listener.record(_progress(start, end, 4)) == 1
    listener.onQueryTerminated(SimpleNamespace(id="q-1", exception=None))
    assert listener.errors == 0 and listener.wait_terminated(timeout=1)
    listener.close()
    with open_meta_store(meta) as meta_store:
        assert load_spark_metrics(meta_store, namespaces["a"])[entry["uuid"]]["batch_id"] == 4
        assert load_spark_metrics(meta_store, namespaces["b"]) == {}
        for table in ("a", "b"):  # b reported no batch, but its query stopped too
            assert (load_query_status(meta_store, namespaces[table]) or {}).get(
                "status") == "stopped"
        assert load_query_status(meta_store, namespaces["skip"]) is None
