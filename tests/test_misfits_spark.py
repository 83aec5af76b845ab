"""schema.change.behavior on a real local Spark: a value of another type than its column fails
the query under ``exception`` with the typed error, and a restart on the same checkpoint with
``lenient`` delivers the refused batch exactly once, the value kept in ``_extra`` with its own
type (docs/schema.md, "Values of another type")."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException

from connector.local import LocalTablestore
from tablestore_cdc.sinks import ExactlyOnceParquetSink

pytestmark = [pytest.mark.slow, pytest.mark.store_table(channels=2, columns=[]),
              pytest.mark.usefixtures("stop_queries")]

SCHEMA = ("id long, qty long, ok boolean, _op string, _channel_id string, _sequence string, "
          "_extra string")


def stream(spark, store: LocalTablestore, policy: str):
    return (spark.readStream.format("tablestore").schema(SCHEMA)
            .option("endpoint", f"local://{store.path}").option("table.name", "t")
            .option("tunnel.name", "q").option("schema.change.behavior", policy).load())


def test_exception_fails_typed_then_lenient_delivers_the_batch_once(spark, store, tmp_path):
    # the table declares only its key: qty is an INTEGER, then a STRING, then an INTEGER again
    for i in range(20):
        store.put_row("t", {"id": i}, {"qty": i, "ok": i % 2 == 0})
    store.put_row("t", {"id": 7}, {"qty": "seven", "colour": "red"})
    store.update_row("t", {"id": 8}, {"qty": 2.5})
    store.put_row("t", {"id": 9}, {"qty": 9, "ok": "yes"})
    changes = 23
    sink = ExactlyOnceParquetSink(tmp_path / "out")
    checkpoint = str(tmp_path / "ckpt")

    failing = (stream(spark, store, "exception").writeStream.foreachBatch(sink)
               .option("checkpointLocation", checkpoint).start())
    with pytest.raises(StreamingQueryException) as info:
        failing.processAllAvailable()
    message = str(info.value)
    assert "SchemaChangeError" in message and "schema.change.behavior=exception" in message
    # both channels hold a misfit, and their two tasks race: Spark reports the first to fail,
    # qty's STRING or DOUBLE in one channel or ok's STRING in the other
    assert re.search(r"column '(qty' is bigint|ok' is boolean)", message), message[:2000]
    assert sink.committed_batches() == []  # nothing of the refused batch was written

    query = (stream(spark, store, "lenient").writeStream.foreachBatch(sink)
             .option("checkpointLocation", checkpoint).start())
    query.processAllAvailable()
    query.stop()
    rows = pq.read_table(tmp_path / "out").to_pylist()
    pairs = [(r["_channel_id"], r["_sequence"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == changes  # every change once
    by_id: dict[int, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["_channel_id"], r["_sequence"])):
        by_id.setdefault(r["id"], []).append(r)
    last = {i: rs[-1] for i, rs in by_id.items()}
    assert (last[7]["qty"], json.loads(last[7]["_extra"])) == (None, {"colour": "red",
                                                                      "qty": "seven"})
    assert (last[8]["qty"], json.loads(last[8]["_extra"])) == (None, {"qty": 2.5})
    assert (last[9]["qty"], last[9]["ok"], json.loads(last[9]["_extra"])) == (
        9, None, {"ok": "yes"})
    assert [last[i]["qty"] for i in (0, 1, 19)] == [0, 1, 19]
