"""Trigger.AvailableNow bounded by commit time, without Spark: the driver protocol and the
executor reader in Spark's order, over the emulator's wire (Tablestore reports no channel
heads) and over the embedded store (heads), with a real SQLite meta store.

- a run reads every change committed before it was prepared, and stops; what is written after
  waits for the next run; two runs with a split in between deliver every change once;
- a restarted run that had not finished reads to the bound of the run it continues, and then
  the next run reads the rest;
- a run whose cap meets each channel's backlog ends after that batch, not after one more that
  reads nothing;
- a service that never says it is caught up (empty pages whose token moves, ``may_more``
  true) does not keep a run going: the reader cuts it off and says so;
- the same wire's lag figures in ``tablestore-cdc meta lag`` and the feed.

Spark's own AvailableNow runs over the emulator are in tests/test_spark_triggers_and_reads.py.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from connector.clients import executor_clients, tunnel_key
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.stop_rule import MAX_EMPTY_PAGES
from connector.tunnel import FINISHED, Record
from connector.tunnel.page import Page, PageLayout
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.partition_reads import read_partition
from testkit.protocol_runs import run_until_caught_up as run


@pytest.fixture
def writer(store: LocalTablestore) -> LocalTablestore:
    """The shared ``store`` fixture (``testkit.fixtures``: table ``t``, 2 channels), which the
    tests write into."""
    return store


def wire_options(emulator: EmulatorServer, tmp_path: Path, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({
        "endpoint": emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
        "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "q",
        "meta.store": f"sqlite://{tmp_path}/meta.db", **extra})


def local_options(writer: LocalTablestore, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({"endpoint": f"local://{writer.path}", "table.name": "t",
                                     "tunnel.name": "q", **extra})


def write(store: LocalTablestore, ids: range) -> None:
    for i in ids:
        store.put_row("t", {"id": i}, {"v": i})


def keys(records: list[Record]) -> list[tuple[str, int]]:
    """(channel, the store's sequence) of records read locally or over the wire (where the
    sequence is ``epoch:commit time:store sequence`` in hex)."""
    return sorted((r.channel_id, int(r.sequence.rsplit(":", 1)[-1], 16) if ":" in r.sequence
                   else int(r.sequence)) for r in records)


def committed(store: LocalTablestore, before_us: int | None = None) -> list[tuple[str, int]]:
    return sorted((r.channel_id, int(r.sequence)) for r in store.change_log("t")
                  if before_us is None or r.commit_ts_us <= before_us)


def prepare(proto: StreamProtocol) -> int:
    """``prepareForTriggerAvailableNow``; returns the bound (µs) and lets a microsecond pass,
    so what the test writes next is committed after it."""
    proto.prepare_available_now()
    assert proto.tracker._prepared is not None
    time.sleep(0.002)
    return proto.tracker._prepared.at_us


def test_over_the_wire_a_run_reads_what_was_committed_before_it_and_stops(
        writer, emulator, tmp_path):
    write(writer, range(40))
    proto = StreamProtocol(wire_options(emulator, tmp_path, maxOffsetsPerChannel="7"))
    assert proto.tunnel.head_sequences(proto.tunnel_id) is None  # Tablestore: by commit time
    bound = prepare(proto)
    start = proto.initial_offset()
    write(writer, range(100, 110))  # after the trigger: the next run's
    end, records = run(proto, start)
    assert keys(records) == committed(writer, bound) and len(records) == 40
    # every manifest of the run carries its bound; every claim reached it or was capped
    batch = proto.meta.get_batch(proto.namespace, proto.uuid_of(end))
    assert batch.manifest is not None and batch.manifest.available_now_us == bound
    proto.close()

    # the next run (a new process, as Spark starts one): a split and writes in between
    writer.split_channel("t", sorted(c.channel_id for c in writer.list_channels("t"))[0])
    write(writer, range(200, 230))
    again = StreamProtocol(wire_options(emulator, tmp_path, maxOffsetsPerChannel="7"))
    prepare(again)
    write(writer, range(300, 305))
    last, more = run(again, end)
    assert last != end
    everything = keys(records) + keys(more)
    assert len(everything) == len(set(everything))  # exactly once
    written_later = {(r.channel_id, int(r.sequence)) for r in writer.change_log("t")
                     if r.primary_key["id"] >= 300}
    assert len(written_later) == 5
    assert sorted(everything) == sorted(set(committed(writer)) - written_later)
    assert {ch for ch, _ in keys(more)} >= {c.channel_id for c in writer.list_channels("t")
                                            if c.parent_ids}  # the split's children too
    again.close()


def test_a_restarted_run_reads_to_its_own_bound_then_the_next_run_reads_the_rest(
        writer, emulator, tmp_path):
    write(writer, range(30))
    first = StreamProtocol(wire_options(emulator, tmp_path, maxOffsetsPerChannel="4"))
    bound = prepare(first)
    start = first.initial_offset()
    end = first.latest_offset(start, None)
    read = [r for p in first.plan(start, end) for r in read_partition(p)]
    first.commit(end)
    assert 0 < len(read) < 30
    first.close()  # killed mid-run

    write(writer, range(100, 108))  # committed after the first run's bound
    restarted = StreamProtocol(wire_options(emulator, tmp_path, maxOffsetsPerChannel="4"))
    assert prepare(restarted) > bound
    after_restart, rest = run(restarted, end)
    assert keys(read + rest) == committed(writer, bound)  # the same bound, not the new one
    restarted.close()

    third = StreamProtocol(wire_options(emulator, tmp_path))
    prepare(third)
    _, late = run(third, after_restart)
    assert sorted(keys(read + rest + late)) == committed(writer)
    third.close()


def _backlog(store: LocalTablestore) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in store.change_log("t"):
        counts[r.channel_id] = counts.get(r.channel_id, 0) + 1
    return counts


def test_a_run_whose_cap_meets_the_backlog_ends_without_an_empty_batch(
        writer, emulator, tmp_path):
    """Over the wire (no heads): a channel read to exactly its cap on a page that caught up
    is confirmed by one more read in the same task, so the run ends after that batch instead
    of planning one more that reads nothing."""
    write(writer, range(30))
    cap = max(_backlog(writer).values())
    proto = StreamProtocol(wire_options(emulator, tmp_path, maxOffsetsPerChannel=str(cap)))
    prepare(proto)
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    records = [r for p in proto.plan(start, end) for r in read_partition(p)]
    proto.commit(end)
    assert proto.latest_offset(end, None) == end  # done: no batch that would read nothing
    assert keys(records) == committed(writer)
    proto.close()


def test_on_the_embedded_store_channels_stop_at_their_heads(writer):
    """With heads (the embedded store) the run stops after each channel's newest record when
    prepared, and a channel born during the run waits for the next one."""
    write(writer, range(20))
    proto = StreamProtocol(local_options(writer, maxOffsetsPerChannel="3"))
    prepare(proto)
    start = proto.initial_offset()
    before = committed(writer)
    parent = sorted(c.channel_id for c in writer.list_channels("t"))[0]
    writer.split_channel("t", parent)
    write(writer, range(50, 60))
    _, records = run(proto, start)
    assert keys(records) == [k for k in before]
    proto.close()


def test_an_empty_closed_channel_is_read_to_its_end_so_its_children_are_read(writer):
    """A child split again before it held anything (head ``""``) is at its bound from the
    start, but it is read anyway: only its end releases its own children, whose changes were
    committed before the trigger."""
    write(writer, range(20))
    parent = sorted(c.channel_id for c in writer.list_channels("t"))[0]
    low, _ = writer.split_channel("t", parent)
    writer.split_channel("t", low)  # `low` holds nothing: its children get its key range
    write(writer, range(20, 60))
    proto = StreamProtocol(local_options(writer, maxOffsetsPerChannel="10"))
    prepare(proto)
    _, records = run(proto, proto.initial_offset())
    assert keys(records) == committed(writer)
    proto.close()


class _NeverCaughtUp:
    """Wraps a real embedded-store client as a service that never reports being caught up
    would answer: every page says more may follow, and a page past the data comes back empty
    with a token that moved (the same position spelt with more spaces in its JSON)."""

    def __init__(self, real: object) -> None:
        self._real = real
        self.empty_pages = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def read_page(self, tunnel_id: str, channel_id: str, token: str, limit: int,
                  layout: PageLayout) -> Page:
        page: Page = self._real.read_page(  # type: ignore[attr-defined]
            tunnel_id, channel_id, token, limit, layout)
        if page.count or page.next_token == FINISHED:
            return Page(page.batch, page.next_token, page.next_token != FINISHED)
        self.empty_pages += 1
        body = json.loads(base64.b64decode(page.next_token))
        moved = json.dumps(body, separators=("," + " " * self.empty_pages, ":"))
        return Page(page.batch, base64.b64encode(moved.encode()).decode(), True)


def test_a_service_that_never_says_it_is_caught_up_does_not_keep_the_run_going(
        writer, caplog):
    write(writer, range(10))
    proto = StreamProtocol(local_options(writer))
    prepare(proto)
    start = proto.initial_offset()
    end = proto.latest_offset(start, None)
    parts = proto.plan(start, end)
    pool, key = executor_clients(), tunnel_key(parts[0].endpoint)
    real = pool.tunnel(parts[0].endpoint)
    wrapper = _NeverCaughtUp(real)
    pool._tunnels[key] = wrapper  # type: ignore[assignment]
    try:
        with caplog.at_level("WARNING", logger="connector.reader"):
            records = [r for p in parts for r in read_partition(p)]
    finally:
        pool._tunnels[key] = real
    assert len(records) == 10
    assert wrapper.empty_pages >= MAX_EMPTY_PAGES
    assert "empty pages in a row" in caplog.text and "caught up" in caplog.text
    proto.commit(end)
    assert proto.latest_offset(end, None) == end  # every channel counted as at the bound
    proto.close()


def test_meta_lag_and_the_feed_over_the_wire(writer, emulator, tmp_path):
    """``tablestore-cdc meta lag`` and the feed show the Tablestore lag figures: behind after
    new writes (records counted within a page), 0 once read."""
    from typer.testing import CliRunner

    from tablestore_cdc.commands.app import app as root_app
    from tablestore_cdc.feed.snapshot import dashboard_snapshot

    write(writer, range(10))
    options = wire_options(emulator, tmp_path)
    proto = StreamProtocol(options)
    end, _ = run(proto, proto.initial_offset())  # caught up
    write(writer, range(10, 25))
    time.sleep(0.05)
    # the instance and the key pair: the recorded endpoint has none (the options' typed
    # endpoint keeps its secrets out of every URI, so the test spells them out)
    endpoint = f"{options.endpoint.uri}&access_key_id={KEY_ID}&access_key_secret={SECRET}"

    def lag() -> dict:
        result = CliRunner().invoke(root_app, ["meta", "lag", "--meta", options.meta_store,
                                               "--endpoint", endpoint, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    behind = lag()
    assert behind["records_behind"] == 15 and behind["seconds_behind"] >= 0.05
    snapshot = dashboard_snapshot(proto.meta, proto.namespace, endpoint=endpoint)
    assert sum(c["lag"]["records_behind"] for c in snapshot["channels"] if c["lag"]) == 15
    run(proto, end)
    caught_up = lag()
    assert caught_up["records_behind"] == 0 and caught_up["seconds_behind"] == 0.0
    proto.close()
