"""One DataFrame started into two sinks, in one Spark session: two queries on one tunnel.

The natural way to write a stream to two places makes two streaming queries, each with its own
planning process, on the same tunnel. The second is refused at its start with
``SourceInUseError`` naming ``tunnel.name`` (connector/planning/lease.py), and the first goes
on, exactly once. The shared local Spark session of testkit/fixtures.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore

pytestmark = pytest.mark.slow


def test_one_dataframe_into_two_sinks_refuses_the_second_query(spark: Any,
                                                                tmp_path: Path) -> None:
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    for i in range(40):
        store.put_row("t", {"id": i}, {"v": i})
    changes = (spark.readStream.format("tablestore").option("endpoint", f"local://{store.path}")
               .option("table.name", "t").option("tunnel.name", "two-sinks").load())
    got: list[Any] = []
    first = (changes.writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt-1")).start())
    second = None
    try:
        first.processAllAvailable()
        second = (changes.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                  .option("checkpointLocation", str(tmp_path / "ckpt-2")).start())
        with pytest.raises(Exception) as refused:
            second.awaitTermination(240)
        message = str(refused.value)
        assert "SourceInUseError" in message and "option 'tunnel.name'" in message
        assert "one-query-many-sinks" in message
        for i in range(40, 70):  # the first query goes on
            store.put_row("t", {"id": i}, {"v": i})
        store.split_channel("t", store.list_channels("t")[0].channel_id)
        first.processAllAvailable()
        assert first.exception() is None
    finally:
        for query in (first, second):
            if query is not None:
                query.stop()
    assert sorted((r["_channel_id"], r["_sequence"]) for r in got) == sorted(
        (c.channel_id, c.sequence) for c in store.change_log("t"))
    assert not list((tmp_path / "out").glob("*.parquet"))
    store.close()
