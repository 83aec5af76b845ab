"""Batch sizing without Spark: ``minOffsetsPerTrigger`` with ``maxTriggerDelay`` (on a clock the
test moves), ``maxBytesPerTrigger`` with ``maxOffsetsPerTrigger`` and ``maxOffsetsPerChannel``,
what Trigger.AvailableNow and Trigger.Once (``ReadAllAvailable``) ignore, and replays that read
what the manifest says whatever the options say by then. The driver protocol and the executor
reader in Spark's order over the embedded store and the emulator's wire, a real SQLite meta
store. (What Spark passes per trigger, and the same on a real Spark:
tests/test_spark_triggers_and_reads.py.)
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.planning.read_limits import TriggerLimits, trigger_limits
from connector.protocol import StreamProtocol
from connector.reader import claim_and_read
from connector.stop_rule import record_sizes
from connector.tunnel.page import PageLayout
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.partition_reads import read_partition

pytestmark = pytest.mark.store_table(channels=3, columns=[("v", "INTEGER"), ("note", "STRING")])


def options(store: LocalTablestore, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                     "tunnel.name": "q", **extra})


def write(store: LocalTablestore, ids: range) -> None:
    for i in ids:  # notes of different lengths: records differ in size
        store.put_row("t", {"id": i}, {"v": i, "note": "x" * (i % 37)})


class Clock:
    """The planner's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def limited(proto: StreamProtocol) -> TriggerLimits:
    """What ``latestOffset`` applies when Spark passes the source's own default limit."""
    return trigger_limits(proto.options, all_available=False)


def test_min_offsets_wait_for_enough_records_or_the_delay(store):
    proto = StreamProtocol(options(store, minOffsetsPerTrigger="10", maxTriggerDelay="60s"))
    clock = proto.clock = Clock()
    start = proto.initial_offset()  # planned now: the delay counts from here
    write(store, range(4))
    assert proto.latest_offset(start, limited(proto)) == start  # 4 < 10
    clock.now += 30
    assert proto.latest_offset(start, limited(proto)) == start  # delay not passed
    write(store, range(4, 10))
    end = proto.latest_offset(start, limited(proto))  # 10 wait: a batch
    assert end != start
    assert sum(len(read_partition(p)) for p in proto.plan(start, end)) == 10
    proto.commit(end)

    write(store, range(10, 13))
    clock.now += 59  # from the last batch's planning
    assert proto.latest_offset(end, limited(proto)) == end
    clock.now += 2  # maxTriggerDelay passed: a batch with the 3 there are
    later = proto.latest_offset(end, limited(proto))
    assert later != end
    assert sum(len(read_partition(p)) for p in proto.plan(end, later)) == 3
    proto.commit(later)
    clock.now += 120  # the delay passed but nothing is new: still no empty batch
    assert proto.latest_offset(later, limited(proto)) == later
    proto.close()


def test_trigger_once_and_available_now_ignore_the_minimum(store):
    proto = StreamProtocol(options(store, minOffsetsPerTrigger="100"))
    proto.clock = Clock()
    start = proto.initial_offset()
    write(store, range(3))
    assert proto.latest_offset(start, limited(proto)) == start
    # Trigger.Once: Spark passes ReadAllAvailable, whatever the options say
    assert proto.latest_offset(start, trigger_limits(proto.options, all_available=True)) != start
    proto.close()
    run = StreamProtocol(options(store, minOffsetsPerTrigger="100", **{"tunnel.name": "q2"}))
    run.prepare_available_now()  # ReadMinRows' contract: an AvailableNow run must end
    first = run.initial_offset()
    assert run.latest_offset(first, limited(run)) != first
    run.close()


