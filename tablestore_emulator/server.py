"""The emulator's HTTP server: POST routes, signatures checked and responses signed.

``EmulatorServer`` is used in-process by tests (start on port 0, ``.url``, stop) and by the
``tablestore-cdc emulator`` command (``commands/emulator.py``), which serves until SIGINT/SIGTERM.

Routes: the table API from ``tablestore_emulator.table_api.ROUTES`` (``/CreateTable``,
``/PutRow`` ...) and the tunnel API from ``tablestore_emulator.tunnel_api.ROUTES``
(``/tunnel/...``). A route handler is ``handler(ctx: EmulatorContext, body: bytes) -> bytes``
(``context.py``): it gets the request's protobuf bytes (already authenticated), returns the
serialized protobuf response, and raises ``errors.OtsError`` for a service error. The server
renders both the way the service does.

Given a certificate and key (``tls_cert`` / ``tls_key``) it serves https, as the service does;
each connection's TLS handshake runs in that connection's thread.

Threads: one thread per connection (``ThreadingHTTPServer``), at most ``MAX_CONNECTIONS``
of them. A connection waiting for a request -- idle between keep-alive requests, or still
receiving one -- can be closed for a newcomer: when the cap is reached, a new connection
takes the place of the one that has waited longest; only when every connection is busy
answering is the newcomer refused at once with 503 ``OTSServerUnavailable`` (which the SDKs
retry). A request's line, headers and body must arrive within ``REQUEST_READ_TIMEOUT_S`` of
its first byte (of the connection, for its first request), a kept-alive connection may idle
``KEEPALIVE_IDLE_TIMEOUT_S`` between requests and an answer must be taken within
``RESPONSE_WRITE_TIMEOUT_S``; past any of them the connection is closed unanswered. The
signature is checked on the headers before the body is read: an unsigned request's body is
never held in memory (past ``UNSIGNED_BODY_LIMIT`` bytes it is not read at all: the answer is
sent and the connection closed), and a body is read into one buffer of its
``Content-Length`` (at most ``framing.MAX_REQUEST_BYTES``). All handlers share one
``LocalTablestore`` (its transactions are serialized by its own lock); handlers that read then
write (row conditions) hold ``ctx.write_lock`` across both so a condition stays true until the
write lands. Writers in *other* processes (``tablestore-cdc local write`` on the same file) do
not take that lock: a condition is atomic against emulator clients only.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import socket
import ssl
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tablestore.protobuf import table_store_pb2 as pb

from cdc_common.credentials import ALIBABA_ACCESS_KEY_ID, ALIBABA_ACCESS_KEY_SECRET
from connector.tunnel.local import LocalTablestore
from tablestore_emulator import auth, table_api, tunnel_api
from tablestore_emulator.context import EmulatorContext, Handler
from tablestore_emulator.errors import (
    OtsError,
    internal_error,
    parameter_invalid,
    server_unavailable,
)
from tablestore_emulator.framing import FramingError, body_length

log = logging.getLogger(__name__)

#: How long a connection may take to complete the TLS handshake (https only).
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: Connections served at once; past it a waiting one is closed for the newcomer, or the
#: newcomer gets a 503 when all are busy (module docstring).
MAX_CONNECTIONS = 128
#: A request's line, headers and body must arrive within this many seconds of its first byte.
REQUEST_READ_TIMEOUT_S = 10.0
#: How long a kept-alive connection may wait for its next request.
KEEPALIVE_IDLE_TIMEOUT_S = 60.0
#: How long an answer may take to be taken by the client.
RESPONSE_WRITE_TIMEOUT_S = 30.0
#: Largest body of a request whose signature fails that is read (and dropped) to keep the
#: connection; past it the body is left unread and the connection closed after the answer.
UNSIGNED_BODY_LIMIT = 64 * 1024


def load_routes() -> dict[str, Handler]:
    """Every route the emulator serves: the table API and the tunnel API."""
    return {**table_api.ROUTES, **tunnel_api.ROUTES}


def new_request_id() -> str:
    """A request id shaped like the service's (hex groups; random, as a UUID4's but cheaper:
    every answer has one)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _Slot:
    """One served connection, as the accept loop and the connection's thread share it: whether
    it is busy answering (else it waits for a request and may be closed for a newcomer), and
    the deadline of what it is reading. Its fields change under ``_Connections.lock``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.busy = False
        self.evicted = False
        self.waiting_since = time.monotonic()
        #: when the bytes awaited must have come: a new connection's whole first request
        #: within REQUEST_READ_TIMEOUT_S of the accept; later, a request's first byte within
        #: the keep-alive idle time and the rest within REQUEST_READ_TIMEOUT_S of it
        self.deadline = self.waiting_since + REQUEST_READ_TIMEOUT_S
        self.in_request = True

    def await_request(self, idle_s: float) -> None:
        """The connection's thread: the next request may take ``idle_s`` to start."""
        now = time.monotonic()
        self.busy, self.in_request = False, False
        self.waiting_since, self.deadline = now, now + idle_s

    def received(self) -> None:
        """Bytes came: the first of a request starts its ``REQUEST_READ_TIMEOUT_S``."""
        if not self.in_request:
            self.in_request = True
            self.deadline = time.monotonic() + REQUEST_READ_TIMEOUT_S


