"""Configuration errors fail fast and say what to fix; outages are retried, honestly counted.

The first-contact rule (``cdc_common.first_contact``), on both Tablestore clients against real
sockets on 127.0.0.1 and the project's emulator:

- at a query's start, a client with no answer yet reports a port nothing listens on and a host
  name that does not resolve at once, in one line naming the option and the endpoint -- never
  retried; ``http://`` sent to an https port (the connection closed without an answer) after
  three such attempts in about a second, with that evidence; one dropped connection is retried
  and the start goes on;
- outside the start (executors, a running query) the same refusal is an outage: retried, and
  within the start a client that has had an answer retries too;
- refused credentials name ``access.key.id`` / ``access.key.secret`` (Tunnel client and meta
  store alike).

The retry layer (``connector.retry``): the log counts attempts as they happen, the deadline
counts from the first attempt, and the final error says how many attempts over how long and
that the query can be restarted on the same checkpoint.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("tablestore")
trustme = pytest.importorskip("trustme")

from cdc_common.first_contact import query_start  # noqa: E402
from connector import retry  # noqa: E402
from connector.errors import (  # noqa: E402
    EndpointUnreachableError,
    TransientTunnelError,
    TunnelAuthError,
)
from connector.local import LocalTablestore  # noqa: E402
from connector.tunnel import open_tunnel_service  # noqa: E402
from meta_store import open_meta_store  # noqa: E402
from meta_store.errors import (  # noqa: E402
    MetaStoreRequestError,
    MetaTableMissingError,
    TransientMetaStoreError,
)
from tablestore_emulator.server import EmulatorServer  # noqa: E402
from testkit.emulator import INSTANCE, KEY_ID, SECRET  # noqa: E402
from testkit.fault_proxy import FaultProxy, Kind, Rule  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tunnel(url: str, secret: str = SECRET, deadline: str = "2") -> object:
    return open_tunnel_service(f"{url}?instance={INSTANCE}&access_key_id={KEY_ID}"
                               f"&access_key_secret={secret}&retry_deadline_s={deadline}")


def meta(url: str, secret: str = SECRET, attempts: int = 3) -> object:
    return open_meta_store(f"tablestore://{INSTANCE}/cfg_meta?endpoint={quote(url, safe='')}"
                           f"&max_attempts={attempts}",
                           {"access_key_id": KEY_ID, "access_key_secret": secret})


@pytest.fixture
def emulators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(plain http URL, https URL) of two emulators over one store with table ``t``. A name
    under ``.invalid`` fails to resolve here, as the resolver would say, without asking one
    (tests reach loopback addresses only)."""
    resolve = socket.getaddrinfo

    def no_dns_for_invalid(host: object, *args: object, **kwargs: object) -> object:
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return resolve(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", no_dns_for_invalid)
    ca = trustme.CA()
    pem = tmp_path / "server.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    store = tmp_path / "store.db"
    with LocalTablestore(store) as writer:
        writer.create_table("t", [("id", "STRING")], [("v", "INTEGER")], channels=1)
    with EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET) as plain, \
            EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET, tls_cert=str(pem),
                           tls_key=str(pem)) as tls:
        yield plain.url, tls.url


def unreachable_endpoints(emulators: tuple[str, str]) -> list[tuple[str, str]]:
    """(endpoint, what the message says) for each way of being wrong."""
    https_port = emulators[1].rsplit(":", 1)[1]
    return [
        (f"http://127.0.0.1:{free_port()}", "nothing listens on"),
        ("http://no-such-host.invalid:8080", "does not resolve"),
        (f"http://127.0.0.1:{https_port}", "if that port serves https, use https://"),
    ]


def test_a_tunnel_endpoint_that_gives_no_answer_at_the_start_fails_at_once(
        emulators: tuple[str, str]) -> None:
    for endpoint, says in unreachable_endpoints(emulators):
        client = tunnel(endpoint, deadline="10")
        began = time.monotonic()
        with query_start(), pytest.raises(EndpointUnreachableError) as info:
            client.list_tunnels("t")
        message = str(info.value)
        assert time.monotonic() - began < 3, message  # not the 10 s of retries
        assert message.startswith(f"endpoint {endpoint}: ") and says in message
        assert "start the query again" in message and SECRET not in message
        assert "\n" not in message


def test_an_https_port_is_named_after_three_attempts_each_closed_without_an_answer(
        emulators: tuple[str, str]) -> None:
    https_port = emulators[1].rsplit(":", 1)[1]
    endpoint = f"http://127.0.0.1:{https_port}"
    began = time.monotonic()
    with query_start(), pytest.raises(EndpointUnreachableError) as info:
        tunnel(endpoint, deadline="10").list_tunnels("t")
    took = time.monotonic() - began
    message = str(info.value)
    assert "(3 attempts over " in message and "each closed without an answer)" in message
    assert 0.9 < took < 5, message  # retried over about a second, not the 10 s deadline
    with query_start(), pytest.raises(MetaStoreRequestError) as meta_info:
        meta(endpoint, attempts=8).get_namespace_info("ns")
    assert "(3 attempts over " in str(meta_info.value)


