"""The emulator as the Tunnel service the official SDKs drive, on the wire.

- ``TestEmulatorTunnelService``: the service contract (tests/contract/tunnel_service_contract.py)
  against ``tablestore_emulator`` over signed HTTP, with the client state machine's clock
  injected so timeouts pass without sleeping.
- The emulator's own parts: the state machine's balancing on its own (``TunnelClients``), the
  headers every request must carry, base-data channel ids on the wire.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import urllib3

from connector.local import LocalTablestore
from connector.tunnel.tablestore import messages as m
from connector.tunnel.tablestore.transport import Credentials, ServiceError, Transport
from tablestore_emulator import auth
from tablestore_emulator.server import EmulatorServer
from tablestore_emulator.tunnel_clients import ChannelState, ClientGone, TunnelClients
from testkit.emulator import INSTANCE, KEY_ID, SECRET
from testkit.tunnel_harnesses import LocalHarness
from tests.contract.tunnel_service_contract import (
    TunnelServiceContract,
    call,
    create_tunnel,
    refused,
)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class EmulatorServiceHarness(LocalHarness):
    """The emulator on a store file, a writer on the same file (the local harness's writer
    operations: create_table, put, split, trim ...), a transport with no retries, and the
    emulator's client state machine on a clock the test moves."""

    def __init__(self, path: Path) -> None:  # not the local harness's: no local service
        self.writer = LocalTablestore(path)
        self.emulator = EmulatorServer(str(path), INSTANCE, KEY_ID, SECRET).start()
        self.clock = Clock()
        self.emulator.context.state["tunnel_clients"] = TunnelClients(self.clock)
        self.transport = Transport(self.emulator.url, INSTANCE, Credentials(KEY_ID, SECRET),
                                   retry_deadline_s=0)

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    def close(self) -> None:
        self.transport.close()
        self.emulator.stop()
        self.writer.close()


@pytest.fixture
def service_harness(tmp_path: Path):
    h = EmulatorServiceHarness(tmp_path / "store.db")
    yield h
    h.close()


class TestEmulatorTunnelService(TunnelServiceContract):
    pass


# --- the state machine on its own ----------------------------------------------------------


def _owned(view: list[ChannelState]) -> set[str]:
    return {c.channel_id for c in view if c.status == "OPEN"}


def test_balancing_settles_to_shares_and_follows_the_store() -> None:
    clock = Clock()
    clients = TunnelClients(clock)
    readable = [f"c{i}" for i in range(7)]
    ids = [clients.connect("t", 60) for _ in range(3)]
    views: dict[str, list[ChannelState]] = {c: [] for c in ids}
    for _ in range(4):
        for c in ids:
            reported = [ChannelState(v.channel_id, v.version + 1, "CLOSE")
                        for v in views[c] if v.status == "CLOSING"]
            views[c] = clients.heartbeat("t", c, reported, readable, [])
    shares = sorted(len(_owned(views[c])) for c in ids)
    assert shares == [2, 2, 3]
    assert set().union(*(_owned(views[c]) for c in ids)) == set(readable)
    # a channel finishes in the store: TERMINATED at a higher version for its owner only
    owner = next(c for c in ids if "c0" in _owned(views[c]))
    before = next(v.version for v in views[owner] if v.channel_id == "c0")
    after = clients.heartbeat("t", owner, [], readable[1:], ["c0"])
    (c0,) = [v for v in after if v.channel_id == "c0"]
    assert (c0.status, c0.version > before) == ("TERMINATED", True)
    # a client reporting TERMINATED for a channel the store has not finished gives it up: it
    # is free again, and handed out (here to the same client) at a still higher version
    other = next(c for c in ids if c != owner)
    (held, *_) = [v for v in clients.heartbeat("t", other, [], readable[1:], ["c0"])
                  if v.status == "OPEN"]
    view = clients.heartbeat("t", other,
                             [ChannelState(held.channel_id, held.version + 1, "TERMINATED")],
                             readable[1:], ["c0"])
    (again,) = [v for v in view if v.channel_id == held.channel_id]
    assert (again.status, again.version) == ("OPEN", held.version + 2)


def test_gone_clients_are_refused_with_the_reason() -> None:
    clock = Clock()
    clients = TunnelClients(clock)
    a = clients.connect("t", 10)
    with pytest.raises(ClientGone, match="never connected"):
        clients.heartbeat("t", "nobody", [], [], [])
    clock.now += 11
    with pytest.raises(ClientGone, match="no heartbeat for more than its 10 s timeout"):
        clients.heartbeat("t", a, [], [], [])
    b = clients.connect("t")  # no timeout given: the SDKs' default
    clock.now += 299
    clients.heartbeat("t", b, [], [], [])
    clients.shutdown("t", b)
    clients.shutdown("t", b)  # idempotent
    with pytest.raises(ClientGone, match="shut down"):
        clients.heartbeat("t", b, [], [], [])


