"""A Spark checkpoint directory set back behind the meta table, on a real local Spark.

Users delete the newest ``offsets/N`` and ``commits/N`` files of a checkpoint directory to
process batches again (or restore the directory from a backup). The source must replay the
batches the meta table holds after that point exactly: same batch boundaries, same records
(docs/operations.md#restoring-a-checkpoint-directory). The protocol-level variants, without
Spark, are in tests/test_protocol_exact_or_refused.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connector.local import LocalTablestore

pytestmark = pytest.mark.slow


def run(spark, store: LocalTablestore, checkpoint: Path, sink: dict[int, list]) -> None:
    def collect(df, batch_id):
        sink[batch_id] = sorted((r["_channel_id"], r["_sequence"]) for r in df.collect())

    query = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
             .option("table.name", "t").option("tunnel.name", "q")
             .option("maxOffsetsPerTrigger", "20").load()
             .writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None


@pytest.mark.oldest_spark
def test_deleting_the_newest_offsets_and_commits_replays_those_batches_exactly(
        spark, store, tmp_path):
    for i in range(50):
        store.put_row("t", {"id": i}, {"v": i})
    checkpoint = tmp_path / "ckpt"
    first: dict[int, list] = {}
    run(spark, store, checkpoint, first)
    store.split_channel("t", store.list_channels("t")[0].channel_id)
    for i in range(50, 80):
        store.put_row("t", {"id": i}, {"v": i})
    run(spark, store, checkpoint, first)
    delivered = [k for b in first.values() for k in b]
    assert sorted(delivered) == sorted((r.channel_id, r.sequence) for r in store.change_log("t"))
    batches = sorted(first)
    assert len(batches) >= 5
    # the offsets carry the read limit (a replay keeps it even if the minted row is gone)
    logged = (checkpoint / "offsets" / str(batches[-1])).read_text().splitlines()[-1]
    assert json.loads(logged)["maxRows"] == 20
    # set the checkpoint back three batches
    redo = batches[-3:]
    for batch_id in redo:
        for log in ("offsets", "commits"):
            (checkpoint / log / str(batch_id)).unlink()
            (checkpoint / log / f".{batch_id}.crc").unlink(missing_ok=True)  # Hadoop checksum
    again: dict[int, list] = {}
    run(spark, store, checkpoint, again)
    assert {b: again[b] for b in redo} == {b: first[b] for b in redo}
    assert set(again) == set(redo)  # and nothing else: the tunnel had nothing new
