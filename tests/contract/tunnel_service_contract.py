"""The Tablestore Tunnel service as the official SDKs drive it: one suite, on the wire.

Where ``tunnel_contract.py`` checks the product's ``TunnelService`` interface, this suite checks
the *service* behind the Tablestore backend, in its own protobuf messages
(``connector.tunnel.tablestore.messages``) sent through the project's signed transport: what
the official Go and Java tunnel workers rely on (Connect, Heartbeat, Shutdown, channel
ownership and versions; GetCheckpoint/Checkpoint and the stored + 1 rule; the documented error
shapes). Sources for each rule are named in ``tablestore_emulator/tunnel_clients.py`` and
docs/tablestore.md.

A backend plugs in with a ``service_harness`` fixture (see ``ServiceHarness``) and a class
inheriting ``TunnelServiceContract``: tests/test_emulator_tunnel_service.py runs it against
the emulator. ``advance(seconds)`` moves the service's clock (the emulator's is injectable; a
real service would have to sleep).
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from connector.tunnel.base import FINISHED
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.transport import ServiceError, Transport

OPEN, CLOSING, CLOSE, TERMINATED = (m.CHANNEL_STATUS[s]
                                    for s in ("OPEN", "CLOSING", "CLOSE", "TERMINATED"))


class ServiceHarness(Protocol):
    """What a backend's ``service_harness`` fixture provides."""

    transport: Transport  # signed requests to the service (no retries)

    def create_table(self, name: str, channels: int) -> None: ...
    def put(self, table: str, key: str, value: int) -> None: ...
    def split(self, table: str, channel_id: str) -> tuple[str, str]: ...
    def trim(self, table: str) -> None: ...
    def advance(self, seconds: float) -> None: ...


# --- the wire, in the project's own messages ---------------------------------------------------


def call(h: ServiceHarness, path: str, request: Any, response_type: Any) -> Any:
    return m.parse(response_type, h.transport.call(path, request.SerializeToString()))


def refused(h: ServiceHarness, path: str, request: Any) -> ServiceError:
    """The service's refusal of ``request`` (the test fails if it is accepted)."""
    try:
        h.transport.call(path, request.SerializeToString())
    except ServiceError as exc:
        return exc
    raise AssertionError(f"{path} was accepted")


def create_tunnel(h: ServiceHarness, table: str, name: str = "tun",
                  tunnel_type: str = "Stream") -> str:
    request = m.CreateTunnelRequest()
    request.tunnel.table_name, request.tunnel.tunnel_name = table, name
    request.tunnel.tunnel_type = m.TUNNEL_TYPE[tunnel_type]
    return str(call(h, "/tunnel/create", request, m.CreateTunnelResponse).tunnel_id)


def describe(h: ServiceHarness, table: str, name: str = "tun") -> Any:
    return call(h, "/tunnel/describe", m.DescribeTunnelRequest(table_name=table,
                                                              tunnel_name=name),
                m.DescribeTunnelResponse)


def connect(h: ServiceHarness, tunnel_id: str, timeout_s: int = 30) -> str:
    request = m.ConnectRequest(tunnel_id=tunnel_id)
    request.client_config.timeout = timeout_s
    request.client_config.client_tag = "contract"
    return str(call(h, "/tunnel/connect", request, m.ConnectResponse).client_id)


class Worker:
    """A tunnel worker as the SDKs keep one: its channels ``{id: (version, status)}``, merged
    with each heartbeat's answer by the SDKs' rule (the higher version wins, the server's copy
    on a tie; channels missing from the answer are dropped: Go ``state.go``
    ``validateChannels``, Java ``TunnelStateMachine.mergeChannels``)."""

    def __init__(self, h: ServiceHarness, tunnel_id: str, timeout_s: int = 30) -> None:
        self.h, self.tunnel_id = h, tunnel_id
        self.client_id = connect(h, tunnel_id, timeout_s)
        self.channels: dict[str, tuple[int, int]] = {}

    def heartbeat(self) -> dict[str, tuple[int, int]]:
        request = m.HeartbeatRequest(tunnel_id=self.tunnel_id, client_id=self.client_id)
        for cid, (version, status) in sorted(self.channels.items()):
            request.channels.add(channel_id=cid, version=version, status=status)
        answer = call(self.h, "/tunnel/heartbeat", request, m.HeartbeatResponse)
        merged = {}
        for c in answer.channels:
            mine = self.channels.get(c.channel_id)
            merged[c.channel_id] = mine if mine and mine[0] > c.version else (c.version,
                                                                              c.status)
        self.channels = merged
        return merged

    def close(self, channel_id: str) -> None:
        """What a worker does when a channel's processor fails, or on CLOSING: report it
        closed at version + 1 (Go ``channel.go`` ``closeAndUpdate``)."""
        version, _ = self.channels[channel_id]
        self.channels[channel_id] = (version + 1, CLOSE)

    def open(self) -> set[str]:
        return {cid for cid, (_, status) in self.channels.items() if status == OPEN}

    def shutdown(self) -> None:
        call(self.h, "/tunnel/shutdown", m.ShutdownRequest(tunnel_id=self.tunnel_id,
                                                           client_id=self.client_id),
             m.ShutdownResponse)


