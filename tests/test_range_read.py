"""Bounded batch reads (``connector.range_read``) without Spark: ``partitions()`` on the
"driver" and ``read()`` of each partition in partition order, as Spark launches a stage's
tasks, over the embedded store and the emulator's wire; compared as sets with the change log.

- exactly the changes committed in ``[startingTimestamp, endingTimestamp)``: a split inside
  the range (children read after their parent's end is pushed to the read's own tunnel), a
  split and a merge after it (children wait, see the parent stopped, and hold nothing),
  changes before and after the range left out;
- the read never touches the streaming query's tunnel (its checkpoints stay) and writes no
  meta store; reading the same partitions again gives the same rows;
- partitions list parents before children.

On a real Spark: tests/test_spark_triggers_and_reads.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from connector.errors import OptionError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.range_read import RangePartition, TablestoreRangeReader, parents_first
from connector.schema import output_schema
from connector.tunnel import ChannelInfo, ChannelStatus, open_tunnel_service
from tablestore_emulator.server import EmulatorServer
from testkit.backends import DynamoBackend, instant_between
from testkit.emulator import INSTANCE, KEY_ID, SECRET

pytestmark = pytest.mark.usefixtures("aws_test_credentials")  # boto3 reads them


@pytest.fixture
def writer(store: LocalTablestore) -> LocalTablestore:
    """The shared ``store`` fixture (``testkit.fixtures``: table ``t``, 2 channels), which the
    tests write into."""
    return store


def write(store: LocalTablestore, ids: range) -> None:
    for i in ids:
        store.put_row("t", {"id": i}, {"v": i})


def now_ms() -> int:
    time.sleep(0.005)
    instant = int(time.time() * 1000)
    time.sleep(0.005)
    return instant


def open_channels(store: LocalTablestore) -> list[str]:
    return sorted(c.channel_id for c in store.list_channels("t") if not c.closed)


def history(store: LocalTablestore) -> tuple[int, int]:
    """Changes before, inside and after a range with a split inside it and a split and a merge
    after it; returns the range (ms)."""
    write(store, range(0, 20))
    start = now_ms()
    write(store, range(20, 40))
    store.split_channel("t", open_channels(store)[0])  # inside the range
    write(store, range(40, 60))
    end = now_ms()
    write(store, range(60, 70))
    low, high = store.split_channel("t", open_channels(store)[-1])  # after the range
    write(store, range(70, 75))
    store.merge_channels("t", low, high)  # its child waits for two waiting parents
    write(store, range(75, 80))
    return start, end


def in_range(store: LocalTablestore, start_ms: int, end_ms: int) -> list[tuple[str, int]]:
    return sorted((r.channel_id, int(r.sequence)) for r in store.change_log("t")
                  if start_ms * 1000 <= r.commit_ts_us < end_ms * 1000)


def read_all(reader: TablestoreRangeReader) -> tuple[list[RangePartition], pa.Table]:
    parts = [p for p in reader.partitions() if isinstance(p, RangePartition)]
    batches = [b for p in parts for b in reader.read(p)]
    return parts, pa.Table.from_batches(batches, schema=batches[0].schema)


def keys(rows: pa.Table) -> list[tuple[str, int]]:
    return sorted((ch, int(seq.rsplit(":", 1)[-1], 16) if ":" in seq else int(seq))
                  for ch, seq in zip(rows.column("_channel_id").to_pylist(),
                                     rows.column("_sequence").to_pylist(), strict=True))


def range_options(endpoint_options: dict[str, str], start: int, end: int) -> SourceOptions:
    return SourceOptions.from_spark({**endpoint_options, "table.name": "t", "tunnel.name": "q",
                                     "startingTimestamp": str(start),
                                     "endingTimestamp": str(end)})


def test_a_range_read_returns_exactly_the_changes_of_the_range(writer, tmp_path):
    with open_tunnel_service(f"local://{writer.path}") as tunnel:
        streaming = tunnel.create_tunnel("t", "q")  # a streaming query's tunnel
        before = {c.channel_id: tunnel.get_checkpoint(streaming.tunnel_id, c.channel_id)
                  for c in tunnel.describe_tunnel("t", "q").channels}
    start, end = history(writer)
    options = range_options({"endpoint": f"local://{writer.path}"}, start, end)
    reader = TablestoreRangeReader(options, output_schema(writer.table_schema("t")))
    parts, rows = read_all(reader)
    assert keys(rows) == in_range(writer, start, end) and rows.num_rows == 40
    # parents before children
    order = [p.channel_id for p in parts]
    for p in parts:
        assert all(order.index(parent) < order.index(p.channel_id)
                   for parent in p.parent_ids if parent in order)
    # per channel in sequence order
    for channel in set(order):
        seqs = [s for ch, s in zip(rows.column("_channel_id").to_pylist(),
                                   rows.column("_sequence").to_pylist(), strict=True)
                if ch == channel]
        assert seqs == sorted(seqs)
    # the same partitions read again: the same rows
    again = pa.Table.from_batches([b for p in parts for b in reader.read(p)])
    assert again.equals(rows)
    # the streaming query's tunnel is untouched, and no meta store was written
    with open_tunnel_service(f"local://{writer.path}") as tunnel:
        assert {c.channel_id: tunnel.get_checkpoint(streaming.tunnel_id, c.channel_id)
                for c in tunnel.describe_tunnel("t", "q").channels
                if c.channel_id in before} == before
        assert any(t.tunnel_name.startswith("q-range-") for t in tunnel.list_tunnels("t"))
    assert not (Path(writer.path).parent / "store.meta.db").exists()


def test_over_the_wire(writer, tmp_path):
    start, end = history(writer)
    with EmulatorServer(str(writer.path), INSTANCE, KEY_ID, SECRET) as emulator:
        options = range_options({"endpoint": emulator.url, "instance.name": INSTANCE,
                                 "access.key.id": KEY_ID, "access.key.secret": SECRET},
                                start, end)
        reader = TablestoreRangeReader(options, output_schema(writer.table_schema("t")))
        _, rows = read_all(reader)
    assert keys(rows) == in_range(writer, start, end) and rows.num_rows == 40


def test_children_of_a_merge_inside_the_range(writer):
    write(writer, range(0, 10))
    start = now_ms()
    write(writer, range(10, 30))
    a, b = open_channels(writer)
    writer.merge_channels("t", a, b)
    write(writer, range(30, 50))
    end = now_ms()
    write(writer, range(50, 55))
    options = range_options({"endpoint": f"local://{writer.path}"}, start, end)
    _, rows = read_all(TablestoreRangeReader(options, output_schema(writer.table_schema("t"))))
    assert keys(rows) == in_range(writer, start, end) and rows.num_rows == 40


def test_parents_first_puts_unnamed_waiting_channels_last():
    channels = [ChannelInfo("c", ChannelStatus.WAIT, parent_ids=("b",)),
                ChannelInfo("b", ChannelStatus.OPEN, parent_ids=("a",)),
                ChannelInfo("a", ChannelStatus.OPEN),
                ChannelInfo("x", ChannelStatus.WAIT),
                ChannelInfo("d", ChannelStatus.OPEN)]
    assert [c.channel_id for c in parents_first(channels)] == ["a", "b", "c", "d", "x"]


def test_on_dynamodb_streams(tmp_path, moto_url, streams_fake):
    """DynamoDB Streams rounds commit times down to the second: changes a second or more away
    from the range's ends are in or out exactly. (``meta.store`` is required for this endpoint
    by the options, and never opened by a batch read.)"""
    backend = DynamoBackend(tmp_path, moto_url, streams_fake)
    start = instant_between(backend, range(0, 10), range(10, 30))
    backend.split()
    end = instant_between(backend, range(30, 45), range(45, 55))
    meta = tmp_path / "unused-meta.db"
    options = range_options({"endpoint": backend.harness.uri,
                             "meta.store": f"sqlite://{meta}"}, start, end)
    schema = output_schema(backend.harness.service.table_schema("t"))
    _, rows = read_all(TablestoreRangeReader(options, schema))
    assert sorted(int(k) for k in rows.column("id").to_pylist()) == list(range(10, 45))
    assert not meta.exists()
    backend.close()


def test_an_end_in_the_future_is_refused(writer):
    future = int(time.time() * 1000) + 3_600_000
    options = range_options({"endpoint": f"local://{writer.path}"}, 0, future)
    with pytest.raises(OptionError, match="'endingTimestamp': is in the future"):
        TablestoreRangeReader(options, output_schema(writer.table_schema("t"))).partitions()
