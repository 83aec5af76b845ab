"""The columnar read path: pages from the local store's sealed segments, and the reader's claim.

- ``LocalTunnelService.read_page`` (sealed Arrow segments sliced, the tail converted) returns
  exactly what the default ``TunnelService.read_page`` builds from ``read_records``, for every
  start and page size, across segment boundaries, trimming, binary and undeclared values, and
  layouts other than the table's (a user schema).
- ``connector.reader.claim_and_read``: pages claimed before they are handed out, replays bounded
  by the recorded count, the AvailableNow bound applied on the ``_sequence`` column.
- Slow: one 1,000,000-record partition read through the source's ``read()``: row count, order
  and the claimed end.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import connector.tunnel.local.segments as segments_module
from connector.clients import executor_clients, tunnel_key
from connector.errors import ReplayDivergedError, TrimmedDataError
from connector.local import LocalTablestore
from connector.options import SourceOptions
from connector.partition import ChannelPartition
from connector.protocol import StreamProtocol
from connector.reader import claim_and_read
from connector.schema import output_schema
from connector.source import TablestoreStreamReader
from connector.stop_rule import record_sizes
from connector.tunnel import FINISHED, TunnelService
from connector.tunnel.local import LocalTunnelService
from connector.tunnel.page import PageLayout

SEGMENT = 16  # records per sealed segment in these tests (the store's default is 4,096)


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setattr(segments_module, "SEGMENT_RECORDS", SEGMENT)


def _mixed_writes(store: LocalTablestore, n: int) -> None:
    """Every kind of change: puts, updates (with and without before-image, deleting a column),
    deletes (of present and missing rows), binary and non-ASCII values, undeclared attributes,
    NaN and infinities."""
    for i in range(n):
        key = {"id": i % 23, "k": bytes([i % 7])}
        kind = i % 6
        if kind == 0:
            store.put_row("t", key, {"s": f"é-{i}\ud800"[: 3 + i % 3], "d": float(i) / 3,
                                     "b": i % 2 == 0, "raw": bytes([i % 256, 0])})
        elif kind == 1:
            store.update_row("t", key, {"d": math.inf if i % 4 else math.nan, "s": None})
        elif kind == 2:
            store.update_row("t", {"id": 1000 + i, "k": b""}, {"colour": "red", "n": i})
        elif kind == 3:
            store.delete_row("t", key)
        elif kind == 4:
            store.put_row("t", key, {"s": "x", "blob": b"\xff\x00", "n": -i})
        else:
            store.delete_row("t", {"id": 5000 + i, "k": b"z"})


@pytest.fixture
def service(tmp_path, small_segments):
    store = LocalTablestore(tmp_path / "store.db")
    store.create_table("t", primary_key=[("id", "INTEGER"), ("k", "BINARY")],
                       columns=[("s", "STRING"), ("d", "DOUBLE"), ("b", "BOOLEAN"),
                                ("raw", "BINARY")], channels=2)
    _mixed_writes(store, 150)
    svc = LocalTunnelService(LocalTablestore(store.path))
    yield svc, store
    svc.close()
    store.close()


def _tokens(svc: LocalTunnelService, store: LocalTablestore, channel: str) -> list[str]:
    """The token after each sequence 0..head of the channel."""
    from connector.tunnel.local.tunnels import encode_token

    head = next(c.head_seq for c in store.list_channels("t") if c.channel_id == channel)
    return [encode_token("t", channel, s) for s in range(head + 1)]


def _layouts(store: LocalTablestore) -> list[PageLayout]:
    table = PageLayout.of_table(store.table_schema("t"))
    narrow = PageLayout(table.columns[:3])  # the rest goes to _extra
    wider = PageLayout((*reversed(table.columns), ("colour", pa.string()), ("n", pa.int64())))
    return [table, narrow, wider]


def test_segments_are_sealed_and_pages_equal_the_records_conversion(service):
    svc, store = service
    tunnel = svc.create_tunnel("t", "q")
    with store.transaction() as conn:
        sealed = conn.execute("SELECT count(*) FROM cdc_change_segments").fetchone()[0]
    assert sealed >= 2 * (150 // 2 // SEGMENT) - 2  # both channels hold several segments
    for layout in _layouts(store):
        for channel in [c.channel_id for c in store.list_channels("t")]:
            tokens = _tokens(svc, store, channel)
            for start in (0, 1, SEGMENT - 1, SEGMENT, SEGMENT + 5, len(tokens) - 2):
                for limit in (1, 7, SEGMENT, 2 * SEGMENT + 3, 1000):
                    got = svc.read_page(tunnel.tunnel_id, channel, tokens[start], limit, layout)
                    # a page may end early (with its segment), never empty while records remain
                    assert 1 <= got.count <= min(limit, len(tokens) - 1 - start)
                    if layout != _layouts(store)[0]:  # not served from segments: never short
                        assert got.count == min(limit, len(tokens) - 1 - start)
                    want = TunnelService.read_page(svc, tunnel.tunnel_id, channel,
                                                   tokens[start], got.count, layout)
                    assert got.batch.equals(want.batch), (layout, channel, start, limit)
                    assert (got.next_token, got.may_more) == (want.next_token, want.may_more)
            # page after page, the whole channel equals one conversion of its records
            pages, token, more = [], tokens[0], True
            while more:
                page = svc.read_page(tunnel.tunnel_id, channel, token, 1000, layout)
                pages.append(page.batch)
                token, more = page.next_token, page.may_more
            whole = TunnelService.read_page(svc, tunnel.tunnel_id, channel, tokens[0], 1000,
                                            layout)
            assert pa.Table.from_batches(pages).equals(pa.Table.from_batches([whole.batch]))


def test_page_values_match_the_change_log(service):
    svc, store = service
    tunnel = svc.create_tunnel("t", "q")
    layout = PageLayout.of_table(store.table_schema("t"))
    channel = store.list_channels("t")[0].channel_id
    pages, token = [], _tokens(svc, store, channel)[0]
    while True:
        page = svc.read_page(tunnel.tunnel_id, channel, token, 1000, layout)
        pages.append(page.batch)
        token = page.next_token
        if not page.may_more:
            break
    log = [r for r in store.change_log("t") if r.channel_id == channel]
    rows = pa.Table.from_batches(pages).to_pylist()
    assert [r["_sequence"] for r in rows] == [r.sequence for r in log]
    assert [r["_op"] for r in rows] == [r.op.value for r in log]
    for row, rec in zip(rows, log, strict=True):
        assert (row["id"], row["k"]) == (rec.primary_key["id"], rec.primary_key["k"])
        after = rec.after_image() or {}
        for name in ("s", "raw", "b"):
            assert row[name] == after.get(name)
        extra = json.loads(row["_extra"]) if row["_extra"] else {}
        assert set(extra) == set(after) - {"s", "d", "b", "raw"}
        assert (row["_before"] is None) == (rec.before is None)


def test_trimmed_segments_and_the_tail(service):
    svc, store = service
    tunnel = svc.create_tunnel("t", "q")
    layout = PageLayout.of_table(store.table_schema("t"))
    store.trim_history("t", keep_last=SEGMENT + 3)  # inside a segment
    _mixed_writes(store, 40)  # sealing resumes after the trim point
    for ch in store.list_channels("t"):
        tokens = _tokens(svc, store, ch.channel_id)
        start = ch.trimmed_upto
        got, token = [], tokens[start]
        while token != tokens[-1]:
            page = svc.read_page(tunnel.tunnel_id, ch.channel_id, token, 1000, layout)
            got.append(page.batch)
            token = page.next_token
        want = TunnelService.read_page(svc, tunnel.tunnel_id, ch.channel_id, tokens[start],
                                       1000, layout)
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches([want.batch]))
        assert want.count == ch.head_seq - start


def _partition(store: LocalTablestore, tmp_path, **extra: str) -> tuple[StreamProtocol,
                                                                       ChannelPartition]:
    options = SourceOptions.from_spark({"endpoint": f"local://{store.path}", "table.name": "t",
                                        "tunnel.name": "q", **extra})
    proto = StreamProtocol(options)
    start = proto.initial_offset()
    parts = proto.plan(start, proto.latest_offset(start, None))
    return proto, max(parts, key=lambda p: p.max_records)


def test_claim_then_replay_yields_the_same_pages(service, tmp_path):
    _, store = service
    proto, part = _partition(store, tmp_path)
    layout = PageLayout.of_table(store.table_schema("t"))
    first = claim_and_read(part, layout)
    _mixed_writes(store, 60)  # new data after the claim: a replay must not read it
    again = claim_and_read(part, layout)
    assert first.end == again.end and first.count == again.count == first.end.records
    first_rows = pa.Table.from_batches(list(first.batches()))
    assert first_rows.equals(pa.Table.from_batches(list(again.batches())))
    seqs = first_rows.column("_sequence").to_pylist()
    assert seqs == sorted(seqs) and first.end.last_sequence == seqs[-1]
    store.trim_history("t", keep_last=0)  # history changed under a recorded end: never guess
    with pytest.raises((ReplayDivergedError, TrimmedDataError)):
        claim_and_read(part, layout)
    proto.close()


def test_available_now_bound_on_the_sequence_column(service, tmp_path):
    _, store = service
    proto, part = _partition(store, tmp_path)
    bound = f"{SEGMENT + 4:020d}"
    bounded = ChannelPartition(**{**part.__dict__, "stop_after_sequence": bound})
    read = claim_and_read(bounded, PageLayout.of_table(store.table_schema("t")))
    assert read.count == SEGMENT + 4 == read.end.records
    seqs = pa.Table.from_batches(list(read.batches())).column("_sequence")
    assert pc.max(seqs).as_py() == bound == read.end.last_sequence
    proto.close()


def _all_rows(store: LocalTablestore, part: ChannelPartition) -> pa.Table:
    """Every record of the partition's channel after its start (a plain read, no claim)."""
    svc = executor_clients().reader(part.endpoint)
    layout = PageLayout.of_table(store.table_schema("t"))
    batches, token = [], part.start_token
    while True:
        page = svc.read_page(part.tunnel_id, part.channel_id, token, 1000, layout)
        batches.append(page.batch)
        if not page.may_more or page.next_token == FINISHED:
            return pa.Table.from_batches(batches)
        token = page.next_token