def get_checkpoint(h: ServiceHarness, tunnel_id: str, channel_id: str,
                   client_id: str = "never-connected") -> Any:
    return call(h, "/tunnel/getcheckpoint",
                m.GetCheckpointRequest(tunnel_id=tunnel_id, client_id=client_id,
                                       channel_id=channel_id), m.GetCheckpointResponse)


def push(h: ServiceHarness, tunnel_id: str, channel_id: str, token: str, seq: int,
         client_id: str = "never-connected") -> None:
    call(h, "/tunnel/checkpoint",
         m.CheckpointRequest(tunnel_id=tunnel_id, client_id=client_id, channel_id=channel_id,
                             checkpoint=token, sequence_number=seq), m.CheckpointResponse)


def read(h: ServiceHarness, tunnel_id: str, channel_id: str, token: str,
         client_id: str = "never-connected") -> Any:
    return call(h, "/tunnel/readrecords",
                m.ReadRecordsRequest(tunnel_id=tunnel_id, client_id=client_id,
                                     channel_id=channel_id, token=token),
                m.ReadRecordsResponse)


def drain(h: ServiceHarness, tunnel_id: str, channel_id: str) -> tuple[int, str]:
    """Read a channel from its checkpoint until no more now, pushing checkpoints the SDK way
    (stored + 1): (records read, last token)."""
    cp = get_checkpoint(h, tunnel_id, channel_id)
    token, seq, count = cp.checkpoint, cp.sequence_number, 0
    while True:
        page = read(h, tunnel_id, channel_id, token)
        count += len(page.records)
        if page.next_token != token:
            seq += 1
            push(h, tunnel_id, channel_id, page.next_token, seq)
        token = page.next_token
        if token == FINISHED or not page.may_more_record:
            return count, token


# --- the suite ---------------------------------------------------------------------------------


