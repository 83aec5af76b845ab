"""Kept-alive HTTP/1.1 connections to one endpoint: the Tunnel client's wire.

``ConnectionPool(endpoint)`` hands out ``Connection``s: ``send(request)`` writes one
request (``post_bytes``), ``read()`` returns its ``Answer`` (status, lower-cased headers,
body); the connection then goes back with ``give_back`` and serves the next request. Sockets
and TLS are the standard library's (``socket``, ``ssl``: the server's certificate and host
name always verified); the answer is parsed by ``httptools`` (the C parser of llhttp, as
uvicorn uses it): status line, headers, ``Content-Length`` and chunked bodies, keep-alive.

Why not urllib3 (which this layer replaced): its request and response layers cost about 0.4 ms
of CPU per call here (URL parsing and pool lookup per request, ``http.client``'s header writer
and its ``email`` header parser, ``HTTPHeaderDict``), several times what the service's answer
takes over loopback; the driver makes a call per channel and batch, and an executor one per
500-record page (docs/performance.md). This layer does only what the client needs: POST with a
body, one endpoint, no redirects, no proxies, no cookies.

Errors are the standard library's, as ``cdc_common.tls`` and ``cdc_common.first_contact``
read them: ``OSError`` (refused, reset, unreachable, ``ssl.SSLError``), ``TimeoutError`` for a
read timeout, ``AnswerDeadlineError`` for an answer not whole within the answer deadline and
``ConnectTimeoutError`` for a connect timeout (all three ``TimeoutError``), ``http.client.
RemoteDisconnected`` for a connection closed before any answer, ``IncompleteAnswer`` for one
closed mid-answer and ``MalformedAnswer`` for bytes that are not HTTP (both
``http.client.HTTPException``). ``Transport`` retries them all. ``AnswerTooLarge`` (a
``MalformedAnswer``) is an answer past the limits below: ``Transport`` does not retry it.

Limits: the server (or whatever sits between) is not trusted with this process's memory or
time. An answer is refused once its header section holds more than ``MAX_HEADER_COUNT``
headers or ``MAX_HEADER_BYTES`` bytes, or its body is longer than ``MAX_ANSWER_BYTES``: a
``Content-Length`` past it before any byte of the body is read, a chunked or close-delimited
body as soon as it grows past it (at most one ``RECV_BYTES`` read beyond); a chunked body's
framing and trailers count with the header section (and may add a quarter of the body). A
whole answer, across all its reads, must arrive within the pool's ``answer_deadline_s`` (the
transport's ``RETRY_DEADLINE_S``), and each read within ``read_timeout``: a server dripping a
byte at a time cannot hold a call longer.

A kept-alive connection the server closed while it was idle is noticed before it is reused
(readable while idle: its end of file is waiting) and opened anew; a request that meets such a
close anyway, before any byte of an answer, is sent once more on a new connection (the
standard rule for kept-alive connections: the request never reached the service).

Thread-safe pool; a ``Connection`` is used by one thread at a time. Not fork-safe: each
process opens its own (``Transport`` does). Who uses it: ``connector.tunnel.tablestore.
transport`` (driver and executors).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

#: bytes asked of the socket per read (a 500-record page is ~65 KB)
RECV_BYTES = 256 * 1024
#: the longest answer body taken: the largest legitimate one is a ReadRecords page, which the
#: service ends at 500 records or about 900 KB (docs/tablestore.md, "Assumptions about the
#: service"); 64 MiB leaves ample room
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: the most headers an answer may carry (the service sends about ten)
MAX_HEADER_COUNT = 128
#: the longest header section (status line and headers) an answer may have
MAX_HEADER_BYTES = 64 * 1024


class ConnectTimeoutError(TimeoutError):
    """No connection to the endpoint within the connect timeout."""


class IncompleteAnswer(http.client.HTTPException):
    """The connection closed in the middle of an answer."""


class MalformedAnswer(http.client.HTTPException):
    """What came back is not an HTTP/1.1 answer."""


class AnswerTooLarge(MalformedAnswer):
    """An answer past one of the module's limits: ``what`` exceeded (the body, the headers'
    count or size) and ``limit``, the constant's value. Its bytes are not read further."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"the answer's {what} exceeds {limit}")
        self.what = what
        self.limit = limit

    def __reduce__(self) -> tuple[type[AnswerTooLarge], tuple[str, int]]:
        return (type(self), (self.what, self.limit))