def _with(part: ChannelPartition, **changes) -> ChannelPartition:
    return ChannelPartition(**{**part.__dict__, **changes})


def test_a_byte_budget_stops_after_the_record_that_crosses_it(service, tmp_path):
    _, store = service
    proto, part = _partition(store, tmp_path)
    layout = PageLayout.of_table(store.table_schema("t"))
    everything = _all_rows(store, part)
    sizes = record_sizes(everything.combine_chunks().to_batches()[0]).to_pylist()
    assert len(set(sizes)) > 1  # records differ in size: the budget counts each
    budget = sum(sizes[:SEGMENT + 5]) - 1  # crossed by record SEGMENT + 5, in the 2nd page
    read = claim_and_read(_with(part, max_bytes=budget), layout)
    taken = read.count
    assert taken == read.end.records == SEGMENT + 5
    assert sum(sizes[:taken - 1]) < budget <= sum(sizes[:taken])
    rows = pa.Table.from_batches(list(read.batches()))
    assert rows.column("_sequence").to_pylist() == everything.column(
        "_sequence").to_pylist()[:taken]
    assert read.end.bound_reached_us is None  # a byte budget is not a bound
    # the claimed end token continues right after the last record taken
    after = executor_clients().reader(part.endpoint).read_page(
        part.tunnel_id, part.channel_id, read.end.token, 1, layout)
    assert after.last_sequence == everything.column("_sequence")[taken].as_py()
    # a replay reads exactly the claimed records, whatever the budget says now
    again = claim_and_read(_with(part, max_bytes=1), layout)
    assert pa.Table.from_batches(list(again.batches())).equals(rows)
    proto.close()


