"""The driver's per-channel calls over the wire run at once, with the same outcomes: checkpoint
pushes (``connector.planning.pushes``) and ``has_new_data``'s probes, against the emulator over
HTTP on 127.0.0.1, driven through ``StreamProtocol`` in Spark's call order (no Spark).

- Pushes overlap (more than one Checkpoint in the emulator at a time, never more than the
  client's ``concurrent_calls``); every channel's end is pushed.
- A push that fails (refused among the others sent at once, then again when pushed alone
  through ``checkpoint``) fails the commit round: the batch stays committed-not-pushed, the
  channels whose push succeeded are not pushed again, the failed one is pushed by the next
  round. ``checkpoint_many`` itself: the plain pushes from one thread, the rest returned.
- ``has_new_data``: false when idle (every OPEN channel probed), true when one channel has a
  record; a channel found to have records is not probed again at the same position.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from connector.errors import TunnelAuthError
from connector.options import SourceOptions
from connector.protocol import StreamProtocol
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.client import DRIVER_CONCURRENCY
from tablestore_emulator.errors import OtsError
from testkit.emulator import INSTANCE, KEY_ID, SECRET, service_uri
from testkit.partition_reads import read_partition
from testkit.tunnel_harnesses import EmulatorHarness

CHANNELS = 8


@pytest.fixture
def harness(tmp_path: Path):
    h = EmulatorHarness(tmp_path / "store.db")
    h.create_table("t", CHANNELS)
    yield h
    h.close()


def _protocol(h: EmulatorHarness, tmp_path: Path) -> StreamProtocol:
    return StreamProtocol(SourceOptions.from_spark({
        "endpoint": h.emulator.url, "instance.name": INSTANCE, "access.key.id": KEY_ID,
        "access.key.secret": SECRET, "table.name": "t", "tunnel.name": "tun",
        "meta.store": f"sqlite://{tmp_path / 'meta.db'}"}))


def _wrap(h: EmulatorHarness, path: str, around) -> None:  # noqa: ANN001 - a test shim
    handler = h.emulator.routes[path]
    h.emulator.routes[path] = lambda ctx, body: around(handler, ctx, body)


def _settle(seen: list[str], quiet_s: float = 0.5, timeout_s: float = 10.0) -> None:
    """Wait until ``seen`` stops growing for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    count, since = len(seen), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        if len(seen) != count:
            count, since = len(seen), time.monotonic()


def _batch(h: EmulatorHarness, protocol: StreamProtocol, start: dict, rows: int) -> dict:
    """Write ``rows`` rows, plan and read one batch (every channel gets some); its end."""
    for i in range(rows):
        h.put("t", f"k{time.monotonic_ns()}-{i}", i)
    end = protocol.latest_offset(start, None)
    schema = protocol.tunnel.table_schema("t")
    for p in protocol.plan(start, end):
        read_partition(p, schema)
    return end


def test_pushes_overlap_and_a_failed_one_is_pushed_again(harness: EmulatorHarness,
                                                         tmp_path: Path) -> None:
    h = harness
    in_flight, most = [0], [0]
    lock = threading.Lock()
    refuse: dict[str, int] = {}
    pushed: list[str] = []

    def checkpoint(handler, ctx, body):  # noqa: ANN001, ANN202 - a test shim
        channel = m.parse(m.CheckpointRequest, body).channel_id
        if refuse.get(channel):
            refuse[channel] -= 1
            raise OtsError(403, "OTSAuthFailed", "refused by the test")
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            time.sleep(0.05)  # a round trip's worth: the pushes overlap if they can
            answer = handler(ctx, body)
            pushed.append(channel)
            return answer
        finally:
            with lock:
                in_flight[0] -= 1

    _wrap(h, "/tunnel/checkpoint", checkpoint)
    protocol = _protocol(h, tmp_path)
    try:
        start = protocol.initial_offset()
        end = _batch(h, protocol, start, 60)
        channels = sorted(c.channel_id for c in protocol.tunnel.describe_tunnel("t", "tun")
                          .channels)
        protocol.commit(end)
        assert sorted(pushed) == channels
        assert 1 < most[0] <= DRIVER_CONCURRENCY
        ends = protocol.meta.get_end_checkpoints(protocol.namespace, protocol.uuid_of(end))
        for channel in channels:
            assert protocol.tunnel.get_checkpoint(protocol.tunnel_id, channel).token == \
                ends[channel].token

        # the next batch: one channel's push is refused
        end2 = _batch(h, protocol, end, 60)
        # refused twice: pushed among the others at once, refused; pushed alone, refused again
        refuse[channels[3]] = 2
        pushed.clear()
        with pytest.raises(TunnelAuthError):
            protocol.commit(end2)
        assert sorted(pushed) == [c for c in channels if c != channels[3]]
        pending = protocol.meta.committed_not_pushed(protocol.namespace)
        assert [b.uuid for b in pending] == [protocol.uuid_of(end2)]
        pushed.clear()
        protocol.push_if_due()  # the next round: only the failed channel is pushed
        assert pushed == [channels[3]]
        assert not protocol.meta.committed_not_pushed(protocol.namespace)
        ends2 = protocol.meta.get_end_checkpoints(protocol.namespace, protocol.uuid_of(end2))
        assert protocol.tunnel.get_checkpoint(protocol.tunnel_id, channels[3]).token == \
            ends2[channels[3]].token
    finally:
        protocol.close()


