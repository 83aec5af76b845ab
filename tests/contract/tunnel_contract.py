"""The tunnel-service contract: one suite every ``TunnelService`` backend must pass.

How a backend plugs in
----------------------
Write a test module for the backend with a ``tunnel_harness`` fixture and a test class that
inherits ``TunnelContract``::

    import pytest
    from tests.contract.tunnel_contract import TunnelContract

    @pytest.fixture
    def tunnel_harness(tmp_path):
        h = MyBackendHarness(...)        # see ``TunnelHarness`` below
        yield h
        h.close()

    class TestMyBackendContract(TunnelContract):
        pass

The harness is a *fresh, empty* backend per test (function-scoped fixture). It gives the suite
``service`` (the ``TunnelService`` under test) and backend-side operations that produce data the
way a writer, or the service itself, would: ``create_table(name, channels)``, ``put(table, key,
value)``, ``update(table, key, value)``, ``delete(table, key)``, ``split(table, channel_id)``,
``merge(table, a, b)``, ``trim(table)`` (trim *all* history held now) and ``change_log(table)``.
Tables follow one convention: key column ``id`` (STRING), one attribute column ``value``
(INTEGER); ``put(t, "k1", 5)`` writes row ``{"id": "k1"}`` with ``{"value": 5}``.

A backend that cannot perform an operation (a real service cannot be told to split a channel)
calls ``pytest.skip("...")`` from that harness method; the tests that need it are skipped, the
rest still run. A backend whose ``has_new_data`` returns ``None`` ("can't tell") skips that test.

``consume`` below is a reference consumer loop (describe, read OPEN channels from their
checkpoints, push checkpoints, push FINISHED, pick up released children); the suite uses it
for ordering checks and backends' own tests may use it for end-to-end runs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from connector.errors import (
    ChannelNotReadableError,
    InvalidCheckpointError,
    MalformedTokenError,
    StaleCheckpointError,
    TrimmedDataError,
    TunnelExistsError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    ChannelType,
    Checkpoint,
    Op,
    Record,
    StartPosition,
    TunnelService,
    TunnelType,
)


class TunnelHarness(Protocol):
    """What a backend's ``tunnel_harness`` fixture provides (see the module docstring)."""

    service: TunnelService

    def create_table(self, name: str, channels: int) -> None: ...
    def put(self, table: str, key: str, value: int) -> None: ...
    def update(self, table: str, key: str, value: int) -> None: ...
    def delete(self, table: str, key: str) -> None: ...
    def split(self, table: str, channel_id: str) -> tuple[str, str]: ...
    def merge(self, table: str, a: str, b: str) -> str: ...
    def trim(self, table: str) -> None: ...
    def change_log(self, table: str) -> list[Record]: ...


# --- a reference consumer -----------------------------------------------------------------------


@dataclass
class ConsumerState:
    """What a consumer remembers between passes: its position and pushed sequence per channel,
    and every record received, in the order received."""

    tunnel_id: str
    positions: dict[str, str] = field(default_factory=dict)
    seqnos: dict[str, int] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)


def consume_pass(
    service: TunnelService,
    table: str,
    tunnel_name: str,
    state: ConsumerState,
    limit: int = 500,
    on_records: Callable[[list[Record]], None] | None = None,
    pages: int = 4,
) -> tuple[int, int]:
    """One pass over the tunnel: read every OPEN channel (at most ``pages`` reads each, so a
    busy channel cannot starve the others), pushing a checkpoint after each read and FINISHED
    at a closed channel's end.

    Channels released by a FINISHED pushed in this pass are read in the next pass (after the
    next describe), so a child is never read before its parents. Returns ``(records read,
    channels finished)``.
    """
    read = finished = 0
    for info in service.describe_tunnel(table, tunnel_name).channels:
        if info.status is not ChannelStatus.OPEN:
            continue
        cid = info.channel_id
        if cid not in state.positions:
            cp = service.get_checkpoint(state.tunnel_id, cid)
            state.positions[cid], state.seqnos[cid] = cp.token, cp.sequence_number
        for _ in range(pages):
            if state.positions[cid] == FINISHED:
                break
            res = service.read_records(state.tunnel_id, cid, state.positions[cid], limit)
            state.records.extend(res.records)
            if on_records is not None and res.records:
                on_records(list(res.records))
            read += len(res.records)
            state.seqnos[cid] += len(res.records) + (res.next_token == FINISHED)
            if res.records or res.next_token == FINISHED:
                service.checkpoint(
                    state.tunnel_id, cid, Checkpoint(res.next_token, state.seqnos[cid])
                )
            state.positions[cid] = res.next_token
            finished += res.next_token == FINISHED
            if not res.may_more:
                break
    return read, finished


