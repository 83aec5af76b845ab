"""The channel-reader contract: pages, tokens, ``may_more``, ``FINISHED``, trimmed data and the
columnar page (``ChannelReader``; executors).

Run for every backend through ``tunnel_contract.TunnelContract``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from connector.errors import (
    ChannelNotReadableError,
    MalformedTokenError,
    TrimmedDataError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
    Op,
)
from tests.contract.tunnel_harness import ContractHelpers, TunnelHarness, consume, per_key, read_all


class ChannelReaderContract(ContractHelpers):
    """The contract of ``connector.tunnel.base.ChannelReader``."""

    def test_read_paging_limit_next_token_may_more(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(7):
            h.put("t", f"k{i}", i)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        token = h.service.get_checkpoint(tid, cid).token
        pages = []
        for _ in range(3):
            res = h.service.read_records(tid, cid, token, 3)
            pages.append((len(res.records), res.may_more))
            assert res.next_token != FINISHED
            token = res.next_token
            got = [r.primary_key["id"] for r in res.records]
            assert all(r.channel_id in ("", cid) for r in res.records)
            assert got == sorted(got, key=lambda k: int(k[1:]))
        assert pages == [(3, True), (3, True), (1, False)]
        res = h.service.read_records(tid, cid, token, 3)
        assert (list(res.records), res.may_more) == ([], False)
        h.put("t", "k7", 7)
        res2 = h.service.read_records(tid, cid, res.next_token, 3)
        assert [(r.op, r.primary_key["id"], r.columns["value"]) for r in res2.records] == [
            (Op.PUT, "k7", 7)
        ]

    def test_sequences_increase_and_records_carry_images(
        self, tunnel_harness: TunnelHarness
    ) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        h.update("t", "a", 2)
        h.delete("t", "a")
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        records, _ = read_all(h.service, tid, cid, h.service.get_checkpoint(tid, cid).token)
        assert [r.op for r in records] == [Op.PUT, Op.UPDATE, Op.DELETE]
        seqs = [r.sequence for r in records]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert records[1].after_image() == {"value": 2}
        assert records[2].after_image() is None
        assert all(r.commit_ts_us > 0 for r in records)

    def test_finished_at_closed_channel_end(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(3):
            h.put("t", f"k{i}", i)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        token = h.service.get_checkpoint(tid, cid).token
        res = h.service.read_records(tid, cid, token, 2)
        assert len(res.records) == 2 and res.next_token != FINISHED
        h.split("t", cid)
        res = h.service.read_records(tid, cid, res.next_token, 2)
        assert len(res.records) == 1
        assert (res.next_token, res.may_more) == (FINISHED, False)
        again = h.service.read_records(tid, cid, FINISHED, 2)
        assert (list(again.records), again.next_token) == ([], FINISHED)

    def test_finished_with_zero_records_at_end(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        records, token = read_all(h.service, tid, cid, h.service.get_checkpoint(tid, cid).token)
        assert len(records) == 1 and token != FINISHED
        h.split("t", cid)
        res = h.service.read_records(tid, cid, token, 10)
        assert (list(res.records), res.next_token) == ([], FINISHED)

    def test_wait_channel_not_readable(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        tid = self._tunnel(h, "t")
        parent = self._only_channel(h, "t")
        a, _ = h.split("t", parent)
        h.put("t", "x", 1)
        with pytest.raises(ChannelNotReadableError):
            h.service.read_records(tid, a, h.service.get_checkpoint(tid, a).token, 10)

    def test_per_key_order_across_split_and_merge(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        self._tunnel(h, "t")
        root = self._only_channel(h, "t")
        keys = [f"k{i}" for i in range(24)]
        expected: dict[str, list[tuple[str, Any]]] = {k: [] for k in keys}

        def round_(n: int) -> None:
            for i, k in enumerate(keys):
                v = n * 100 + i
                if (i + n) % 5 == 0:
                    h.delete("t", k)
                    expected[k].append(("DELETE", None))
                elif n == 0 or (i + n) % 3 == 0:
                    h.put("t", k, v)
                    expected[k].append(("PUT", v))
                else:
                    h.update("t", k, v)
                    expected[k].append(("UPDATE", v))

        round_(0)
        round_(1)
        a, b = h.split("t", root)
        round_(2)
        round_(3)
        child = h.merge("t", a, b)
        round_(4)
        state = consume(h.service, "t", "tun", limit=7)
        assert per_key(state.records) == expected
        assert self._statuses(h, "t")[child] is ChannelStatus.OPEN
        assert all(self._statuses(h, "t")[c] is ChannelStatus.TERMINATED for c in (root, a, b))

    def test_malformed_tokens(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 2)
        tid = self._tunnel(h, "t")
        c1, c2 = (c.channel_id for c in h.service.describe_tunnel("t", "tun").channels)
        junk = base64.b64encode(json.dumps({"x": 1}).encode()).decode()
        other = h.service.get_checkpoint(tid, c2).token
        for bad in ("garbage!!", "", junk, other):
            with pytest.raises(MalformedTokenError):
                h.service.read_records(tid, c1, bad, 10)
            with pytest.raises(MalformedTokenError):
                h.service.checkpoint(tid, c1, Checkpoint(bad, 1))

    def test_trimmed_read_raises_with_resume_token(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        start = h.service.get_checkpoint(tid, cid).token
        for i in range(5):
            h.put("t", f"k{i}", i)
        h.trim("t")
        h.put("t", "k5", 5)
        with pytest.raises(TrimmedDataError) as exc:
            h.service.read_records(tid, cid, start, 10)
        assert exc.value.channel_id == cid
        resumed, _ = read_all(h.service, tid, cid, exc.value.resume_token)
        assert per_key(resumed) == {"k5": [("PUT", 5)]}
        assert all(r.primary_key["id"] != "k0" for r in h.change_log("t"))

    def test_read_page_equals_the_default_conversion_of_read_records(
        self, tunnel_harness: TunnelHarness
    ) -> None:
        """``read_page`` (what executors call) gives, page for page, the batch the default
        adapter builds from ``read_records`` (``records_to_page``), the same next token and
        ``may_more`` -- for the declared layout, a layout lacking ``value`` (it lands in
        ``_extra``) and one with a column no record has."""
        import pyarrow as pa

        from connector.tunnel.page import PageLayout, records_to_page

        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(5):
            h.put("t", f"k{i}", i)
        h.update("t", "k1", 10)
        h.delete("t", "k2")
        h.put("t", "k2", -3)
        h.update("t", "k9", 9)  # an update of a row that did not exist
        h.delete("t", "k0")
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        layouts = [
            PageLayout.of_table(h.service.table_schema("t")),
            PageLayout((("id", pa.string()),)),
            PageLayout((("value", pa.int64()), ("id", pa.string()), ("absent", pa.float64()))),
        ]
        for layout in layouts:
            token, pages, seen = h.service.get_checkpoint(tid, cid).token, 0, 0
            while True:
                result = h.service.read_records(tid, cid, token, 3)
                page = h.service.read_page(tid, cid, token, 3, layout)
                expected = records_to_page(result.records, layout)
                assert page.batch.schema == expected.schema
                assert page.batch.to_pylist() == expected.to_pylist()
                assert page.batch.equals(expected)
                assert (page.count, page.next_token, page.may_more) == (
                    len(result.records), result.next_token, result.may_more)
                seen += page.count
                pages += 1
                if not result.records or result.next_token == FINISHED:
                    break
                token = result.next_token
            assert seen == len(h.change_log("t")) and pages >= 3, (seen, pages)

    def test_a_page_tells_the_token_after_each_of_its_records(
        self, tunnel_harness: TunnelHarness
    ) -> None:
        """``Page.token_after(n)`` -- what a read that stops inside a page goes on from, with no
        second request -- reads on from the record after the ``n``-th; all of them end at
        ``next_token``; a part of the page ends where its last record does."""
        from connector.tunnel.page import PageLayout

        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(6):
            h.put("t", f"k{i}", i)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        start = h.service.get_checkpoint(tid, cid).token
        every = [r.primary_key["id"] for r in read_all(h.service, tid, cid, start)[0]]
        page = h.service.read_page(tid, cid, start, 6,
                                   PageLayout.of_table(h.service.table_schema("t")))
        assert page.count >= 3 and page.batch.column("id").to_pylist() == every[:page.count]
        assert page.token_after(page.count) == page.next_token
        for n in range(1, page.count):
            rest, _ = read_all(h.service, tid, cid, page.token_after(n))
            assert [r.primary_key["id"] for r in rest] == every[n:], n
        part = page.part(1, 2)
        assert part.count == 2 and part.batch.column("id").to_pylist() == every[1:3]
        assert part.next_token == page.token_after(3) and part.may_more
        assert part.token_after(1) == page.token_after(2)
