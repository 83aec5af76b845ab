"""The tunnel-administration contract: tunnels on a table, their start positions and types,
the table's schema, and what is not there (``TunnelAdministration``; driver, inspection CLI).

Run for every backend through ``tunnel_contract.TunnelContract``.
"""

from __future__ import annotations

from typing import Any

import pytest

from connector.errors import (
    TunnelExistsError,
    UnknownChannelError,
    UnknownTableError,
    UnknownTunnelError,
)
from connector.tunnel.base import (
    ChannelStatus,
    ChannelType,
    Checkpoint,
    Op,
    StartPosition,
    TunnelType,
)
from tests.contract.tunnel_harness import ContractHelpers, TunnelHarness, consume, per_key, read_all


class TunnelAdministrationContract(ContractHelpers):
    """The contract of ``connector.tunnel.base.TunnelAdministration``."""

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
