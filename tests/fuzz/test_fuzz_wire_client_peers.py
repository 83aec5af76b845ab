"""Fuzz target: hostile peers against the Tunnel client's HTTP wire
(``connector.tunnel.tablestore.http``), over real sockets on 127.0.0.1.

Input: what a server (or a proxy in between) answers one request with, drawn piece by piece --
a status line (now and then mutated), a header section (a few headers, a flood of one name
repeated or of distinct names around ``MAX_HEADER_COUNT``, a value around
``MAX_HEADER_BYTES``), a framing (a true ``Content-Length``, one past the answer bound, one
that lies, chunked in pieces of 1 byte to 64 KiB with or without a trailer, delimited by the
close), a body around the answer bound or endless (or an endless trailer), and a pace (all at
once, dripped in pieces, or stalled part-way). The peer is a thread of this process writing
bytes built before the input starts.

Property: one exchange gives an ``Answer`` within the bounds (body, header count) or one of the
errors the module documents (``AnswerTooLarge``, ``AnswerDeadlineError`` and the other
timeouts, ``IncompleteAnswer``, ``MalformedAnswer``, ``RemoteDisconnected``, a reset), never
another error; it ends within the answer deadline plus slack; and the memory Python allocated
meanwhile (``tracemalloc``'s peak, the client's and the peer's) stays under a bound set by the
answer bound, not by what the peer sends. Each input's outcome is reported with ``event``.

Sizes are scaled down in the default run (a 256 KiB answer bound, a 0.1 s answer deadline:
seconds in all) and up (an 8 MiB bound, bodies to 24 MiB, floods of 5,000 headers, a 0.3 s
deadline) when ``FUZZ_EXAMPLES`` is set (``make fuzz``); the real 64 MiB bound is
tests/test_tablestore_http.py's, with the client's whole process measured.
"""

from __future__ import annotations

import functools
import http.client
import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from connector.tunnel.tablestore.http import (
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    RECV_BYTES,
    Answer,
    AnswerDeadlineError,
    AnswerTooLarge,
    ConnectionPool,
    IncompleteAnswer,
    MalformedAnswer,
)
from testkit.fuzzing import fuzz_settings, mostly, mutated
from testkit.socket_peers import Handler, LoopbackServer, read_request

pytestmark = pytest.mark.fuzz

LONG = bool(os.environ.get("FUZZ_EXAMPLES"))
#: the answer bound the pool is given: scaled down (the real ``MAX_ANSWER_BYTES`` is held by
#: tests/test_tablestore_http.py, the client's process measured whole)
BOUND = 8 * 1024 * 1024 if LONG else 256 * 1024
#: the whole-answer deadline the pool is given: what a dripping or stalled input costs
DEADLINE_S = 0.3 if LONG else 0.1
#: what one input may take beyond the deadline (a loaded machine, the peer's last write)
SLACK_S = 3.0
#: Python allocations one exchange may make at its peak: the body kept and joined, a few reads
#: past the bound, the header section (httptools joins a header's pieces), the peer's pieces
MEMORY_BOUND = 2 * BOUND + 6 * RECV_BYTES + 4 * MAX_HEADER_BYTES + 2 * 1024 * 1024
#: the errors ``http``'s docstring names for an answer that is not taken
DOCUMENTED = (AnswerTooLarge, AnswerDeadlineError, TimeoutError, IncompleteAnswer,
              MalformedAnswer, http.client.RemoteDisconnected, ConnectionResetError,
              BrokenPipeError)


@dataclass
class Peer:
    """One input's answer: ``head`` then ``body``, then ``forever`` (if not empty) again and
    again, written in pieces of ``piece`` bytes ``pause_s`` apart (``0``: at once), stopping
    for good after ``stall_after`` bytes (``None``: never); then closed or held open."""

    head: bytes
    body: bytes
    forever: bytes = b""
    piece: int = 0
    pause_s: float = 0.0
    stall_after: int | None = None
    close: bool = False
    kind: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # built now, while the input is drawn: the peer allocates nothing while it plays
        self.wire = memoryview(self.head + self.body)

    def play(self, conn: socket.socket) -> None:
        sent = 0
        for data in self._stream():
            if self.stall_after is not None and sent + len(data) > self.stall_after:
                conn.sendall(data[:max(self.stall_after - sent, 0)])
                self.stop.wait(30)
                return
            if self.pause_s and self.stop.wait(self.pause_s):
                return
            conn.sendall(data)
            sent += len(data)
            if self.stop.is_set():
                return
        if not self.close:
            self.stop.wait(30)

    def _stream(self) -> Iterator[bytes | memoryview]:
        step = self.piece or len(self.wire) or 1
        for at in range(0, len(self.wire), step):
            yield self.wire[at:at + step]
        while self.forever:
            yield self.forever  # one object, sent again: nothing allocated per write


class PeerServer(LoopbackServer):
    """Serves each connection with the ``peer`` current at its accept, after reading one
    request."""

    def __init__(self) -> None:
        self.peer: Peer | None = None
        super().__init__()

    def handler(self) -> Handler:
        return functools.partial(self._serve_peer, peer=self.peer)

    @staticmethod
    def _serve_peer(conn: socket.socket, peer: Peer | None) -> None:
        if read_request(conn) is not None and peer is not None:  # the fuzz's have no body
            peer.play(conn)


@pytest.fixture(scope="module")
def server() -> Iterator[PeerServer]:
    peer_server = PeerServer()
    tracemalloc.start()
    yield peer_server
    tracemalloc.stop()
    peer_server.listener.close()


