"""Socket servers on 127.0.0.1 that stand as the peer of the Tunnel client's HTTP wire
(``connector.tunnel.tablestore.http``) in its tests (tests/test_tablestore_http.py) and its
fuzz target (tests/fuzz/test_fuzz_wire_client_peers.py): ``LoopbackServer`` accepts each
connection and serves it in its own thread, ``read_request`` reads one request off it,
``started_servers`` closes every server a test started; what the peer answers is the test's."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

S = TypeVar("S", bound="LoopbackServer")
A = TypeVar("A")

#: what serves one accepted connection (in its own thread); it returns when it is done
Handler = Callable[[socket.socket], None]


def read_request(conn: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes] | None:
    """One request read off ``conn`` (its head, then a body of its ``Content-Length``, none
    without one), ``buffer`` holding what was read past the one before: (the request, what
    was read past it), or None when the client closed before a whole head."""
    while b"\r\n\r\n" not in buffer:
        data = conn.recv(65536)
        if not data:
            return None
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


class LoopbackServer:
    """Listens on 127.0.0.1 (a free port) from its construction: each accepted connection is
    counted (``connections``) and served in a daemon thread by the ``handler()`` of the moment
    it was accepted, then closed; an ``OSError`` there is the client going away. A subclass
    sets what its ``handler`` reads before calling ``__init__``; ``close`` stops accepting."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handler(self) -> Handler:
        """What serves the connection just accepted (called in the accepting thread)."""
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.handler()),
                             daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket, handler: Handler) -> None:
        with conn:
            try:
                handler(conn)
            except OSError:
                return  # the client went away

    def close(self) -> None:
        self.listener.close()


@contextmanager
def started_servers(make: Callable[[A], S]) -> Iterator[Callable[[A], S]]:
    """A test's way to start servers (``make(arg)``, e.g. a server class), every one started
    closed when the block ends (a fixture yields it)."""
    servers: list[S] = []

    def start(arg: A) -> S:
        servers.append(make(arg))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()