def test_has_new_data_probes_every_channel_and_remembers_a_yes(harness: EmulatorHarness,
                                                               tmp_path: Path) -> None:
    h = harness
    probes: list[str] = []

    def read(handler, ctx, body):  # noqa: ANN001, ANN202 - a test shim
        probes.append(m.parse(m.ReadRecordsRequest, body).channel_id)
        return handler(ctx, body)

    protocol = _protocol(h, tmp_path)
    try:
        start = protocol.initial_offset()
        end = _batch(h, protocol, start, 40)
        protocol.commit(end)
        _wrap(h, "/tunnel/readrecords", read)
        assert protocol.latest_offset(end, None) == end  # idle: no batch
        assert sorted(probes) == sorted(c.channel_id for c in protocol.tunnel.describe_tunnel(
            "t", "tun").channels)  # every channel asked once
        h.put("t", "new", 1)
        positions = {ch: p.token for ch, p in protocol.positions_after(
            protocol.uuid_of(end)).items()}
        probes.clear()
        assert protocol.tunnel.has_new_data(protocol.tunnel_id, positions) is True
        assert probes  # it was read to tell
        _settle(probes)  # probes already sent when the answer came finish in the background
        probes.clear()
        assert protocol.tunnel.has_new_data(protocol.tunnel_id, positions) is True
        assert probes == []  # the same position: known to have a record, not read again
    finally:
        protocol.close()


def test_checkpoint_many_pushes_the_plain_cases_and_returns_the_rest(
        harness: EmulatorHarness) -> None:
    """``checkpoint_many`` pushes, from one thread, every channel whose stored number the
    client knows; a channel not seen yet and a push the service refuses come back, in order,
    for ``checkpoint`` (which then pushes them); nothing is pushed twice."""
    from connector.tunnel import Checkpoint
    from connector.tunnel.tablestore.client import TablestoreTunnelService

    h = harness
    for i in range(40):
        h.put("t", f"k{i}", i)
    client = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))
    other = TablestoreTunnelService.from_uri(service_uri(h.emulator.url))  # another pusher
    seen: list[str] = []
    _wrap(h, "/tunnel/checkpoint",
          lambda handler, ctx, body: (seen.append(m.parse(m.CheckpointRequest, body).channel_id),
                                      handler(ctx, body))[1])
    try:
        tid = client.create_tunnel("t", "tun").tunnel_id
        channels = sorted(c.channel_id for c in client.describe_tunnel("t", "tun").channels)
        ends = {}
        for ch in channels:
            start = client.get_checkpoint(tid, ch)  # unknown to the client: the last one
            page = client.read_records(tid, ch, start.token, 100)
            ends[ch] = Checkpoint(page.next_token, 1)
        known, unseen = channels[:-1], channels[-1]
        client._stored.pop((tid, unseen))
        refused = known[2]  # another writer pushes first: the stored number moved
        other.get_checkpoint(tid, refused)
        other.checkpoint(tid, refused, Checkpoint(ends[refused].token, 1))
        other.checkpoint(tid, refused, Checkpoint(other.get_checkpoint(tid, refused).token, 1))
        seen.clear()
        pushes = [(ch, ends[ch]) for ch in channels]
        left = client.checkpoint_many(tid, pushes)
        assert left == [refused, unseen]
        assert sorted(seen) == sorted(known)  # the refused one was asked (and said no)
        for ch in left:
            client.checkpoint(tid, ch, ends[ch])
        for ch in channels:
            assert client.get_checkpoint(tid, ch).token == ends[ch].token
        seen.clear()
        assert client.checkpoint_many(tid, pushes) == []  # held already: nothing sent
        assert seen == []
    finally:
        client.close()
        other.close()