def _headers(draw: Any) -> tuple[list[bytes], str]:
    shape = draw(mostly(st.just("few"), st.sampled_from(
        ["repeated-flood", "distinct-flood", "long-value", "many-long"]), one_in=3))
    if shape == "few":
        return [b"X-Ots-Requestid: r1\r\n", b"X-Ots-Date: now\r\n"], shape
    count = draw(st.sampled_from([MAX_HEADER_COUNT - 2, MAX_HEADER_COUNT,
                                  MAX_HEADER_COUNT + 1, 4 * MAX_HEADER_COUNT,
                                  (40 if LONG else 8) * MAX_HEADER_COUNT]))
    if shape == "repeated-flood":
        return [b"X-Repeated: %d\r\n" % i for i in range(count)], shape
    if shape == "distinct-flood":
        return [b"X-H%d: v\r\n" % i for i in range(count)], shape
    size = draw(st.sampled_from([MAX_HEADER_BYTES // 2, MAX_HEADER_BYTES - 64,
                                 MAX_HEADER_BYTES, 2 * MAX_HEADER_BYTES,
                                 (64 if LONG else 8) * MAX_HEADER_BYTES]))
    if shape == "long-value":
        return [b"X-Long: " + b"v" * size + b"\r\n"], shape
    each = draw(st.sampled_from([100, 1000]))
    return [b"X-M%d: %s\r\n" % (i, b"m" * each) for i in range(size // each)], shape


@st.composite
def peers(draw: Any) -> Peer:
    status = b"HTTP/1.1 200 OK\r\n"
    status = draw(mostly(st.just(status), mutated(status)))
    headers, header_shape = _headers(draw)
    framing = draw(st.sampled_from(["length", "length-past-bound", "length-lies", "chunked",
                                    "until-close"]))
    size = draw(st.sampled_from([0, 1000, BOUND - 1, BOUND, BOUND + 1, 3 * BOUND]))
    endless = framing in ("chunked", "until-close") and draw(mostly(st.just(False),
                                                                     st.just(True), 4))
    body, forever = b"b" * size, b""
    if framing == "length":
        headers.append(b"Content-Length: %d\r\n" % size)
    elif framing == "length-past-bound":
        headers.append(b"Content-Length: %d\r\n" % draw(st.sampled_from([BOUND + 1, 1 << 40])))
        body = body[:1000]
    elif framing == "length-lies":
        headers.append(b"Content-Length: %d\r\n" % (size + draw(st.integers(1, 1000))))
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked\r\n")
        step = draw(st.sampled_from([1, 7, 64, 64 * 1024]))
        chunk = b"%x\r\n" % step + b"c" * step + b"\r\n"
        trailer = draw(mostly(st.just(0), st.sampled_from(
            [1000, MAX_HEADER_BYTES, 8 * MAX_HEADER_BYTES, -1]), 4))
        framing += f" by {step}"
        rest = size % step
        body = chunk * (size // step) + (b"%x\r\n" % rest + b"c" * rest + b"\r\n" if rest
                                         else b"") + b"0\r\n"
        if endless:
            body, forever = b"", chunk * max(1, 64 * 1024 // len(chunk))
        elif trailer < 0:  # a trailer that never ends
            body, forever = body + b"X-Trailer: ", b"t" * (64 * 1024)
            framing, endless = framing + " trailer", True
        else:
            framing += f" trailer {trailer}" if trailer else ""
            body += (b"X-Trailer: " + b"t" * trailer + b"\r\n" if trailer else b"") + b"\r\n"
    else:
        headers.append(b"Connection: close\r\n")
        if endless:
            body, forever = b"", b"e" * (64 * 1024)
    pace = draw(mostly(st.just("burst"), st.sampled_from(["drip", "stall"]), 8))
    peer = Peer(status + b"".join(headers) + b"\r\n", body, forever,
                close=draw(st.booleans()) or framing == "until-close",
                kind=f"{header_shape} {framing}{' endless' if endless else ''} {pace}")
    if pace == "drip":
        peer.piece, peer.pause_s = draw(st.sampled_from([(1, 0.01), (512, 0.005)]))
    elif pace == "stall":
        peer.stall_after = draw(st.integers(0, len(peer.head) + len(body)))
    return peer


@fuzz_settings()
@given(peer=peers())
def test_hostile_peers_end_in_a_bounded_answer_or_a_documented_error(
        server: PeerServer, peer: Peer) -> None:
    pool = ConnectionPool(server.url, ca_bundle=None, connect_timeout=2.0, read_timeout=10.0,
                          max_idle=1, answer_deadline_s=DEADLINE_S, max_answer_bytes=BOUND)
    server.peer = peer
    event(f"peer: {peer.kind}")
    tracemalloc.reset_peak()  # the peak from now: what is held already, and the exchange's
    held = tracemalloc.get_traced_memory()[0]
    began = time.monotonic()
    try:
        outcome: Answer | Exception = pool.exchange(pool.post_bytes("/p", "", b""))
    except DOCUMENTED as exc:
        outcome = exc
    finally:
        took = time.monotonic() - began
        grown = tracemalloc.get_traced_memory()[1] - held
        peer.stop.set()
        pool.close()
    if isinstance(outcome, Answer):
        event("outcome: answer")
        assert len(outcome.body) <= BOUND
        assert len(outcome.headers) <= MAX_HEADER_COUNT
    elif isinstance(outcome, AnswerTooLarge):
        event(f"outcome: AnswerTooLarge ({outcome.what})")
    else:
        event(f"outcome: {type(outcome).__name__}")
    assert took < DEADLINE_S + SLACK_S, peer.kind
    assert grown < MEMORY_BOUND, (peer.kind, grown)
    if "endless" in peer.kind:
        assert not isinstance(outcome, Answer)