class TunnelServiceContract:
    """Inherit it in a ``Test...`` class next to a ``service_harness`` fixture."""

    # connect, heartbeat, ownership ------------------------------------------------------------

    def test_every_open_channel_owned_by_exactly_one_client_balanced(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 5)
        tid = create_tunnel(h, "t")
        a, b = Worker(h, tid), Worker(h, tid)
        assert a.client_id != b.client_id
        for _ in range(3):  # a few rounds: rebalancing settles through CLOSING -> CLOSE
            for w in (a, b):
                w.heartbeat()
                for cid, (_, status) in list(w.channels.items()):
                    if status == CLOSING:
                        w.close(cid)
        channels = {c.channel_id for c in describe(h, "t").channels}
        assert a.open().isdisjoint(b.open())
        assert a.open() | b.open() == channels
        assert sorted([len(a.open()), len(b.open())]) == [2, 3]
        owners = {c.channel_id: c.client_id for c in describe(h, "t").channels}
        assert owners == {**{c: a.client_id for c in a.open()},
                          **{c: b.client_id for c in b.open()}}

    def test_a_new_client_gets_its_share_through_closing(self, service_harness: ServiceHarness
                                                         ) -> None:
        h = service_harness
        h.create_table("t", 4)
        tid = create_tunnel(h, "t")
        a = Worker(h, tid)
        assert len(a.heartbeat()) == 4
        b = Worker(h, tid)
        assert b.heartbeat() == {}  # nothing free yet: two of a's channels are closing
        closing = {cid for cid, (_, s) in a.heartbeat().items() if s == CLOSING}
        assert len(closing) == 2
        for cid in closing:
            a.close(cid)
        a.heartbeat()
        assert a.open() == set(a.channels) - closing
        assert b.heartbeat() and b.open() == closing

    def test_silent_client_loses_its_channels_within_its_timeout(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 4)
        tid = create_tunnel(h, "t")
        a, b = Worker(h, tid, timeout_s=20), Worker(h, tid, timeout_s=20)
        a.heartbeat(), b.heartbeat(), a.heartbeat()
        before = {**b.channels}
        assert len(a.open()) == len(b.open()) == 2
        h.advance(15)
        a.heartbeat()
        h.advance(10)  # b: 25 s without a heartbeat, past its 20 s
        a.heartbeat()
        assert len(a.open()) == 4
        for cid, (version, _) in before.items():
            assert a.channels[cid][0] > version  # handed over at a higher version
        gone = refused(h, "/tunnel/heartbeat",
                       m.HeartbeatRequest(tunnel_id=tid, client_id=b.client_id))
        assert (gone.http_status, gone.code) == (410, "OTSResourceGone")

    def test_a_closed_channel_comes_back_at_a_higher_version(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 1)
        tid = create_tunnel(h, "t")
        w = Worker(h, tid)
        (cid,) = w.heartbeat()
        opened_at = w.channels[cid][0]
        w.close(cid)  # its processor failed once
        w.heartbeat()
        version, status = w.channels[cid]
        assert status == OPEN and version > opened_at + 1

    def test_shutdown_releases_at_once(self, service_harness: ServiceHarness) -> None:
        h = service_harness
        h.create_table("t", 2)
        tid = create_tunnel(h, "t")
        a, b = Worker(h, tid), Worker(h, tid)
        a.heartbeat(), b.heartbeat()
        assert len(a.open()) == len(b.open()) == 1
        a.shutdown()
        assert len(b.heartbeat()) == 2 and len(b.open()) == 2
        gone = refused(h, "/tunnel/heartbeat",
                       m.HeartbeatRequest(tunnel_id=tid, client_id=a.client_id))
        assert (gone.http_status, gone.code) == (410, "OTSResourceGone")

    def test_unknown_client_heartbeat_refused_reads_and_checkpoints_accepted(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 1)
        h.put("t", "a", 1)
        tid = create_tunnel(h, "t")
        gone = refused(h, "/tunnel/heartbeat",
                       m.HeartbeatRequest(tunnel_id=tid, client_id="spark-client"))
        assert (gone.http_status, gone.code) == (410, "OTSResourceGone")
        (cid,) = [c.channel_id for c in describe(h, "t").channels]
        assert drain(h, tid, cid)[0] == 1  # GetCheckpoint, ReadRecords, Checkpoint: no Connect

    def test_base_channels_terminated_after_finished(self, service_harness: ServiceHarness
                                                     ) -> None:
        h = service_harness
        h.create_table("t", 2)
        for i in range(6):
            h.put("t", f"k{i}", i)
        tid = create_tunnel(h, "t", tunnel_type="BaseAndStream")
        w = Worker(h, tid)
        base = {c.channel_id for c in describe(h, "t").channels if c.channel_type == "BaseData"}
        assert base and all(cid.startswith("BaseData_") for cid in base)
        assert set(w.heartbeat()) == base  # the stream channels wait for the base data
        read_total = 0
        for cid in sorted(base):
            count, token = drain(h, tid, cid)
            read_total += count
            assert token == FINISHED
        assert read_total == 6
        view = w.heartbeat()
        assert {cid for cid, (_, s) in view.items() if s == TERMINATED} == base
        statuses = {c.channel_id: c.channel_status for c in describe(h, "t").channels}
        assert {statuses[c] for c in base} == {"TERMINATED"}
        stream = set(statuses) - base
        assert w.open() == stream  # released to the worker now

    # checkpoints --------------------------------------------------------------------------------

    def test_checkpoint_is_the_stored_sequence_plus_one(self, service_harness: ServiceHarness
                                                        ) -> None:
        h = service_harness
        h.create_table("t", 1)
        for i in range(3):
            h.put("t", f"k{i}", i)
        tid = create_tunnel(h, "t")
        (cid,) = [c.channel_id for c in describe(h, "t").channels]
        start = get_checkpoint(h, tid, cid)
        page = read(h, tid, cid, start.checkpoint)
        stored = start.sequence_number
        for wrong in (stored, stored + 2, stored - 1):  # equal, a jump, lower
            exc = refused(h, "/tunnel/checkpoint",
                          m.CheckpointRequest(tunnel_id=tid, client_id="c", channel_id=cid,
                                              checkpoint=page.next_token,
                                              sequence_number=wrong))
            assert (exc.http_status, exc.code) == (400, "OTSSequenceNumberNotMatch")
        push(h, tid, cid, page.next_token, stored + 1)
        got = get_checkpoint(h, tid, cid)
        assert (got.checkpoint, got.sequence_number) == (page.next_token, stored + 1)

    # error shapes (the service's error reference) -------------------------------------------

    def test_missing_table_and_tunnel_are_400_parameter_invalid(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 1)
        tid = create_tunnel(h, "t")
        (cid,) = [c.channel_id for c in describe(h, "t").channels]
        for path, request in (
            ("/tunnel/describe", m.DescribeTunnelRequest(table_name="nope", tunnel_name="x")),
            ("/tunnel/describe", m.DescribeTunnelRequest(table_name="t", tunnel_name="nope")),
            ("/tunnel/list", m.ListTunnelRequest(table_name="nope")),
            ("/tunnel/delete", m.DeleteTunnelRequest(table_name="t", tunnel_name="nope")),
            ("/tunnel/connect", m.ConnectRequest(tunnel_id="nope")),
            ("/tunnel/getcheckpoint", m.GetCheckpointRequest(tunnel_id="nope", client_id="c",
                                                             channel_id=cid)),
            ("/tunnel/getcheckpoint", m.GetCheckpointRequest(tunnel_id=tid, client_id="c",
                                                             channel_id="nope")),
        ):
            exc = refused(h, path, request)
            assert (exc.http_status, exc.code) == (400, "OTSParameterInvalid"), path

    def test_trimmed_data_is_400_tunnel_server_unavailable(self, service_harness: ServiceHarness
                                                           ) -> None:
        h = service_harness
        h.create_table("t", 1)
        tid = create_tunnel(h, "t")
        (cid,) = [c.channel_id for c in describe(h, "t").channels]
        start = get_checkpoint(h, tid, cid).checkpoint
        h.put("t", "a", 1)
        h.trim("t")
        exc = refused(h, "/tunnel/readrecords",
                      m.ReadRecordsRequest(tunnel_id=tid, client_id="c", channel_id=cid,
                                           token=start))
        assert (exc.http_status, exc.code) == (400, "OTSTunnelServerUnavailable")
        assert exc.message.startswith("OTSTrimmedDataAccess")

    def test_unknown_operation_is_400_parameter_invalid(self, service_harness: ServiceHarness
                                                        ) -> None:
        exc = refused(service_harness, "/tunnel/nosuchthing", m.ListTunnelRequest())
        assert (exc.http_status, exc.code) == (400, "OTSParameterInvalid")
        assert "Unsupported operation" in exc.message

    # what describe and getrpo report ------------------------------------------------------------

    def test_describe_reports_owner_count_and_rpo_in_nanoseconds(
        self, service_harness: ServiceHarness
    ) -> None:
        h = service_harness
        h.create_table("t", 1)
        tid = create_tunnel(h, "t")
        before = time.time_ns()
        for i in range(3):
            h.put("t", f"k{i}", i)
        w = Worker(h, tid)
        (cid,) = w.heartbeat()
        assert drain(h, tid, cid)[0] == 3
        d = describe(h, "t")
        (c,) = d.channels
        assert (c.client_id, c.channel_count) == (w.client_id, 3)
        assert before <= c.channel_rpo <= time.time_ns()  # the last record's time, in ns
        assert d.tunnel_rpo == c.channel_rpo
        rpo = call(h, "/tunnel/getrpo", m.GetRpoRequest(tunnel_id=tid), m.GetRpoResponse)
        per_channel = json.loads(rpo.rpo_infos)[tid][cid]
        assert (per_channel["TotalCount"], per_channel["RpoTime"]) == (3, c.channel_rpo)
        assert per_channel["AccessTime"] >= before
        assert json.loads(rpo.tunnel_rpo_infos)[tid]["RpoTime"] == d.tunnel_rpo


__all__ = ["ServiceHarness", "TunnelServiceContract", "Worker", "call", "refused"]

