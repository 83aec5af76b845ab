"""The fault proxy itself (testkit/fault_proxy.py), against a small HTTP service on
127.0.0.1 that counts what it applied: each kind does what it says, and only to the requests
its rule picks. Fast: no Spark, no emulator."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from testkit.fault_proxy import FaultProxy, Kind, Rule

BODY = b"0123456789" * 50


class _Service(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    applied: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        request = self.rfile.read(length)
        _Service.applied.append(f"{self.path} {request.decode()}")
        self.send_response(200)
        self.send_header("Authorization", "OTS key:c2lnbmF0dXJl")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    _Service.applied = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hop = FaultProxy(server.server_address[1], name="test").start()
    try:
        yield hop
    finally:
        hop.stop()
        server.shutdown()


def post(hop: FaultProxy, path: str = "/op", body: str = "x", *, read_timeout: float = 5.0,
         pool: urllib3.PoolManager | None = None, target: str = "") -> urllib3.BaseHTTPResponse:
    pool = pool or urllib3.PoolManager(retries=False)
    headers = {"X-Amz-Target": target} if target else {}
    return pool.request("POST", hop.url + path, body=body.encode(), headers=headers,
                        timeout=urllib3.Timeout(connect=2, read=read_timeout))


def test_passes_requests_through_on_one_kept_alive_connection(proxy: FaultProxy) -> None:
    pool = urllib3.PoolManager(retries=False)
    for i in range(5):
        response = post(proxy, body=str(i), pool=pool)
        assert response.status == 200 and response.data == BODY
    assert _Service.applied == [f"/op {i}" for i in range(5)]
    assert proxy.requests == 5 and not proxy.injected


def test_reset_before_never_reaches_the_service(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.RESET_BEFORE, times=1))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        post(proxy, body="lost")
    assert _Service.applied == []
    assert post(proxy, body="next").status == 200  # one request only
    assert _Service.applied == ["/op next"]


@pytest.mark.parametrize("kind", [Kind.RESET_AFTER, Kind.TRUNCATE])
def test_reset_after_and_truncate_lose_an_answer_the_service_applied(
        proxy: FaultProxy, kind: Kind) -> None:
    proxy.add(Rule(kind, times=1))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        post(proxy, body="applied")
    assert _Service.applied == ["/op applied"]


def test_reset_after_body_delivers_the_answer_then_kills_the_connection(
        proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.RESET_AFTER_BODY, times=1))
    pool = urllib3.PoolManager(retries=False)
    assert post(proxy, pool=pool).data == BODY
    time.sleep(0.2)
    # the pooled connection is gone; urllib3 notices and reconnects
    assert post(proxy, pool=pool).data == BODY


@pytest.mark.parametrize("kind,status", [(Kind.BARE_500, 500), (Kind.BARE_503, 503)])
def test_bare_5xx_is_an_html_page_the_service_never_saw(proxy: FaultProxy, kind: Kind,
                                                        status: int) -> None:
    proxy.add(Rule(kind, times=2))
    pool = urllib3.PoolManager(retries=False)
    for _ in range(2):
        response = post(proxy, pool=pool)
        assert response.status == status and response.data.startswith(b"<html>")
        assert "authorization" not in {k.lower() for k in response.headers}
    assert post(proxy, pool=pool).status == 200
    assert _Service.applied == ["/op x"]


def test_corrupt_body_flips_one_byte(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.CORRUPT_BODY, times=1))
    data = post(proxy).data
    assert len(data) == len(BODY) and sum(a != b for a, b in zip(data, BODY, strict=True)) == 1


def test_bad_signature_changes_the_authorization_header_only(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.BAD_SIGNATURE, times=1))
    response = post(proxy)
    assert response.data == BODY
    assert response.headers["Authorization"] != "OTS key:c2lnbmF0dXJl"
    assert response.headers["Authorization"].startswith("OTS key:c2lnbmF0dXJ")


def test_stall_ends_at_the_clients_read_timeout(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.STALL, times=1))
    began = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        post(proxy, read_timeout=0.5)
    assert time.monotonic() - began < 3
    assert _Service.applied == ["/op x"]  # the service applied it


def test_delay_holds_the_request(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.DELAY, delay_s=0.4, times=1))
    began = time.monotonic()
    assert post(proxy).status == 200
    assert time.monotonic() - began >= 0.4


def test_rules_pick_by_path_target_and_ordinal(proxy: FaultProxy) -> None:
    proxy.add(Rule(Kind.BARE_503, path=r"^/meta", ordinals=frozenset({2, 3})))
    proxy.add(Rule(Kind.BARE_500, target=r"\.PutItem$"))
    pool = urllib3.PoolManager(retries=False)
    statuses = [post(proxy, "/meta", pool=pool).status for _ in range(4)]
    assert statuses == [200, 503, 503, 200]
    assert post(proxy, "/tunnel", pool=pool).status == 200
    assert post(proxy, "/", target="DynamoDB_20120810.PutItem", pool=pool).status == 500
    assert post(proxy, "/", target="DynamoDB_20120810.GetItem", pool=pool).status == 200
    assert [i.kind for i in proxy.injected] == [Kind.BARE_503, Kind.BARE_503, Kind.BARE_500]
    assert proxy.injected[-1].what == "DynamoDB_20120810.PutItem"


def test_down_for_a_window_then_up(proxy: FaultProxy) -> None:
    proxy.down(0.6)
    began = time.monotonic()
    failures = 0
    while True:
        try:
            post(proxy)
            break
        except urllib3.exceptions.ProtocolError:
            failures += 1
            time.sleep(0.1)
    assert failures >= 3 and 0.5 <= time.monotonic() - began < 3


def test_random_share_takes_every_kind_in_turn(proxy: FaultProxy) -> None:
    kinds = (Kind.BARE_503, Kind.BARE_500, Kind.CORRUPT_BODY)
    proxy.random(0.3, kinds, seed=7)
    pool = urllib3.PoolManager(retries=False)
    for _ in range(200):
        post(proxy, pool=pool)
    injected = [i.kind for i in proxy.injected]
    assert 30 <= len(injected) <= 90
    assert injected[:6] == [*kinds, *kinds]
    proxy.clear()
    before = len(proxy.injected)
    for _ in range(20):
        post(proxy, pool=pool)
    assert len(proxy.injected) == before


def test_only_loopback_upstreams() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy(80, upstream_host="10.0.0.1")