def consume(
    service: TunnelService,
    table: str,
    tunnel_name: str,
    state: ConsumerState | None = None,
    limit: int = 500,
) -> ConsumerState:
    """Read the tunnel until a pass finds nothing new (no records, no channel finished)."""
    if state is None:
        tunnel_id = service.describe_tunnel(table, tunnel_name).tunnel.tunnel_id
        state = ConsumerState(tunnel_id)
    while True:
        read, finished = consume_pass(service, table, tunnel_name, state, limit)
        if not read and not finished:
            return state


def per_key(records: Iterable[Record]) -> dict[str, list[tuple[str, Any]]]:
    """``{key: [(op, value), ...]}`` in the given order (value ``None`` for a DELETE)."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for r in records:
        value = None if r.op is Op.DELETE else r.columns.get("value")
        out.setdefault(r.primary_key["id"], []).append((r.op.value, value))
    return out


def read_all(
    service: TunnelService, tunnel_id: str, channel_id: str, token: str, limit: int = 1000
) -> tuple[list[Record], str]:
    """Read a channel from ``token`` until no more is available now: (records, next token)."""
    records: list[Record] = []
    while True:
        res = service.read_records(tunnel_id, channel_id, token, limit)
        records.extend(res.records)
        token = res.next_token
        if not res.may_more:
            return records, token


# --- the suite ---------------------------------------------------------------------------------


class TunnelContract:
    """The contract. Inherit it in a ``Test...`` class next to a ``tunnel_harness`` fixture."""

    # helpers ------------------------------------------------------------------------------

    @staticmethod
    def _tunnel(
        h: TunnelHarness,
        table: str,
        name: str = "tun",
        tunnel_type: TunnelType = TunnelType.STREAM,
        start: StartPosition = StartPosition.EARLIEST,
    ) -> str:
        return h.service.create_tunnel(table, name, tunnel_type, start).tunnel_id

    @staticmethod
    def _statuses(h: TunnelHarness, table: str, name: str = "tun") -> dict[str, ChannelStatus]:
        return {c.channel_id: c.status for c in h.service.describe_tunnel(table, name).channels}

    @staticmethod
    def _only_channel(h: TunnelHarness, table: str, name: str = "tun") -> str:
        (cid,) = [c.channel_id for c in h.service.describe_tunnel(table, name).channels]
        return cid

    @staticmethod
    def _finish(h: TunnelHarness, tid: str, cid: str) -> list[Record]:
        """Read a closed channel from its checkpoint to FINISHED and push FINISHED."""
        cp = h.service.get_checkpoint(tid, cid)
        records, token = read_all(h.service, tid, cid, cp.token)
        assert token == FINISHED
        h.service.checkpoint(tid, cid, Checkpoint(FINISHED, cp.sequence_number + len(records) + 1))
        return records

    # tunnels ------------------------------------------------------------------------------

    def test_create_describe_list_delete(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 2)
        h.create_table("u", 1)
        info = h.service.create_tunnel("t", "tun", TunnelType.STREAM, StartPosition.EARLIEST)
        assert (info.table_name, info.tunnel_name) == ("t", "tun")
        assert info.tunnel_type is TunnelType.STREAM
        assert info.start_position is StartPosition.EARLIEST
        assert isinstance(info.tunnel_id, str) and info.tunnel_id
        desc = h.service.describe_tunnel("t", "tun")
        assert desc.tunnel == info
        assert len(desc.channels) == 2
        assert {c.status for c in desc.channels} == {ChannelStatus.OPEN}
        assert {c.channel_type for c in desc.channels} == {ChannelType.STREAM}
        other = h.service.create_tunnel("u", "tun2")
        assert [t.tunnel_id for t in h.service.list_tunnels("t")] == [info.tunnel_id]
        assert {t.tunnel_id for t in h.service.list_tunnels()} == {info.tunnel_id, other.tunnel_id}
        h.service.delete_tunnel("t", "tun")
        assert h.service.list_tunnels("t") == []
        with pytest.raises(UnknownTunnelError):
            h.service.describe_tunnel("t", "tun")
        with pytest.raises(UnknownTunnelError):
            h.service.get_checkpoint(info.tunnel_id, desc.channels[0].channel_id)

    def test_duplicate_tunnel_name_rejected_per_table(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.create_table("u", 1)
        first = h.service.create_tunnel("t", "tun")
        with pytest.raises(TunnelExistsError) as exc:
            h.service.create_tunnel("t", "tun")
        assert "tun" in str(exc.value)
        h.service.create_tunnel("u", "tun")  # the same name on another table is another tunnel
        assert h.service.ensure_tunnel("t", "tun").tunnel_id == first.tunnel_id

    def test_deleted_tunnel_recreated_starts_fresh(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        records, token = read_all(h.service, tid, cid, h.service.get_checkpoint(tid, cid).token)
        h.service.checkpoint(tid, cid, Checkpoint(token, 1))
        h.service.delete_tunnel("t", "tun")
        tid2 = self._tunnel(h, "t")
        assert tid2 != tid
        again, _ = read_all(h.service, tid2, cid, h.service.get_checkpoint(tid2, cid).token)
        assert per_key(again) == per_key(records) == {"a": [("PUT", 1)]}

    def test_unknown_table_tunnel_channel(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        token = h.service.get_checkpoint(tid, cid).token
        with pytest.raises(UnknownTableError):
            h.service.create_tunnel("nope", "tun")
        with pytest.raises(UnknownTableError):
            h.service.table_schema("nope")
        with pytest.raises((UnknownTableError, UnknownTunnelError)):
            h.service.describe_tunnel("nope", "tun")
        with pytest.raises(UnknownTunnelError):
            h.service.describe_tunnel("t", "nope")
        with pytest.raises(UnknownTunnelError):
            h.service.delete_tunnel("t", "nope")
        with pytest.raises(UnknownTunnelError):
            h.service.read_records("no-such-tunnel", cid, token, 10)
        with pytest.raises(UnknownChannelError):
            h.service.read_records(tid, "no-such-channel", token, 10)
        with pytest.raises(UnknownChannelError):
            h.service.get_checkpoint(tid, "no-such-channel")
        with pytest.raises(UnknownChannelError):
            h.service.checkpoint(tid, "no-such-channel", Checkpoint(token, 1))

    def test_table_schema(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        schema = h.service.table_schema("t")
        assert schema.table_name == "t"
        assert [c.name for c in schema.primary_key] == ["id"]
        assert schema.primary_key[0].type == "STRING"

    # start positions ------------------------------------------------------------------------

    def test_earliest_reads_history_latest_skips_it(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        h.put("t", "b", 2)
        early = self._tunnel(h, "t", "early", start=StartPosition.EARLIEST)
        late = self._tunnel(h, "t", "late", start=StartPosition.LATEST)
        h.put("t", "c", 3)
        cid = self._only_channel(h, "t", "early")
        got_early, _ = read_all(h.service, early, cid, h.service.get_checkpoint(early, cid).token)
        got_late, _ = read_all(h.service, late, cid, h.service.get_checkpoint(late, cid).token)
        assert per_key(got_early) == {"a": [("PUT", 1)], "b": [("PUT", 2)], "c": [("PUT", 3)]}
        assert per_key(got_late) == {"c": [("PUT", 3)]}

    def test_latest_treats_closed_channels_as_terminated(
        self, tunnel_harness: TunnelHarness
    ) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        self._tunnel(h, "t", "probe")
        parent = self._only_channel(h, "t", "probe")
        h.put("t", "a", 1)
        a, b = h.split("t", parent)
        self._tunnel(h, "t", "late", start=StartPosition.LATEST)
        st = self._statuses(h, "t", "late")
        assert st[parent] is ChannelStatus.TERMINATED
        assert st[a] is st[b] is ChannelStatus.OPEN
        st_early = self._statuses(h, "t", "probe")
        assert st_early[parent] is ChannelStatus.OPEN
        assert st_early[a] is st_early[b] is ChannelStatus.WAIT

    def test_get_checkpoint_start_then_pushed(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        start = h.service.get_checkpoint(tid, cid)
        assert not start.finished
        records, token = read_all(h.service, tid, cid, start.token)
        assert len(records) == 1
        h.service.checkpoint(tid, cid, Checkpoint(token, start.sequence_number + 1))
        assert h.service.get_checkpoint(tid, cid) == Checkpoint(token, start.sequence_number + 1)
        assert read_all(h.service, tid, cid, token)[0] == []

    # reading --------------------------------------------------------------------------------

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

    # lineage ----------------------------------------------------------------------------------

    def test_children_wait_until_parent_finished_per_tunnel(
        self, tunnel_harness: TunnelHarness
    ) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        one = self._tunnel(h, "t", "one")
        self._tunnel(h, "t", "two")
        parent = self._only_channel(h, "t", "one")
        h.put("t", "a", 1)
        a, b = h.split("t", parent)
        for name in ("one", "two"):
            st = self._statuses(h, "t", name)
            assert (st[parent], st[a], st[b]) == (
                ChannelStatus.OPEN,
                ChannelStatus.WAIT,
                ChannelStatus.WAIT,
            )
        infos = {c.channel_id: c for c in h.service.describe_tunnel("t", "one").channels}
        assert parent in infos[a].parent_ids and parent in infos[b].parent_ids
        # reading the parent to its end is not enough: the FINISHED push releases children
        cp = h.service.get_checkpoint(one, parent)
        records, token = read_all(h.service, one, parent, cp.token)
        assert token == FINISHED
        assert self._statuses(h, "t", "one")[a] is ChannelStatus.WAIT
        h.service.checkpoint(one, parent, Checkpoint(FINISHED, len(records) + 1))
        st_one, st_two = self._statuses(h, "t", "one"), self._statuses(h, "t", "two")
        assert (st_one[parent], st_one[a], st_one[b]) == (
            ChannelStatus.TERMINATED,
            ChannelStatus.OPEN,
            ChannelStatus.OPEN,
        )
        assert (st_two[parent], st_two[a], st_two[b]) == (
            ChannelStatus.OPEN,
            ChannelStatus.WAIT,
            ChannelStatus.WAIT,
        )

    def test_merge_child_waits_for_both_parents(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 2)
        tid = self._tunnel(h, "t")
        p1, p2 = (c.channel_id for c in h.service.describe_tunnel("t", "tun").channels)
        child = h.merge("t", p1, p2)
        infos = {c.channel_id: c for c in h.service.describe_tunnel("t", "tun").channels}
        assert set(infos[child].parent_ids) >= {p1, p2}
        assert infos[child].status is ChannelStatus.WAIT
        self._finish(h, tid, p1)
        assert self._statuses(h, "t")[child] is ChannelStatus.WAIT
        self._finish(h, tid, p2)
        assert self._statuses(h, "t")[child] is ChannelStatus.OPEN

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

    # checkpoints ------------------------------------------------------------------------------

    def test_independent_checkpoints_per_tunnel(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(4):
            h.put("t", f"k{i}", i)
        one, two = self._tunnel(h, "t", "one"), self._tunnel(h, "t", "two")
        cid = self._only_channel(h, "t", "one")
        res = h.service.read_records(one, cid, h.service.get_checkpoint(one, cid).token, 3)
        h.service.checkpoint(one, cid, Checkpoint(res.next_token, 3))
        assert h.service.get_checkpoint(one, cid) == Checkpoint(res.next_token, 3)
        start_two = h.service.get_checkpoint(two, cid)
        assert start_two != Checkpoint(res.next_token, 3)
        assert len(read_all(h.service, two, cid, start_two.token)[0]) == 4
        assert len(read_all(h.service, one, cid, res.next_token)[0]) == 1

    def test_stale_checkpoint_rejected_equal_accepted(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        for i in range(3):
            h.put("t", f"k{i}", i)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        res = h.service.read_records(tid, cid, h.service.get_checkpoint(tid, cid).token, 2)
        h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 5))
        h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 5))  # idempotent
        with pytest.raises(StaleCheckpointError):
            h.service.checkpoint(tid, cid, Checkpoint(res.next_token, 4))
        assert h.service.get_checkpoint(tid, cid) == Checkpoint(res.next_token, 5)
        more = h.service.read_records(tid, cid, res.next_token, 10)
        h.service.checkpoint(tid, cid, Checkpoint(more.next_token, 6))
        assert h.service.get_checkpoint(tid, cid) == Checkpoint(more.next_token, 6)

    def test_finished_push_rejected_before_the_end(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        tid = self._tunnel(h, "t")
        cid = self._only_channel(h, "t")
        with pytest.raises(InvalidCheckpointError):  # the channel is still open
            h.service.checkpoint(tid, cid, Checkpoint(FINISHED, 1))
        a, _ = h.split("t", cid)
        with pytest.raises(InvalidCheckpointError):  # closed, but its record was never read
            h.service.checkpoint(tid, cid, Checkpoint(FINISHED, 1))
        with pytest.raises(InvalidCheckpointError):  # a child in WAIT
            h.service.checkpoint(tid, a, Checkpoint(FINISHED, 1))
        assert self._statuses(h, "t")[cid] is ChannelStatus.OPEN
        self._finish(h, tid, cid)
        assert self._statuses(h, "t")[cid] is ChannelStatus.TERMINATED

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

    # progress -----------------------------------------------------------------------------------

    def test_has_new_data(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 1)
        tid = self._tunnel(h, "t")
        parent = self._only_channel(h, "t")
        pos = {parent: h.service.get_checkpoint(tid, parent).token}
        first = h.service.has_new_data(tid, pos)
        if first is None:
            pytest.skip("this backend cannot tell whether new data is waiting")
        assert first is False
        assert h.service.has_new_data(tid, {}) is True  # a readable channel with no position
        h.put("t", "a", 1)
        assert h.service.has_new_data(tid, pos) is True
        _, pos[parent] = read_all(h.service, tid, parent, pos[parent])
        assert h.service.has_new_data(tid, pos) is False
        a, b = h.split("t", parent)
        assert h.service.has_new_data(tid, pos) is True  # closed, not yet read to FINISHED
        _, pos[parent] = read_all(h.service, tid, parent, pos[parent])
        assert pos[parent] == FINISHED
        assert h.service.has_new_data(tid, pos) is False  # children wait for the push
        h.service.checkpoint(tid, parent, Checkpoint(FINISHED, 2))
        assert h.service.has_new_data(tid, pos) is True  # released children not in pos
        pos[a] = h.service.get_checkpoint(tid, a).token
        pos[b] = h.service.get_checkpoint(tid, b).token
        assert h.service.has_new_data(tid, pos) is False
        h.put("t", "b", 2)
        assert h.service.has_new_data(tid, pos) is True

    # base data ----------------------------------------------------------------------------------

    def test_base_and_stream_snapshot_boundary(self, tunnel_harness: TunnelHarness) -> None:
        h = tunnel_harness
        h.create_table("t", 2)
        for i in range(30):
            h.put("t", f"k{i}", i)
        for i in range(10):
            h.update("t", f"k{i}", 100 + i)
        for i in range(10, 15):
            h.delete("t", f"k{i}")
        snapshot = {f"k{i}": (100 + i if i < 10 else i) for i in range(30) if not 10 <= i < 15}
        self._tunnel(h, "t", tunnel_type=TunnelType.BASE_AND_STREAM)
        desc = h.service.describe_tunnel("t", "tun")
        base = [c for c in desc.channels if c.channel_type is ChannelType.BASE_DATA]
        stream = [c for c in desc.channels if c.channel_type is ChannelType.STREAM]
        assert base and all(c.status is ChannelStatus.OPEN for c in base)
        assert stream and all(c.status is ChannelStatus.WAIT for c in stream)
        after: dict[str, list[tuple[str, Any]]] = {}
        for i in range(5):
            h.update("t", f"k{i}", 200 + i)
            after.setdefault(f"k{i}", []).append(("UPDATE", 200 + i))
        for i in range(30, 35):
            h.put("t", f"k{i}", i)
            after.setdefault(f"k{i}", []).append(("PUT", i))
        for i in range(20, 25):
            h.delete("t", f"k{i}")
            after.setdefault(f"k{i}", []).append(("DELETE", None))
        state = consume(h.service, "t", "tun", limit=4)
        base_ids = {c.channel_id for c in base}
        from_base = [r for r in state.records if r.channel_id in base_ids]
        assert {r.op for r in from_base} == {Op.PUT}
        assert {r.primary_key["id"]: r.columns["value"] for r in from_base} == snapshot
        assert len(from_base) == len(snapshot)  # each row exactly once
        expected = {k: [("PUT", v)] for k, v in snapshot.items()}
        for k, ops in after.items():
            expected.setdefault(k, []).extend(ops)
        assert per_key(state.records) == expected
        final = {c.channel_id: c.status for c in h.service.describe_tunnel("t", "tun").channels}
        assert all(final[c] is ChannelStatus.TERMINATED for c in base_ids)
        assert all(final[c.channel_id] is ChannelStatus.OPEN for c in stream)

    # the columnar read path ---------------------------------------------------------------

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