class AnswerDeadlineError(TimeoutError):
    """An answer not whole within the pool's ``answer_deadline_s`` (its reads each arrived in
    time, but too slowly together)."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``headers`` by lower-cased name (repeated ones joined by ", ")."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Collector:
    """httptools' callbacks for one answer, within the limits it is given (module docstring):
    past one, ``refused`` says which and nothing more is kept; ``Connection.read`` raises."""

    __slots__ = ("headers", "chunks", "complete", "headers_complete", "keep_alive", "parser",
                 "unasked", "refused", "body_bytes", "header_count", "header_bytes",
                 "max_body", "max_header_count", "max_header_bytes")

    def __init__(self, max_body: int, max_header_count: int, max_header_bytes: int) -> None:
        #: values by lower-cased name, in order (joined once, at the end: a list, as repeated
        #: names would make joining as they come quadratic)
        self.headers: dict[str, list[str]] = {}
        self.chunks: list[bytes] = []
        self.complete = False
        self.headers_complete = False
        self.keep_alive = False
        #: bytes of another answer came after this one (nothing was asked for them)
        self.unasked = False
        #: the limit the answer went past, as ``AnswerTooLarge``
        self.refused: AnswerTooLarge | None = None
        self.body_bytes = self.header_count = self.header_bytes = 0
        self.max_body = max_body
        self.max_header_count = max_header_count
        self.max_header_bytes = max_header_bytes
        self.parser = httptools.HttpResponseParser(self)

    def joined_headers(self) -> dict[str, str]:
        return {key: values[0] if len(values) == 1 else ", ".join(values)
                for key, values in self.headers.items()}

    def has_header(self, key: str, part: str = "") -> bool:
        return any(part in value for value in self.headers.get(key, ()))

    def on_message_begin(self) -> None:
        if self.complete:
            self.unasked = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.unasked or self.refused is not None:
            return
        self.header_count += 1
        self.header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self.header_count > self.max_header_count:
            self.refused = AnswerTooLarge("header count", self.max_header_count)
            return
        if self.header_bytes > self.max_header_bytes:
            self.refused = AnswerTooLarge("header bytes", self.max_header_bytes)
            return
        self.headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        if self.unasked or self.refused is not None:
            return
        self.headers_complete = True
        # asked now: llhttp answers from the message being parsed, not after it
        self.keep_alive = self.parser.should_keep_alive()
        length = self.headers.get("content-length")
        try:  # llhttp has checked it is digits; refused here before any of the body is read
            too_long = length is not None and int(length[0]) > self.max_body
        except ValueError:
            too_long = False
        if too_long:
            self.refused = AnswerTooLarge("body bytes (Content-Length)", self.max_body)

    def on_body(self, data: bytes) -> None:
        if self.unasked or self.refused is not None:
            return
        self.body_bytes += len(data)
        if self.body_bytes > self.max_body:
            self.refused = AnswerTooLarge("body bytes", self.max_body)
            self.chunks = []
            return
        self.chunks.append(data)

    def on_message_complete(self) -> None:
        self.complete = True


@dataclass(frozen=True)
class Endpoint:
    """Where to connect: from ``http://host:port`` or ``https://host:port`` (a path, if any, is
    not used: the service's paths are absolute)."""

    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class Connection:
    """One socket to the endpoint, opened on the first ``send``; reusable after a complete
    answer the server did not mark ``Connection: close``."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._sock: socket.socket | None = None
        self.reusable = False
        #: served an answer before: a failure before the next answer's first byte may be the
        #: server's idle close (the request is then sent again once)
        self.reused = False

    def _open(self) -> socket.socket:
        pool = self._pool
        try:
            sock = socket.create_connection((pool.endpoint.host, pool.endpoint.port),
                                            timeout=pool.connect_timeout)
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                f"no connection to {pool.endpoint.host_header} within "
                f"{pool.connect_timeout:g} s") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if pool.tls is not None:
                sock = pool.tls.wrap_socket(sock, server_hostname=pool.endpoint.host)
            sock.settimeout(pool.read_timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    def send(self, request: bytes) -> None:
        """Write one whole request (opening the socket first if needed)."""
        if self._sock is None:
            self._sock = self._open()
            self.reused = False
        self.reusable = False  # until its answer is read whole
        try:
            self._sock.sendall(request)
        except BaseException:
            self.close()
            raise

    def read(self) -> Answer:
        """Read the answer to the request sent, within the pool's limits and answer deadline
        (module docstring); raises as the module docstring says (and closes the socket: a
        connection that failed is never reused)."""
        sock = self._sock
        if sock is None:
            raise http.client.RemoteDisconnected("the connection is not open")
        pool = self._pool
        collector = _Collector(pool.max_answer_bytes, pool.max_header_count,
                               pool.max_header_bytes)
        parser = collector.parser
        received = 0
        deadline = time.monotonic() + pool.answer_deadline_s
        try:
            while not collector.complete:
                left = deadline - time.monotonic()
                cut = left < pool.read_timeout  # this read's timeout is the deadline's rest
                if left <= 0:
                    raise AnswerDeadlineError(self._late(received))
                sock.settimeout(left if cut else pool.read_timeout)
                try:
                    data = sock.recv(RECV_BYTES)
                except TimeoutError as exc:
                    if cut:
                        raise AnswerDeadlineError(self._late(received)) from exc
                    raise
                except ConnectionResetError as exc:
                    if received == 0:
                        raise  # before any answer: ``exchange`` may send the request again
                    raise IncompleteAnswer(f"the connection was reset after {received} bytes "
                                           "of the answer") from exc
                if not data:
                    if received == 0:
                        raise http.client.RemoteDisconnected(
                            "the server closed the connection without an answer")
                    if collector.headers_complete and self._ends_at_close(collector):
                        break  # a body delimited by the connection's end
                    raise IncompleteAnswer(f"the connection closed after {received} bytes "
                                           "of the answer")
                received += len(data)
                try:
                    parser.feed_data(data)
                except httptools.HttpParserUpgrade as exc:
                    raise MalformedAnswer("the server asked to switch protocols") from exc
                except httptools.HttpParserError as exc:
                    raise MalformedAnswer(f"not an HTTP answer: {exc}") from exc
                if collector.refused is not None:
                    raise collector.refused
                self._check_besides_body(collector, received)
            status = parser.get_status_code()
            # a connection that carried bytes nobody asked for is not trusted with another call
            keep = collector.complete and collector.keep_alive and not collector.unasked
        except BaseException:
            self.close()
            raise
        self.reusable = keep
        if not keep:
            self.close()
        else:
            self.reused = True
            sock.settimeout(pool.read_timeout)  # not the deadline's rest: for the next send
        return Answer(status, collector.joined_headers(), b"".join(collector.chunks))

    def _check_besides_body(self, collector: _Collector, received: int) -> None:
        """Bytes that are not the body: the header section, then a chunked body's framing and
        trailers (which httptools holds whole until each ends), at most a quarter of the body
        beyond ``max_header_bytes`` (a legitimate server's chunks are far longer than their
        framing)."""
        limit = self._pool.max_header_bytes
        if not collector.headers_complete:
            if received > limit:
                raise AnswerTooLarge("header bytes", limit)
            return
        limit += collector.body_bytes // 4
        if received - collector.body_bytes > limit:
            raise AnswerTooLarge("bytes besides the body (chunk framing, trailers)", limit)

    def _late(self, received: int) -> str:
        return (f"the answer timed out: not whole within {self._pool.answer_deadline_s:g} s "
                f"({received} bytes came)")

    @staticmethod
    def _ends_at_close(collector: _Collector) -> bool:
        return (not collector.has_header("content-length")
                and not collector.has_header("transfer-encoding", "chunked"))

    def idle_closed(self) -> bool:
        """Has the server closed this idle connection (or sent something unasked)?"""
        if self._sock is None:
            return False
        try:  # poll, not select: a process may hold more descriptors than select takes
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self.reusable = False
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


class ConnectionPool:
    """Connections to one endpoint, at most ``max_idle`` kept open between requests."""

    def __init__(self, url: str, *, ca_bundle: str | None, connect_timeout: float,
                 read_timeout: float, max_idle: int, answer_deadline_s: float,
                 max_answer_bytes: int = MAX_ANSWER_BYTES,
                 max_header_count: int = MAX_HEADER_COUNT,
                 max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        """``read_timeout`` bounds each read of an answer, ``answer_deadline_s`` all of them
        together; the ``max_*`` limits are the module's constants (tests pass smaller ones)."""
        self.endpoint = Endpoint.parse(url)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.answer_deadline_s = answer_deadline_s
        self.max_answer_bytes = max_answer_bytes
        self.max_header_count = max_header_count
        self.max_header_bytes = max_header_bytes
        self.max_idle = max_idle
        self.tls: ssl.SSLContext | None = None
        if self.endpoint.scheme == "https":
            # the default context verifies the certificate chain and the host name
            self.tls = ssl.create_default_context(cafile=ca_bundle)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        #: connections made so far, and connections given back while already idle (tests
        #: check that connections are reused, and never handed to two callers)
        self.opened = 0
        self.given_back_twice = 0

    def take(self) -> Connection:
        """An idle connection the server still holds open, else a new one (not opened yet)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                with self._lock:
                    self.opened += 1
                return Connection(self)
            if not conn.idle_closed():
                return conn
            conn.close()

    def give_back(self, conn: Connection) -> None:
        """Return ``conn`` after its answer was read (or it failed): kept when reusable."""
        if conn.reusable:
            with self._lock:
                if any(idle is conn for idle in self._idle):
                    self.given_back_twice += 1  # a caller's bug: never hand it out twice
                    return
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    return
        conn.close()

    def exchange(self, request: bytes) -> Answer:
        """Send ``request`` and read its answer on a pooled connection. A kept-alive connection
        that turns out closed before any answer is replaced and the request sent once more."""
        conn = self.take()
        try:
            try:
                conn.send(request)
                return conn.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not conn.reused:
                    raise
                conn.close()  # the server's idle close raced this request: never served
                conn.send(request)
                return conn.read()
        finally:
            self.give_back(conn)

    def post_bytes(self, path: str, header_lines: str, body: bytes) -> bytes:
        """A POST of ``body`` to ``path`` with ``header_lines`` already written out (each
        ``name: value\r\n``, values checked by the caller to hold no line breaks; the
        transport keeps its fixed ones written), after the Host and Content-Length lines."""
        return (f"POST {path} HTTP/1.1\r\nHost: {self.endpoint.host_header}\r\n"
                f"Content-Length: {len(body)}\r\n{header_lines}\r\n").encode("latin-1") + body

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