class _Connections:
    """The served connections (at most ``cap``): admitted by the accept loop, released by their
    threads when they end."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.lock = threading.Lock()
        self.slots: dict[socket.socket, _Slot] = {}

    def admit(self, sock: socket.socket) -> _Slot | None:
        """A slot for a new connection (closing the longest-waiting one at the cap), or None
        when every connection is busy answering."""
        with self.lock:
            if len(self.slots) >= self.cap:
                waiting = [s for s in self.slots.values() if not s.busy]
                if not waiting:
                    return None
                oldest = min(waiting, key=lambda s: s.waiting_since)
                self._evict(oldest)
            slot = self.slots[sock] = _Slot(sock)
            return slot

    def _evict(self, slot: _Slot) -> None:
        del self.slots[slot.sock]
        slot.evicted = True
        try:  # wakes its thread's read with the end of the stream; plain socket's shutdown:
            # an SSLSocket's own would drop its TLS state under the reading thread
            socket.socket.shutdown(slot.sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def mark_busy(self, slot: _Slot) -> bool:
        """The connection's thread starts answering; False if it was closed for a newcomer."""
        with self.lock:
            slot.busy = True
            return not slot.evicted

    def release(self, sock: socket.socket) -> None:
        with self.lock:
            self.slots.pop(sock, None)


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes as its request parser reads them: each read waits at most until
    the slot's deadline (then ``TimeoutError``, which ``http.server`` answers by closing), and
    a connection closed for a newcomer reads as ended."""

    def __init__(self, sock: socket.socket, slot: _Slot) -> None:
        super().__init__()
        self.sock, self.slot = sock, slot

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.slot.evicted:
            return 0
        remaining = self.slot.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(remaining)
        try:
            n = self.sock.recv_into(buffer)
        except OSError:
            if self.slot.evicted:
                return 0
            raise
        if n:
            self.slot.received()
        return n


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDKs pool connections
    # headers and body leave in separate writes: without TCP_NODELAY the body waits for the
    # client's delayed ACK (~40 ms per request)
    disable_nagle_algorithm = True
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            # the TLS handshake runs here, in this connection's thread, not in the accept
            # loop: a client that never completes it (or refuses the certificate) holds up
            # no one else
            self.request.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()
            self.request.settimeout(None)
        self._slot = self.server.connections.slots.get(self.request) or _Slot(self.request)
        self._requests_read = 0
        self.rfile.close()  # the parser reads through the deadlines instead
        self.rfile = io.BufferedReader(_DeadlineReader(self.request, self._slot))

    def handle_one_request(self) -> None:
        """One request: a new connection's first within ``REQUEST_READ_TIMEOUT_S``; a later
        one's first byte within ``KEEPALIVE_IDLE_TIMEOUT_S``, the rest within
        ``REQUEST_READ_TIMEOUT_S`` of it."""
        if self._requests_read:
            self._slot.await_request(KEEPALIVE_IDLE_TIMEOUT_S)
        self._requests_read += 1
        super().handle_one_request()

    def _read_body(self, length: int) -> bytes | None:
        """The body: one buffer of ``length`` bytes read through the request's deadline; None
        when the client was too slow or its connection was closed for a newcomer (the
        connection is then closed unanswered); ``FramingError`` when the stream ended first."""
        try:
            body = self.rfile.read(length) if length else b""
        except (TimeoutError, OSError) as exc:
            log.debug("emulator: body not received: %r", exc)
            self.close_connection = True
            return None
        if len(body) != length:
            self.close_connection = True
            if self._slot.evicted:
                return None
            raise FramingError(f"Request body ended after {len(body)} of {length} bytes.")
        return body

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        emu = self.server.emulator
        if emu.stopped:
            # a keep-alive connection outliving stop(): drop it unanswered, as a stopped service
            # would, so the client reconnects (and finds the restarted server) instead of
            # reading an error this server never meant to give
            self.close_connection = True
            return
        path = self.path.split("?", 1)[0]
        request_id = new_request_id()
        sign = True
        try:
            length = body_length(self.headers)
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                auth.verify_headers(path, headers, access_key_id=emu.access_key_id,
                                    access_key_secret=emu.access_key_secret,
                                    instance=emu.instance)
            except OtsError:
                sign = False  # the client may hold another secret: an auth error is unsigned
                if length > UNSIGNED_BODY_LIMIT:  # never read: answer, then close
                    self.close_connection = True
                elif self._read_body(length) is None:
                    return
                raise
            body = self._read_body(length)
            if body is None:
                return
            if not self.server.connections.mark_busy(self._slot):
                self.close_connection = True
                return
            try:
                auth.verify_body(headers, body)
            except OtsError:
                sign = False
                raise
            handler = emu.routes.get(path)
            if handler is None:  # the service's error reference: 400, not 404
                raise parameter_invalid(f"Unsupported operation: {path}.")
            status, payload = 200, handler(emu.context, body)
        except OtsError as exc:
            status, payload = exc.http_status, _error_body(exc)
            if isinstance(exc, FramingError):  # the body's end is unknown: nothing after it
                sign = False  # can be read, and the request is not authenticated
                self.close_connection = True
        except Exception:  # a bug: answer like the service does, keep serving
            log.exception("emulator: %s failed", path)
            bug = internal_error()
            status, payload = bug.http_status, _error_body(bug)
        if sign:
            headers_out = auth.response_headers(
                path,
                payload,
                request_id=request_id,
                access_key_id=emu.access_key_id,
                access_key_secret=emu.access_key_secret,
                corrupt_signature=emu.corrupt_response_signatures,
            )
        else:
            headers_out = {"x-ots-requestid": request_id}
        self._answer(status, headers_out, payload)

    def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        """Send one answer, taken within ``RESPONSE_WRITE_TIMEOUT_S``; it says ``Connection:
        close`` when the connection ends after it."""
        self.request.settimeout(RESPONSE_WRITE_TIMEOUT_S)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The refusals of ``http.server`` itself -- a request line or headers it cannot parse,
        a method other than POST, a line too long -- in the service's shape instead of an HTML
        page: a 4xx (400 for what it would answer 5xx), a protobuf ``Error``
        (``OTSParameterInvalid``), ``x-ots-requestid``, and the connection closed."""
        status = code if 400 <= code < 500 else HTTPStatus.BAD_REQUEST
        reason = message or HTTPStatus(code).phrase
        payload = _error_body(parameter_invalid(f"Malformed HTTP request: {reason}."))
        self.log_error("code %d, message %s", code, reason)
        self.close_connection = True
        # a request line it could not read leaves the version at HTTP/0.9, which would send
        # the body without a status line: no SDK speaks 0.9, answer in 1.1
        self.request_version = self.protocol_version
        self._answer(status, {"x-ots-requestid": new_request_id()}, payload)


