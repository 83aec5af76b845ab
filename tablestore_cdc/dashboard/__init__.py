"""``tablestore-cdc dashboard``: a tiny local web page over the progress feed.

A ``ThreadingHTTPServer`` (standard library) serves the page (``STATIC_FILES``: local files of
this package, no CDN, works offline), ``/api/sources`` (``feed.snapshot.sources_summary``: the
page's first view when the store holds several sources), ``/api/progress[?namespace=NS]``
(``feed.snapshot.dashboard_snapshot``; ``409`` with ``{"error": ...}`` when the namespace is
ambiguous or unknown, ``503`` when the meta store cannot be read) and ``/healthz``
(docs/progress-feed.md, "The dashboard").

Runs in an operator's shell or next to the driver; it only reads the meta store and the tunnel.
It binds to 127.0.0.1 by default: the page has no authentication, so expose it on another
interface only behind something that has.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

import typer

from connector.errors import CdcError
from meta_store import MetaStore
from tablestore_cdc.feed.reading import InspectedStore, InspectionError, open_existing_meta_store
from tablestore_cdc.feed.snapshot import dashboard_snapshot, sources_summary

log = logging.getLogger("tablestore_cdc.dashboard")

STATIC_DIR = Path(__file__).resolve().parent
#: path -> (file in STATIC_DIR, content type); nothing else is served from disk
STATIC_FILES: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


class DashboardApp:
    """What the HTTP handlers ask: one open meta store, snapshots cached for ``cache_s``
    (several browsers polling every second cost one meta-store read per period).

    Built by ``make_server`` in the dashboard process; handler threads share it (the snapshot
    is built under a lock).
    """

    def __init__(self, store: MetaStore, namespace: str | None = None,
                 endpoint: str | None = None, recent: int = 50, cache_s: float = 0.5) -> None:
        # a corrupt row is skipped (and listed in the snapshot's "corrupt") rather than failing
        # the page
        self.store: Any = InspectedStore(store)
        self.namespace = namespace
        self.endpoint = endpoint
        self.recent = recent
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, bytes]] = {}  # per document
        self._ends_cache: dict[str, Any] = {}  # committed batches' end checkpoints (final)

    @classmethod
    def open(cls, meta_uri: str, **kwargs: Any) -> DashboardApp:
        """Open the meta store (refusing a SQLite path that does not exist)."""
        return cls(open_existing_meta_store(meta_uri), **kwargs)

    def snapshot_json(self, namespace: str | None = None) -> bytes:
        """The ``/api/progress`` body for ``namespace`` (default: the one the dashboard was
        started with, else the store's only one)."""
        ns = namespace or self.namespace
        return self._cached_json(f"progress#{ns}", lambda: dashboard_snapshot(
            self.store, ns, endpoint=self.endpoint, recent=self.recent,
            ends_cache=self._ends_cache))

    def sources_json(self) -> bytes:
        """The ``/api/sources`` body: every source of the meta store, summarised."""
        return self._cached_json("sources", lambda: sources_summary(self.store))

    def _cached_json(self, key: str, build: Any) -> bytes:
        with self._lock:
            now = time.monotonic()
            cached = self._cached.get(key)
            if cached is not None and now - cached[0] < self.cache_s:
                return cached[1]
            if len(self._ends_cache) > 4 * self.recent:  # batches age out of the window
                self._ends_cache.clear()
            body = json.dumps(build(), separators=(",", ":")).encode()
            self._cached[key] = (now, body)
            return body

    def close(self) -> None:
        self.store.close()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "tablestore-cdc-dashboard"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path, _, query = self.path.partition("?")
        if path == "/api/progress":
            namespace = parse_qs(query).get("namespace", [None])[-1]
            self._api(lambda: self.server.app.snapshot_json(namespace))
        elif path == "/api/sources":
            self._api(self.server.app.sources_json)
        elif path == "/favicon.ico":
            self.send_response(HTTPStatus.NO_CONTENT)
            self.end_headers()
        elif path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        elif path in STATIC_FILES:
            name, content_type = STATIC_FILES[path]
            self._send(HTTPStatus.OK, (STATIC_DIR / name).read_bytes(), content_type)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    def _api(self, build: Any) -> None:
        try:
            body = build()
        except InspectionError as exc:
            self._json_error(HTTPStatus.CONFLICT, str(exc))
            return
        except CdcError as exc:
            self._json_error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
            return
        self._send(HTTPStatus.OK, body, "application/json")

    def _json_error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        log.debug("%s " + format, self.address_string(), *args)


#: a browser that closed its connection while the page answered (a tab closed, a reload)
CLOSED_CONNECTION = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: DashboardApp) -> None:
        self.app = app
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called by ``socketserver`` in the handler's thread when a request raised: a
        connection the browser closed is routine (one DEBUG line, no traceback); anything
        else is logged once with its traceback, as the standard library prints it."""
        error = sys.exc_info()[1]
        if isinstance(error, CLOSED_CONNECTION):
            log.debug("%s closed the connection: %s", client_address[0], error)
            return
        log.error("request from %s failed", client_address[0], exc_info=error)


def make_server(app: DashboardApp, host: str = "127.0.0.1", port: int = 8765
                ) -> ThreadingHTTPServer:
    """A bound server (``port=0`` picks a free one: read ``server.server_address``). Call
    ``serve_forever()`` (blocking, or in a thread) and ``shutdown()``/``server_close()``."""
    return _Server((host, port), app)


def dashboard_command(
    meta: Annotated[str, typer.Option(
        "--meta", envvar="TABLESTORE_CDC_META", show_envvar=True,
        help="Meta-store URI: sqlite:///abs/path.db, dynamodb://TABLE?region=... or "
        "tablestore://INSTANCE/TABLE?endpoint=http(s)://HOST[:PORT] (`tablestore-cdc meta uri "
        "--endpoint ...` prints the one a query on that endpoint uses).")],
    namespace: Annotated[str | None, typer.Option(
        "--namespace", "-n", help="Source namespace to show first; default: the only one, "
        "or a table of every source when there are several.")] = None,
    endpoint: Annotated[str | None, typer.Option(
        "--endpoint", help="Tunnel endpoint URI instead of the namespace's own.")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind (no authentication!).")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")
                    ] = 8765,
) -> None:
    """Serve the progress dashboard (page + /api/progress) until interrupted."""
    try:
        app = DashboardApp.open(meta, namespace=namespace, endpoint=endpoint)
    except CdcError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        server = make_server(app, host, port)
    except OSError as exc:
        app.close()
        typer.echo(f"error: cannot listen on {host}:{port}: {exc}", err=True)
        raise typer.Exit(2) from None
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    typer.echo(f"dashboard for {app.store.uri} on http://{bound_host}:{bound_port}/ "
               "(Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        app.close()