def test_an_available_now_time_bound_stops_at_the_commit_time_and_records_reaching_it(
        service, tmp_path):
    _, store = service
    proto, part = _partition(store, tmp_path)
    layout = PageLayout.of_table(store.table_schema("t"))
    stamps = _all_rows(store, part).column("_commit_ts").cast(pa.int64()).to_pylist()
    bound = stamps[SEGMENT + 2]
    read = claim_and_read(_with(part, available_now_us=bound), layout)
    assert read.count == sum(1 for ts in stamps if ts <= bound) >= SEGMENT + 3
    assert read.end.bound_reached_us == bound
    # a cap that stops the read first: the bound is not reached
    proto2, part2 = _partition(store, tmp_path, **{"tunnel.name": "q2"})
    capped = claim_and_read(_with(part2, available_now_us=bound, max_records=3), layout)
    assert capped.count == 3 and capped.end.bound_reached_us is None
    # caught up before the bound (everything was committed before it): reached as well
    _, part3 = _partition(store, tmp_path, **{"tunnel.name": "q3"})
    whole = claim_and_read(_with(part3, available_now_us=stamps[-1] + 10**9), layout)
    assert whole.count == len(stamps) and whole.end.bound_reached_us == stamps[-1] + 10**9
    for p in (proto, proto2):
        p.close()