def test_min_offsets_count_by_reading_ahead_where_the_service_cannot_count(tmp_path):
    """Tablestore's lag counts a channel only within one page (about 500 records) of its
    head; beyond, the planner reads ahead, never further than the minimum."""
    writer = LocalTablestore(tmp_path / "store.db")
    writer.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")],
                        channels=1)
    with EmulatorServer(str(writer.path), INSTANCE, KEY_ID, SECRET) as emulator:
        wire = SourceOptions.from_spark({
            "endpoint": emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "q",
            "meta.store": f"sqlite://{tmp_path}/meta.db", "minOffsetsPerTrigger": "700"})
        proto = StreamProtocol(wire)
        proto.clock = Clock()
        start = proto.initial_offset()
        writer.batch_write("t", [("put", {"id": i}, {"v": i}) for i in range(650)])
        lag = proto.tunnel.lag(proto.tunnel_id, {})
        # more than a page: the page counted, a lower bound
        assert [(v.records_behind < 650, v.exact) for v in lag.values()] == [(True, False)]
        assert proto.latest_offset(start, limited(proto)) == start  # 650 < 700
        writer.batch_write("t", [("put", {"id": i}, {"v": i}) for i in range(650, 720)])
        assert proto.latest_offset(start, limited(proto)) != start
        proto.close()
    writer.close()


def _claimed_bytes(store: LocalTablestore, proto: StreamProtocol, start: dict, end: dict
                   ) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Per channel of the batch: its byte budget and the sizes of the records it read."""
    layout = PageLayout.of_table(store.table_schema("t"))
    budgets, sizes = {}, {}
    for part in proto.plan(start, end):
        budgets[part.channel_id] = part.max_bytes
        read = claim_and_read(part, layout)
        rows = list(read.batches())
        sizes[part.channel_id] = [n for b in rows for n in record_sizes(b).to_pylist()]
    return budgets, sizes


def test_max_bytes_budgets_every_read_and_a_replay_reads_the_same(store, tmp_path):
    write(store, range(300))
    proto = StreamProtocol(options(store, maxBytesPerTrigger="3000", maxOffsetsPerTrigger="200",
                                   maxOffsetsPerChannel="60"))
    start = proto.initial_offset()
    end = proto.latest_offset(start, limited(proto))
    assert end["maxBytes"] == 3000 and end["maxRows"] == 200
    budgets, sizes = _claimed_bytes(store, proto, start, end)
    manifest = proto.meta.get_batch(proto.namespace, proto.uuid_of(end)).manifest
    assert manifest is not None
    assert sum(c.max_bytes or 0 for c in manifest.channels) <= 3000
    assert sum(c.max_records for c in manifest.channels) <= 200
    assert all(c.max_records <= 60 for c in manifest.channels)
    for channel, taken in sizes.items():
        assert taken, "every channel has records waiting"
        # stopped by its budget: the last record crossed it, the ones before did not
        assert sum(taken[:-1]) < budgets[channel] <= sum(taken) or len(taken) == 60
    proto.close()

    # the options change and the driver restarts: the batch is replayed as planned
    again = StreamProtocol(options(store, maxBytesPerTrigger="100000"))
    replay_budgets, replay_sizes = _claimed_bytes(store, again, start, end)
    assert replay_budgets == budgets and replay_sizes == sizes
    again.close()


def test_an_offset_minted_before_a_restart_is_planned_with_its_own_limits(store, tmp_path):
    """Spark logs the offset, the driver dies before planning: the next driver plans the batch
    with the limits in the offset, not with the options it was started with."""
    write(store, range(200))
    proto = StreamProtocol(options(store, maxBytesPerTrigger="2000"))
    start = proto.initial_offset()
    end = proto.latest_offset(start, limited(proto))
    proto.close()
    restarted = StreamProtocol(options(store, maxBytesPerTrigger="900000"))
    parts = restarted.plan(start, end)
    assert sum(p.max_bytes or 0 for p in parts) <= 2000
    read = [pa.Table.from_batches(list(claim_and_read(
        p, PageLayout.of_table(store.table_schema("t"))).batches())) for p in parts]
    assert 0 < sum(t.num_rows for t in read) < 200
    restarted.close()
