"""The Tunnel client's HTTP connections (``connector.tunnel.tablestore.http``) against a real
socket server on 127.0.0.1 that answers each request with scripted bytes: keep-alive reuse,
every way an answer can be delimited, every way it can break, and the idle close of a
kept-alive connection. Then a hostile server (``HostileServer``: endless bodies, bytes dripped,
header floods, a huge ``Content-Length``) against the wire's limits: the answer bound, the
header count and size bounds, the whole-answer deadline, through the pool, the transport and
the client (its typed error, its documented 15 s, its process's memory)."""

from __future__ import annotations

import http.client
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connector.errors import TransientTunnelError, TunnelAnswerTooLargeError
from connector.tunnel.tablestore.client import TablestoreTunnelService
from connector.tunnel.tablestore.http import (
    MAX_ANSWER_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    AnswerDeadlineError,
    AnswerTooLarge,
    ConnectionPool,
    ConnectTimeoutError,
    Endpoint,
    IncompleteAnswer,
    MalformedAnswer,
)
from connector.tunnel.tablestore.transport import RETRY_DEADLINE_S, Credentials, Transport
from testkit.socket_peers import Handler, LoopbackServer, read_request, started_servers

#: what the server does with one request: bytes to send, then whether to close the connection
Script = Callable[[int, bytes], tuple[bytes, bool]]