def test_one_connection_dropped_at_the_start_is_retried_and_the_start_goes_on(
        emulators: tuple[str, str]) -> None:
    plain, _ = emulators
    with FaultProxy(int(plain.rsplit(":", 1)[1])) as proxy:
        proxy.add(Rule(Kind.RESET_BEFORE, ordinals=frozenset({1})))
        with query_start():
            assert tunnel(proxy.url, deadline="10").list_tunnels("t") == []
        assert [i.kind for i in proxy.injected] == [Kind.RESET_BEFORE]
        proxy.add(Rule(Kind.RESET_BEFORE, ordinals=frozenset({1})))
        with query_start(), pytest.raises(MetaTableMissingError):  # an answer: it got through
            meta(proxy.url).get_namespace_info("ns")
        assert [i.kind for i in proxy.injected] == [Kind.RESET_BEFORE] * 2


def test_the_meta_store_endpoint_that_gives_no_answer_at_the_start_fails_at_once(
        emulators: tuple[str, str]) -> None:
    for endpoint, says in unreachable_endpoints(emulators):
        store = meta(endpoint, attempts=8)
        with query_start(), pytest.raises(MetaStoreRequestError) as info:
            store.get_namespace_info("ns")
        message = str(info.value)
        assert f"meta.store endpoint {endpoint}: " in message and says in message
        assert SECRET not in message


def test_outside_the_start_and_after_a_first_answer_a_refusal_is_an_outage(
        tmp_path: Path) -> None:
    port = free_port()
    client = tunnel(f"http://127.0.0.1:{port}", deadline="0.3")
    with pytest.raises(TransientTunnelError):  # an executor's client: retried
        client.list_tunnels("t")
    store = tmp_path / "store.db"
    with LocalTablestore(store) as writer:
        writer.create_table("t", [("id", "STRING")], [("v", "INTEGER")], channels=1)
    with EmulatorServer(str(store), INSTANCE, KEY_ID, SECRET, port=port):
        answered = tunnel(f"http://127.0.0.1:{port}", deadline="0.3")
        with query_start():
            assert answered.list_tunnels("t") == []
    with query_start(), pytest.raises(TransientTunnelError):  # it answered before: an outage
        answered.list_tunnels("t")


def test_refused_credentials_name_the_options(emulators: tuple[str, str]) -> None:
    plain, _ = emulators
    with pytest.raises(TunnelAuthError) as info:
        tunnel(plain, secret="wrong-secret").list_tunnels("t")
    assert "OTSAuthFailed" in str(info.value)
    assert "access.key.id / access.key.secret" in str(info.value)
    assert "ALIBABA_CLOUD_ACCESS_KEY_ID" in str(info.value)
    with pytest.raises(MetaStoreRequestError) as meta_info:
        meta(plain, secret="wrong-secret").get_namespace_info("ns")
    assert "OTSAuthFailed" in str(meta_info.value)
    assert "meta store's credentials were refused" in str(meta_info.value)
    assert "access.key.id / access.key.secret" in str(meta_info.value)
    assert "wrong-secret" not in str(info.value) + str(meta_info.value)


# --- the retry layer ----------------------------------------------------------------------


class Slow:
    """A client whose every call fails after ``seconds`` with ``error`` (a backend that waits
    out its own retries before giving up)."""

    def __init__(self, seconds: float, error: Exception) -> None:
        self.seconds, self.error, self.calls = seconds, error, 0

    def call(self) -> None:
        self.calls += 1
        time.sleep(self.seconds)
        raise self.error


def test_attempts_are_counted_honestly_and_the_last_error_says_what_to_do(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each attempt takes longer than the deadline (as a Tablestore call that retried for its
    own 15 s): the layer stops after the second, and says two attempts, not "1 of 6"."""
    monkeypatch.setattr(retry, "DEADLINE_S", 0.2)
    slow = Slow(0.25, TransientTunnelError(detail="endpoint down"))
    caplog.set_level(logging.INFO, logger="connector.retry")
    with pytest.raises(TransientTunnelError) as info:
        retry.with_retries(slow).call()
    assert slow.calls == 2
    message = str(info.value)
    assert message.startswith("tunnel service temporarily unavailable: endpoint down (gave up "
                              "after 2 attempt(s) in ")
    assert "restarted on the same checkpoint location: nothing is lost" in message
    lines = [r.getMessage() for r in caplog.records if r.name == "connector.retry"]
    assert len(lines) == 1 and "attempt 1 of at most 6 within 0 s" in lines[0]


def test_the_final_error_after_every_attempt_keeps_its_type_and_fields() -> None:
    flaky = Slow(0.0, TransientMetaStoreError(detail="throttled"))
    with pytest.raises(TransientMetaStoreError) as info:
        retry.with_retries(flaky).call()
    assert flaky.calls == retry.ATTEMPTS
    assert info.value.detail.startswith(f"throttled (gave up after {retry.ATTEMPTS} attempt(s)")
