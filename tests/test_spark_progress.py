"""Spark's own progress report carries the tunnel's head and lag (``reportLatestOffset``).

Runs a real query on the session ``spark`` fixture against an embedded local store and reads
``query.lastProgress["sources"][0]["latestOffset"]`` — what monitoring systems consume; and
checks, without Spark, that a measurement is reused rather than repeated on every trigger.
"""

from __future__ import annotations

import json

import pytest

from connector.local import LocalTablestore
from testkit.waiting import wait_until


def _latest(progress: dict) -> dict | None:
    value = progress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.slow
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
        wait_until("the first progress report", lambda: query.lastProgress, timeout=120,
                   query=query)
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

        wait_until("the lag to reach 0 with all 300 rows read", caught_up, timeout=180,
                   query=query)
        assert any(0 < b < 300 for b in behind), behind
        final = _latest(query.lastProgress)
        assert all(e["recordsBehind"] == 0 and e["secondsBehind"] == 0
                   for e in final["channels"].values())
    finally:
        query.stop()
        store.close()


@pytest.mark.parametrize("took", [0.001, 2.0])
def test_measurements_are_reused_for_twenty_times_their_cost(tmp_path, took):
    """No Spark: the reporter on a real ``StreamProtocol`` over a local store, with a clock
    the test moves (a measurement "takes" ``took`` seconds)."""
    from connector.latest_offset_report import MAX_REFRESH_S, MIN_REFRESH_S, LatestOffsetReporter
    from connector.options import SourceOptions
    from connector.protocol import StreamProtocol

    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], channels=2)
    for i in range(10):
        store.put_row("t", {"id": i}, {})
    protocol = StreamProtocol(SourceOptions.from_spark({
        "endpoint": f"local://{store.path}", "table.name": "t", "tunnel.name": "q"}))
    now = [100.0]
    ticks = iter([])

    def clock() -> float:  # each measurement's end reads the clock once more
        return next(ticks, now[0])

    reporter = LatestOffsetReporter(protocol, clock=clock)
    try:
        start = protocol.uuid_of(protocol.initial_offset())
        ticks = iter([now[0], now[0] + took])
        first = reporter.report(start)
        assert first["recordsBehindLatest"] == 10 and reporter.measurements == 1
        interval = min(MAX_REFRESH_S, max(MIN_REFRESH_S, 20 * took))
        store.put_row("t", {"id": 99}, {})
        now[0] += interval - 0.01
        assert reporter.report(start) is first and reporter.measurements == 1  # reused
        now[0] += 0.02
        again = reporter.report(start)
        assert reporter.measurements == 2 and again["recordsBehindLatest"] == 11
    finally:
        protocol.close()
        store.close()
