"""``snapshot.op`` on a real local Spark over the embedded store: a BaseAndStream tunnel's base
data (the rows the table holds when the tunnel is created) read as ``_op`` READ, the stream's
changes as PUT, UPDATE and DELETE; by default the base rows stay PUT. The apply sink upserts the
READ rows: its Delta table equals the source table (docs/schema.md, "Snapshot rows")."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from connector.local import LocalTablestore
from tablestore_cdc.lakehouse import DeltaApplySink
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import read_delta, rows_by_key, table_state

pytestmark = [pytest.mark.slow, pytest.mark.store_table(channels=2, columns=[]),
              pytest.mark.usefixtures("stop_queries")]


def stream(spark, store: LocalTablestore, tunnel: str, **options: str):
    reader = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
              .option("table.name", "t").option("tunnel.name", tunnel)
              .option("tunnel.type", "BaseAndStream"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def snapshot_then_changes(store: LocalTablestore) -> None:
    """Ten rows before the tunnel exists; the caller creates it; then ``changes``."""
    for i in range(10):
        store.put_row("t", {"id": i}, {"qty": i, "name": f"n{i}"})


def changes(store: LocalTablestore) -> None:
    store.update_row("t", {"id": 1}, {"qty": 100})
    store.delete_row("t", {"id": 2})
    store.put_row("t", {"id": 20}, {"qty": 20})


def ops_by_key(rows: list[dict]) -> dict[int, list[str]]:
    ordered = sorted(rows, key=lambda r: (r["_channel_id"].startswith("base-") is False,
                                          r["_channel_id"], r["_sequence"]))
    out: dict[int, list[str]] = {}
    for row in ordered:
        out.setdefault(row["id"], []).append(row["_op"])
    return out


def test_base_rows_are_read_then_the_stream_and_the_apply_upserts_them(spark, store, tmp_path):
    snapshot_then_changes(store)
    # the tunnel is created by the query's start: the snapshot is the table at that instant
    sink = ExactlyOnceParquetSink(tmp_path / "log")
    delta = DeltaApplySink(str(tmp_path / "lake"), key_columns=["id"])

    def both(batch, batch_id):
        sink(batch, batch_id)
        delta(batch, batch_id)

    query = (stream(spark, store, "marked", **{"snapshot.op": "READ"}).writeStream
             .foreachBatch(both).option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    changes(store)
    query.processAllAvailable()
    query.stop()
    rows = pq.read_table(tmp_path / "log").to_pylist()
    ops = ops_by_key(rows)
    assert {i: ops[i][0] for i in range(10)} == dict.fromkeys(range(10), "READ")
    assert ops[1] == ["READ", "UPDATE"] and ops[2] == ["READ", "DELETE"] and ops[20] == ["PUT"]
    assert all(r["_channel_id"].startswith("base-") == (r["_op"] == "READ") for r in rows)
    assert {k: {c: v for c, v in row.items() if v is not None}
            for k, row in rows_by_key(store.scan("t")).items()} == table_state(
        read_delta(str(tmp_path / "lake")), ["id"])


def test_by_default_base_rows_are_puts(spark, store, tmp_path):
    snapshot_then_changes(store)
    sink = ExactlyOnceParquetSink(tmp_path / "log")
    query = (stream(spark, store, "plain").writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    query.stop()
    rows = pq.read_table(tmp_path / "log").to_pylist()
    assert len(rows) == 10 and {r["_op"] for r in rows} == {"PUT"}
    assert all(r["_channel_id"].startswith("base-") for r in rows)
