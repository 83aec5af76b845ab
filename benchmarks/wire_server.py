"""The emulator's routes in a process of their own, served lean: the wire benchmarks' far side.

``python -m benchmarks.wire_server STORE --instance I --key-id K --secret S [--replay]
[--delay-ms N]`` prints ``listening on http://127.0.0.1:PORT`` and serves until killed.

Every route of ``tablestore_emulator`` (table and tunnel API) answers as ``tablestore-cdc
emulator`` does: requests verified, responses signed (``tablestore_emulator.auth``), errors in
the service's shape. What differs is only how it is served, so the figures measure our side:

- **one asyncio loop** (an ``asyncio.Protocol`` per connection, requests parsed by ``httptools``,
  the C parser the client uses too) in a process of its own: the client's CPU and GIL are not
  shared with the server, and a request costs the server tens of microseconds of HTTP instead of
  the threaded ``http.server``'s parsing (or aiohttp's request objects, which served it before:
  about 0.15 ms more per request);
- ``--replay``: a ReadRecords answer is encoded once and kept, by (channel, token,
  max_records), with its MD5, then served from memory (signed anew each time, so its date
  stays valid). Only for a store nobody writes while the server runs (a kept answer would hide
  new records). The client-only benchmark reads everything once (a warm-up) and then
  measures reads that cost the server a lookup and a signature: the client, Spark and the
  source, not the emulator's PlainBuffer encoder;
- ``--delay-ms N``: every response leaves N ms after its request arrived (``call_later``, so
  concurrent requests wait at the same time, as they would on a network with that round trip);
- ``GET /_stats``: JSON ``{"calls": {path: n}, "replayed": n, "encoded": n, "cpu_s": {path:
  s}, "wall_s": {path: s}}`` -- the requests served so far (``/_stats`` itself not counted) and
  the CPU and wall time spent answering them (checks, route, signing; not the HTTP parsing; the
  wall time also holds the store's waits), so a benchmark counts calls and the server's share
  per batch.

Used by ``benchmarks.wire`` (client-only throughput and CPU per record, the memory row) and
``benchmarks.protocol`` (the driver's calls over the wire).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httptools

from connector.local import LocalTablestore
from connector.tunnel.tablestore import messages as m
from tablestore_emulator import auth
from tablestore_emulator.errors import OtsError, internal_error, parameter_invalid
from tablestore_emulator.server import EmulatorContext, load_routes, new_request_id

log = logging.getLogger("benchmarks.wire_server")

READ_PATH = "/tunnel/readrecords"
#: the repository root: the server process imports ``benchmarks`` from here
ROOT = Path(__file__).resolve().parent.parent


def _error_body(exc: OtsError) -> bytes:
    from tablestore.protobuf import table_store_pb2 as pb

    return bytes(pb.Error(code=exc.code, message=exc.message).SerializeToString())


class WireServer:
    """The routes, the replay memo and the counters (one event loop: no locks needed)."""

    def __init__(self, store_path: str, instance: str, key_id: str, secret: str,
                 replay: bool = False, delay_ms: float = 0.0) -> None:
        store = LocalTablestore(store_path)
        self.context = EmulatorContext(store=store, instance=instance)
        self.routes = load_routes()
        self.instance, self.key_id, self.secret = instance, key_id, secret
        self.replay = replay
        self.delay_s = delay_ms / 1000
        #: (channel id, token, max_records) -> the encoded ReadRecords response and its MD5
        self.kept: dict[tuple[str, str, int], tuple[bytes, str]] = {}
        self.calls: Counter[str] = Counter()
        #: CPU seconds spent answering, per path (checking, the route, signing), and the wall
        #: seconds (the same, plus waits: the store's lock and its write-ahead log's syncs)
        self.cpu_s: Counter[str] = Counter()
        self.wall_s: Counter[str] = Counter()
        self.replayed = 0
        self.encoded = 0
        #: the connections open now, closed when the server stops
        self.open_transports: set[Any] = set()

    def answer(self, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, bytes, bool, str | None]:
        """(status, payload, sign, the payload's MD5 if known) of one request, as
        EmulatorServer answers it."""
        try:
            try:
                auth.verify_headers(path, headers, access_key_id=self.key_id,
                                    access_key_secret=self.secret, instance=self.instance)
                auth.verify_body(headers, body)
            except OtsError as exc:
                return exc.http_status, _error_body(exc), False, None
            handler = self.routes.get(path)
            if handler is None:
                raise parameter_invalid(f"Unsupported operation: {path}.")
            if path == READ_PATH and self.replay:
                payload, md5 = self._read(handler, body)
                return 200, payload, True, md5
            return 200, handler(self.context, body), True, None
        except OtsError as exc:
            return exc.http_status, _error_body(exc), True, None
        except Exception:  # a bug: answer like the service does, keep serving
            log.exception("wire server: %s failed", path)
            bug = internal_error()
            return bug.http_status, _error_body(bug), True, None

    def _read(self, handler: Any, body: bytes) -> tuple[bytes, str]:
        """The kept answer to a ReadRecords request and its MD5 (computed once: a replayed
        answer costs the server its signature only)."""
        request = m.parse(m.ReadRecordsRequest, body)
        key = (request.channel_id, request.token, request.max_records)
        kept = self.kept.get(key)
        if kept is None:
            payload = handler(self.context, body)
            kept = self.kept[key] = (payload, auth.content_md5(payload))
            self.encoded += 1
        else:
            self.replayed += 1
        return kept

    def respond(self, method: str, path: str, headers: dict[str, str], body: bytes
                ) -> bytes:
        """The whole HTTP answer to one request (``GET /_stats`` or a route)."""
        if method == "GET" and path == "/_stats":
            text = json.dumps({"calls": dict(self.calls), "replayed": self.replayed,
                               "encoded": self.encoded, "cpu_s": dict(self.cpu_s),
                               "wall_s": dict(self.wall_s)}).encode()
            return _http_answer(200, {"content-type": "application/json"}, text)
        self.calls[path] += 1
        began, began_wall = time.thread_time(), time.perf_counter()
        status, payload, sign, md5 = self.answer(path, headers, body)
        request_id = new_request_id()
        out = (auth.response_headers(path, payload, request_id=request_id,
                                     access_key_id=self.key_id,
                                     access_key_secret=self.secret, body_md5=md5)
               if sign else {"x-ots-requestid": request_id})
        answer = _http_answer(status, out, payload)
        self.cpu_s[path] += time.thread_time() - began
        self.wall_s[path] += time.perf_counter() - began_wall
        return answer


#: status -> its reason phrase (an enum lookup per answer costs more than the dict's)
_REASONS = {s.value: s.phrase for s in HTTPStatus}


def _http_answer(status: int, headers: dict[str, str], body: bytes) -> bytes:
    reason = _REASONS[status]
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n{head}\r\n"
            .encode("latin-1") + body)


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed by httptools, answered in order (a request's
    answer is computed when it is complete; ``delay_s`` after it arrived, it is written)."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.url = b""
        self.arrived = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.open_transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.open_transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.arrived = time.monotonic()  # of the request it completes (one or two segments)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_http_answer(400, {}, b"bad request"))
                self.transport.close()

    def on_message_begin(self) -> None:
        self.headers, self.body, self.url = {}, [], b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("ascii")
        path = self.url.split(b"?", 1)[0].decode("latin-1")  # the SDKs send a bare path
        answer = self.server.respond(method, path, self.headers, b"".join(self.body))
        transport = self.transport
        if transport is None:
            return
        wait = self.arrived + self.server.delay_s - time.monotonic()
        if wait > 0:  # same delay for every request: answers still leave in order
            asyncio.get_running_loop().call_later(wait, _write, transport, answer)
        else:
            transport.write(answer)


def _write(transport: asyncio.Transport, answer: bytes) -> None:
    if not transport.is_closing():
        transport.write(answer)


async def _serve(server: WireServer, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then close the listener and every open connection (a
    client's kept-alive connection must not keep the process up)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listener = await loop.create_server(lambda: _Connection(server), host, port)
    bound = listener.sockets[0].getsockname()
    print(f"listening on http://{bound[0]}:{bound[1]}", flush=True)
    await stop.wait()
    listener.close()
    for transport in list(server.open_transports):
        transport.close()


class WireServerProcess:
    """``python -m benchmarks.wire_server`` started in a process of its own (the benchmarks'
    side): ``url``, ``stats()``, ``stop()``; also a context manager."""

    def __init__(self, store: Path, log_path: Path, instance: str, key_id: str, secret: str,
                 replay: bool = False, delay_ms: float = 0.0, profile: Path | None = None
                 ) -> None:
        args = [sys.executable, "-m", "benchmarks.wire_server", str(store), "--instance",
                instance, "--key-id", key_id, "--secret", secret, "--delay-ms", str(delay_ms)]
        if replay:
            args.append("--replay")
        if profile is not None:
            args += ["--profile", str(profile)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(log_path, "ab"),  # noqa: SIM115
                                     text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"wire server did not start: {line!r} (see {log_path})")
        self.url = line.removeprefix("listening on ")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=30) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def __enter__(self) -> WireServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wire_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--instance", required=True)
    parser.add_argument("--key-id", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--profile", metavar="FILE",
                        help="profile the server (cProfile, CPU time) and write the stats to "
                        "FILE when it is stopped (SIGTERM)")
    args = parser.parse_args(argv)
    server = WireServer(args.store, args.instance, args.key_id, args.secret,
                        replay=args.replay, delay_ms=args.delay_ms)
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile(time.process_time)
        profile.enable()
    try:
        asyncio.run(_serve(server, args.host, args.port))
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        server.context.store.close()


if __name__ == "__main__":
    sys.exit(main())
