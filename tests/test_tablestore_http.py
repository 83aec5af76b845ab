"""The Tunnel client's HTTP connections (``connector.tunnel.tablestore.http``) against a real
socket server on 127.0.0.1 that answers each request with scripted bytes: keep-alive reuse,
every way an answer can be delimited, every way it can break, and the idle close of a
kept-alive connection."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connector.tunnel.tablestore.http import (
    ConnectionPool,
    ConnectTimeoutError,
    Endpoint,
    IncompleteAnswer,
    MalformedAnswer,
)
from connector.tunnel.tablestore.transport import Credentials, Transport

#: what the server does with one request: bytes to send, then whether to close the connection
Script = Callable[[int, bytes], tuple[bytes, bool]]


def ok(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


class ScriptedServer:
    """Accepts connections; the ``n``-th request overall (from 0) is answered by ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(rest) < length:
                    rest += conn.recv(65536)
                request, buffer = head + b"\r\n\r\n" + rest[:length], rest[length:]
                with self._lock:
                    n = len(self.requests)
                    self.requests.append(request)
                answer, close = self.script(n, request)
                conn.sendall(answer)
                if close:
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


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
