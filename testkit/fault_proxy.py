"""A fault-injecting HTTP/1.1 proxy for tests: one hop (client -> proxy -> service), loopback only.

``FaultProxy(upstream_port).start()`` listens on 127.0.0.1 on a free port and forwards every
HTTP request to the service, one upstream connection per client connection (keep-alive on both
sides). For each request it decides, from its plan, whether to let it through or to misbehave
the way a network, a load balancer or a dying peer does:

===================  ==========================================================================
``delay``            hold the request ``delay_s`` before forwarding it (a slow link)
``reset_before``     RST the client's connection; the service never sees the request
``reset_after``      forward, let the service apply it, RST before any byte of the answer
``reset_after_body`` send the whole answer, then RST (the pooled connection is dead)
``truncate``         send the headers (full ``Content-Length``, at least 1) and half the body,
                     then FIN
``stall``            forward, let the service apply it, send nothing until the client gives up
                     (its read timeout) or ``stall_s`` passed
``bare_500``         answer ``500`` with an HTML body, never forwarded (what a load balancer
``bare_503``         sends: no service error code, no signature), ``bare_503`` likewise
``corrupt_body``     forward, flip one byte in the middle of the answer's body (an empty body
                     gets a stray byte)
``bad_signature``    forward, flip one character of the answer's ``Authorization`` header (no such
                     header, as in AWS answers: flip a body byte instead)
===================  ==========================================================================

The plan (thread-safe; the test changes it while traffic flows):

- ``add(Rule(kind, path=..., target=..., ordinals=..., times=..., until=...))``: per request,
  matched on the path (regex), the ``X-Amz-Target`` header (regex: DynamoDB operations), the
  ordinal among the requests the rule matched (1-based), a count and a time window; the first
  rule that applies wins;
- ``window(kind, seconds)``: every request for the next ``seconds`` (``down(seconds)`` is
  ``reset_before``: the hop is down while the others are up);
- ``random(rate, kinds, seed)``: a seeded share ``rate`` of the requests not taken by a rule
  misbehave, the kinds taken in turn (every kind, over and over).

``injected`` lists what was done (ordinal, path or target, kind); ``requests`` counts requests.

Runs an asyncio loop in a daemon thread of the calling process (the test or the harness); the
query's processes reach it through the endpoint or meta-store URI the harness gives them.
Only 127.0.0.1 is ever listened on or connected to.
"""

from __future__ import annotations

import asyncio
import enum
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Self

LOOPBACK = "127.0.0.1"
#: how long a ``stall`` holds an answer at most if the client never gives up (seconds)
STALL_S = 120.0
DELAY_S = 1.0
#: the largest request or response head accepted (bytes)
MAX_HEAD = 64 * 1024
BARE_BODY = b"<html><body><h1>%d %s</h1><hr><center>load balancer</center></body></html>\n"


class Kind(str, enum.Enum):  # noqa: UP042 - the value is what logs and reports show
    DELAY = "delay"
    RESET_BEFORE = "reset_before"
    RESET_AFTER = "reset_after"
    RESET_AFTER_BODY = "reset_after_body"
    TRUNCATE = "truncate"
    STALL = "stall"
    BARE_500 = "bare_500"
    BARE_503 = "bare_503"
    CORRUPT_BODY = "corrupt_body"
    BAD_SIGNATURE = "bad_signature"


#: the kinds a client can ride out without waiting for its read timeout (the 8 % mix)
QUICK_KINDS = (Kind.RESET_BEFORE, Kind.BARE_503, Kind.RESET_AFTER, Kind.CORRUPT_BODY,
               Kind.BARE_500, Kind.TRUNCATE, Kind.BAD_SIGNATURE, Kind.RESET_AFTER_BODY,
               Kind.DELAY)


@dataclass
class Rule:
    """When a request gets ``kind``: every condition given must hold."""

    kind: Kind
    path: str | None = None  # regex searched in the request target
    target: str | None = None  # regex searched in the X-Amz-Target header
    ordinals: frozenset[int] | None = None  # among the requests this rule's filters matched
    times: int | None = None  # applies at most this many times
    until: float | None = None  # time.monotonic() after which it no longer applies
    delay_s: float = DELAY_S
    stall_s: float = STALL_S
    matched: int = field(default=0, init=False)
    applied: int = field(default=0, init=False)

    def take(self, path: str, target: str, now: float) -> bool:
        """Count the request if the filters match; True when the fault applies to it."""
        if self.until is not None and now > self.until:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        if self.path is not None and not re.search(self.path, path):
            return False
        if self.target is not None and not re.search(self.target, target):
            return False
        self.matched += 1
        if self.ordinals is not None and self.matched not in self.ordinals:
            return False
        self.applied += 1
        return True


@dataclass(frozen=True)
class Injected:
    ordinal: int
    at: float  # time.monotonic()
    what: str  # the X-Amz-Target, else the path
    kind: Kind


