"""The Tablestore client's prefetch (``read_page`` sends the next page's request ahead) against
the emulator over HTTP on 127.0.0.1.

- Reads with prefetch on give the same pages and tokens as reads with it off, the prefetched
  answers are used, and the requests share kept-alive connections.
- A prefetch that fails is never raised: the reader's own request answers.
- A batch whose last read prefetched the page past its end: the claimed end, the rows, the
  replay and the pushed checkpoint are those of the records asked for, and the next batch
  starts right after them (the driver's protocol and the executor's ``claim_and_read``, in
  Spark's call order, without Spark).
- The ``read.prefetch`` option: folded into the endpoint as ``prefetch=false``, not part of the
  source identity, refused where it means nothing.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pyarrow as pa
import pytest

from connector.errors import OptionError
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.reader import claim_and_read
from connector.tunnel.page import PageLayout
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.client import TablestoreTunnelService
from connector.tunnel.tablestore.tokens import inside_page
from tablestore_emulator.errors import OtsError
from tablestore_emulator.server import EmulatorServer
from testkit.emulator import INSTANCE, KEY_ID, SECRET, service_uri
from testkit.tunnel_harnesses import EmulatorHarness
from testkit.waiting import wait_until

RECORDS = 2_300  # the emulator pages by 500: five pages


@pytest.fixture
def harness(tmp_path: Path):
    h = EmulatorHarness(tmp_path / "store.db")
    h.create_table("t", 1)
    h.writer.batch_write("t", [("put", {"id": f"k{i:05d}"}, {"value": i})
                               for i in range(RECORDS)])
    yield h
    h.close()


def _read_requests(emulator: EmulatorServer) -> list[tuple[str, int]]:
    """(token, max_records) of every ReadRecords request the emulator serves from now on."""
    seen: list[tuple[str, int]] = []
    handler = emulator.routes["/tunnel/readrecords"]

    def counted(ctx, body):  # noqa: ANN001, ANN202 - a test shim
        request = m.parse(m.ReadRecordsRequest, body)
        seen.append((request.token, request.max_records))
        return handler(ctx, body)

    emulator.routes["/tunnel/readrecords"] = counted
    return seen


def _read_pages(client: TablestoreTunnelService, tid: str, cid: str, limit: int,
                layout: PageLayout) -> tuple[pa.Table, list[str]]:
    token = client.get_checkpoint(tid, cid).token
    batches, tokens = [], []
    while True:
        page = client.read_page(tid, cid, token, limit, layout)
        batches.append(page.batch)
        tokens.append(page.next_token)
        token = page.next_token
        if not page.may_more:
            return pa.Table.from_batches(batches), tokens


def test_prefetched_reads_equal_plain_reads_and_reuse_connections(harness: EmulatorHarness
                                                                  ) -> None:
    h = harness
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "tun").channels]
    layout = PageLayout.of_table(h.service.table_schema("t"))
    plain = TablestoreTunnelService.from_uri(service_uri(h.emulator.url, prefetch="false"))
    ahead = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))
    try:
        requests = _read_requests(h.emulator)
        want_rows, want_tokens = _read_pages(plain, tid, cid, 1000, layout)
        plain_requests = len(requests)
        assert plain.prefetch_stats == {"used": 0, "unused": 0}
        requests.clear()
        rows, tokens = _read_pages(ahead, tid, cid, 1000, layout)
        assert rows.equals(want_rows) and tokens == want_tokens
        assert rows.num_rows == RECORDS
        assert ahead.prefetch_stats["used"] == plain_requests - 1  # all but the first page
        assert len(requests) == plain_requests  # nothing asked twice, nothing past the end
        pool = ahead._transport._pool
        assert plain_requests >= 5 and pool.opened <= 2  # kept alive, reused
    finally:
        plain.close()
        ahead.close()


def _reachable_bytes(root: object, depth: int = 6) -> list[int]:
    """Sizes of the ``bytes`` objects reachable from ``root`` through Python references."""
    seen: set[int] = set()
    frontier, sizes = [root], []
    for _ in range(depth):
        following = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) in seen or isinstance(ref, type):
                    continue
                seen.add(id(ref))
                if isinstance(ref, bytes | bytearray | memoryview):
                    sizes.append(len(ref))
                following.append(ref)
        frontier = following
    return sizes


@pytest.mark.parametrize("limit", [300, 1000], ids=["inside-a-page", "whole-pages"])
def test_a_page_does_not_keep_the_services_answer_alive(harness: EmulatorHarness,
                                                         limit: int) -> None:
    """The reader holds a batch's pages until the batch's end is claimed: a page keeps its
    columns and what tells its tokens, not the service's answer as well (which doubled the
    memory of a large partition read over the wire)."""
    h = harness
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "tun").channels]
    layout = PageLayout.of_table(h.service.table_schema("t"))
    start = h.service.get_checkpoint(tid, cid).token
    page = h.service.read_page(tid, cid, start, limit, layout)
    assert page.count == min(limit, 500)
    assert max(_reachable_bytes(page), default=0) < 1_000  # the answer was over 10 KB
    assert page.token_after(100) == inside_page(start, 100)  # still told without the answer


def test_a_failed_prefetch_is_not_raised_the_own_request_answers(
        harness: EmulatorHarness) -> None:
    h = harness
    tid = h.service.create_tunnel("t", "tun").tunnel_id
    (cid,) = [c.channel_id for c in h.service.describe_tunnel("t", "tun").channels]
    layout = PageLayout.of_table(h.service.table_schema("t"))
    handler = h.emulator.routes["/tunnel/readrecords"]
    seen: list[str] = []
    refused: list[str] = []

    def refuse_each_token_once(ctx, body):  # noqa: ANN001, ANN202 - a test shim
        # the first page's token passes; every later page's first request (the prefetch) fails
        token = m.parse(m.ReadRecordsRequest, body).token
        if seen and token not in seen:
            seen.append(token)
            refused.append(token)
            raise OtsError(403, "OTSAuthFailed", "refused once by the test")
        seen.append(token)
        return handler(ctx, body)

    h.emulator.routes["/tunnel/readrecords"] = refuse_each_token_once
    client = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))
    try:
        rows, _ = _read_pages(client, tid, cid, 1000, layout)
        assert rows.num_rows == RECORDS
        assert len(refused) == 4  # every prefetch failed ...
        assert client.prefetch_stats["used"] == 4  # ... and the reads' own requests answered
        # each connection went back to the pool once: no two callers can ever be handed the
        # same connection
        assert client._transport._pool.given_back_twice == 0
    finally:
        client.close()


def _options(url: str, **extra: str) -> SourceOptions:
    return SourceOptions.from_spark({
        "endpoint": url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
        "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "tun",
        "meta.store": "sqlite:///tmp/unused-meta.db", **extra})


def test_a_batch_whose_prefetch_ran_past_its_end(harness: EmulatorHarness, tmp_path: Path
                                                 ) -> None:
    h = harness
    options = SourceOptions.from_spark({
        "endpoint": h.emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
        "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "tun",
        "meta.store": f"sqlite://{tmp_path / 'meta.db'}", "maxOffsetsPerChannel": "1200"})
    protocol = StreamProtocol(options)
    try:
        layout = PageLayout.of_table(protocol.tunnel.table_schema("t"))
        start = protocol.initial_offset()
        end = protocol.latest_offset(start, None)
        (part,) = protocol.plan(start, end)
        requests = _read_requests(h.emulator)
        first = claim_and_read(part, layout)
        # pages of 500: 500 + 500 (the prefetched answer) + 200; the last read said more
        # records follow, so the page past the end was requested too
        assert first.end.records == 1200 and first.count == 1200
        # that request is on its way when the read returns (sent ahead, not waited for): the
        # emulator must receive it, within a few seconds
        wait_until("the request for the page past the end", lambda: [
            token for token, _ in requests], lambda tokens: first.end.token in tokens,
            timeout=10, interval=0.01)
        rows = pa.Table.from_batches(list(first.batches()))
        assert rows.column("id").to_pylist() == [f"k{i:05d}" for i in range(1200)]
        again = claim_and_read(part, layout)  # a replay: exactly the recorded records
        assert again.end == first.end
        assert pa.Table.from_batches(list(again.batches())).equals(rows)
        protocol.commit(end)
        (cid,) = [c.channel_id for c in protocol.tunnel.describe_tunnel("t", "tun").channels]
        assert protocol.tunnel.get_checkpoint(protocol.tunnel_id, cid).token == first.end.token
        # the next batch starts right after the claimed end (the held page may serve it)
        end2 = protocol.latest_offset(end, None)
        (part2,) = protocol.plan(end, end2)
        second = claim_and_read(part2, layout)
        ids = pa.Table.from_batches(list(second.batches())).column("id").to_pylist()
        assert ids == [f"k{i:05d}" for i in range(1200, 2300)]
    finally:
        protocol.close()


def test_read_prefetch_option() -> None:
    url = "http://127.0.0.1:9"
    on, off = _options(url), _options(url, **{"read.prefetch": "False"})
    assert on.read_prefetch and not off.read_prefetch
    assert "prefetch" not in on.endpoint.uri and off.endpoint.uri.endswith("&prefetch=false")
    assert on.source_identity == off.source_identity  # how it reads, not what
    assert TablestoreTunnelService.from_endpoint(off.endpoint).prefetch is False
    assert TablestoreTunnelService.from_endpoint(on.endpoint).prefetch is True
    with pytest.raises(OptionError, match="read.prefetch"):
        _options(url, **{"read.prefetch": "sometimes"})
    with pytest.raises(OptionError, match="read.prefetch"):
        SourceOptions.from_spark({"endpoint": "local:///tmp/store.db", "table.name": "t",
                                  "tunnel.name": "tun", "read.prefetch": "false"})
