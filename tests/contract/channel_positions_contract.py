"""The channel-positions contract: checkpoints per (tunnel, channel), FINISHED pushes that
release children, and ``has_new_data`` (``ChannelPositions``; driver).

Run for every backend through ``tunnel_contract.TunnelContract``.
"""

from __future__ import annotations

import pytest

from connector.errors import (
    InvalidCheckpointError,
    StaleCheckpointError,
)
from connector.tunnel.base import (
    FINISHED,
    ChannelStatus,
    Checkpoint,
)
from tests.contract.tunnel_harness import ContractHelpers, TunnelHarness, read_all


class ChannelPositionsContract(ContractHelpers):
    """The contract of ``connector.tunnel.base.ChannelPositions``."""

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