@dataclass
class _Message:
    head: bytes  # start line and headers, without the blank line
    headers: dict[str, str]  # lower-cased names
    body: bytes
    #: an answer to a HEAD (or a 1xx, 204, 304): its headers, a Content-Length among them,
    #: describe a body that is never sent (S3A takes an object's length from a HEAD's)
    bodiless: bool = False

    @property
    def start(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def encode(self, body: bytes | None = None, *, length: int | None = None) -> bytes:
        """The message re-framed with a ``Content-Length`` (``length`` may lie: truncation),
        without an ``Expect`` (the body goes whole: the service must not answer ``100``)."""
        body = self.body if body is None else body
        if self.bodiless:
            return self.head + b"\r\n\r\n"
        lines = [line for line in self.head.split(b"\r\n")[1:]
                 if line.split(b":", 1)[0].strip().lower()
                 not in (b"content-length", b"transfer-encoding", b"expect")]
        count = len(body) if length is None else length
        return (b"\r\n".join([self.head.split(b"\r\n", 1)[0], *lines,
                              b"Content-Length: %d" % count]) + b"\r\n\r\n" + body)


class _Closed(Exception):
    """The peer closed the connection between messages."""


async def _read_message(reader: asyncio.StreamReader, *, response_to: str = "",
                        client: asyncio.StreamWriter | None = None) -> _Message:
    """One HTTP/1.1 message: its head, and its body by Content-Length, chunked, or to EOF.
    A request with ``Expect: 100-continue`` (S3A's uploads) is told ``100 Continue`` on
    ``client`` first: its sender holds the body until then."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed() from None
        raise
    head = head[:-4]
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if client is not None and headers.get("expect", "").lower() == "100-continue":
        client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await client.drain()
    status = head.split(b" ", 2)[1] if response_to else b""
    if response_to == "HEAD" or status in (b"204", b"304") or status.startswith(b"1"):
        return _Message(head, headers, b"", bodiless=True)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        return _Message(head, headers, bytes(body))
    if "content-length" in headers:
        return _Message(head, headers, await reader.readexactly(int(headers["content-length"])))
    if response_to:  # a response without a length runs to the end of the connection
        return _Message(head, headers, await reader.read())
    return _Message(head, headers, b"")


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer or a reset middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """TCP_NODELAY: a message leaves at once (no 40 ms wait for the peer's delayed ACK)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _flip_middle(body: bytes) -> bytes:
    """One byte flipped in the middle; an empty body gets one stray byte instead."""
    if not body:
        return b"\x00"
    i = len(body) // 2
    return body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1:]


def _bad_signature(message: _Message) -> _Message | None:
    """The message with one character of its Authorization header's signature changed."""
    lines = message.head.split(b"\r\n")
    for n, line in enumerate(lines):
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization" and value.strip():
            value = value.rstrip()
            i = len(value) - 1
            while i > 0 and value[i:i + 1] == b"=":
                i -= 1
            swapped = b"B" if value[i:i + 1] == b"A" else b"A"
            lines[n] = name + b":" + value[:i] + swapped + value[i + 1:]
            return _Message(b"\r\n".join(lines), message.headers, message.body)
    return None


class Upstream:
    """The service end of one proxied client connection, opened at its first forwarded
    request (the loop's thread)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def forward(self, request: _Message, method: str) -> _Message | None:
        """The service's response to ``request``; None: the service dropped the connection."""
        if self._streams is None:
            self._streams = await asyncio.open_connection(*self.address, limit=MAX_HEAD)
            _no_delay(self._streams[1])
        up_reader, up_writer = self._streams
        up_writer.write(request.encode())
        await up_writer.drain()
        try:
            response = await _read_message(up_reader, response_to=method)
        except (_Closed, asyncio.IncompleteReadError, ConnectionError):
            return None
        if response.headers.get("connection", "").lower() == "close":
            self.close()
        return response

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class LoopbackServer:
    """An asyncio server on 127.0.0.1 in a thread of its own, for the tests' proxies
    (``FaultProxy`` here, ``testkit.s3_faults.S3FaultProxy``): ``start()`` returns it listening
    (port 0: a free one, in ``port``), ``stop()`` closes it and cancels its connections; a
    subclass answers each request in ``_answer`` and names its thread ``thread_name``."""

    thread_name = "loopback-server"

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    #: the (host, port) a subclass forwards its clients' requests to
    upstream: tuple[str, int]

    async def _answer(self, request: _Message, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, upstream: Upstream) -> bool:
        """Answer one client request (the loop's thread); False: the connection is over."""
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection (the loop's thread): its requests in turn, each answered by
        ``_answer``; a connection error aborts it, ``stop()`` cancels it."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        _no_delay(writer)
        upstream = Upstream(self.upstream)
        try:
            while True:
                try:
                    request = await _read_message(reader, client=writer)
                except (_Closed, asyncio.IncompleteReadError, ConnectionError):
                    return
                if not await self._answer(request, reader, writer, upstream):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            _abort(writer)
        except asyncio.CancelledError:
            _abort(writer)
            raise
        finally:
            upstream.close()
            self._tasks.discard(task)

    def start(self, port: int = 0) -> Self:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, LOOPBACK, port, limit=MAX_HEAD))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{self.thread_name} did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FaultProxy(LoopbackServer):
    """One hop's proxy (module docstring). ``start()`` returns it listening; ``stop()``."""

    def __init__(self, upstream_port: int, *, upstream_host: str = LOOPBACK,
                 name: str = "hop") -> None:
        if upstream_host not in (LOOPBACK, "localhost"):
            raise ValueError("the fault proxy only forwards to loopback addresses")
        super().__init__()
        self.upstream = (upstream_host, upstream_port)
        self.name = name
        self.thread_name = f"fault-proxy-{name}"
        self.requests = 0
        self.injected: list[Injected] = []
        self._rules: list[Rule] = []
        self._rate = 0.0
        self._kinds: tuple[Kind, ...] = QUICK_KINDS
        self._turn = 0
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    # --- the plan (any thread) -------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def window(self, kind: Kind, seconds: float, **filters: object) -> Rule:
        """``kind`` for every request (matching ``filters``) during the next ``seconds``."""
        return self.add(Rule(kind, until=time.monotonic() + seconds, **filters))  # type: ignore[arg-type]

    def down(self, seconds: float) -> Rule:
        """The hop is down for ``seconds``: every request is reset before it is forwarded."""
        return self.window(Kind.RESET_BEFORE, seconds)

    def random(self, rate: float, kinds: Iterable[Kind] = QUICK_KINDS, seed: int = 0) -> None:
        """A seeded share ``rate`` of requests misbehave, the ``kinds`` taken in turn."""
        with self._lock:
            self._rate = rate
            self._kinds = tuple(kinds)
            self._rng = random.Random(f"{self.name}:{seed}")
            self._turn = 0

    def clear(self) -> None:
        """Let everything through from now on."""
        with self._lock:
            self._rules.clear()
            self._rate = 0.0

    def counts(self) -> dict[str, int]:
        """Injected faults by kind."""
        with self._lock:
            result: dict[str, int] = {}
            for item in self.injected:
                result[item.kind.value] = result.get(item.kind.value, 0) + 1
            return result

    def _decide(self, path: str, target: str) -> tuple[Rule | None, Kind | None, int]:
        with self._lock:
            self.requests += 1
            ordinal = self.requests
            now = time.monotonic()
            for rule in self._rules:
                if rule.take(path, target, now):
                    self.injected.append(Injected(ordinal, now, target or path, rule.kind))
                    return rule, rule.kind, ordinal
            if self._rate and self._rng.random() < self._rate:
                kind = self._kinds[self._turn % len(self._kinds)]
                self._turn += 1
                self.injected.append(Injected(ordinal, now, target or path, kind))
                return None, kind, ordinal
            return None, None, ordinal

    # --- one client connection (the loop's thread) --------------------------------------------

    async def _answer(self, request: _Message, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, upstream: Upstream) -> bool:
        method, path = (request.start.split(" ") + ["", ""])[:2]
        rule, kind, _ = self._decide(path, request.headers.get("x-amz-target", ""))
        if kind is Kind.RESET_BEFORE:
            _abort(writer)
            return False
        if kind in (Kind.BARE_500, Kind.BARE_503):
            status, reason = ((500, b"Internal Server Error") if kind is Kind.BARE_500
                              else (503, b"Service Temporarily Unavailable"))
            body = BARE_BODY % (status, reason)
            writer.write(b"HTTP/1.1 %d %s\r\nServer: lb\r\nContent-Type: text/html\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (status, reason, len(body), body))
            await writer.drain()
            return True
        if kind is Kind.DELAY:
            await asyncio.sleep(rule.delay_s if rule else DELAY_S)
        response = await upstream.forward(request, method)
        if response is None:
            _abort(writer)  # the service dropped it: so does the hop
            return False
        if kind is Kind.RESET_AFTER:
            _abort(writer)
            return False
        if kind is Kind.STALL:
            try:  # until the client gives up (EOF) or the stall's bound
                await asyncio.wait_for(reader.read(1), rule.stall_s if rule else STALL_S)
            except (TimeoutError, ConnectionError):
                pass
            _abort(writer)
            return False
        if kind is Kind.TRUNCATE:
            # an empty body is cut too: it announces one byte it never sends
            writer.write(response.encode(response.body[:len(response.body) // 2],
                                         length=max(1, len(response.body))))
            await writer.drain()
            writer.close()
            return False
        if kind is Kind.CORRUPT_BODY:
            response = _Message(response.head, response.headers, _flip_middle(response.body))
        if kind is Kind.BAD_SIGNATURE:
            response = _bad_signature(response) or _Message(
                response.head, response.headers, _flip_middle(response.body))
        writer.write(response.encode())
        await writer.drain()
        if kind is Kind.RESET_AFTER_BODY:
            await asyncio.sleep(0.05)  # let the answer leave before the RST
            _abort(writer)
            return False
        if response.headers.get("connection", "").lower() == "close":
            writer.close()
            return False
        return True