def ok(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


class ScriptedServer(LoopbackServer):
    """Accepts connections; the ``n``-th request overall (from 0) is answered by ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        super().__init__()

    def handler(self) -> Handler:
        return self._serve_requests

    def _serve_requests(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            got = read_request(conn, buffer)
            if got is None:
                return
            request, buffer = got
            with self._lock:
                n = len(self.requests)
                self.requests.append(request)
            answer, close = self.script(n, request)
            conn.sendall(answer)
            if close:
                return


@pytest.fixture
def serve() -> Iterator[Callable[[Script], ScriptedServer]]:
    with started_servers(ScriptedServer) as start:
        yield start


def _pool(url: str, read_timeout: float = 5.0, **limits: Any) -> ConnectionPool:
    limits.setdefault("answer_deadline_s", 10.0)
    return ConnectionPool(url, ca_bundle=None, connect_timeout=2.0, read_timeout=read_timeout,
                          max_idle=4, **limits)


def test_kept_alive_connection_serves_every_request(serve: Callable[[Script], ScriptedServer]
                                                    ) -> None:
    server = serve(lambda n, _: (ok(f"answer {n}".encode(), "X-Ots-Date: now\r\n"), False))
    pool = _pool(server.url)
    answers = [pool.exchange(pool.post_bytes("/tunnel/list", "x-ots-a: 1\r\n", b"body"))
               for _ in range(20)]
    assert [a.body for a in answers] == [f"answer {n}".encode() for n in range(20)]
    assert answers[0].status == 200 and answers[0].headers["x-ots-date"] == "now"
    assert server.connections == 1 and pool.opened == 1
    first = server.requests[0]
    assert first.startswith(b"POST /tunnel/list HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
    assert b"Content-Length: 4\r\n" in first and b"x-ots-a: 1\r\n" in first
    assert first.endswith(b"\r\n\r\nbody")
    pool.close()


def test_kept_alive_with_more_descriptors_than_select_takes(
        serve: Callable[[Script], ScriptedServer]) -> None:
    """A process holding over 1,024 descriptors (a Spark driver may): connections still reused."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [socket.socket() for _ in range(1100)]
    try:
        server = serve(lambda n, _: (ok(b"x"), False))
        pool = _pool(server.url)
        for _ in range(5):
            assert pool.exchange(pool.post_bytes("/p", "", b"")).body == b"x"
        assert server.connections == 1
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_chunked_and_close_delimited_answers(serve: Callable[[Script], ScriptedServer]) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    to_close = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy, bye"
    server = serve(lambda n, _: (chunked, False) if n == 0 else (to_close, True))
    pool = _pool(server.url)
    request = pool.post_bytes("/p", "", b"")
    assert pool.exchange(request).body == b"hello world"
    answer = pool.exchange(request)  # same connection, then closed after the body
    assert (answer.status, answer.body) == (503, b"busy, bye")
    assert server.connections == 1
    assert pool.exchange(request).body == b"busy, bye"  # a new connection: not reused
    assert server.connections == 2


def test_bytes_after_the_answer_are_not_taken_and_the_connection_not_reused(
        serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda n, _: (ok(b"mine") + ok(b"unasked"), False))
    pool = _pool(server.url)
    request = pool.post_bytes("/p", "", b"")
    assert pool.exchange(request).body == b"mine"
    assert pool.exchange(request).body == b"mine"  # a new connection, not the unasked answer
    assert server.connections == 2


def test_idle_close_is_noticed_before_reuse(serve: Callable[[Script], ScriptedServer]) -> None:
    # the server closes after each answer without saying so: the pool must not send the next
    # request into the dead connection (or must send it again once when it does)
    server = serve(lambda n, _: (ok(b"x"), True))
    pool = _pool(server.url)
    for _ in range(5):
        assert pool.exchange(pool.post_bytes("/p", "", b"")).body == b"x"
    assert len(server.requests) == 5 and server.connections == 5


@pytest.mark.parametrize("answer, error", [
    (b"", http.client.RemoteDisconnected),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", IncompleteAnswer),
    (b"HTTP/1.1 200 OK\r\nContent-Le", IncompleteAnswer),
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", MalformedAnswer),
])
def test_broken_answers_raise_and_close(serve: Callable[[Script], ScriptedServer],
                                        answer: bytes, error: type[Exception]) -> None:
    server = serve(lambda n, _: (answer, True))
    pool = _pool(server.url)
    with pytest.raises(error):
        pool.exchange(pool.post_bytes("/p", "", b""))
    assert pool._idle == []  # a connection that failed is never reused


def test_read_timeout_and_refused_and_connect_timeout(
        serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda n, _: (b"", False))  # never answers
    silent = _pool(server.url, read_timeout=0.3)
    with pytest.raises(TimeoutError):
        silent.exchange(silent.post_bytes("/p", "", b""))
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(ConnectionRefusedError):
        _pool(f"http://127.0.0.1:{port}").exchange(b"")
    assert issubclass(ConnectTimeoutError, TimeoutError)


def test_endpoint_forms() -> None:
    assert Endpoint.parse("https://i.cn-hangzhou.ots.aliyuncs.com").host_header == \
        "i.cn-hangzhou.ots.aliyuncs.com"
    assert Endpoint.parse("http://127.0.0.1:8080/x").host_header == "127.0.0.1:8080"
    assert Endpoint.parse("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse("ftp://host")


def test_transport_refuses_a_line_break_in_a_header_value() -> None:
    with pytest.raises(ValueError, match="instance holds a line break"):
        Transport("http://127.0.0.1:1", "inst\r\nX-Evil: 1", Credentials("k", "s"))
    with pytest.raises(ValueError, match="access key id holds a line break"):
        Transport("http://127.0.0.1:1", "inst", Credentials("k\n", "s"))


# --- a hostile server: endless, dripping or flooding answers ---------------------------------

#: what a hostile server does once it has read a request: write to the socket until it likes
Behaviour = Callable[[socket.socket], None]


class HostileServer(LoopbackServer):
    """Accepts connections on 127.0.0.1; on each reads one request (head and body), counts it,
    then lets ``behave`` write what it likes: an endless body, bytes dripped, a header flood.
    A client that gives up closes the socket, which ends ``behave`` (its write fails)."""

    def __init__(self, behave: Behaviour) -> None:
        self.behave = behave
        self.requests = 0
        super().__init__()

    def handler(self) -> Handler:
        return self._serve_one

    def _serve_one(self, conn: socket.socket) -> None:
        if read_request(conn) is None:
            return
        self.requests += 1
        self.behave(conn)


@pytest.fixture
def hostile() -> Iterator[Callable[[Behaviour], HostileServer]]:
    with started_servers(HostileServer) as start:
        yield start


MIB = 1024 * 1024


def endless_chunked(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"100000\r\n" + b"x" * MIB + b"\r\n"
    while True:
        conn.sendall(chunk)


def endless_until_close(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    block = b"y" * MIB
    while True:
        conn.sendall(block)


def endless_trailer(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"5\r\nhello\r\n0\r\nX-Trailer: ")
    block = b"t" * MIB
    while True:
        conn.sendall(block)


def endless_one_byte_chunks(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    block = b"1\r\nx\r\n" * 100_000
    while True:
        conn.sendall(block)


def dripping(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    while True:
        conn.sendall(b"z")
        time.sleep(0.05)


def dripping_headers(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while True:
        conn.sendall(b"X-Drip: 1\r\n")
        time.sleep(0.02)


def silent(conn: socket.socket) -> None:
    time.sleep(30)


def header_flood(count: int, name: bytes = b"X-Repeated") -> Behaviour:
    def behave(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(
            name + b": " + str(i).encode() + b"\r\n" for i in range(count))
            + b"Content-Length: 2\r\n\r\nok")
        time.sleep(5)
    return behave


def long_header(size: int) -> Behaviour:
    def behave(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"v" * size + b"\r\n"
                     b"Content-Length: 2\r\n\r\nok")
        time.sleep(5)
    return behave


def long_status_line(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 " + b"O" * (4 * MIB))
    time.sleep(5)


def huge_content_length(conn: socket.socket) -> None:
    # the head only: a client that waited for the body would wait for its read timeout
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {1 << 40}\r\n\r\n".encode())
    time.sleep(30)


@pytest.mark.parametrize("behave", [endless_chunked, endless_until_close],
                         ids=["chunked", "until-close"])
def test_endless_body_is_refused_once_past_the_answer_bound(
        hostile: Callable[[Behaviour], HostileServer], behave: Behaviour) -> None:
    pool = _pool(hostile(behave).url, max_answer_bytes=4 * MIB)
    began = time.monotonic()
    with pytest.raises(AnswerTooLarge, match=f"body bytes exceeds {4 * MIB}") as caught:
        pool.exchange(pool.post_bytes("/p", "", b""))
    assert time.monotonic() - began < 5
    assert (caught.value.what, caught.value.limit) == ("body bytes", 4 * MIB)
    assert pool._idle == []


@pytest.mark.parametrize("behave", [endless_trailer, endless_one_byte_chunks],
                         ids=["trailer", "one-byte-chunks"])
def test_endless_chunk_framing_or_trailer_is_refused(
        hostile: Callable[[Behaviour], HostileServer], behave: Behaviour) -> None:
    # httptools holds a trailer's value whole until its line ends: bounded with the headers
    pool = _pool(hostile(behave).url, max_answer_bytes=4 * MIB)
    with pytest.raises(AnswerTooLarge, match="besides the body") as caught:
        pool.exchange(pool.post_bytes("/p", "", b""))
    assert caught.value.limit < MAX_HEADER_BYTES + MIB


def test_chunked_answer_in_small_chunks_is_taken(serve: Callable[[Script], ScriptedServer]
                                                 ) -> None:
    piece = b"p" * 64
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + (b"40\r\n" + piece + b"\r\n") * 16384 + b"0\r\nX-Trailer: t\r\n\r\n")
    server = serve(lambda n, _: (chunked, False))
    pool = _pool(server.url)
    assert pool.exchange(pool.post_bytes("/p", "", b"")).body == piece * 16384


def test_content_length_past_the_bound_is_refused_before_reading_the_body(
        hostile: Callable[[Behaviour], HostileServer]) -> None:
    pool = _pool(hostile(huge_content_length).url, read_timeout=20.0)
    began = time.monotonic()
    with pytest.raises(AnswerTooLarge, match="Content-Length"):
        pool.exchange(pool.post_bytes("/p", "", b""))
    assert time.monotonic() - began < 5  # not waiting for a body it will not take


def test_a_body_as_long_as_the_bound_is_taken(serve: Callable[[Script], ScriptedServer]
                                              ) -> None:
    body = b"b" * 4096
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"1000\r\n" + body + b"\r\n0\r\n\r\n")
    server = serve(lambda n, _: (ok(body) if n % 2 == 0 else chunked, False))
    pool = _pool(server.url, max_answer_bytes=4096)
    for _ in range(4):
        assert pool.exchange(pool.post_bytes("/p", "", b"")).body == body


@pytest.mark.parametrize("behave", [dripping, dripping_headers, silent],
                         ids=["body", "headers", "nothing"])
def test_slow_answer_ends_at_the_answer_deadline(
        hostile: Callable[[Behaviour], HostileServer], behave: Behaviour) -> None:
    # each read comes within the read timeout (or, silent, would time out only after 20 s):
    # the whole answer's deadline ends it
    pool = _pool(hostile(behave).url, read_timeout=20.0, answer_deadline_s=1.0)
    began = time.monotonic()
    with pytest.raises(AnswerDeadlineError, match="timed out: not whole within 1 s"):
        pool.exchange(pool.post_bytes("/p", "", b""))
    assert 1.0 <= time.monotonic() - began < 4
    assert issubclass(AnswerDeadlineError, TimeoutError)  # retried as a network error


def test_a_kept_connection_gets_its_read_timeout_back_after_a_deadline_cut_read(
        serve: Callable[[Script], ScriptedServer]) -> None:
    server = serve(lambda n, _: (ok(b"x"), False))
    pool = _pool(server.url, read_timeout=7.0, answer_deadline_s=5.0)
    assert pool.exchange(pool.post_bytes("/p", "", b"")).body == b"x"
    [conn] = pool._idle
    assert conn._sock is not None and conn._sock.gettimeout() == 7.0


def test_repeated_headers_are_joined_in_order(serve: Callable[[Script], ScriptedServer]
                                              ) -> None:
    extra = "".join(f"X-Ots-Repeated: {i}\r\n" for i in range(100))
    server = serve(lambda n, _: (ok(b"x", extra), False))
    pool = _pool(server.url)
    answer = pool.exchange(pool.post_bytes("/p", "", b""))
    assert answer.headers["x-ots-repeated"] == ", ".join(str(i) for i in range(100))
    assert answer.headers["content-length"] == "1"


@pytest.mark.parametrize("behave, what", [
    (header_flood(MAX_HEADER_COUNT), "header count"),  # with Content-Length: one too many
    (header_flood(200_000), "header count"),
    (header_flood(50_000, b"X-" + b"n" * 40), "header count"),
    (long_header(MAX_HEADER_BYTES), "header bytes"),
    (long_header(8 * MIB), "header bytes"),
    (long_status_line, "header bytes"),
], ids=["one-too-many", "repeated-flood", "distinct-flood", "one-long", "8-mib", "status-line"])
def test_header_flood_is_refused_past_the_count_and_size_bounds(
        hostile: Callable[[Behaviour], HostileServer], behave: Behaviour, what: str) -> None:
    pool = _pool(hostile(behave).url)
    with pytest.raises(AnswerTooLarge, match=what) as caught:
        pool.exchange(pool.post_bytes("/p", "", b""))
    limit = MAX_HEADER_COUNT if what == "header count" else MAX_HEADER_BYTES
    assert caught.value.limit == limit
    assert pickle.loads(pickle.dumps(caught.value)).what == what


def test_headers_within_the_bounds_are_taken(serve: Callable[[Script], ScriptedServer]) -> None:
    extra = "".join(f"X-H{i}: {'v' * 100}\r\n" for i in range(MAX_HEADER_COUNT - 1))
    server = serve(lambda n, _: (ok(b"x", extra), False))
    pool = _pool(server.url)
    answer = pool.exchange(pool.post_bytes("/p", "", b""))
    assert len(answer.headers) == MAX_HEADER_COUNT and answer.body == b"x"


def test_an_answer_past_the_bounds_is_a_typed_error_and_not_asked_again(
        hostile: Callable[[Behaviour], HostileServer]) -> None:
    server = hostile(huge_content_length)
    client = TablestoreTunnelService(server.url, "inst", Credentials("k", "s"))
    with pytest.raises(TunnelAnswerTooLargeError, match="answer refused") as caught:
        client.list_tunnels("t")
    error = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(error, TunnelAnswerTooLargeError)
    assert error.fields["limit"] == MAX_ANSWER_BYTES and "/tunnel/list" in str(error)
    assert server.requests == 1  # never retried: asking again would read as much again
    transport = Transport(server.url, "inst", Credentials("k", "s"))
    with pytest.raises(AnswerTooLarge):
        transport.send("/tunnel/list", b"").result()  # a pipelined call alike
    assert server.requests == 2
    client.close()
    transport.close()


def test_dripping_server_fails_the_call_within_the_documented_deadline(
        hostile: Callable[[Behaviour], HostileServer]) -> None:
    """The client's own 15 s (``RETRY_DEADLINE_S``, docs/operations.md "Errors"), not the
    30 s read timeout and not forever: the first attempt uses up the call's retry time."""
    client = TablestoreTunnelService(hostile(dripping).url, "inst", Credentials("k", "s"))
    began = time.monotonic()
    with pytest.raises(TransientTunnelError, match="timed out"):
        client.list_tunnels("t")
    assert RETRY_DEADLINE_S <= time.monotonic() - began < RETRY_DEADLINE_S + 5
    client.close()


_ENDLESS_CHILD = """
import resource, sys, time
from connector.tunnel.tablestore.client import TablestoreTunnelService
from connector.tunnel.tablestore.transport import Credentials

client = TablestoreTunnelService(sys.argv[1], "inst", Credentials("k", "s"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
began = time.monotonic()
try:
    client.list_tunnels("t")
    outcome = "answered"
except Exception as exc:
    outcome = type(exc).__name__
grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(outcome, time.monotonic() - began, grown_kib)
"""


@pytest.mark.parametrize("behave", [endless_chunked, endless_until_close],
                         ids=["chunked", "until-close"])
def test_endless_body_keeps_the_client_process_memory_bounded(
        hostile: Callable[[Behaviour], HostileServer], behave: Behaviour) -> None:
    """The real bound (64 MiB) in a process of its own, whose peak resident size is measured
    (``ru_maxrss``: every page it ever held, not a sample)."""
    server = hostile(behave)
    child = subprocess.run([sys.executable, "-c", _ENDLESS_CHILD, server.url],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    outcome, seconds, grown_kib = child.stdout.split()
    assert outcome == "TunnelAnswerTooLargeError"
    assert float(seconds) < RETRY_DEADLINE_S
    assert int(grown_kib) < 256 * 1024
