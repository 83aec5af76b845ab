"""Spark's own progress report carries the tunnel's head and lag (``reportLatestOffset``).

Runs a real query on the session ``spark`` fixture against an embedded local store and reads
``query.lastProgress["sources"][0]["latestOffset"]`` — what monitoring systems consume.
"""

from __future__ import annotations

import json
import time

import pytest

from connector.local import LocalTablestore

pytestmark = pytest.mark.slow


def _latest(progress: dict) -> dict | None:
    value = progress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else value


def _wait(condition, timeout: float, query) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError("condition not reached")


def test_last_progress_carries_heads_and_lag(spark, tmp_path):
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                       channels=3)
    for i in range(300):
        store.put_row("t", {"id": i}, {"v": i})
    heads = {c.channel_id: c.head_seq for c in store.list_channels("t")}
    assert sum(heads.values()) == 300
    seen: list[int] = []
    query = (spark.readStream.format("tablestore")
             .option("endpoint", f"local://{store.path}").option("table.name", "t")
             .option("tunnel.name", "q").option("maxOffsetsPerTrigger", "30").load()
             .writeStream.foreachBatch(lambda df, _: seen.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        _wait(lambda: query.lastProgress is not None, 120, query)
        first = _latest(query.lastProgress)
        # batch 0 was planned from the very start: everything is still behind
        assert first is not None, query.lastProgress
        assert set(first["channels"]) == set(heads)
        for ch, entry in first["channels"].items():
            assert int(entry["head"]) == heads[ch]
            assert entry["recordsBehind"] == heads[ch]
            assert entry["secondsBehind"] > 0
        assert first["recordsBehindLatest"] == 300
        assert first["secondsBehindLatest"] > 0
        assert first["source"].endswith("#t#q")
        assert first["channelCount"] == 3

        # the lag shrinks as batches are read (capped at 30 rows each) and reaches 0
        behind: list[int] = []

        def caught_up() -> bool:
            latest = _latest(query.lastProgress)
            behind.append(latest["recordsBehindLatest"])
            return latest["recordsBehindLatest"] == 0 and sum(seen) == 300

        _wait(caught_up, 180, query)
        assert any(0 < b < 300 for b in behind), behind
        final = _latest(query.lastProgress)
        assert all(e["recordsBehind"] == 0 and e["secondsBehind"] == 0
                   for e in final["channels"].values())
    finally:
        query.stop()
        store.close()
