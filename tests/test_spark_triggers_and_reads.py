"""On a real local Spark: what Spark passes per trigger, and the reads that depend on it end to
end, over the emulator's wire (``http://``) where the Tablestore backend is what is tested.

- Spark passes the source's default limit to ``latestOffset`` under a processing-time trigger
  and under Trigger.AvailableNow, ``ReadAllAvailable`` under Trigger.Once: read back from the
  offsets Spark logged (``maxRows`` / ``maxBytes`` are written only when limits applied);
- Trigger.AvailableNow over the wire: every change written before the trigger, then the query
  stops; twice on one checkpoint with writes and a split in between; exactly once;
- ``secondsBehindLatest`` in ``query.lastProgress`` over the wire: above 0 while a writer is
  ahead, 0 once the query caught up;
- ``startingTimestamp`` over the wire: exactly the changes at or after the instant;
- ``spark.read`` of a time range: exactly the changes in it, one partition per channel;
- batch sizes recorded in the manifests respect min/max/bytes, and the delay cap holds.

The same rules without Spark: tests/test_available_now.py, test_starting_timestamp.py,
test_range_read.py, test_batch_sizing.py. A SIGKILL during an AvailableNow run:
integration/test_available_now_restart.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from connector.local import LocalTablestore
from meta_store import open_meta_store
from tablestore_cdc.sinks import ExactlyOnceParquetSink
from tablestore_cdc.verify import verify
from tablestore_emulator.server import EmulatorServer
from tablestore_emulator.tunnel_api import wire_change_log
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.fixtures import write_changes

pytestmark = [pytest.mark.slow,
              pytest.mark.store_table(channels=2, columns=[("name", "STRING"), ("qty", "INTEGER")]),
              pytest.mark.usefixtures("stop_queries")]


@pytest.fixture
def writer(store: LocalTablestore) -> LocalTablestore:
    """The shared ``store`` fixture (``testkit.fixtures``: table ``t`` with ``name`` and ``qty``,
    2 channels), which the tests write into; the shared ``emulator`` serves it."""
    return store


def wire_options(emulator: EmulatorServer, tmp_path: Path) -> dict[str, str]:
    return {"endpoint": emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{tmp_path}/meta.db",
            "catalog": '{"columns": {"name": {"type": "string"}, "qty": {"type": "long"}}}'}


def read_stream(spark, options: dict[str, str]):
    reader = spark.readStream.format("tablestore")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def wait_until(condition, timeout: float, query=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError("condition not reached")


def logged_offsets(checkpoint: Path) -> list[dict[str, Any]]:
    """The source offsets Spark wrote to its offset log, batch by batch."""
    files = sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    return [json.loads(f.read_text().splitlines()[-1]) for f in files]


# --- what Spark passes per trigger -------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["processingTime", "availableNow", "once"])
def test_what_spark_passes_to_latest_offset_per_trigger(spark, writer, tmp_path, trigger):
    """The source's default limit reaches ``latestOffset`` under a processing-time trigger and
    under AvailableNow (Spark calls getDefaultReadLimit for both), ``ReadAllAvailable`` under
    Trigger.Once: the limits then go into the logged offset, or not."""
    write_changes(writer, 300)
    checkpoint = tmp_path / "ckpt"
    counts: list[int] = []
    options = {"endpoint": f"local://{writer.path}", "table.name": "t", "tunnel.name": "q",
               "maxOffsetsPerTrigger": "100", "maxBytesPerTrigger": "1m"}
    writer_ = (read_stream(spark, options).writeStream
               .foreachBatch(lambda df, _: counts.append(df.count()))
               .option("checkpointLocation", str(checkpoint)))
    if trigger == "processingTime":
        query = writer_.trigger(processingTime="100 milliseconds").start()
        wait_until(lambda: sum(counts) == 300, 180, query)
        query.stop()
    else:
        query = writer_.trigger(**{trigger: True}).start()
        assert query.awaitTermination(180)
    assert query.exception() is None
    offsets = [o for o in logged_offsets(checkpoint) if o]
    assert offsets
    if trigger == "once":
        assert all("maxRows" not in o and "maxBytes" not in o for o in offsets)
        assert counts == [300]  # everything, whatever the options say
    else:
        assert all(o["maxRows"] == 100 and o["maxBytes"] == 1024 * 1024 for o in offsets)
        assert sum(counts) == 300 and max(counts) <= 100


# --- Trigger.AvailableNow over the wire --------------------------------------------------------


def test_available_now_over_the_wire_twice_with_a_split_exactly_once(
        spark, writer, emulator, tmp_path):
    write_changes(writer, 200)
    sink = ExactlyOnceParquetSink(tmp_path / "sink")
    late: list[int] = []

    def store_and_write_late(df, batch_id):
        sink(df, batch_id)
        if not late:  # written after the run started: the next run's
            write_changes(writer, 30, start=1000)
            late.append(1)

    def run(function) -> None:
        query = (read_stream(spark, {**wire_options(emulator, tmp_path),
                                     "maxOffsetsPerChannel": "40"})
                 .writeStream.foreachBatch(function).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        assert query.awaitTermination(240), "AvailableNow did not stop by itself"
        assert query.exception() is None

    before_first = {(r.channel_id, r.sequence) for r in wire_change_log(writer.change_log("t"))}
    run(store_and_write_late)
    first = {(d.channel_id, d.sequence) for d in sink.deliveries(["id"])}
    assert first == before_first and late

    writer.split_channel("t", sorted(c.channel_id for c in writer.list_channels("t")
                                     if not c.closed)[0])
    write_changes(writer, 120, start=2000)
    run(sink)
    result = verify(wire_change_log(writer.change_log("t")), sink.deliveries(["id"]))
    assert result.ok, f"{result.summary()} {result.examples}"
    assert {c.channel_id for c in writer.list_channels("t") if c.parent_ids} <= {
        d.channel_id for d in sink.deliveries(["id"])}


# --- lag in query.lastProgress over the wire ---------------------------------------------------


def _latest(progress: dict) -> dict | None:
    value = progress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else value


def test_seconds_behind_latest_rises_while_a_writer_is_ahead_then_returns_to_zero(
        spark, writer, emulator, tmp_path):
    write_changes(writer, 400)
    seen: list[int] = []
    query = (read_stream(spark, {**wire_options(emulator, tmp_path),
                                 "maxOffsetsPerTrigger": "40"})
             .writeStream.foreachBatch(lambda df, _: seen.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
    behind: list[float] = []

    def reported() -> bool:
        latest = _latest(query.lastProgress) if query.lastProgress else None
        if latest is not None and latest["secondsBehindLatest"] is not None:
            behind.append(latest["secondsBehindLatest"])
        return any(b > 0 for b in behind)

    wait_until(reported, 180, query)
    first = _latest(query.lastProgress)
    assert first is not None and first["source"].endswith("#t#q")
    assert all(entry["head"] is None for entry in first["channels"].values())  # no heads

    def caught_up() -> bool:
        latest = _latest(query.lastProgress)
        return (sum(seen) == 400 and latest is not None
                and latest["secondsBehindLatest"] == 0)

    wait_until(caught_up, 240, query)
    final = _latest(query.lastProgress)
    assert all(e["secondsBehind"] == 0 and e["recordsBehind"] == 0
               for e in final["channels"].values())
    assert final["recordsBehindLatest"] == 0
    query.stop()


# --- startingTimestamp and bounded reads over the wire -----------------------------------------


def test_starting_timestamp_over_the_wire(spark, writer, emulator, tmp_path):
    write_changes(writer, 120)
    time.sleep(0.01)
    instant = int(time.time() * 1000)
    time.sleep(0.01)
    write_changes(writer, 150, start=500)
    rows: list[Any] = []
    query = (read_stream(spark, {**wire_options(emulator, tmp_path),
                                 "startingTimestamp": str(instant)})
             .writeStream.foreachBatch(lambda df, _: rows.extend(df.collect()))
             .trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    assert query.awaitTermination(180) and query.exception() is None
    expected = {(r.channel_id, r.sequence) for r in wire_change_log(writer.change_log("t"))
                if r.commit_ts_us >= instant * 1000}
    assert {(r._channel_id, r._sequence) for r in rows} == expected and len(rows) == 150


@pytest.mark.parametrize("over", ["wire", "local"])
def test_a_bounded_batch_read_returns_exactly_the_changes_in_range(
        spark, writer, emulator, tmp_path, over):
    write_changes(writer, 60)
    time.sleep(0.01)
    start = int(time.time() * 1000)
    write_changes(writer, 80, start=100)
    writer.split_channel("t", sorted(c.channel_id for c in writer.list_channels("t"))[0])
    write_changes(writer, 80, start=200)
    time.sleep(0.01)
    end = int(time.time() * 1000)
    time.sleep(0.01)
    write_changes(writer, 40, start=300)
    options = (wire_options(emulator, tmp_path) if over == "wire" else
               {"endpoint": f"local://{writer.path}", "table.name": "t", "tunnel.name": "q"})
    reader = spark.read.format("tablestore")
    for key, value in {**options, "startingTimestamp": str(start),
                       "endingTimestamp": str(end)}.items():
        reader = reader.option(key, value)
    df = reader.load()
    log = wire_change_log(writer.change_log("t")) if over == "wire" else writer.change_log("t")
    expected = {(r.channel_id, r.sequence) for r in log
                if start * 1000 <= r.commit_ts_us < end * 1000}
    got = [(r._channel_id, r._sequence) for r in df.collect()]
    assert sorted(got) == sorted(expected) and len(got) == 160
    assert df.rdd.getNumPartitions() == 4  # one per channel: two, then the split's two


# --- batch sizes in the manifests ------------------------------------------------------------


def test_batch_sizes_in_the_manifests_respect_min_max_bytes_and_the_delay(
        spark, writer, tmp_path):
    write_changes(writer, 400)
    counts: list[int] = []
    options = {"endpoint": f"local://{writer.path}", "table.name": "t", "tunnel.name": "q",
               "maxOffsetsPerTrigger": "100", "maxBytesPerTrigger": "4k",
               "minOffsetsPerTrigger": "20", "maxTriggerDelay": "3s"}
    query = (read_stream(spark, options).writeStream
             .foreachBatch(lambda df, _: counts.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="100 milliseconds").start())
    wait_until(lambda: sum(counts) == 400, 240, query)
    write_changes(writer, 5, start=400)  # fewer than the minimum: only the delay lets them through
    wait_until(lambda: sum(counts) == 405, 120, query)
    query.stop()
    meta = open_meta_store(f"sqlite://{Path(str(writer.path)).with_suffix('')}.meta.db")
    namespace = next(iter(meta.list_namespaces()))
    batches = [b for b in meta.list_batches(namespace)
               if b.manifest is not None and b.prev_uuid is not None]
    ends = meta.get_end_checkpoints_of(namespace, [b.uuid for b in batches])
    by_time = sorted(batches, key=lambda b: b.manifest.planned_at)  # type: ignore[union-attr]
    sizes = [sum(e.records for e in ends[b.uuid].values()) for b in by_time]
    assert sum(sizes) == 405 and max(sizes) <= 100
    for batch in by_time:
        assert batch.manifest is not None
        assert sum(c.max_records for c in batch.manifest.channels) <= 100
        assert sum(c.max_bytes or 0 for c in batch.manifest.channels) <= 4 * 1024
    assert max(sizes) < 100  # the byte budget, not the record cap, ended the full batches
    assert sizes[-1] == 5
    # a batch of fewer than the minimum came only once maxTriggerDelay had passed
    planned = [b.manifest.planned_at for b in by_time]  # type: ignore[union-attr]
    for i, size in enumerate(sizes[1:], start=1):
        if size < 20:
            assert planned[i] - planned[i - 1] >= 3.0, (i, size, planned)
    meta.close()
