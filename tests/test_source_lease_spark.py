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


def test_a_stopped_querys_lease_is_released_so_the_next_query_starts_at_once(
        spark: Any, tmp_path: Path) -> None:
    """``query.stop()`` ends the planning process with SIGTERM; its lease is released then
    (not left to expire), and a second query on the same tunnel starts without a refusal.
    SIGTERM in the middle of a meta-store call, on every backend: tests/test_lease_sigterm.py."""
    import time

    from connector.options import SourceOptions
    from meta_store import open_meta_store

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=2)
    for i in range(20):
        store.put_row("t", {"id": i}, {"v": i})
    options = {"endpoint": f"local://{store.path}", "table.name": "t",
               "tunnel.name": "handover"}
    source = SourceOptions.from_spark(options)

    def start(checkpoint: str, got: list[Any]) -> Any:
        changes = spark.readStream.format("tablestore").options(**options).load()
        return (changes.writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
                .option("checkpointLocation", str(tmp_path / checkpoint)).start())

    first_rows: list[Any] = []
    first = start("ckpt-1", first_rows)
    first.processAllAvailable()
    with open_meta_store(source.meta_store) as meta:
        assert meta.get_lease(source.source_identity).live(time.time())
    first.stop()
    deadline = time.time() + 5
    with open_meta_store(source.meta_store) as meta:
        while meta.get_lease(source.source_identity).live(time.time()):
            assert time.time() < deadline, "the stopped query's lease is still live after 5 s"
            time.sleep(0.2)
    second_rows: list[Any] = []
    second = start("ckpt-2", second_rows)  # another query on the same tunnel: not refused
    try:
        for i in range(20, 25):
            store.put_row("t", {"id": i}, {"v": i})
        second.processAllAvailable()
        assert second.exception() is None
        assert sorted(r["id"] for r in second_rows) == list(range(20, 25))
        assert sorted(r["id"] for r in first_rows) == list(range(20))
    finally:
        second.stop()