# --- the emulator's own wire details --------------------------------------------------------


def test_headers_the_sdks_always_send_are_required(service_harness: EmulatorServiceHarness
                                                   ) -> None:
    h = service_harness
    body = m.ListTunnelRequest().SerializeToString()
    for missing in ("x-ots-instancename", "x-ots-apiversion"):
        headers = {"x-ots-date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                   "x-ots-apiversion": "2018-04-01", "x-ots-accesskeyid": KEY_ID,
                   "x-ots-instancename": INSTANCE, "x-ots-contentmd5": auth.content_md5(body)}
        del headers[missing]
        headers["x-ots-signature"] = auth.request_signature("/tunnel/list", headers, SECRET)
        resp = urllib3.request("POST", h.emulator.url + "/tunnel/list", body=body,
                               headers=headers)
        error = m.parse(m.Error, resp.data)
        assert (resp.status, error.code) == (400, "OTSParameterInvalid")
        assert missing in error.message


def test_base_channels_go_by_the_sdk_name_on_the_wire(service_harness: EmulatorServiceHarness
                                                      ) -> None:
    h = service_harness
    h.create_table("t", 1)
    h.put("t", "a", 1)
    request = m.CreateTunnelRequest()
    request.tunnel.table_name, request.tunnel.tunnel_name = "t", "tun"
    request.tunnel.tunnel_type = m.TUNNEL_TYPE["BaseAndStream"]
    tid = call(h, "/tunnel/create", request, m.CreateTunnelResponse).tunnel_id
    desc = call(h, "/tunnel/describe", m.DescribeTunnelRequest(table_name="t", tunnel_name="tun"),
                m.DescribeTunnelResponse)
    (base,) = [c.channel_id for c in desc.channels if c.channel_type == "BaseData"]
    (stream,) = [c.channel_id for c in desc.channels if c.channel_type == "Stream"]
    assert base == f"BaseData_{stream}"
    (stream_info,) = [c for c in desc.channels if c.channel_id == stream]
    assert list(stream_info.parent_ids) == [base]  # lineage names the wire id too
    cp = call(h, "/tunnel/getcheckpoint",
              m.GetCheckpointRequest(tunnel_id=tid, client_id="c", channel_id=base),
              m.GetCheckpointResponse)
    page = call(h, "/tunnel/readrecords",
                m.ReadRecordsRequest(tunnel_id=tid, client_id="c", channel_id=base,
                                     token=cp.checkpoint), m.ReadRecordsResponse)
    assert len(page.records) == 1
    store_name = refused(h, "/tunnel/getcheckpoint",  # the store's own name is not a wire id
                         m.GetCheckpointRequest(tunnel_id=tid, client_id="c",
                                                channel_id=f"base-{stream}"))
    assert store_name.code == "OTSParameterInvalid"
    with pytest.raises(ServiceError, match="tunnel_id is required"):
        h.transport.call("/tunnel/getrpo", m.GetRpoRequest().SerializeToString())


# --- tokens a client made up -------------------------------------------------------------


def _wire_token_of(inner_json: bytes) -> str:
    """A wire token (base64 ``Token`` v2) carrying ``inner_json`` as the store's token."""
    import base64

    inner = base64.b64encode(inner_json).decode("ascii")
    content = m.TokenContentV2(iterator=inner, total_count=0)
    envelope = m.Token(version=2, content=content.SerializeToString())
    return base64.b64encode(envelope.SerializeToString()).decode("ascii")


NESTED_JSON = {
    "arrays": b"[" * 100_000 + b"]" * 100_000,
    "objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "inside a token": b'{"t":"t","c":"x","s":' + b"[" * 5000 + b"]" * 5000 + b"}",
}


@pytest.mark.parametrize("kind", sorted(NESTED_JSON))
@pytest.mark.parametrize("route", ["/tunnel/readrecords", "/tunnel/checkpoint"])
def test_a_token_of_deeply_nested_json_is_400(service_harness: EmulatorServiceHarness,
                                              route: str, kind: str) -> None:
    h = service_harness
    h.create_table("t", 1)
    tid = create_tunnel(h, "t")
    desc = call(h, "/tunnel/describe", m.DescribeTunnelRequest(table_name="t", tunnel_name="tun"),
                m.DescribeTunnelResponse)
    channel = desc.channels[0].channel_id
    token = _wire_token_of(NESTED_JSON[kind])
    request: Any
    if route == "/tunnel/readrecords":
        request = m.ReadRecordsRequest(tunnel_id=tid, client_id="c", channel_id=channel,
                                       token=token)
    else:
        request = m.CheckpointRequest(tunnel_id=tid, client_id="c", channel_id=channel,
                                      checkpoint=token, sequence_number=1)
    refusal = refused(h, route, request)
    assert (refusal.http_status, refusal.code) == (400, "OTSParameterInvalid"), refusal
    assert "token" in str(refusal).lower()