def _error_body(exc: OtsError) -> bytes:
    return pb.Error(code=exc.code, message=exc.message).SerializeToString()


def _busy_answer() -> bytes:
    """The answer to a connection over the cap when every connection is busy: the service's
    503, unsigned, sent without waiting (its bytes fit any socket buffer) before the
    connection is closed (over https, where no handshake has run, it is only closed)."""
    payload = _error_body(server_unavailable(
        f"Server is busy: {MAX_CONNECTIONS} connections are being answered, retry later."))
    head = (f"HTTP/1.1 503 Service Unavailable\r\nx-ots-requestid: {new_request_id()}\r\n"
            f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n")
    return head.encode("ascii") + payload


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold up stop()
    request_queue_size = MAX_CONNECTIONS  # the listen backlog: a burst of connects is queued
    emulator: EmulatorServer
    connections: _Connections

    def process_request(self, request: Any, client_address: Any) -> None:
        """The accept loop: a slot for the connection (module docstring), then its thread; a
        503 at once when every connection is busy."""
        if self.connections.admit(request) is None:
            try:
                request.setblocking(False)
                if not isinstance(request, ssl.SSLSocket):  # no TLS yet: nothing to say
                    request.send(_busy_answer())
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.connections.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request (a Python worker exiting), or refuses or botches
        the TLS handshake, is routine: one debug line, not a traceback on stderr. Anything
        else is still reported."""
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError, TimeoutError)):
            log.debug("emulator: client %s disconnected", client_address)
            return
        super().handle_error(request, client_address)


class EmulatorServer:
    """A Tablestore emulator over one store file, served on ``host:port`` (0 = a free port).

    ``start()`` binds and serves in a background thread; ``url`` is then
    ``http://HOST:PORT`` (``https://`` when ``tls_cert`` and ``tls_key`` name a PEM
    certificate chain and its private key); ``stop()`` closes the socket and the store. Also a
    context manager. ``channels``: how many change-log channels CreateTable gives a table.
    ``corrupt_response_signatures`` (test switch) makes every response's signature wrong.
    """

    def __init__(
        self,
        store_path: str,
        instance: str,
        access_key_id: str,
        access_key_secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        channels: int = 4,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("serving https takes both a certificate and its key")
        self.store_path = str(store_path)
        self.instance = instance
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.host = host
        self.port = port
        self.channels = channels
        self.tls_cert, self.tls_key = tls_cert, tls_key
        self.corrupt_response_signatures = False
        self.routes: dict[str, Handler] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._context: EmulatorContext | None = None

    @classmethod
    def with_throwaway_key(cls, store_path: str, instance: str, **kwargs: Any) -> EmulatorServer:
        """An emulator whose one key pair is made up for this run (the demo's, a benchmark's):
        known to this process and whoever it hands ``source_options`` or ``credential_env`` to,
        never written down. ``kwargs``: as the constructor's."""
        return cls(str(store_path), instance, f"{instance}-{secrets.token_hex(4)}",
                   secrets.token_urlsafe(18), **kwargs)

    def source_options(self) -> dict[str, str]:
        """The reader options that reach this emulator besides ``endpoint`` (its ``url``): the
        instance and the key pair."""
        return {"instance.name": self.instance, "access.key.id": self.access_key_id,
                "access.key.secret": self.access_key_secret}

    def credential_env(self) -> dict[str, str]:
        """The key pair under the environment names a Tablestore meta store in this instance
        reads its credentials from (``cdc_common.credentials``); a process started with them
        (a query's, and the Spark processes it starts) can open that meta store."""
        return {ALIBABA_ACCESS_KEY_ID: self.access_key_id,
                ALIBABA_ACCESS_KEY_SECRET: self.access_key_secret}

    @property
    def stopped(self) -> bool:
        return self._context is None

    @property
    def context(self) -> EmulatorContext:
        if self._context is None:
            raise RuntimeError("the emulator is not started")
        return self._context

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the emulator is not started")
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls_cert else 'http'}://{host!s}:{port}"

    def start(self) -> EmulatorServer:
        """Open the store, bind, and serve in a daemon thread. Returns self."""
        if self._httpd is not None:
            return self
        self.routes = load_routes()
        tls = None
        if self.tls_cert is not None:  # before the store opens: a bad file fails alone
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            tls.load_cert_chain(self.tls_cert, self.tls_key)
        store = LocalTablestore(self.store_path)
        self._context = EmulatorContext(store=store, instance=self.instance, channels=self.channels)
        httpd = _HTTPServer((self.host, self.port), _Handler)
        httpd.connections = _Connections(MAX_CONNECTIONS)
        if tls is not None:
            httpd.socket = tls.wrap_socket(httpd.socket, server_side=True,
                                           do_handshake_on_connect=False)
        httpd.emulator = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
            name="tablestore-emulator", daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Block until ``stop()`` is called (from a signal handler or another thread)."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.5)

    def expire_tunnel(self, table: str, tunnel_name: str) -> str:
        """Test hook: expire a tunnel as the service does once its change log passed the
        stream's retention (``tunnel_api.expire_tunnel``); returns its id."""
        return tunnel_api.expire_tunnel(self.context, table, tunnel_name)

    def stop(self) -> None:
        """Stop accepting, close the socket and the store. Safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._context is not None:
            self._context.store.close()
            self._context = None

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