def test_a_starting_timestamp_skips_the_older_records_and_the_claim_starts_after_them(
        service, tmp_path):
    _, store = service
    proto, part = _partition(store, tmp_path)
    layout = PageLayout.of_table(store.table_schema("t"))
    everything = _all_rows(store, part)
    stamps = everything.column("_commit_ts").cast(pa.int64()).to_pylist()
    instant = stamps[SEGMENT + 3]
    read = claim_and_read(_with(part, skip_before_us=instant), layout)
    first = sum(1 for ts in stamps if ts < instant)
    rows = pa.Table.from_batches(list(read.batches()))
    assert rows.column("_sequence").to_pylist() == everything.column(
        "_sequence").to_pylist()[first:]
    assert read.end.start_token != part.start_token and read.end.records == len(stamps) - first
    again = claim_and_read(_with(part, skip_before_us=instant), layout)  # replays the claim
    assert pa.Table.from_batches(list(again.batches())).equals(rows)
    proto.close()


@pytest.mark.slow
@pytest.mark.extended  # a minute of writing and reading: make test-extended
def test_a_million_record_partition(tmp_path):
    """One channel of 1,000,000 changes read in one batch through the source's ``read()``:
    every row once, in sequence order, and the claimed end says so."""
    n = 1_000_000
    store = LocalTablestore(tmp_path / "big.db")
    store.create_table("t", primary_key=[("id", "INTEGER")],
                       columns=[("name", "STRING"), ("qty", "INTEGER")], channels=1)
    chunk = 5000
    for lo in range(0, n, chunk):
        store.batch_write("t", [("put", {"id": i % 50_000}, {"name": f"n{i}", "qty": i})
                                for i in range(lo, lo + chunk)])
    proto, part = _partition(store, tmp_path, maxOffsetsPerChannel=str(2 * n))
    reader = TablestoreStreamReader(proto.options, output_schema(store.table_schema("t")))
    rows, previous, last = 0, "", None
    for batch in reader.read(part):
        seq = batch.column("_sequence")
        assert seq[0].as_py() > previous
        assert pc.all(pc.greater(seq.slice(1), seq.slice(0, len(seq) - 1))).as_py() in (True,
                                                                                         None)
        assert pc.all(pc.equal(batch.column("_channel_id"), part.channel_id)).as_py()
        previous = last = seq[-1].as_py()
        qty = batch.column("qty")
        assert qty[0].as_py() == rows  # the n-th change wrote qty=n
        rows += batch.num_rows
    assert rows == n and last == f"{n:020d}"
    end = proto.meta.get_end_checkpoint(proto.namespace, part.end_uuid, part.channel_id)
    assert end is not None and end.records == n and end.last_sequence == last
    assert end.token != FINISHED and end.sequence_number == part.start_sequence_number + n
    proto.close()
    executor_clients()._tunnels.pop(tunnel_key(part.endpoint)).close()
    store.close()
