"""The emulator's HTTP server: POST routes, signatures checked and responses signed.

``EmulatorServer`` is used in-process by tests (start on port 0, ``.url``, stop) and by the
``tablestore-cdc emulator`` command (tablestore_cdc/cli.py), which serves until SIGINT/SIGTERM.

Routes: the table API from ``tablestore_emulator.table_api.ROUTES`` (``/CreateTable``,
``/PutRow`` ...) and the tunnel API from ``tablestore_emulator.tunnel_api.ROUTES``
(``/tunnel/...``). A route handler is ``handler(ctx: EmulatorContext, body: bytes) -> bytes``
(``context.py``): it gets the request's protobuf bytes (already authenticated), returns the
serialized protobuf response, and raises ``errors.OtsError`` for a service error. The server
renders both the way the service does.

Given a certificate and key (``tls_cert`` / ``tls_key``) it serves https, as the service does;
each connection's TLS handshake runs in that connection's thread.

Threads: one thread per connection (``ThreadingHTTPServer``). All handlers share one
``LocalTablestore`` (its transactions are serialized by its own lock); handlers that read then
write (row conditions) hold ``ctx.write_lock`` across both so a condition stays true until the
write lands. Writers in *other* processes (``tablestore-cdc local write`` on the same file) do
not take that lock: a condition is atomic against emulator clients only.
"""

from __future__ import annotations

import logging
import os
import secrets
import ssl
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tablestore.protobuf import table_store_pb2 as pb

from cdc_common.credentials import ALIBABA_ACCESS_KEY_ID, ALIBABA_ACCESS_KEY_SECRET
from connector.tunnel.local import LocalTablestore
from tablestore_emulator import auth, table_api, tunnel_api
from tablestore_emulator.context import EmulatorContext, Handler
from tablestore_emulator.errors import OtsError, internal_error, parameter_invalid
from tablestore_emulator.framing import FramingError, body_length

log = logging.getLogger(__name__)

#: How long a connection may take to complete the TLS handshake (https only).
TLS_HANDSHAKE_TIMEOUT_S = 10.0


def load_routes() -> dict[str, Handler]:
    """Every route the emulator serves: the table API and the tunnel API."""
    return {**table_api.ROUTES, **tunnel_api.ROUTES}


def new_request_id() -> str:
    """A request id shaped like the service's (hex groups; random, as a UUID4's but cheaper:
    every answer has one)."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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
            body = self.rfile.read(body_length(self.headers))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                auth.verify_request(
                    path,
                    headers,
                    body,
                    access_key_id=emu.access_key_id,
                    access_key_secret=emu.access_key_secret,
                    instance=emu.instance,
                )
            except OtsError:
                sign = False  # the client may hold another secret: an auth error is unsigned
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
        self.send_response(status)
        for name, value in headers_out.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
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
        self.send_response(status)
        self.send_header("x-ots-requestid", new_request_id())
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


def _error_body(exc: OtsError) -> bytes:
    return pb.Error(code=exc.code, message=exc.message).SerializeToString()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold up stop()
    emulator: EmulatorServer

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
        self._context = EmulatorContext(
            store=store, instance=self.instance, store_path=store.path, channels=self.channels
        )
        httpd = _HTTPServer((self.host, self.port), _Handler)
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
